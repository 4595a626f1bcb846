"""verl's GRPO advantages -> token advantages, against verl's own code.

- ``credit: uniform`` gives back verl's GRPO advantages bit for bit, padded and in the
  nested TransferQueue layout;
- DATC's token advantages from the engine-layout W0 equal ``credit_core.assign_credit`` on
  the response-aligned W0 (the one-token shift of verl's ``response_from_nested``);
- ABC's and RED's (mean and paper forms) from the engine-layout attention and prefix rewards,
  and KTAE's, equal ``assign_credit`` on the response-aligned signal with verl's scores
  summed as the rewards and its uids as the groups;
- they reach verl's ``ppo_loss`` unchanged: its gradient with respect to each token's
  log-prob is -A_t / N (token-mean, ratio 1 at the old policy);
- for a strategy that reads a direction model, the step's metrics carry its within-group
  agreement with verl's reward (``credit/direction_agreement``, from the scores the engine
  ships at each response's last token), and the diagnostics beside it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.utils.losses import ppo_loss

from backends.common.config_values import CreditSection
from backends.common.credit import CreditRun
from backends.verl.config import BACKEND, SCORES_FIELD, SIGNAL_FIELDS, CreditSettings
from backends.verl.credit import EXTRA_FIELD, credit_fields, response_advantages
from backends.verl.engine import WORK_FIELD
from credit_core import (
    CreditConfig,
    CreditError,
    CreditSignals,
    TokenRewards,
    assign_credit,
    get_strategy,
)
from credit_core.agreement_gate import GateConfig, direction_agreement, gate_token_advantages
from tests.backends.verl.layouts import as_stored, nested, v1_batch, verl_grpo
from tests.backends.verl.test_config import verl_config

PROMPTS = [3, 5, 4, 2, 6, 3, 4, 5]
RESPONSES = [6, 1, 4, 7, 3, 7, 5, 2]
GROUP = 4
VOCAB = 50


@pytest.fixture
def batch() -> TensorDict:
    return v1_batch(PROMPTS, RESPONSES, VOCAB)


@pytest.fixture
def grpo() -> torch.Tensor:
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 1.0, 0.25])
    return verl_grpo(scores, RESPONSES, GROUP)


def settings_of(credit: str | dict[str, object]) -> CreditSettings:
    """The verl backend's ``CreditSettings`` of ``credit`` (its one ``CreditRun``)."""
    config = CreditConfig.parse(credit)
    return CreditSettings(CreditSection(config), CreditRun.build(config, BACKEND))


def padded_mask() -> torch.Tensor:
    T = max(RESPONSES)
    return torch.arange(T).unsqueeze(0) < torch.tensor(RESPONSES).unsqueeze(1)


def test_uniform_is_verl_grpo_bit_for_bit(batch: TensorDict, grpo: torch.Tensor) -> None:
    fields = batch.select("responses", "response_mask")
    fields["advantages"] = as_stored(grpo, batch)
    stored, metrics = credit_fields(settings_of("uniform"), fields)
    assert stored.dtype == grpo.dtype and torch.equal(stored.to_padded_tensor(0.0), grpo)
    assert torch.equal(stored.values(), fields["advantages"].values())
    assert torch.equal(stored.offsets(), fields["advantages"].offsets())
    assert "credit/direction_agreement" not in metrics  # reads no direction model


def test_response_advantage_is_read_back_exactly(grpo: torch.Tensor) -> None:
    A = response_advantages(grpo, padded_mask())
    assert torch.equal(A.unsqueeze(1) * padded_mask(), grpo)


def test_token_level_advantages_are_refused(grpo: torch.Tensor) -> None:
    varied = grpo.clone()
    varied[0, 1] += 1.0
    with pytest.raises(CreditError, match=r"algorithm\.adv_estimator"):
        response_advantages(varied, padded_mask())


def engine_layout_work(batch: TensorDict, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A random W0 in the engine's layout (nested like input_ids, the value at j about token
    j + 1, 0 at prompt positions) and the same values response-aligned, padded (B, T)."""
    g = torch.Generator().manual_seed(seed)
    rows, aligned = [], torch.zeros(len(RESPONSES), max(RESPONSES))
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        w = torch.zeros(p + r)
        w[p - 1 : p + r - 1] = torch.rand(r, generator=g) * 2 - 0.5
        rows.append(w)
        aligned[i, :r] = w[p - 1 : p + r - 1]
    return nested(rows), aligned


#: The direction model's own score of each response (the engine's ``SCORES_FIELD``).
DIRECTION_SCORES = [0.3, -0.2, 0.9, 0.1, 0.5, 0.5, -1.0, 0.2]


def engine_layout_scores() -> torch.Tensor:
    """``DIRECTION_SCORES`` as the engine ships them: nested like ``input_ids``, each at the
    position that predicts its response's last token, 0 elsewhere."""
    rows = []
    for score, p, r in zip(DIRECTION_SCORES, PROMPTS, RESPONSES, strict=True):
        row = torch.zeros(p + r)
        row[p + r - 2] = score
        rows.append(row)
    return nested(rows)


def measured_fields(batch: TensorDict, grpo: torch.Tensor) -> TensorDict:
    """verl's advantages, rewards and uids, and the engine's direction-model scores."""
    fields = batch.select("responses", "response_mask")
    fields["advantages"] = as_stored(grpo, batch)
    fields.update(reward_fields(batch))
    fields[SCORES_FIELD] = engine_layout_scores()
    return fields


def datc_fields(batch: TensorDict, grpo: torch.Tensor) -> tuple[TensorDict, torch.Tensor]:
    fields = measured_fields(batch, grpo)
    work, aligned = engine_layout_work(batch)
    fields[WORK_FIELD] = work
    return fields, aligned


def test_datc_from_engine_layout_equals_assign_credit_and_logs_the_agreement(
    batch: TensorDict, grpo: torch.Tensor
) -> None:
    fields, aligned = datc_fields(batch, grpo)
    settings = settings_of({"name": "datc", "beta": 1.0})
    stored, metrics = credit_fields(settings, fields)
    mask = padded_mask()
    expected = assign_credit(
        get_strategy(CreditConfig.parse({"name": "datc", "beta": 1.0})),
        response_advantages(grpo, mask),
        mask,
        batch["responses"].to_padded_tensor(0).long(),
        CreditSignals(unsigned_work=aligned),
    )
    assert metrics["credit/weight_max"] > 1.0
    assert torch.equal(stored.to_padded_tensor(0.0), expected.token_advantages)
    assert not torch.allclose(stored.to_padded_tensor(0.0), grpo)  # not uniform
    groups = torch.tensor([i // GROUP for i in range(len(RESPONSES))])
    want = direction_agreement(torch.tensor(DIRECTION_SCORES), torch.tensor(SCORES), groups)
    assert metrics["credit/direction_is_reward"] == 0.0
    assert metrics["credit/direction_agreement"] == want.value and want.value != 0.0
    assert metrics["credit/agreement_groups"] == want.groups == 2


SCORES = [1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 1.0, 0.25]


def reward_fields(batch: TensorDict) -> TensorDict:
    """verl's stored ``rm_scores`` (each response's score at its last token, nested) and
    ``uid`` (one string per prompt, GROUP samples each)."""
    rows = []
    for score, r in zip(SCORES, RESPONSES, strict=True):
        row = torch.zeros(r)
        row[r - 1] = score
        rows.append(row)
    fields = TensorDict({"rm_scores": nested(rows)}, batch_size=len(RESPONSES))
    fields["uid"] = torch.tensor([i // GROUP for i in range(len(RESPONSES))])
    return fields


@pytest.mark.parametrize(
    ("credit", "signal"),
    [
        ({"name": "abc", "beta": 0.5}, "reward_attention"),
        ({"name": "abc", "beta": 0.5, "mode": "paper"}, "reward_attention"),
        ({"name": "red"}, "prefix_rewards"),
        ({"name": "red", "mode": "paper"}, "prefix_rewards"),
        ({"name": "ktae"}, None),
        ({"name": "p2t"}, "reward_attribution"),
        ({"name": "p2t", "mode": "paper", "null": "zero"}, "reward_attribution"),
    ],
    ids=["abc", "abc_paper", "red", "red_paper", "ktae", "p2t", "p2t_paper"],
)
def test_abc_red_ktae_and_p2t_equal_assign_credit_with_verls_rewards_and_groups(
    batch: TensorDict, grpo: torch.Tensor, credit: dict[str, object], signal: str | None
) -> None:
    strategy = get_strategy(CreditConfig.parse(credit))
    settings = settings_of(credit)
    fields = measured_fields(batch, grpo)
    signals = CreditSignals()
    if signal is not None:
        values, aligned = engine_layout_work(batch, seed=3)
        if signal == "reward_attention":  # alpha >= 0, sum 1 over each response
            aligned = aligned.abs() / aligned.abs().sum(dim=1, keepdim=True)
            values = nested(
                [
                    torch.cat([torch.zeros(p - 1), aligned[i, :r], torch.zeros(1)])
                    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True))
                ]
            )
        fields[SIGNAL_FIELDS[signal]] = values
        signals = CreditSignals(**{signal: aligned})
    stored, metrics = credit_fields(settings, fields)
    mask = padded_mask()
    expected = assign_credit(
        strategy,
        response_advantages(grpo, mask),
        mask,
        batch["responses"].to_padded_tensor(0).long(),
        signals,
        rewards=torch.tensor(SCORES),
        groups=torch.tensor([i // GROUP for i in range(len(RESPONSES))]),
    )
    got = stored.to_padded_tensor(0.0)
    assert torch.equal(got, expected.token_advantages)
    assert not torch.allclose(got, grpo)  # not uniform
    # the direction model's agreement where the strategy reads one (abc, red, p2t; not ktae)
    assert ("credit/direction_agreement" in metrics) == (signal is not None)


def test_a_gate_mixes_each_steps_credit_by_the_ema_after_that_step(
    batch: TensorDict, grpo: torch.Tensor
) -> None:
    """With ``gate`` each ``credit_fields`` (one per training step) folds the step's
    agreement into the EMA once and mixes DATC's token advantages toward GRPO by the alpha
    after it (``gate_token_advantages``); a second step with the scores reversed moves the
    EMA as a reference gate does."""
    gate = GateConfig(agreement=(-0.5, 0.5), decay=0.9)
    settings = settings_of({"name": "datc", "gate": gate.model_dump()})
    reference = gate.build()
    mask, groups = padded_mask(), torch.tensor([i // GROUP for i in range(len(RESPONSES))])
    A = response_advantages(grpo, mask)
    for sign in (1.0, -1.0):
        fields, aligned = datc_fields(batch, grpo)
        fields[SCORES_FIELD] = engine_layout_scores() * sign
        stored, metrics = credit_fields(settings, fields)
        agreement = direction_agreement(
            torch.tensor(DIRECTION_SCORES) * sign, torch.tensor(SCORES), groups
        )
        alpha = reference.update(agreement)
        plain = assign_credit(
            get_strategy("datc"),
            A,
            mask,
            batch["responses"].to_padded_tensor(0).long(),
            CreditSignals(unsigned_work=aligned),
        )
        want = gate_token_advantages(plain.token_advantages, A, mask, alpha)
        assert 0.0 < alpha < 1.0 and metrics["credit/gate_alpha"] == alpha
        assert metrics["credit/direction_agreement_ema"] == reference.ema
        assert torch.equal(stored.to_padded_tensor(0.0), want)
    assert settings.run.state_dict() == {"gate": reference.state_dict()}


def test_a_row_without_a_valid_token_gets_no_credit_and_no_shift(
    batch: TensorDict, grpo: torch.Tensor
) -> None:
    """A response whose mask is all 0 (``assign_credit`` runs on the other rows): 0 token
    advantages under GRPO, D = 0 under the critic, the other rows' credit as
    ``assign_credit``'s on them."""
    fields, aligned = datc_fields(batch, grpo)
    rows = [torch.ones(r, dtype=torch.long) for r in RESPONSES]
    rows[1] = torch.zeros(RESPONSES[1], dtype=torch.long)
    fields["response_mask"] = nested(rows)
    mask = padded_mask()
    mask[1] = False
    stored, _ = credit_fields(settings_of("datc"), fields)
    expected = assign_credit(
        get_strategy("datc"),
        response_advantages(grpo * mask, mask),
        mask,
        batch["responses"].to_padded_tensor(0).long(),
        CreditSignals(unsigned_work=aligned),
    )
    assert torch.equal(stored.to_padded_tensor(0.0), expected.token_advantages)
    shift, _ = credit_fields(settings_of("datc"), fields, critic=True)
    padded = shift.to_padded_tensor(0.0)
    assert torch.equal(padded[1], torch.zeros_like(padded[1])) and bool(padded.any())


def test_missing_engine_field_names_the_plugin(batch: TensorDict, grpo: torch.Tensor) -> None:
    fields = batch.select("responses", "response_mask")
    fields["advantages"] = as_stored(grpo, batch)
    with pytest.raises(CreditError, match=f"gave no {WORK_FIELD}.*backends.verl.plugin"):
        credit_fields(settings_of("datc"), fields)


def actor_config():
    """verl's own actor config (``FSDPActorConfig``) from the composed Hydra config."""
    from omegaconf import open_dict
    from verl.utils.config import omega_conf_to_dataclass

    actor = verl_config("algorithm.adv_estimator=grpo").actor_rollout_ref.actor
    with open_dict(actor):
        actor.ppo_micro_batch_size_per_gpu = len(PROMPTS)
        actor.ppo_mini_batch_size = len(PROMPTS)
    return omega_conf_to_dataclass(actor)


def test_datc_token_advantages_reach_ppo_loss(batch: TensorDict, grpo: torch.Tensor) -> None:
    fields, _ = datc_fields(batch, grpo)
    token_adv, _ = credit_fields(settings_of("datc"), fields)
    g = torch.Generator().manual_seed(2)
    log_probs = [-torch.rand(p + r, generator=g) for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    old = [lp[p - 1 : p + r - 1] for lp, p, r in zip(log_probs, PROMPTS, RESPONSES, strict=True)]
    leaf = nested(log_probs).values().clone().requires_grad_(True)
    model_output = {
        "log_probs": torch.nested.nested_tensor_from_jagged(leaf, batch["input_ids"].offsets())
    }
    data = batch.clone()
    data["old_log_probs"] = nested(old)
    data["advantages"] = token_adv
    n_tokens = sum(RESPONSES)
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=n_tokens, global_batch_size=len(PROMPTS))
    loss, _ = ppo_loss(actor_config(), model_output, data)
    (grad,) = torch.autograd.grad(loss, leaf)
    expected = torch.zeros_like(leaf)
    start = 0
    for row, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        expected[start + p - 1 : start + p + r - 1] = -token_adv[row] / n_tokens
        start += p + r
    torch.testing.assert_close(grad, expected)


def test_uniforms_shift_under_a_critic_is_exactly_zero(batch: TensorDict) -> None:
    """``uniform`` under GAE adds D = 0 exactly: verl's token rewards stay its own."""
    fields = batch.select("responses", "response_mask")
    fields.update(reward_fields(batch))
    shift, _ = credit_fields(settings_of("uniform"), fields, critic=True)
    assert torch.equal(shift.values(), torch.zeros_like(shift.values()))
    assert torch.equal(shift.offsets(), batch["response_mask"].offsets())


def with_reward_infos(fields: TensorDict, infos: list[dict[str, object]]) -> TensorDict:
    """``fields`` with each sample's reward extra info in verl's ``extra_fields`` (as its
    agent loop stores them: ``list_of_dict_to_tensordict`` of the samples' dicts)."""
    rows = [{EXTRA_FIELD: {"reward_extra_info": info}} for info in infos]
    fields[EXTRA_FIELD] = tu.list_of_dict_to_tensordict(rows)[EXTRA_FIELD]
    return fields


def step_infos() -> list[dict[str, object]]:
    """A compute_score's dicts: per-token rewards for the first group, per-step spans for
    the second, one sample (row 6) with no token rewards (its outcome only)."""
    infos: list[dict[str, object]] = []
    for i, (score, r) in enumerate(zip(SCORES, RESPONSES, strict=True)):
        info: dict[str, object] = {"score": score}
        if i < GROUP:
            info["token_rewards"] = [0.1 * ((i + k) % 3) for k in range(r)]
        elif i != 6:
            info["step_rewards"] = [(0, (r + 1) // 2, float(i % 2)), ((r + 1) // 2, r, 0.5)][
                : 1 if r == 1 else 2
            ]
        infos.append(info)
    return infos


def test_process_reads_the_reward_extra_infos_token_and_step_rewards(
    batch: TensorDict, grpo: torch.Tensor
) -> None:
    """``process`` gets the compute_score's token and step rewards as ``TokenRewards``
    (``from_dense`` / ``from_spans`` on the response mask) with verl's scores and uids;
    under the critic D puts them in place of the outcome at the last token."""
    fields = batch.select("responses", "response_mask")
    fields["advantages"] = as_stored(grpo, batch)
    fields.update(reward_fields(batch))
    infos = step_infos()
    fields = with_reward_infos(fields, infos)
    settings = settings_of({"name": "process", "outcome_weight": 0.5})
    stored, metrics = credit_fields(settings, fields)
    mask = padded_mask()
    dense = TokenRewards.from_dense([info["token_rewards"] for info in infos[:GROUP]], mask[:GROUP])
    spans = [info.get("step_rewards", []) for info in infos[GROUP:]]
    given = TokenRewards.cat([dense, TokenRewards.from_spans(spans, mask[GROUP:])])
    expected = assign_credit(
        settings.plan.strategy,
        response_advantages(grpo, mask),
        mask,
        batch["responses"].to_padded_tensor(0).long(),
        CreditSignals(token_rewards=given),
        rewards=torch.tensor(SCORES),
        groups=torch.tensor([i // GROUP for i in range(len(RESPONSES))]),
    )
    assert torch.equal(stored.to_padded_tensor(0.0), expected.token_advantages)
    assert metrics["credit/weight_max"] > 1.0
    shift, _ = credit_fields(settings_of("process"), fields, critic=True)
    last = torch.zeros(mask.shape)
    last[torch.arange(len(RESPONSES)), torch.tensor(RESPONSES) - 1] = torch.tensor(SCORES)
    assert torch.equal(shift.to_padded_tensor(0.0), (given.values - last).float())


@pytest.mark.parametrize(
    ("row", "info", "error"),
    [
        (1, {"token_rewards": [0.5, 0.5]}, r"response 1: token_rewards: expected one reward per "),
        (5, {"step_rewards": [(0, 2, float("nan"))]}, r"response 5: step_rewards\[0\]: reward: "),
        (3, {"step_rewards": [(0, 9, 1.0)]}, r"response 3: step_rewards\[0\]: expected integer"),
        (2, {"token_rewards": 1.0}, r"response 2: token_rewards: expected a list, got float"),
    ],
    ids=["length", "nan", "span", "not_a_list"],
)
def test_a_bad_token_reward_is_one_error_naming_the_sample(
    batch: TensorDict, grpo: torch.Tensor, row: int, info: dict[str, object], error: str
) -> None:
    fields = batch.select("responses", "response_mask")
    fields["advantages"] = as_stored(grpo, batch)
    fields.update(reward_fields(batch))
    infos = step_infos()
    infos[row] = {"score": SCORES[row], **info}
    with pytest.raises(CreditError, match=r"the reward function's reward_extra_info: " + error):
        credit_fields(settings_of("process"), with_reward_infos(fields, infos))


def test_process_without_token_rewards_says_what_to_return(
    batch: TensorDict, grpo: torch.Tensor
) -> None:
    fields = batch.select("responses", "response_mask")
    fields["advantages"] = as_stored(grpo, batch)
    fields.update(reward_fields(batch))
    fields = with_reward_infos(fields, [{"score": s} for s in SCORES])
    with pytest.raises(CreditError, match=r"no response has 'token_rewards' or 'step_rewards'"):
        credit_fields(settings_of("process"), fields)
