"""``CreditFSDPEngine`` on verl's real FSDP2 engine, on the CPU (test-only CPU platform).

- W0 from the old-log-prob forward equals ``credit_core.unsigned_work_from_logits`` of a plain
  Hugging Face forward of the same weights and a separately built direction model's gradient;
  for ``datc_mid``/``datc_ig`` (the gradient on the path to m1), ``token_work`` of that
  forward's ``PolicyStats`` and ``path_reward_grad``;
- the direction model's attention (``abc``) and prefix rewards (``red``) shipped from the same
  forward's request equal the direction model's own ``score`` on the same rows, and P2T's
  attribution equals ``DirectionModel.attribution`` of its gradient there, at the cost of
  DATC's reward passes (one direction-model forward + backward per micro-batch);
- with or without the work request (``datc``, ``datc_mid``, ``abc``, ``red`` or ``p2t``), the engine
  runs exactly as many policy forwards as verl's own engine (one per micro-batch) and gives
  verl's own log-probs bit for bit;
- verl's ``EngineRegistry`` picks the subclass for fsdp/fsdp2 on NVIDIA GPUs;
- with ``scores`` in the request, the direction model's score of each response is shipped
  beside the signal, equal to its own ``score``, from the same pass (no extra
  direction-model pass, except one no-grad forward on the path);
- the actor side of a step runs: old-log-prob forward with W0, DATC token advantages and the
  direction model's agreement with the reward, verl's ``train_batch`` with its ``ppo_loss``.
"""

from __future__ import annotations

import json
import math
import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

import torch
from tensordict import TensorDict
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.utils import tensordict_utils as tu
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import response_from_nested

from adapters.config import build_direction_model
from adapters.grad_path import path_alphas, path_reward_grad
from backends.common.config_values import CreditSection
from backends.common.credit import CreditRun
from backends.verl.config import BACKEND, SCORES_FIELD, SIGNAL_FIELDS, CreditSettings
from backends.verl.credit import credit_fields
from backends.verl.engine import WORK_FIELD, CreditFSDPEngine
from credit_core import (
    CreditConfig,
    CreditError,
    policy_stats_from_logits,
    token_work,
    unsigned_work_from_logits,
)
from credit_core.agreement_gate import direction_agreement
from tests.backends.verl.engines import (
    MICRO_BATCH,
    PROMPTS,
    RESPONSES,
    TEMPERATURE,
    build_engine,
    infer,
    old_log_prob_batch,
    work_request,
)
from tests.backends.verl.layouts import as_stored, v1_batch, verl_grpo
from tests.backends.verl.test_credit import actor_config


@pytest.fixture(scope="module", params=[True, False], ids=["packed", "padded"])
def engines(models: tuple[Path, Path], process_group: None, request: Any) -> tuple[Any, Any]:
    """The credit engine and verl's own, on the same weights, in one layout."""
    policy, _ = models
    packed = bool(request.param)
    return (
        build_engine(CreditFSDPEngine, policy, packed),
        build_engine(FSDPEngineWithLMHead, policy, packed),
    )


def independent_work(policy: Path, rm: Path, batch: TensorDict, points: int) -> torch.Tensor:
    """W0 (B, R) by credit_core from a plain Hugging Face forward and a separately built
    direction model, on the same token ids (right-padded rows); with ``points`` >= 1, g on
    the path to that forward's m1 (``path_reward_grad``) and W0 from ``PolicyStats``."""
    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, attn_implementation="sdpa").eval()
    B, P, R = len(PROMPTS), max(PROMPTS), max(RESPONSES)
    ids = batch["input_ids"].to_padded_tensor(0)
    attention = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        attention[i, : p + r] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits
    V = logits.shape[-1]
    predicting = torch.zeros(B, R, V)
    prompt_ids = torch.zeros(B, P, dtype=torch.long)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        predicting[i, :r] = logits[i, p - 1 : p + r - 1]
        prompt_ids[i, P - p :] = ids[i, :p]
        prompt_mask[i, P - p :] = 1
    responses = batch["responses"].to_padded_tensor(0)
    response_mask = batch["response_mask"].to_padded_tensor(0)
    direction = build_direction_model(
        {"kind": "seq_classification", "path": str(rm)}, tokenizer, policy_vocab_size=V
    )
    if points:
        E = direction.reward_embedding
        stats = policy_stats_from_logits(
            predicting, responses, E, temperature=TEMPERATURE, chunk_size=64
        )
        rollout = (prompt_ids, prompt_mask, responses, response_mask)
        path = path_reward_grad(direction, *rollout, stats.m1, path_alphas(points))
        path = torch.where(response_mask.bool().unsqueeze(2), path, 0.0)
        return token_work(stats, path.detach(), None)
    g = direction.score(prompt_ids, prompt_mask, responses, response_mask, with_grad=True)
    assert g.reward_grad is not None
    return unsigned_work_from_logits(
        predicting,
        responses,
        direction.reward_embedding,
        g.reward_grad.detach(),
        temperature=TEMPERATURE,
        chunk_size=64,
    )


@pytest.mark.parametrize("points", [0, 1, 2], ids=["datc", "datc_mid", "datc_ig2"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed_bsz", "dynamic_bsz"])
def test_w0_from_the_old_log_prob_forward_equals_credit_core(
    models: tuple[Path, Path], engines: tuple[Any, Any], dynamic: bool, points: int
) -> None:
    """Also for the path strategies: their m1 comes from this same forward's logits."""
    policy, rm = models
    credit, _ = engines
    batch = old_log_prob_batch(credit, work_request(rm, points, scores=True), dynamic)
    output, _ = infer(credit, batch)
    # the direction model's scores: of W0's gradient pass, or on the path one forward more
    torch.testing.assert_close(
        shipped_scores(output, batch), direct_score(policy, rm, batch).rewards, rtol=1e-4, atol=1e-5
    )
    work = response_from_nested(output[WORK_FIELD], batch["response_mask"]).to_padded_tensor(0.0)
    expected = independent_work(policy, rm, batch, points)
    mask = batch["response_mask"].to_padded_tensor(0).bool()
    scale = float(expected[mask].abs().max())
    assert scale > 0
    torch.testing.assert_close(work[mask], expected[mask], rtol=1e-4, atol=1e-4 * scale)
    assert torch.equal(work[~mask], torch.zeros_like(work[~mask]))


def direct_score(policy: Path, rm: Path, batch: TensorDict, signal: str | None = None) -> Any:
    """A separately built direction model's own ``score`` (no gradient; with ``signal``'s
    attention or prefix rewards) on the batch's prompt (left-padded) and response
    (right-padded) token ids."""
    tokenizer = AutoTokenizer.from_pretrained(policy)
    B, P = len(PROMPTS), max(PROMPTS)
    ids = batch["input_ids"].to_padded_tensor(0)
    prompt_ids = torch.zeros(B, P, dtype=torch.long)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        prompt_ids[i, P - p :] = ids[i, :p]
        prompt_mask[i, P - p :] = 1
    responses = batch["responses"].to_padded_tensor(0)
    response_mask = batch["response_mask"].to_padded_tensor(0)
    direction = build_direction_model({"kind": "seq_classification", "path": str(rm)}, tokenizer)
    return direction.score(
        prompt_ids,
        prompt_mask,
        responses,
        response_mask,
        with_grad=False,
        with_attention=signal == "reward_attention",
        with_prefix_rewards=signal == "prefix_rewards",
    )


def direct_signal(policy: Path, rm: Path, batch: TensorDict, signal: str) -> torch.Tensor:
    """The attention or prefix rewards (B, R) of ``direct_score``."""
    out = direct_score(policy, rm, batch, signal)
    found = out.attention if signal == "reward_attention" else out.prefix_rewards
    assert found is not None
    return found


def shipped_scores(output: dict[str, Any], batch: TensorDict) -> torch.Tensor:
    """The direction model's score of each response (B,) as the engine ships it (at the
    position that predicts the response's last token, 0 elsewhere), read as the trainer
    reads it; the shipped values are checked to be 0 at every other position."""
    nested_scores = response_from_nested(output[SCORES_FIELD], batch["response_mask"])
    padded = nested_scores.to_padded_tensor(0.0)
    last = torch.tensor(RESPONSES) - 1
    rows = torch.arange(len(RESPONSES))
    assert int((padded != 0).sum()) <= len(RESPONSES) and torch.equal(
        padded.sum(dim=-1), padded[rows, last]
    )
    assert int((output[SCORES_FIELD].values() != 0).sum()) == int((padded != 0).sum())
    return padded[rows, last]


@pytest.mark.parametrize("signal", ["reward_attention", "prefix_rewards"], ids=["abc", "red"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed_bsz", "dynamic_bsz"])
def test_attention_and_prefix_rewards_equal_the_direction_models_own(
    models: tuple[Path, Path], engines: tuple[Any, Any], dynamic: bool, signal: str
) -> None:
    """ABC's and RED's signal from the old-log-prob forward's request, cut to the response
    by verl's ``response_from_nested``, is the direction model's own on the same rows (the
    micro-batches score subsets of the rows: the values are per row)."""
    policy, rm = models
    credit, _ = engines
    batch = old_log_prob_batch(credit, work_request(rm, signals=(signal,), scores=True), dynamic)
    output, _ = infer(credit, batch)
    assert set(output) & set(SIGNAL_FIELDS.values()) == {SIGNAL_FIELDS[signal]}
    torch.testing.assert_close(  # the scores of the same scoring pass
        shipped_scores(output, batch), direct_score(policy, rm, batch).rewards, rtol=1e-4, atol=1e-5
    )
    shipped = response_from_nested(output[SIGNAL_FIELDS[signal]], batch["response_mask"])
    got = shipped.to_padded_tensor(0.0)
    expected = direct_signal(policy, rm, batch, signal)
    mask = batch["response_mask"].to_padded_tensor(0).bool()
    assert float(expected[mask].abs().max()) > 0
    torch.testing.assert_close(got[mask], expected[mask], rtol=1e-4, atol=1e-5)
    assert torch.equal(got[~mask], torch.zeros_like(got[~mask]))
    if signal == "reward_attention":  # alpha sums to 1 over each response
        torch.testing.assert_close(got.sum(dim=1), torch.ones(len(PROMPTS)))


def direct_attribution(policy: Path, rm: Path, batch: TensorDict, null: str) -> torch.Tensor:
    """P2T's r_t (B, R): ``DirectionModel.attribution`` of a separately built direction
    model's own reward gradient on the batch's prompt (left-padded) and response
    (right-padded) token ids."""
    direction, responses, response_mask, g = direct_reward_grad(policy, rm, batch)
    return direction.attribution(g, responses, response_mask, null)


def direct_reward_grad(
    policy: Path, rm: Path, batch: TensorDict
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A separately built direction model, the batch's responses (B, R) and mask
    (right-padded), and the model's own reward gradient g (B, R, d) on the batch's prompt
    (left-padded) and response token ids."""
    tokenizer = AutoTokenizer.from_pretrained(policy)
    B, P = len(PROMPTS), max(PROMPTS)
    ids = batch["input_ids"].to_padded_tensor(0)
    prompt_ids = torch.zeros(B, P, dtype=torch.long)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        prompt_ids[i, P - p :] = ids[i, :p]
        prompt_mask[i, P - p :] = 1
    responses = batch["responses"].to_padded_tensor(0)
    response_mask = batch["response_mask"].to_padded_tensor(0)
    direction = build_direction_model({"kind": "seq_classification", "path": str(rm)}, tokenizer)
    out = direction.score(prompt_ids, prompt_mask, responses, response_mask, with_grad=True)
    assert out.reward_grad is not None
    return direction, responses, response_mask, out.reward_grad.detach()


def attribution_request(rm: Path, null: str) -> str:
    """The trainer's request for P2T's ``reward_attribution`` with ``null``."""
    request = json.loads(work_request(rm, signals=("reward_attribution",)))
    return json.dumps({**request, "null": null})


@pytest.mark.parametrize("null", ["pad", "unk", "zero"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed_bsz", "dynamic_bsz"])
def test_attribution_equals_the_direction_models_own(
    models: tuple[Path, Path], engines: tuple[Any, Any], dynamic: bool, null: str
) -> None:
    """P2T's r_t = (E'[y_t] - e_null) . g_t (docs/design.md, "Gradient x input attribution
    (P2T)") from the old-log-prob forward's request, cut to the response by verl's
    ``response_from_nested``, is ``DirectionModel.attribution`` of a separately built
    direction model's gradient on the same rows, with the request's null (the pad null, a
    non-zero table row, gives other values than the others; the tiny RM's unk row, id 0,
    is its zero padding_idx row)."""
    policy, rm = models
    credit, _ = engines
    batch = old_log_prob_batch(credit, attribution_request(rm, null), dynamic)
    output, _ = infer(credit, batch)
    field = SIGNAL_FIELDS["reward_attribution"]
    assert set(output) & set(SIGNAL_FIELDS.values()) == {field}
    got = response_from_nested(output[field], batch["response_mask"]).to_padded_tensor(0.0)
    expected = direct_attribution(policy, rm, batch, null)
    mask = batch["response_mask"].to_padded_tensor(0).bool()
    scale = float(expected[mask].abs().max())
    assert scale > 0
    torch.testing.assert_close(got[mask], expected[mask], rtol=1e-4, atol=1e-4 * scale)
    assert torch.equal(got[~mask], torch.zeros_like(got[~mask]))
    other = direct_attribution(policy, rm, batch, "zero" if null == "pad" else "pad")
    assert not torch.allclose(got[mask], other[mask], rtol=1e-4, atol=1e-4 * scale)


@pytest.fixture(scope="module")
def bf16_engine(models: tuple[Path, Path], process_group: None) -> Any:
    """The credit engine under verl's default mixed precision: bf16 parameters in the
    forward, under verl's bf16 autocast, which covers ``prepare_model_outputs``."""
    return build_engine(CreditFSDPEngine, models[0], packed=True, param_dtype="bf16")


@pytest.mark.parametrize("null", ["pad", "zero"])
def test_attribution_under_verls_bf16_autocast_is_computed_in_float32(
    models: tuple[Path, Path], bf16_engine: Any, null: str
) -> None:
    """P2T's r_t reads token ids and the float32 direction model's gradient only, so verl's
    bf16 mixed precision leaves it the float32 value of ``DirectionModel.attribution``, to
    the tolerance of the float32 engine (issue 44, finding 5: computed under verl's bf16
    autocast, its products were rounded to bf16, a relative error near 1e-2)."""
    policy, rm = models
    batch = old_log_prob_batch(bf16_engine, attribution_request(rm, null))
    output, _ = infer(bf16_engine, batch)
    field = SIGNAL_FIELDS["reward_attribution"]
    got = response_from_nested(output[field], batch["response_mask"]).to_padded_tensor(0.0)
    expected = direct_attribution(policy, rm, batch, null)
    mask = batch["response_mask"].to_padded_tensor(0).bool()
    scale = float(expected[mask].abs().max())
    assert got.dtype == torch.float32 and scale > 0
    torch.testing.assert_close(got[mask], expected[mask], rtol=1e-4, atol=1e-4 * scale)
    assert torch.equal(got[~mask], torch.zeros_like(got[~mask]))


def test_w0_under_verls_bf16_autocast_is_reduced_in_float32(
    models: tuple[Path, Path], bf16_engine: Any
) -> None:
    """Under verl's bf16 mixed precision W0 is ``credit_core.unsigned_work_from_logits`` of
    the logits that forward gave (bf16, recorded from the engine's module), read in float32,
    with the float32 direction model's gradient, to the float32 engine's tolerance (it held
    before the engine disabled autocast for its signals too: of the signals only P2T's
    attribution was rounded by verl's bf16 autocast)."""
    policy, rm = models
    batch = old_log_prob_batch(bf16_engine, work_request(rm))
    recorded: list[torch.Tensor] = []
    hook = bf16_engine.module.register_forward_hook(
        lambda _m, _i, out: recorded.append(out.logits.detach())
    )
    try:
        output, _ = infer(bf16_engine, batch)
    finally:
        hook.remove()
    work = response_from_nested(output[WORK_FIELD], batch["response_mask"]).to_padded_tensor(0.0)
    direction, responses, _, g = direct_reward_grad(policy, rm, batch)
    expected = torch.zeros_like(work)
    lengths = [p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        logits = recorded[i // MICRO_BATCH]  # packed: (1, tokens of the micro-batch, V)
        start = sum(lengths[i - i % MICRO_BATCH : i]) + p - 1
        span = logits[0, start : start + r].float().unsqueeze(0)
        assert logits.dtype == torch.bfloat16
        expected[i, :r] = unsigned_work_from_logits(
            span,
            responses[i, :r].unsqueeze(0),
            direction.reward_embedding,
            g[i, :r].unsqueeze(0),
            temperature=TEMPERATURE,
            chunk_size=64,
        )[0]
    mask = batch["response_mask"].to_padded_tensor(0).bool()
    scale = float(expected[mask].abs().max())
    assert scale > 0
    torch.testing.assert_close(work[mask], expected[mask], rtol=1e-4, atol=1e-4 * scale)


def reward_model_passes(engine: Any, request: str) -> tuple[int, int]:
    """The direction model's forwards and backwards (input-gradient passes) while the
    engine serves ``request`` (built first, so the hooks see its module)."""
    infer(engine, old_log_prob_batch(engine, request))  # builds the direction model
    assert engine._credit_direction is not None
    module = engine._credit_direction[1].modules[0]
    forwards: list[int] = []
    backwards: list[int] = []
    hooks = [
        module.register_forward_hook(lambda *_: forwards.append(1)),
        # the score head's output is a tensor (the model's is a ModelOutput, which backward
        # hooks do not see)
        module.score.register_full_backward_pre_hook(lambda *_: backwards.append(1)),
    ]
    try:
        infer(engine, old_log_prob_batch(engine, request))
    finally:
        for hook in hooks:
            hook.remove()
    return len(forwards), len(backwards)


def test_attribution_costs_the_reward_passes_of_datc_and_no_more(
    models: tuple[Path, Path], engines: tuple[Any, Any]
) -> None:
    """P2T reads the gradient DATC takes: per micro-batch one direction-model forward and
    one backward, as for W0 (and none without a request); the direction model's scores
    (its agreement with the reward) come from that same pass."""
    _, rm = models
    credit, _ = engines
    p2t = reward_model_passes(credit, attribution_request(rm, "pad"))
    datc = reward_model_passes(credit, work_request(rm))
    scored = reward_model_passes(credit, work_request(rm, scores=True))
    assert p2t == datc == scored == (len(PROMPTS) // MICRO_BATCH, len(PROMPTS) // MICRO_BATCH)


def test_a_null_the_direction_model_lacks_is_refused_naming_it(
    models: tuple[Path, Path], engines: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``null: unk`` with a reward model whose tokenizer has no unknown token (as most
    byte-level BPE tokenizers; the tiny one has one, so it is taken away here) stops the
    forward, naming the key and the null (the direction model is built in the engine)."""
    _, rm = models
    credit, _ = engines
    infer(credit, old_log_prob_batch(credit, attribution_request(rm, "unk")))  # it has one
    assert credit._credit_direction is not None
    monkeypatch.setattr(credit._credit_direction[1], "unk_id", None)
    with pytest.raises(CreditError, match=r"^algorithm.credit: reward_attribution: null: 'unk'"):
        infer(credit, old_log_prob_batch(credit, attribution_request(rm, "unk")))


REQUESTS = {
    "datc": ("unsigned_work", 0),
    "datc_mid": ("unsigned_work", 1),
    "abc": ("reward_attention", 0),
    "red": ("prefix_rewards", 0),
    "p2t": ("reward_attribution", 0),
}


@pytest.mark.parametrize("strategy", sorted(REQUESTS))
def test_forward_count_and_log_probs_equal_verl_own_engine(
    models: tuple[Path, Path], engines: tuple[Any, Any], strategy: str
) -> None:
    _, rm = models
    credit, stock = engines
    signal, points = REQUESTS[strategy]
    request = work_request(rm, points, signals=(signal,))
    if signal == "reward_attribution":
        request = attribution_request(rm, "pad")
    with_work, n_with = infer(credit, old_log_prob_batch(credit, request))
    without, n_without = infer(credit, old_log_prob_batch(credit, None))
    own, n_own = infer(stock, old_log_prob_batch(stock, None))
    assert n_with == n_without == n_own == len(PROMPTS) // MICRO_BATCH
    fields = set(SIGNAL_FIELDS.values())
    assert not fields & set(without) and not fields & set(own)
    assert set(with_work) - set(own) == {SIGNAL_FIELDS[signal]}
    for output in (with_work, without):
        for key in own:
            assert torch.equal(output[key].values(), own[key].values()), key


def test_registry_picks_the_credit_engine_on_nvidia() -> None:
    os.environ.update(VERL_ENGINE_DEVICE="cuda", VERL_ENGINE_VENDOR="nvidia")
    try:
        for backend in ("fsdp", "fsdp2"):
            assert EngineRegistry.get_engine_cls("language_model", backend) is CreditFSDPEngine
        os.environ["VERL_ENGINE_VENDOR"] = "other"
        assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is FSDPEngineWithLMHead
    finally:
        os.environ.pop("VERL_ENGINE_DEVICE")
        os.environ.pop("VERL_ENGINE_VENDOR")


def test_an_actor_step_with_datc_token_advantages(
    models: tuple[Path, Path], process_group: None
) -> None:
    """The actor side of a verl GRPO step on the real engine: the old-log-prob forward
    (with W0), verl's GRPO advantages spread by DATC, then verl's ``train_batch`` with its
    ``ppo_loss``: one forward per micro-batch, a finite non-zero gradient, new weights."""
    policy, rm = models
    engine = build_engine(CreditFSDPEngine, policy, packed=True)
    old = old_log_prob_batch(engine, work_request(rm, scores=True))
    output, _ = infer(engine, old)
    fields = old.select("responses", "response_mask")
    scores = torch.tensor([1.0, 0.0, 0.25, 0.75])
    fields["advantages"] = as_stored(verl_grpo(scores, RESPONSES, group=2), old)
    fields[WORK_FIELD] = output[WORK_FIELD]
    fields[SCORES_FIELD] = output[SCORES_FIELD]
    rm_scores = [torch.zeros(r) for r in RESPONSES]
    for row, r in enumerate(RESPONSES):
        rm_scores[row][r - 1] = scores[row]
    fields["rm_scores"] = torch.nested.as_nested_tensor(rm_scores, layout=torch.jagged)
    fields["uid"] = torch.tensor([0, 0, 1, 1])
    config = CreditConfig.parse("datc")
    advantages, metrics = credit_fields(
        CreditSettings(CreditSection(config), CreditRun.build(config, BACKEND)), fields
    )
    groups = torch.tensor([0, 0, 1, 1])
    want = direction_agreement(shipped_scores(output, old), scores, groups)
    assert metrics["credit/direction_agreement"] == want.value and want.groups == 2
    data = v1_batch(PROMPTS, RESPONSES, engine.model_config.hf_config.vocab_size)
    data["old_log_probs"] = response_from_nested(output["log_probs"], data["response_mask"])
    data["advantages"] = advantages
    tu.assign_non_tensor(
        data,
        temperature=TEMPERATURE,
        use_remove_padding=True,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=MICRO_BATCH,
        max_token_len_per_gpu=4096,
        use_fused_kernels=False,
        global_batch_size=len(PROMPTS),
    )
    before = [p.detach().clone() for p in engine.module.parameters()]
    calls = []
    hook = engine.module.register_forward_hook(lambda *_: calls.append(1))
    try:
        with engine.train_mode():
            out = engine.train_batch(data, loss_function=partial(ppo_loss, config=actor_config()))
    finally:
        hook.remove()
    grad_norm = float(out["metrics"]["grad_norm"])
    assert len(calls) == len(PROMPTS) // MICRO_BATCH
    assert math.isfinite(grad_norm) and grad_norm > 0
    assert any(
        not torch.equal(a, b.detach())
        for a, b in zip(before, engine.module.parameters(), strict=True)
    )


def test_ulysses_sequence_parallelism_is_refused_by_the_engine(
    models: tuple[Path, Path], process_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under Ulysses sequence parallelism (verl's ``use_ulysses_sp``, set from the engine
    config's ``ulysses_sequence_parallel_size``, whichever key the user set) the forward's
    logits are this rank's slice of the packed sequence, while the rows' offsets are global:
    the engine refuses to reduce W0 from them, naming the key, instead of reading another
    token's logits. verl's forward runs here as under SP size 2 (its inputs cut to this
    rank's half: one rank of the SP group in a one-process group)."""
    import verl.workers.engine.fsdp.transformer_impl as impl

    _, rm = models
    engine = build_engine(CreditFSDPEngine, models[0], packed=True)
    monkeypatch.setattr(engine, "use_ulysses_sp", True)
    monkeypatch.setattr(engine, "ulysses_sequence_parallel_size", 2)
    monkeypatch.setattr(impl, "gather_outputs_and_unpad", lambda t, **kw: t)
    with pytest.raises(CreditError, match=r"fsdp_config.ulysses_sequence_parallel_size: 2"):
        infer(engine, old_log_prob_batch(engine, work_request(rm)))
