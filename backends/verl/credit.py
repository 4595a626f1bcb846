"""The credit step of the verl backend: verl's GRPO advantages + signals -> token advantages.

verl's trainer writes GRPO's advantages as a (B, T) tensor, the response advantage A_i
broadcast over the row's response mask (``compute_grpo_outcome_advantage``:
``scores.unsqueeze(-1) * response_mask``). ``token_advantages`` reads A_i back from that
tensor and hands it, with the signals the strategy reads, to the one shared
``credit_core.assign_credit``; ``credit: uniform`` gives back verl's tensor bit for bit
(A_i * 1 at the mask, 0 elsewhere). ``credit_fields`` does the same on the nested
TransferQueue fields that verl's V1 trainer stores (``response_from_nested`` layout).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from verl.workers.utils.padding import response_from_nested, response_to_nested

from backends.verl.engine import WORK_FIELD
from credit_core import CreditDiagnostics, CreditError, CreditSignals, CreditStrategy, assign_credit
from credit_core.plan import CreditPlan


def response_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A (B,) from verl's (B, T) advantages: each row's value at its first valid token (0 for
    a row without one). ``CreditError`` when a row's advantage varies over its valid tokens
    (not a response-level estimator: the credit spreads one advantage per response)."""
    first = mask.int().argmax(dim=1)
    rows = torch.arange(mask.shape[0], device=mask.device)
    A = torch.where(mask.any(dim=1), advantages[rows, first], torch.zeros_like(advantages[:, 0]))
    if not bool(torch.where(mask, advantages == A.unsqueeze(1), True).all()):
        raise CreditError(
            "algorithm.adv_estimator: the advantages vary within a response; the credit "
            "strategies spread one response-level (GRPO) advantage over the tokens"
        )
    return A


def token_advantages(
    strategy: CreditStrategy,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    token_ids: torch.Tensor,
    signals: CreditSignals,
) -> tuple[torch.Tensor, CreditDiagnostics | None]:
    """Token advantages (B, T) float32 of ``strategy`` from verl's (B, T) ``advantages``,
    ``mask`` (B, T) bool, the response ``token_ids`` and ``signals``: 0 where ``mask`` is
    False and at rows without a valid token; the diagnostics (None without a valid row)."""
    A = response_advantages(advantages, mask)
    rows = mask.any(dim=1)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if not bool(rows.any()):
        return out, None
    every = bool(rows.all())
    result = assign_credit(
        strategy,
        A if every else A[rows],
        mask if every else mask[rows],
        token_ids.long() if every else token_ids[rows].long(),
        signals if every else signals.select(rows),
    )
    out[rows] = result.token_advantages
    return out, result.diagnostics


def credit_fields(
    plan: CreditPlan, fields: TensorDict
) -> tuple[torch.Tensor, CreditDiagnostics | None]:
    """Nested token advantages (B, j) of ``plan``'s strategy from the TransferQueue ``fields``
    of a batch after verl's
    ``_compute_advantage``: ``advantages``, ``response_mask``, ``responses`` (nested, response
    length), plus ``entropy`` (response layout) when ``token_entropy`` is read and
    ``WORK_FIELD`` (the engine's prompt + response layout) when ``unsigned_work`` is read."""
    response_mask = fields["response_mask"]
    reads = plan.signals
    found = {}
    if "unsigned_work" in reads:
        if WORK_FIELD not in fields:
            raise CreditError(
                f"algorithm.credit: the actor engine gave no {WORK_FIELD}; is the plugin "
                "backends.verl.plugin loaded in the worker processes (its verl.plugins entry "
                "point, or VERL_USE_EXTERNAL_MODULES=backends.verl.plugin)?"
            )
        found["unsigned_work"] = response_from_nested(fields[WORK_FIELD], response_mask)
    if "token_entropy" in reads:
        found["token_entropy"] = fields["entropy"]
    padded = TensorDict(
        {
            "advantages": fields["advantages"],
            "response_mask": response_mask,
            "responses": fields["responses"],
            **found,
        },
        batch_size=fields.batch_size,
    ).to_padded_tensor()
    mask = padded["response_mask"].bool()
    signals = CreditSignals(**{name: padded[name].float() for name in found})
    adv, diagnostics = token_advantages(
        plan.strategy, padded["advantages"], mask, padded["responses"], signals
    )
    return response_to_nested(adv, response_mask), diagnostics
