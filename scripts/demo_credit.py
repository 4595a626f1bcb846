"""Print GRPO and DATC token advantages side by side for one small group of responses.

A toy world: a 16-word vocabulary, a frozen linear reward model that likes some words
("good", "happy", "sun") and dislikes others, and a random policy. DATC should move credit
onto the words that actually changed the reward, keeping each response's sign and mean.
Run: python scripts/demo_credit.py [--seed N] [--beta B] [--lam L]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from credit_core import CreditBatch, get_strategy, group_advantages, policy_stats_from_logits

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "very", "and"]
WORDS += ["good", "happy", "sun", "bad", "sad", "rain"]
LIKED, DISLIKED = ("good", "happy", "sun"), ("bad", "sad", "rain")


def _color(text: str, weight: float, use_color: bool) -> str:
    if not use_color:
        return text
    if weight > 1.05:
        code = "1;32" if weight > 1.5 else "32"
    elif weight < 0.95:
        code = "2;37"
    else:
        code = "0"
    return f"\033[{code}m{text}\033[0m"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--lam", type=float, default=0.5)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--length", type=int, default=7)
    args = parser.parse_args(argv)
    use_color = sys.stdout.isatty() and "NO_COLOR" not in os.environ

    gen = torch.Generator().manual_seed(args.seed)
    V, d, G, T = len(WORDS), 8, args.group_size, args.length
    emb = torch.randn(V, d, generator=gen)
    direction = emb[[WORDS.index(w) for w in LIKED]].mean(0)
    direction -= emb[[WORDS.index(w) for w in DISLIKED]].mean(0)

    def reward_model(inputs_embeds: torch.Tensor) -> torch.Tensor:
        return torch.tanh(inputs_embeds.mean(1) @ direction)

    logits = 1.5 * torch.randn(G, T, V, generator=gen)
    tokens = torch.multinomial(torch.softmax(logits, -1).reshape(-1, V), 1, generator=gen)
    tokens = tokens.reshape(G, T)
    inputs = emb[tokens].requires_grad_(True)
    scores = reward_model(inputs)
    (grad,) = torch.autograd.grad(scores.sum(), inputs)
    rewards = scores.detach()

    batch = CreditBatch(
        advantages=group_advantages(rewards, G),
        mask=torch.ones(G, T, dtype=torch.bool),
        token_ids=tokens,
        reward_grad=grad,
        policy_stats=policy_stats_from_logits(logits, tokens, emb),
    )
    grpo = get_strategy("uniform").assign(batch)
    datc = get_strategy("datc", beta=args.beta, lam=args.lam).assign_with_diagnostics(batch)

    print(
        f"reward model likes {LIKED}, dislikes {DISLIKED}; group of {G}, beta={args.beta}, "
        f"lam={args.lam}\n"
    )
    width = max(len(w) for w in WORDS) + 1
    for i in range(G):
        a = float(batch.advantages[i])
        print(f"response {i}: reward {float(rewards[i]):+.3f}   advantage A = {a:+.3f}")
        words = [WORDS[t] for t in tokens[i].tolist()]
        weights = (datc.token_advantages[i] / a).tolist() if a != 0 else [1.0] * T
        print(
            "  token  "
            + "".join(
                _color(f"{w:>{width}}", x, use_color) for w, x in zip(words, weights, strict=True)
            )
        )
        print("  GRPO   " + "".join(f"{float(v):>+{width}.2f}" for v in grpo[i]))
        print("  DATC   " + "".join(f"{float(v):>+{width}.2f}" for v in datc.token_advantages[i]))
        mean = float(datc.token_advantages[i].mean())
        print(f"  mean   GRPO {float(grpo[i].mean()):+.3f}  DATC {mean:+.3f}  (kept)\n")
    diag = ", ".join(f"{k}={v:.3g}" for k, v in datc.diagnostics.to_dict().items())
    print(f"diagnostics: {diag}")
    print(
        "\nA token is up-weighted when the GRPO push on it (up if A > 0, down if A < 0) moves the"
        "\npolicy's expected reward-model input toward higher reward; see docs/design.md."
    )


if __name__ == "__main__":
    main()
