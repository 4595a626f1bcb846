"""The verl backend's credit: the process's ``CreditRun`` (``CreditSettings.run``, built once
by ``config.credit_settings``) applied to the nested TransferQueue fields of a step.

Under GRPO verl's trainer writes the advantages as a (B, T) tensor, the response advantage
A_i broadcast over the row's response mask (``compute_grpo_outcome_advantage``:
``scores.unsqueeze(-1) * response_mask``). ``credit_fields`` reads A_i back from that tensor
(``response_advantages``) and hands it, with the signals the strategy reads, the response
rewards and groups (verl's scores and uids, where the strategy reads them or the step
measures the direction model) and the direction model's scores (``SCORES_FIELD``, shipped by
the engine), to ``CreditRun.apply``: ``assign_credit`` (rows without a valid token get 0),
the direction model's within-group agreement with verl's reward and, with a gate, the mix
toward GRPO (docs/design.md, "Trusting the direction model"). ``credit: uniform`` gives back
verl's tensor bit for bit (A_i * 1 at the mask, 0 elsewhere).

For a strategy that reads token rewards (``process``) the step also reads each sample's
reward extra info (``extra_fields``, where verl's agent loop stores the reward's
``reward_extra_info``: a ``compute_score`` dict's items, or a reward manager's): its
``token_rewards`` (one per response token) or ``step_rewards`` ((start, end, reward) spans)
become ``CreditSignals.token_rewards`` (``given_token_rewards``; docs/verl.md).

Under verl's critic estimator (GAE) ``credit_fields(..., critic=True)`` runs the same step
on GRPO's response advantages of the same rollouts (verl's own
``compute_grpo_outcome_advantage`` of the scores within each prompt's samples) and returns
``credit_core.token_rewards.critic_reward_shift``'s D, which the trainer adds to verl's
token rewards before verl's own GAE (docs/design.md, "Credit under a critic").

Either way it returns the step's metrics for verl's ``metrics`` dict: the strategy's
diagnostics and, for a strategy that reads a direction model, ``AgreementMetrics.to_dict()``
(``credit/direction_agreement``, ... or ``credit/direction_is_reward``). The gate's EMA is
the run's checkpointed state (``save_credit_state`` / ``load_credit_state``, beside
verl's own checkpoint of the step).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.workers.utils.padding import response_from_nested, response_to_nested

from backends.common.credit import CreditRun, CreditStep
from backends.verl.config import SCORES_FIELD, SIGNAL_FIELDS, CreditSettings
from credit_core import CreditError, CreditSignals, TokenRewards
from credit_core.given_rewards import OUTCOME_KEY, STEP_KEY, TOKEN_KEY, parse_reward_outputs
from credit_core.token_rewards import critic_reward_shift

#: The TransferQueue fields of the response rewards (verl's token-level scores, the reward
#: at each response's last token) and of each response's prompt id (verl's group).
REWARD_FIELDS = ("rm_scores", "uid")
#: The TransferQueue field of each sample's extra fields (a dict; verl's agent loop keeps the
#: reward's extra info there under ``REWARD_INFO_KEY``).
EXTRA_FIELD = "extra_fields"
REWARD_INFO_KEY = "reward_extra_info"
#: How errors in the token rewards name their source.
REWARD_INFO_NAME = f"the reward function's {REWARD_INFO_KEY}"


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


@dataclass(frozen=True)
class RewardGroups:
    """The response rewards R (B,) float32 (verl's scores summed over the response, as its
    GRPO sums ``token_level_rewards``) and each response's group (B,) int64 (the index of
    its prompt's ``uid`` among the batch's sorted uids)."""

    rewards: torch.Tensor
    groups: torch.Tensor


def reward_groups(scores: torch.Tensor, uid: object) -> RewardGroups:
    """``RewardGroups`` from verl's padded token-level ``scores`` (B, T) and its ``uid``
    field (anything with ``tolist()``: strings or numbers, one per row)."""
    ids = [str(u) for u in uid.tolist()]  # type: ignore[attr-defined]
    if len(ids) != scores.shape[0]:
        raise CreditError(f"uid: expected {scores.shape[0]} ids (one per response), got {len(ids)}")
    _, index = np.unique(np.array(ids, dtype=object), return_inverse=True)
    groups = torch.as_tensor(index.astype(np.int64), device=scores.device)
    return RewardGroups(scores.float().sum(dim=-1), groups)


def given_token_rewards(
    extra_fields: object, mask: torch.Tensor, rewards: torch.Tensor
) -> TokenRewards:
    """The ``TokenRewards`` (B, T) the reward function gave: for each of the B samples, its
    ``extra_fields`` dict (verl's per-sample extra fields, anything with ``tolist()`` or a
    list) holds the reward's extra info (``REWARD_INFO_KEY``), whose ``token_rewards`` (one
    number per valid token of the row of ``mask`` (B, T) bool) or ``step_rewards``
    (``(start, end, reward)`` spans of those tokens' positions) are read by
    ``parse_reward_outputs`` with the outcome ``rewards`` (B,) (verl's score); a sample
    with neither gives none. ``CreditError`` naming the sample (its row in the step's
    batch) for a bad length, span or value, and when no sample gives token rewards."""
    infos = extra_fields.tolist() if hasattr(extra_fields, "tolist") else extra_fields
    if not isinstance(infos, list) or len(infos) != mask.shape[0]:
        got = f"{len(infos)}" if isinstance(infos, list) else type(infos).__name__
        raise CreditError(
            f"{EXTRA_FIELD}: expected a list of {mask.shape[0]} dicts (one per response), got {got}"
        )
    items = [_reward_item(info, float(r)) for info, r in zip(infos, rewards.tolist(), strict=True)]
    _, token = parse_reward_outputs(items, mask, name=REWARD_INFO_NAME)
    if token is None:
        raise CreditError(
            f"algorithm.credit: the strategy reads token rewards, but {REWARD_INFO_NAME} of "
            f"no response has {TOKEN_KEY!r} or {STEP_KEY!r}: return {{'score': R, "
            f"{STEP_KEY!r}: [(start, end, reward), ...]}} (or {TOKEN_KEY!r}: one reward per "
            "response token) from compute_score (docs/verl.md)"
        )
    return token


def _reward_item(info: object, outcome: float) -> object:
    """One ``parse_reward_outputs`` item of a sample's extra fields: the outcome alone, or
    a mapping of it with the reward extra info's token or step rewards."""
    extra = info.get(REWARD_INFO_KEY) if isinstance(info, Mapping) else None
    if not isinstance(extra, Mapping):
        return outcome
    given = {k: extra[k] for k in (TOKEN_KEY, STEP_KEY) if k in extra}
    return {OUTCOME_KEY: outcome, **given} if given else outcome


@dataclass(frozen=True)
class PaddedInputs:
    """The credit step's inputs from a batch's TransferQueue fields, padded to (B, T):
    ``fields`` (``response_mask``, ``responses``, the signals' fields, and ``advantages`` /
    ``rm_scores`` where read), the ``mask`` (B, T) bool, the ``signals``, the response
    rewards and groups (``context``, None unless read) and the direction model's score of
    each response (``scores`` (B,) float32, None unless the step measures it); the signals
    carry the reward function's token rewards where the strategy reads them
    (``given_token_rewards``)."""

    fields: TensorDict
    mask: torch.Tensor
    signals: CreditSignals
    context: RewardGroups | None
    scores: torch.Tensor | None


def reads_rewards(settings: CreditSettings, critic: bool) -> bool:
    """Whether the credit step reads the response rewards and groups: under the critic
    estimator (where verl's advantages are not GRPO's), for a strategy that reads them or
    the token rewards (whose outcomes they are), or to measure the direction model against
    the reward (``CreditSettings.measures``)."""
    plan = settings.plan
    return critic or plan.reads_groups or plan.reads_token_rewards or settings.measures


def fields_read(settings: CreditSettings, critic: bool) -> list[str]:
    """The TransferQueue fields the credit step of ``settings`` reads (``critic``: under
    the critic estimator)."""
    plan = settings.plan
    names = ["response_mask", "responses"]
    names += [SIGNAL_FIELDS[s] for s in sorted(plan.signals) if s in SIGNAL_FIELDS]
    if "token_entropy" in plan.signals:
        names.append("entropy")
    if not critic:
        names.append("advantages")
    if reads_rewards(settings, critic):
        names += REWARD_FIELDS
    if settings.measures:
        names.append(SCORES_FIELD)
    if plan.reads_token_rewards:
        names.append(EXTRA_FIELD)
    return names


def _engine_field(fields: TensorDict, field: str) -> torch.Tensor:
    """The engine's output ``field`` (nested), ``CreditError`` naming the plugin without it."""
    if field not in fields:
        raise CreditError(
            f"algorithm.credit: the actor engine gave no {field}; is the plugin "
            "backends.verl.plugin loaded in the worker processes (its verl.plugins "
            "entry point, or VERL_USE_EXTERNAL_MODULES=backends.verl.plugin)?"
        )
    value: torch.Tensor = fields[field]
    return value


def padded_inputs(
    settings: CreditSettings, fields: TensorDict, critic: bool = False
) -> PaddedInputs:
    """``PaddedInputs`` of ``settings`` from the nested TransferQueue ``fields`` (the
    ``fields_read``): each engine signal's field and the direction model's scores (the
    engine's prompt + response layout) cut to the response, verl's ``entropy`` as it is
    (response layout)."""
    plan = settings.plan
    response_mask = fields["response_mask"]
    found = {}
    for signal in sorted(plan.signals):
        if signal in SIGNAL_FIELDS:
            engine = _engine_field(fields, SIGNAL_FIELDS[signal])
            found[signal] = response_from_nested(engine, response_mask)
    if "token_entropy" in plan.signals:
        found["token_entropy"] = fields["entropy"]
    kept = {n: fields[n] for n in ("advantages", "rm_scores") if n in fields}
    if settings.measures:
        kept[SCORES_FIELD] = response_from_nested(
            _engine_field(fields, SCORES_FIELD), response_mask
        )
    padded = TensorDict(
        {"response_mask": response_mask, "responses": fields["responses"], **kept, **found},
        batch_size=fields.batch_size,
    ).to_padded_tensor()
    context = None
    if reads_rewards(settings, critic):
        context = reward_groups(padded["rm_scores"], fields["uid"])
    # one score per response, at its last token (0 elsewhere): the sum is that score exactly
    scores = padded[SCORES_FIELD].float().sum(dim=-1) if settings.measures else None
    mask = padded["response_mask"].bool()
    token_rewards = None
    if plan.reads_token_rewards:
        assert context is not None  # reads_rewards: read with the token rewards
        token_rewards = given_token_rewards(fields[EXTRA_FIELD], mask, context.rewards)
    signals = CreditSignals(
        **{name: padded[name].float() for name in found}, token_rewards=token_rewards
    )
    return PaddedInputs(padded, mask, signals, context, scores)


def step_metrics(step: CreditStep) -> dict[str, float]:
    """The step's ``credit/...`` metrics: the strategy's diagnostics and, for a strategy
    that reads a direction model, its agreement with the reward (``AgreementMetrics``)."""
    metrics = step.result.diagnostics.to_dict(prefix="credit/")
    if step.agreement is not None:
        metrics.update(step.agreement.to_dict(prefix="credit/"))
    return metrics


def grpo_advantages(scores: torch.Tensor, mask: torch.Tensor, uid: object) -> torch.Tensor:
    """verl's own GRPO advantages (B, T) (``compute_grpo_outcome_advantage``, normalized by
    the group's std) of the padded token-level ``scores`` within the groups of ``uid``."""
    index: Any = np.array([str(u) for u in uid.tolist()], dtype=object)  # type: ignore[attr-defined]
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=scores, response_mask=mask.float(), index=index
    )
    out: torch.Tensor = advantages
    return out


def credit_fields(
    settings: CreditSettings, fields: TensorDict, critic: bool = False
) -> tuple[torch.Tensor, dict[str, float]]:
    """The step's credit from the TransferQueue ``fields`` (``fields_read(settings,
    critic)``), nested like ``response_mask`` (B, j), and the step's metrics
    (``step_metrics``): one ``CreditRun.apply`` (the one call of ``assign_credit`` in this
    backend; a training step's, so the gate's EMA, if any, advances).

    - GRPO (``critic`` False; a batch after verl's ``_compute_advantage``): the token
      advantages of verl's response advantages, which replace verl's ``advantages``.
    - The critic estimator (``critic``; a batch before it): D, ``critic_reward_shift`` of
      the credit of GRPO's advantages of verl's scores (``rm_scores``) within the prompts'
      groups (``uid``), to add to verl's token rewards; 0 at rows without a valid token
      (their token advantages are 0, so their weights are 1)."""
    inputs = padded_inputs(settings, fields, critic)
    mask, context = inputs.mask, inputs.context
    if critic:
        advantages = grpo_advantages(inputs.fields["rm_scores"], mask, fields["uid"])
    else:
        advantages = inputs.fields["advantages"]
    A = response_advantages(advantages, mask)
    step = settings.run.apply(
        A,
        mask,
        inputs.fields["responses"].long(),
        inputs.signals,
        rewards=None if context is None else context.rewards,
        groups=None if context is None else context.groups,
        direction_scores=inputs.scores,
    )
    if critic:
        values = _critic_shift(settings, step, A, mask, context)
    else:
        values = step.result.token_advantages
    return response_to_nested(values, fields["response_mask"]), step_metrics(step)


def _critic_shift(
    settings: CreditSettings,
    step: CreditStep,
    A: torch.Tensor,
    mask: torch.Tensor,
    context: RewardGroups | None,
) -> torch.Tensor:
    """D (B, T) float32 of the step's credit (``critic_reward_shift`` in the strategy's
    ``critic_reward_form``) formed on GRPO's response advantages ``A`` (B,) and the rewards
    and groups ``context``."""
    assert context is not None  # padded_inputs reads them under a critic
    plan = settings.plan
    form = plan.strategy.critic_reward_form
    if form is None:  # credit_settings refuses such a strategy under a critic estimator
        raise CreditError(f"algorithm.credit: {plan.name!r} has no critic_reward_form")
    return critic_reward_shift(
        step.result,
        A,
        context.rewards,
        context.groups,
        mask,
        form,
        name=f"algorithm.credit: {plan.name}",
    )


#: The file of the run's credit state (the gate's EMA) in verl's checkpoint of a step
#: (``global_step_<n>``), written only where there is state.
CREDIT_STATE_FILE = "credit.pt"


def save_credit_state(run: CreditRun, folder: str) -> None:
    """Write ``run.state_dict()`` to ``folder``/``CREDIT_STATE_FILE`` where the run has
    state (a gate); nothing otherwise."""
    state = run.state_dict()
    if state:
        os.makedirs(folder, exist_ok=True)
        torch.save(state, os.path.join(folder, CREDIT_STATE_FILE))


def load_credit_state(run: CreditRun, folder: str) -> None:
    """Restore the run's state from verl's checkpoint ``folder`` (no file: no state);
    ``CreditError`` naming the file when it does not match the run (a gate resumed from a
    checkpoint without one, or the other way round)."""
    path = os.path.join(folder, CREDIT_STATE_FILE)
    state = torch.load(path, weights_only=True) if os.path.exists(path) else {}
    try:
        run.load_state_dict(state)
    except CreditError as err:
        raise CreditError(f"{path}: {err}") from err
