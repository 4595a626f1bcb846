"""Timings and counts of the adapters on this machine: ``python -m benchmarks.adapters``.

Prints, for the packaged MiniLM reward model: one ``DirectionModel.score`` forward+backward
and one ``response_logprobs_and_stats`` call (tiny Llama policy on MiniLM's 30,522-token
vocabulary, PolicyStats with d = 384) at batch B x R response tokens; the one-time bridge
build for a 600-token BPE policy and for a 30,522-token (WordPiece) policy; and how many
policy tokens the bridge drops (empty tokens) for the BPE policy. Times are medians.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from adapters.minilm import load_minilm
from adapters.policy import response_logprobs_and_stats
from adapters.reward_models import EncoderSimilarityRM
from adapters.tiny import TINY_CORPUS, tiny_causal_lm, train_bpe_tokenizer
from adapters.vocab_bridge import VocabBridge
from benchmarks.timing import Summary, interleaved


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` timed calls after one warm-up call."""
    return Summary.of(interleaved({"fn": fn}, repeats=repeats)["fn"]).median


def main(argv: list[str] | None = None) -> None:
    """Run the measurements and print one line per figure."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--response-len", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    B, R, P = args.batch, args.response_len, args.prompt_len

    model, tok = load_minilm()
    V = len(tok)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, V, (B, P + R), generator=gen)
    mask = torch.ones_like(ids)
    dm = EncoderSimilarityRM(model, tok, tok, "a happy dog playing in the park")
    policy = tiny_causal_lm("llama", V)
    print(f"torch threads: {torch.get_num_threads()}; batch {B} x {R} response tokens")

    def rm() -> object:
        return dm.score(ids[:, :P], mask[:, :P], ids[:, P:], mask[:, P:], with_grad=True)

    def stats() -> object:
        with torch.no_grad():
            return response_logprobs_and_stats(
                policy, ids, mask, R, reward_embedding=dm.reward_embedding
            )

    print(f"MiniLM score (forward+backward): {_median_s(rm, args.repeats) * 1e3:.0f} ms")
    print(
        f"response_logprobs_and_stats (V={V}, d=384): {_median_s(stats, args.repeats) * 1e3:.0f} ms"
    )

    bpe = train_bpe_tokenizer(TINY_CORPUS, 600)
    t0 = time.perf_counter()
    small = VocabBridge(bpe, tok)
    t1 = time.perf_counter()
    VocabBridge(tok, bpe)
    t2 = time.perf_counter()
    print(f"bridge build, BPE policy (V={len(bpe)}) -> MiniLM: {(t1 - t0) * 1e3:.0f} ms")
    print(f"bridge build, WordPiece policy (V={V}) -> BPE RM: {(t2 - t1) * 1e3:.0f} ms")
    print(f"BPE policy tokens dropped by the bridge (empty): {small.n_empty} of {len(bpe)}")

    rows = [bpe.encode(t) for t in TINY_CORPUS]
    n = max(map(len, rows))
    r_ids = torch.tensor([r + [1] * (n - len(r)) for r in rows])
    r_mask = torch.tensor([[1] * len(r) + [0] * (n - len(r)) for r in rows])
    p_ids = torch.zeros(len(rows), 1, dtype=torch.long)
    out = EncoderSimilarityRM(model, tok, bpe, "a happy dog").score(
        p_ids, torch.ones_like(p_ids), r_ids, r_mask, with_grad=True
    )
    d = out.diagnostics
    print(
        f"TINY_CORPUS through the bridge: {d['bridge/dropped_rm_tokens']:.0f} RM tokens dropped, "
        f"{100 * d['bridge/dropped_grad_fraction']:.1f}% of the gradient mass (L1)"
    )


if __name__ == "__main__":
    main()
