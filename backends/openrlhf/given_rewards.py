"""The token rewards an OpenRLHF reward function gives, from its ``extra_logs`` to
``CreditSignals.token_rewards`` (docs/openrlhf.md, "Token rewards from the reward function").

OpenRLHF 0.11.2's agent executors keep three entries of what the reward function (a
``--reward.remote_url`` server or ``.py`` file's ``reward_func``, or an agent's ``step``)
returns: ``rewards``, ``scores`` and ``extra_logs``; the samples generator turns each
``extra_logs`` value into a float32 tensor ``torch.tensor([value])`` of the sample's ``info``.
So the token rewards ride in ``extra_logs``, as ``token_rewards`` or ``step_rewards``, one
entry per query of the function's batch like ``rewards`` (OpenRLHF calls it with one query:
``[[r_0, ..., r_{n-1}]]`` or ``[[(start, end, reward), ...]]``).

``take_reward_items`` runs on the rollout's single-sample ``Experience`` objects before
OpenRLHF concatenates them into micro-batches (which would zero-pad those tensors to one
length, losing each one's own): it pops the two entries from each sample's ``info`` and
puts back one item per sample under ``INFO_KEY``, a list, which OpenRLHF's concatenation
chains in the micro-batch's row order. ``step_token_rewards`` pops them from the step's
micro-batches and reads them with ``credit_core.parse_reward_outputs`` against the action
masks, naming each sample by its place in the step's rollout (``Experience.index``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from credit_core import CreditError, TokenRewards, parse_reward_outputs
from credit_core.given_rewards import OUTCOME_KEY, STEP_KEY, TOKEN_KEY

#: The ``info`` entry that carries each sample's given rewards from the rollout to the step.
INFO_KEY = "credit/given_rewards"
#: How errors name where the token rewards come from.
SOURCE_NAME = "the reward function's extra_logs"


def take_reward_items(samples: Sequence[Any]) -> None:
    """For each single-sample ``Experience`` of ``samples`` (``info`` as OpenRLHF's samples
    generator made it), pop ``info[TOKEN_KEY]`` / ``info[STEP_KEY]`` and set
    ``info[INFO_KEY]`` to ``[item]``: None where neither is there, else ``{key: value}``
    for each one there, ``value`` the function's entry for the sample as a Python list
    (span positions that are whole numbers as ints). ``CreditError`` naming the sample (its
    place in ``samples``) when an entry is not a list of one entry, the sample's."""
    for i, sample in enumerate(samples):
        item: dict[str, object] = {}
        for key in (TOKEN_KEY, STEP_KEY):
            if key in sample.info:
                item[key] = _entry(f"{SOURCE_NAME}: response {i}: {key}", sample.info.pop(key))
        sample.info[INFO_KEY] = [item or None]


def step_token_rewards(experiences: Sequence[Any], mask: torch.Tensor) -> TokenRewards:
    """The ``TokenRewards`` (N, W) of the step's micro-batches ``experiences`` (their rows
    stacked in order, as ``mask`` (N, W) bool, the step's action masks): each sample's item
    (``take_reward_items``, popped from ``info``) read by ``parse_reward_outputs``, positions
    counting the sample's action tokens. ``CreditError`` naming the sample by its place in
    the step's rollout (``Experience.index``) for a bad length, span or value; when a
    micro-batch carries no items (``take_reward_items`` did not run); and when no sample
    gives token rewards."""
    items: list[object] = []
    for k, experience in enumerate(experiences):
        found = experience.info.pop(INFO_KEY, None)
        if not isinstance(found, list) or len(found) != experience.action_mask.shape[0]:
            raise CreditError(
                f"experience.info[{INFO_KEY!r}] of micro-batch {k}: expected one item per "
                "sample, put there from the rollout (TokenCreditExperienceMaker"
                f".split_rollout_samples), got {type(found).__name__}"
            )
        items += found
    index = torch.cat([torch.as_tensor(e.index, dtype=torch.long).reshape(-1) for e in experiences])
    order = torch.argsort(index)  # row r of the rollout's order is step row order[r]
    ordered = [_with_outcome(items[int(r)]) for r in order]
    _, token = parse_reward_outputs(ordered, mask[order], name=SOURCE_NAME)
    if token is None:
        raise CreditError(
            f"--credit: the strategy reads token rewards, but {SOURCE_NAME} of no sample has "
            f"{TOKEN_KEY!r} or {STEP_KEY!r}: return {{'rewards': ..., 'scores': ..., "
            f"'extra_logs': {{{STEP_KEY!r}: [[(start, end, reward), ...]]}}}} (or "
            f"{TOKEN_KEY!r}: [[one reward per response token]]) from reward_func "
            "(docs/openrlhf.md)"
        )
    return token.select(torch.argsort(order))


def _with_outcome(item: object) -> object:
    """A ``parse_reward_outputs`` item: the sample's given rewards with a placeholder
    outcome (the strategy reads OpenRLHF's own rewards, not this one), or that outcome."""
    return {OUTCOME_KEY: 0.0, **item} if isinstance(item, dict) else 0.0


def _entry(where: str, value: object) -> object:
    """The sample's entry of an ``extra_logs`` list (one per query) from the tensor OpenRLHF
    made of it; ``CreditError`` naming ``where`` unless it is a list of one entry."""
    found = value.tolist() if isinstance(value, torch.Tensor) else value
    entries = found[0] if isinstance(found, list) and len(found) == 1 else None
    if not isinstance(entries, list) or len(entries) != 1:
        raise CreditError(
            f"{where}: expected a list with one entry per query of the reward function's batch "
            "(OpenRLHF calls it with one: [[...]]), got "
            + (f"{len(entries)} entries" if isinstance(entries, list) else "a number")
        )
    return _whole_positions(entries[0])


def _whole_positions(entry: object) -> object:
    """``entry`` with the first two items of each 3-item list (a span's start and end, float
    after OpenRLHF's tensor) as ints where they are whole numbers."""
    if not isinstance(entry, list):
        return entry
    return [
        [*(_as_int(x) for x in span[:2]), span[2]]
        if isinstance(span, list) and len(span) == 3
        else span
        for span in entry
    ]


def _as_int(x: object) -> object:
    return int(x) if isinstance(x, float) and x.is_integer() else x
