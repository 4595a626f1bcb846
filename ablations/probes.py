"""Looking at a trained policy after its run: exact held-out scores and where DATC's credit goes.

Both sample from the run's final policy through the trainer's own rollout
(``GRPORecipe.rollout``) and credit path (``GRPORecipe.signals``), under seeds derived from
the run's seed and a tag of their own, so they never reuse the training or evaluation
samples.

- ``extra_eval``: an exact scorer (``(prompts, responses) -> scores``) on every held-out
  prompt: mean over G samples at the training temperature, and over greedy responses.
- ``credit_examples``: for the first held-out prompts whose group has non-zero advantages,
  the strategy's token weights w_t = A_t / A of a few responses (both signs of A), with the
  tokens' text, for the credit heat-map.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from adapters.scorers import decode_rows
from backends.common.data import Prompt
from backends.torch.rollout import RolloutBatch
from backends.torch.trainer import GRPORecipe


def _sample(
    recipe: GRPORecipe, prompts: Sequence[Prompt], *, group_size: int, greedy: bool, tag: str
) -> RolloutBatch:
    """The trainer's own rollout of ``prompts`` (held-out: ``group`` indexes them)."""
    index = list(range(len(prompts)))
    return recipe.rollout(prompts, index, index, group_size=group_size, greedy=greedy, tag=tag)


@torch.no_grad()
def extra_eval(
    recipe: GRPORecipe, scorers: Mapping[str, Callable[[list[str], list[str]], Sequence[float]]]
) -> dict[str, float]:
    """``{name}_sampled`` and ``{name}_greedy`` held-out means of every scorer."""
    if not scorers or not recipe.eval_prompts:
        return {}
    cfg = recipe.cfg
    tok = recipe.policy.tokenizer
    out: dict[str, float] = {}
    g_size = cfg.eval.group_size or cfg.rollout.group_size
    for mode, greedy, g in (("sampled", False, g_size), ("greedy", True, 1)):
        batch = _sample(
            recipe, recipe.eval_prompts, group_size=g, greedy=greedy, tag=f"ablate_extra_{mode}"
        )
        prompts = decode_rows(tok, batch.prompt_ids, batch.prompt_mask)
        responses = decode_rows(tok, batch.response_ids, batch.response_mask)
        for name, fn in scorers.items():
            scores = [float(x) for x in fn(prompts, responses)]
            out[f"{name}_{mode}"] = sum(scores) / len(scores)
    return out


def credit_examples(
    recipe: GRPORecipe, n_responses: int, max_prompts: int = 8
) -> list[dict[str, Any]]:
    """Token weights of up to ``n_responses`` responses to one held-out prompt (see module)."""
    cfg = recipe.cfg
    policy = recipe.policy
    strategy = recipe.credit.strategy
    embedding = recipe.reward.embedding
    if not strategy.requires or embedding is None:
        return []
    G = cfg.rollout.group_size
    for i, prompt in enumerate(recipe.eval_prompts[:max_prompts]):
        batch = recipe.rollout(
            [prompt], [i], [i], group_size=G, greedy=False, tag=f"ablate_credit_{i}"
        )
        signals = recipe.signals(batch, recipe.eval_prompts)
        adv, rewards = signals.advantages, signals.rewards
        if not bool((adv != 0).any()):
            continue
        order = sorted(range(G), key=lambda r: -abs(float(adv[r])))
        pos = [r for r in order if adv[r] > 0][: (n_responses + 1) // 2]
        neg = [r for r in order if adv[r] < 0][: n_responses - len(pos)]
        rows = sorted(pos, key=lambda r: -float(adv[r])) + sorted(neg, key=lambda r: -float(adv[r]))
        examples = []
        for r in rows:
            n = int(batch.response_mask[r].sum())
            ids = batch.response_ids[r, :n].tolist()
            a = float(adv[r])
            examples.append(
                {
                    "prompt": prompt.text,
                    "tokens": [policy.tokenizer.decode([t]) for t in ids],
                    "weights": (signals.token_advantages[r, :n] / a).tolist(),
                    "reward": float(rewards[r]),
                    "advantage": a,
                }
            )
        return examples
    return []
