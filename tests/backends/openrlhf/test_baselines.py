"""The published baselines under OpenRLHF: ``entropy_top`` and ``random_top`` select over the
step's whole rollout batch, ``abc`` and ``red`` read the direction model's attention and
prefix rewards, and a strategy the run cannot serve is refused naming what is missing.

The token-credit experience maker runs as in a trainer actor, through OpenRLHF's real
``compute_advantages_and_returns``, binding and gathering its signals on in-process actors
(``PolicyHost``: OpenRLHF's own ``PolicyModelActor.forward`` and ``execute_batch`` around a
real ``Actor``) through ``LocalGroup``, the actor-group calls with Ray taken out. Every
expected value is recomputed independently from the same logits or the same direction model
(full softmax entropy, ``torch.quantile``, the published weight formulas).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from backends.openrlhf.actor_side import direction_signals_for_actions
from backends.openrlhf.compat import ResolvedCredit, check_direction_capabilities, resolve_credit
from backends.openrlhf.launcher import main
from backends.openrlhf.settings import OpenRLHFCreditConfig
from credit_core import (
    CreditBatch,
    CreditConfig,
    CreditError,
    CreditResult,
    CreditSignals,
    CreditStrategy,
    assign_credit,
    get_strategy,
    hookimpl,
    register_plugin,
    unregister_plugin,
)
from tests.backends.openrlhf.policy_host import LocalGroup, PolicyHost
from tests.backends.openrlhf.signal_direction import SignalDirectionModel
from tests.helpers.openrlhf import multi_turn_sample, openrlhf_args, rollout_samples

pytestmark = pytest.mark.usefixtures("single_torch_thread")

VOCAB, DIM = 79, 6
PROMPTS = [[3, 4, 5]] * 2 + [[6, 7]] * 2 + [[8, 9, 10, 11]] * 2 + [[12]] * 2
RESPONSES = [
    [20, 21, 22, 23],
    [24, 25],
    [26, 27, 28, 29, 30, 31],
    [32],
    [33, 34, 35],
    [36, 37, 38, 39, 40],
    [41, 42],
    [43, 44, 45, 46],
]
REWARDS = [1.0, 0.0, 0.5, 2.0, -1.0, 0.25, 0.3, 0.9]
#: ``RESPONSES`` with tokens shared within and across the prompts' pairs
SHARED_TOKEN_RESPONSES = [
    [20, 21, 22, 23],
    [20, 25],
    [26, 20, 28, 29, 30, 31],
    [32, 20],
    [33, 34, 20],
    [36, 33, 38, 20, 40],
    [41, 42],
    [43, 41, 45, 46],
]
RHO = 0.3  # 27 action tokens: the quantile sits between two order statistics
FLAGS = [
    "--algo.advantage.estimator",
    "group_norm",
    "--rollout.n_samples_per_prompt",
    "2",
    "--rollout.micro_batch_size",
    "3",
    "--algo.kl.use_loss",
]
RM_FLAGS = ["--reward.model_name_or_path", "/models/rm"]
REMOTE_FLAGS = ["--reward.remote_url", "http://rm"]
RM_SEED = 3


def direction(attention: bool = True) -> dict[str, Any]:
    """The settings of a direction model (seed ``RM_SEED``): a ``SignalDirectionModel``, or
    with ``attention`` False the plain ``TinyDirectionModel`` (``DirectionModel``'s default
    ``gives_attention``, False)."""
    factory = (
        "tests.backends.openrlhf.signal_direction:signal_direction_model"
        if attention
        else "tests.helpers.openrlhf:tiny_direction_model"
    )
    kwargs = {"vocab": VOCAB, "dim": DIM, "seed": RM_SEED}
    return {"kind": "module", "factory": factory, "factory_kwargs": kwargs}


@pytest.fixture(autouse=True)
def actors_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PolicyModelActor.forward`` on the CPU; ``ray.get`` of a ``LocalGroup``'s results."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(ray, "get", lambda results: results)


def stock_maker() -> Any:
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    strategy = type("Strategy", (), {"args": openrlhf_args(FLAGS)})()
    tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()
    return RemoteExperienceMaker(
        None, None, None, None, FixedKLController(0.0), strategy, tokenizer
    )


def credit_maker(credit: ResolvedCredit, policy: Any, reward: Any = None) -> Any:
    """The token-credit maker on the policy (and reward-model) hosts, which it binds as it
    binds OpenRLHF's actor groups, ready for a step whose forwards the test dispatches by
    hand: prepared as ``make_experience`` prepares it first (``prepare_actors``)."""
    from backends.openrlhf.experience_maker import TokenCreditExperienceMaker

    stock = stock_maker()
    groups = (LocalGroup(policy), None, None if reward is None else LocalGroup(reward), None)
    maker = TokenCreditExperienceMaker(
        *groups, stock.kl_ctl, stock.strategy, stock.tokenizer, credit=credit
    )
    maker.prepare_actors()
    return maker


def micro_batches() -> list[Any]:
    """The rollout split into micro-batches of 3, 3 and 2 by OpenRLHF itself."""
    return stock_maker().split_rollout_samples(rollout_samples(PROMPTS, RESPONSES, REWARDS))


def with_logprobs(batches: list[Any], logprobs: list[torch.Tensor]) -> list[Any]:
    """What ``make_experience`` adds before the advantages: log-probs and a zero KL."""
    for exp, logp in zip(batches, logprobs, strict=True):
        exp.action_log_probs = logp
        exp.kl = torch.zeros_like(logp)
    return batches


def stock_advantages(batches: list[Any]) -> list[torch.Tensor]:
    """OpenRLHF's own advantages (B, A): A_i on every action token of response i."""
    out = stock_maker().compute_advantages_and_returns(copy.deepcopy(batches))
    return [exp.advantages for exp in out]


def resolved(credit: str | dict[str, Any], flags: list[str], **settings: Any) -> ResolvedCredit:
    """``resolve_credit`` of strategy ``credit`` on ``FLAGS`` + ``flags``."""
    return resolve_credit(
        openrlhf_args([*FLAGS, *flags]),
        OpenRLHFCreditConfig(credit=CreditConfig.parse(credit), **settings),
    )


@pytest.mark.parametrize("mode", ["mask", "weight"])
def test_entropy_top_is_exact_over_the_step_and_costs_no_policy_forward(mode: str) -> None:
    batches = micro_batches()
    assert [len(b.sequences) for b in batches] == [3, 3, 2]
    host = PolicyHost(VOCAB, seed=1, temperature=0.7)
    stock_logp = host.run("forward", batches)
    assert host.forwards == len(batches)  # stock OpenRLHF: one forward per micro-batch

    cfg = OpenRLHFCreditConfig(
        credit=CreditConfig.parse({"name": "entropy_top", "rho": RHO, "mode": mode})
    )
    credit = resolve_credit(openrlhf_args([*FLAGS, "--rollout.temperature", "0.7"]), cfg)
    assert credit.requires == {"token_entropy"}
    assert credit.placement is None and credit.direction is None  # no direction model
    maker = credit_maker(credit, host)
    host.forwards = 0
    batches = with_logprobs(batches, host.run("forward", batches))  # make_experience's forward
    out = maker.compute_advantages_and_returns(copy.deepcopy(batches))
    assert host.forwards == len(batches)  # ... and nothing more for the entropy
    for exp, want in zip(batches, stock_logp, strict=True):
        assert torch.equal(exp.action_log_probs, want)  # OpenRLHF's log-probs are untouched

    # Independently: the full softmax entropy of the same (temperature-scaled) logits, the
    # threshold of torch.quantile over every action token of the step.
    host.actor.eval()
    entropies = []
    for exp in batches:
        with torch.no_grad():
            _, output = host.actor(
                exp.sequences, exp.action_mask, exp.attention_mask, return_output=True
            )
        T, A = exp.sequences.shape[1], exp.action_mask.shape[1]
        logp = torch.log_softmax(output["logits"][:, T - A - 1 : T - 1].double(), dim=-1)
        entropies.append(-(logp.exp() * logp).sum(dim=-1))
    valid = torch.cat([H[e.action_mask.bool()] for H, e in zip(entropies, batches, strict=True)])
    assert valid.numel() == sum(map(len, RESPONSES))
    tau = torch.quantile(valid, 1.0 - RHO)
    assert float((valid - tau).abs().min()) > 1e-5  # no entropy within float error of tau
    no_selection = 0
    for exp, got, entropy, adv in zip(
        batches, out, entropies, stock_advantages(batches), strict=True
    ):
        acts = exp.action_mask.bool()
        selected = acts & (entropy >= tau)
        if mode == "mask":  # A_t = A M_t
            weights = selected.double()
        else:  # w_t = M_t n / sum M_t; 1 for a response without a selected token
            n, k = acts.sum(1, keepdim=True), selected.sum(1, keepdim=True)
            weights = torch.where(k > 0, selected * n / k.clamp_min(1), acts.double())
            no_selection += int((k == 0).sum())
        want = (adv.double() * weights).float()
        torch.testing.assert_close(got.advantages, want, rtol=1e-6, atol=1e-7)
        assert got.info["credit/extra_policy_forwards"].tolist() == [0.0] * len(acts)
    assert int((valid >= tau).sum()) == round(RHO * valid.numel())
    logged = out[0].info["credit/uniform_fallbacks"]  # the step's count, in every micro-batch
    assert logged.tolist() == [float(no_selection)] * len(out[0].sequences)


def test_random_top_selects_over_the_step_from_one_seeded_stream() -> None:
    """The maker keeps one ``random_top`` for the run: step after step its selection is
    credit_core's on the step's stacked batch, its generator advancing from the seed."""
    batches = micro_batches()
    with_logprobs(batches, [torch.zeros(b.action_mask.shape) for b in batches])
    top = {"name": "random_top", "rho": 0.25, "seed": 5}
    credit = resolved(top, ["--ds.packing_samples"])  # nothing from the logits: packing is fine
    assert credit.requires == frozenset() and credit.placement is None
    maker = credit_maker(credit, policy=None)  # nothing is bound or gathered
    steps = [maker.compute_advantages_and_returns(copy.deepcopy(batches)) for _ in range(2)]

    # The step's batch: every micro-batch's responses in order, action columns left-aligned,
    # padded to the widest micro-batch.
    width = max(b.action_mask.shape[1] for b in batches)

    def stacked(per_batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in per_batch])

    mask = stacked([b.action_mask for b in batches]).bool()
    first = mask.long().argmax(dim=1, keepdim=True)  # A_i: the value on the first action token
    advantages = stacked(stock_advantages(batches)).gather(1, first).squeeze(1)
    ids = stacked([b.sequences[:, 1:] for b in batches]).long()  # action tokens (A = T - 1)
    reference = get_strategy("random_top", rho=0.25, seed=5)
    selections = []
    for step in steps:
        want = assign_credit(reference, advantages, mask, ids).token_advantages
        got = stacked([exp.advantages for exp in step])
        assert torch.equal(got, want)
        selections.append(got != 0)
    assert not torch.equal(selections[0], selections[1])  # the stream advanced
    assert torch.equal(
        maker.credit_strategy.state_dict()["generator"], reference.state_dict()["generator"]
    )


@pytest.mark.parametrize("placement", ["policy", "reward"])
@pytest.mark.parametrize(("name", "signal"), [("abc", "attention"), ("red", "prefix_rewards")])
def test_abc_and_red_read_one_scoring_call_of_the_direction_model(
    name: str, signal: str, placement: str
) -> None:
    batches = micro_batches()
    policy = PolicyHost(VOCAB, seed=2, temperature=1.0)
    credit = resolved(
        name, RM_FLAGS if placement == "reward" else [], direction=direction(), placement=placement
    )
    wanted = {"attention": "reward_attention", "prefix_rewards": "prefix_rewards"}[signal]
    assert credit.requires == {wanted} and credit.placement == placement
    host = policy if placement == "policy" else PolicyHost(VOCAB, seed=4, temperature=1.0)
    maker = credit_maker(credit, policy, None if placement == "policy" else host)
    policy.forwards = 0
    batches = with_logprobs(batches, policy.run("forward", batches))
    out = maker.compute_advantages_and_returns(copy.deepcopy(batches))
    rm = host._credit_states[placement].direction_model  # built on that host
    assert isinstance(rm, SignalDirectionModel)
    assert policy.forwards == len(batches)  # the policy's own log-prob forwards only
    flags = (False, signal == "attention", signal == "prefix_rewards")
    assert rm.requests == [flags] * len(batches)  # one scoring call per micro-batch

    # Independently, per response: the same model on the plain prompt | response, then the
    # published mean-keeping weights.
    reference = SignalDirectionModel(VOCAB, DIM, seed=RM_SEED)
    for exp, got, adv in zip(batches, out, stock_advantages(batches), strict=True):
        for b, i in enumerate(map(int, exp.index)):
            prompt, response = PROMPTS[i], RESPONSES[i]
            ids, R = torch.tensor([prompt + response]), len(response)
            mask = torch.ones_like(ids)
            scored = reference.score(
                ids[:, : len(prompt)],
                mask[:, : len(prompt)],
                ids[:, len(prompt) :],
                mask[:, len(prompt) :],
                with_grad=False,
                with_attention=signal == "attention",
                with_prefix_rewards=signal == "prefix_rewards",
            )
            A = adv[b, len(prompt) - 1].double()
            values = getattr(scored, signal)[0].double()
            if name == "abc":  # w_t = (1 - beta) + beta n alpha_t, beta = 0.5
                w = 0.5 + 0.5 * R * values
            else:  # w_t proportional to max(sign(A) r_t, 0) + eps, mean 1
                raw = (torch.sign(A) * values).clamp_min(0.0) + 1e-6
                w = raw * R / raw.sum()
            span = got.advantages[b, len(prompt) - 1 : len(prompt) - 1 + R]
            torch.testing.assert_close(span, (A * w).float(), rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(span.double().mean(), A, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(
                got.info["credit/direction_reward"][b], scored.rewards[0], rtol=1e-6, atol=1e-7
            )


@pytest.mark.parametrize("placement", ["policy", "reward"])
def test_abc_is_refused_at_install_when_the_direction_model_gives_no_attention(
    placement: str,
) -> None:
    """Only the built model knows: the maker builds it on the actors hosting it when it is
    installed (before the first step) and refuses, naming what is missing."""
    credit = resolved(
        "abc",
        RM_FLAGS if placement == "reward" else [],
        direction=direction(attention=False),
        placement=placement,
    )
    policy = PolicyHost(VOCAB, seed=2, temperature=1.0)
    reward = None if placement == "policy" else PolicyHost(VOCAB, seed=4, temperature=1.0)
    with pytest.raises(CreditError) as info:
        credit_maker(credit, policy, reward)
    text = str(info.value)
    for fragment in (
        "--credit.direction: strategy 'abc' reads the direction model's attention",
        "gives_attention is False",
    ):
        assert fragment in text
    red = resolved("red", [], direction=direction(attention=False), placement="policy")
    credit_maker(red, PolicyHost(VOCAB, seed=2, temperature=1.0))  # red reads no attention


def test_direction_signals_of_a_multi_turn_sample_stay_on_its_actions() -> None:
    """Observation tokens are scored (the model reads the transcript) but get no value; the
    attention is renormalized over the action tokens, so abc keeps the response's mean."""
    rm = SignalDirectionModel(VOCAB, DIM, seed=5)
    sample = multi_turn_sample([3, 4], [([30, 31], True), ([40, 41, 42], False), ([32], True)], 1)
    seqs, attn, acts = sample.sequences, sample.attention_mask, sample.action_mask
    found = direction_signals_for_actions(
        rm, seqs, attn, acts, frozenset({"reward_attention", "prefix_rewards"})
    )
    assert rm.requests == [(False, True, True)]  # one call for both signals
    whole = rm.score(
        seqs[:, :2], attn[:, :2], seqs[:, 2:], attn[:, 2:], with_grad=False, with_attention=True
    )
    scored = rm.score(
        seqs[:, :2],
        attn[:, :2],
        seqs[:, 2:],
        attn[:, 2:],
        with_grad=False,
        with_prefix_rewards=True,
    )
    on = [1, 2, 6]  # action columns of the response tokens 0, 1 and 5
    alpha = whole.attention[0, [0, 1, 5]]
    assert found.reward_attention is not None and found.prefix_rewards is not None
    torch.testing.assert_close(found.reward_attention[0, on], alpha / alpha.sum())
    torch.testing.assert_close(found.prefix_rewards[0, on], scored.prefix_rewards[0, [0, 1, 5]])
    off = [0, 3, 4, 5]
    assert float(found.reward_attention[0, off].abs().sum()) == 0.0
    assert float(found.prefix_rewards[0, off].abs().sum()) == 0.0
    torch.testing.assert_close(found.direction_reward, whole.rewards)
    assert found.reward_grad is None


def test_a_transformer_reward_model_gives_attention_and_prefix_rewards_in_one_call(
    tmp_path: Path,
) -> None:
    """The direction model an OpenRLHF run builds by default (its RM folder as a one-label
    sequence classifier): gradient, attention and prefix rewards of a concatenated OpenRLHF
    micro-batch from one scoring call equal, at the action tokens, each sample scored alone
    in the plain prompt | response layout."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    from adapters.config import build_direction_model
    from adapters.tiny import tiny_seq_classifier, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(vocab_size=300)
    tiny_seq_classifier("llama", len(tokenizer), hidden=16, seed=10).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    rm = build_direction_model({"kind": "seq_classification", "path": str(tmp_path)}, tokenizer)
    assert rm.gives_attention
    prompts = [[p + 40 for p in prompt] for prompt in PROMPTS[::2]]  # text tokens, not special
    responses = [[r + 40 for r in response] for response in RESPONSES[::2]]
    batch = Experience.concat_experiences(rollout_samples(prompts, responses, [0.0] * 4), 0)
    found = direction_signals_for_actions(
        rm,
        batch.sequences,
        batch.attention_mask,
        batch.action_mask,
        frozenset({"reward_grad", "reward_attention", "prefix_rewards"}),
    )
    assert found.reward_grad is not None and found.reward_attention is not None
    assert found.prefix_rewards is not None and found.direction_reward is not None
    for b, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        ids = torch.tensor([prompt + response])
        mask = torch.ones_like(ids)
        P, span = len(prompt), slice(len(prompt) - 1, len(prompt) - 1 + len(response))
        alone = rm.score(
            ids[:, :P],
            mask[:, :P],
            ids[:, P:],
            mask[:, P:],
            with_grad=True,
            with_attention=True,
            with_prefix_rewards=True,
        )
        assert alone.attention is not None and alone.prefix_rewards is not None
        torch.testing.assert_close(found.direction_reward[b], alone.rewards[0])
        torch.testing.assert_close(found.reward_attention[b, span], alone.attention[0])
        torch.testing.assert_close(found.prefix_rewards[b, span], alone.prefix_rewards[0])
        torch.testing.assert_close(found.reward_grad[b, span], alone.reward_grad[0])
    assert float(found.reward_attention[~batch.action_mask.bool()].abs().sum()) == 0.0


def test_an_install_refusal_reaches_the_command_line_as_one_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal is raised in the trainer actor (or, building the model, in a model actor
    under it): Ray wraps it, once or twice; ``credit-openrlhf`` prints its message alone."""
    from backends.openrlhf.injection import TrainerWithCredit

    refusal = CreditError("credit strategy 'abc' reads 'reward_attention', ...")
    in_model = ray.exceptions.RayTaskError("model", "Traceback ...", refusal).as_instanceof_cause()
    nested = ray.exceptions.RayTaskError("trainer", "Traceback ...", in_model)
    call = type("Call", (), {"remote": staticmethod(lambda *_: "ref")})()
    handle = type("Handle", (), {"__ray_call__": call})()
    actor_class = type("ActorClass", (), {"remote": staticmethod(lambda *_: handle)})()

    def launch(cfg: OpenRLHFCreditConfig, _: Any) -> None:
        TrainerWithCredit(actor_class, cfg, on_install=print).remote()

    def raising(failure: Exception) -> Any:
        def get(_: Any) -> Any:
            raise failure

        return get

    for failure in (in_model, nested):
        monkeypatch.setattr(ray, "get", raising(failure))
        assert main(["--credit", "abc"], train=launch) == 2
        err = capsys.readouterr().err.splitlines()
        assert err[0] == f"credit-openrlhf: error: {refusal}" and len(err) == 2
    bug = ray.exceptions.RayTaskError("trainer", "Traceback ...", ValueError("a bug"))
    monkeypatch.setattr(ray, "get", raising(bug))
    with pytest.raises(ray.exceptions.RayTaskError):  # not a refusal: raised as it is
        main(["--credit", "abc"], train=launch)


def test_resolve_credit_serves_the_baselines_and_names_what_is_missing() -> None:
    entropy = resolved("entropy_top", REMOTE_FLAGS)
    assert entropy.requires == {"token_entropy"} and entropy.placement is None
    packed = resolved("entropy_top", ["--ds.packing_samples", "--train.dynamic_batch_enable"])
    assert packed.requires == {"token_entropy"}  # read from the packed logits (test_packing)
    with pytest.raises(CreditError) as info:
        resolved("entropy_top", ["--ds.packing_samples", "--ds.ring_attn_size", "2"])
    text = str(info.value)
    assert "--ds.ring_attn_size > 1: ring attention is not supported" in text
    assert "the signals ['token_entropy'] are reduced from the policy's logits" in text
    assert "--ds.packing_samples" not in text
    with pytest.raises(CreditError) as info:
        resolved("datc", [*RM_FLAGS, "--ds.tensor_parallel_size", "2"])
    text = str(info.value)
    assert "--ds.tensor_parallel_size > 1: tensor parallelism is not supported" in text
    assert "a check that each rank's logits span the whole vocabulary" in text

    abc = resolved("abc", RM_FLAGS)
    assert abc.requires == {"reward_attention"} and abc.placement == "reward"
    assert abc.direction == {"kind": "seq_classification", "path": "/models/rm"}
    red = resolved("red", [*REMOTE_FLAGS, "--ds.packing_samples"], direction=direction())
    assert red.requires == {"prefix_rewards"} and red.placement == "policy"
    for name, signal in (("abc", "reward_attention"), ("red", "prefix_rewards")):
        with pytest.raises(
            CreditError,
            match=rf"'{name}' needs a differentiable reward model \(the direction model\) for "
            rf"its signals \['{signal}'\]",
        ):
            resolved(name, REMOTE_FLAGS)
    with pytest.raises(
        CreditError, match=r"--algo.advantage.estimator: 'gae'; credit strategy 'random_top'"
    ):
        resolve_credit(
            openrlhf_args(["--algo.advantage.estimator", "gae"]),
            OpenRLHFCreditConfig(credit=CreditConfig.parse("random_top")),
        )

    # What only the built direction model tells (checked at install), naming what is missing.
    check_direction_capabilities(abc, gives_attention=True)
    check_direction_capabilities(red, gives_attention=False)  # red reads no attention
    with pytest.raises(CreditError, match=r"direction model \{'kind': 'seq_classification', "):
        check_direction_capabilities(abc, gives_attention=False)


class StepWideOnGradients(CreditStrategy):
    """A plugin strategy that selects across the step while reading a (B, A, d) signal."""

    name = "step_wide_on_gradients"
    requires = frozenset({"reward_grad"})
    gathers = True

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        raise AssertionError("refused before any step")


class StepWidePlugin:
    @hookimpl
    def credit_core_strategies(self) -> list[type[CreditStrategy]]:
        return [StepWideOnGradients]


def test_a_step_wide_selection_over_gradients_is_refused_at_start_up() -> None:
    plugin = register_plugin(StepWidePlugin(), name="tests-openrlhf-step-wide")
    try:
        with pytest.raises(
            CreditError,
            match=r"'step_wide_on_gradients' selects tokens across the step's batch "
            r"\(CreditStrategy.gathers\) and reads the \(B, A, d\) signals \['reward_grad'\]",
        ):
            resolved("step_wide_on_gradients", RM_FLAGS)
    finally:
        unregister_plugin(plugin)


def test_baseline_parameters_come_from_credit_flags(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[OpenRLHFCreditConfig] = []
    flags = ["--credit", "entropy_top", "--credit.rho", "0.3", "--credit.mode", "weight"]
    assert main([*flags, *FLAGS], train=lambda cfg, _: seen.append(cfg)) == 0
    assert seen[0].credit.params == {"rho": 0.3, "mode": "weight"}
    assert main(["--credit", "random_top", "--credit.mode", "top"], train=lambda *_: None) == 2
    err = capsys.readouterr().err
    assert err.startswith("credit-openrlhf: error:") and "mode" in err and "'mask'" in err


@pytest.mark.parametrize("flags", [RM_FLAGS, REMOTE_FLAGS])
def test_oar_g_is_refused_at_start_up_naming_its_signal_and_the_answer_span(
    flags: list[str],
) -> None:
    """OAR-G reads the policy's own answer-distribution gradient and the task's answer span;
    OpenRLHF's actors compute neither (docs/design.md, "Answer-gradient reweighting")."""
    with pytest.raises(CreditError) as info:
        resolved("oar_g", flags)
    text = str(info.value)
    assert text.startswith(
        "--credit: strategy 'oar_g' is not served: it reads ['answer_saliency'] and each "
        "response's answer span (CreditBatch.answer_mask)"
    )
    assert "which the OpenRLHF backend does not provide" in text


def _group_return_advantages(r: list[torch.Tensor], totals_of: list[float]) -> list[torch.Tensor]:
    """The paper forms' route, by hand: G_t = sum_{s >= t} r_s of each response, then
    (G_t - mean_g G_0) / (std_g G_0 + 1e-6) within each prompt's pair (unbiased std)."""
    out = []
    for i, tokens in enumerate(r):
        pair = totals_of[i - i % 2 : i - i % 2 + 2]
        mean = sum(pair) / 2
        std = (sum((x - mean) ** 2 for x in pair) / 1) ** 0.5
        G = tokens.flip(0).cumsum(0).flip(0)
        out.append((G - mean) / (std + 1e-6))
    return out


@pytest.mark.parametrize("name", ["ktae", "abc_paper", "red_paper", "p2t_paper"])
def test_a_strategy_reading_groups_gets_the_steps_rewards_and_groups_under_grpo(
    name: str,
) -> None:
    """Under GRPO (``group_norm``) the maker hands a strategy that ``reads_groups`` the whole
    step with each response's reward (OpenRLHF's, before its normalization) and its prompt's
    group, whole although micro-batches of 3 split the pairs. The paper forms (ABC's, RED's,
    P2T's) are recomputed by hand from the direction model on each plain prompt | response;
    ``ktae`` is
    ``assign_credit`` on the rollout as written in this file (its own statistics are checked
    against ``scipy.stats.fisher_exact`` in tests/credit_core)."""
    credit_config: Any = {
        "ktae": "ktae",
        "abc_paper": {"name": "abc", "mode": "paper"},
        "red_paper": {"name": "red", "mode": "paper"},
        "p2t_paper": {"name": "p2t", "mode": "paper", "null": "zero"},
    }[name]
    # ktae scores a token by its presence across a group: the pairs share tokens here
    responses = SHARED_TOKEN_RESPONSES if name == "ktae" else RESPONSES
    batches = stock_maker().split_rollout_samples(rollout_samples(PROMPTS, responses, REWARDS))
    policy = PolicyHost(VOCAB, seed=2, temperature=1.0)
    credit = resolved(credit_config, [], direction=direction(), placement="policy")
    assert credit.plan.reads_groups
    maker = credit_maker(credit, policy)
    batches = with_logprobs(batches, policy.run("forward", batches))
    out = maker.compute_advantages_and_returns(copy.deepcopy(batches))
    got = {
        int(i): exp.advantages[b][exp.action_mask[b].bool()]
        for exp in out
        for b, i in enumerate(exp.index)
    }
    assert all(len(got[i]) == len(responses[i]) for i in range(len(responses)))

    if name == "ktae":
        n = len(responses)
        width = max(map(len, responses))
        mask = torch.tensor([[t < len(r) for t in range(width)] for r in responses])
        ids = torch.tensor([r + [0] * (width - len(r)) for r in responses])
        rewards = torch.tensor(REWARDS)
        pairs = rewards.reshape(-1, 2)
        grpo = (pairs - pairs.mean(-1, keepdim=True)) / (pairs.std(-1, keepdim=True) + 1e-9)
        want = assign_credit(
            get_strategy("ktae"),
            grpo.reshape(-1),
            mask,
            ids,
            CreditSignals(),
            rewards=rewards,
            groups=torch.arange(n) // 2,
        ).token_advantages
        expected = [want[i, : len(responses[i])] for i in range(n)]
    else:
        reference = SignalDirectionModel(VOCAB, DIM, seed=RM_SEED)
        token_rewards = []
        for prompt, response, R in zip(PROMPTS, responses, REWARDS, strict=True):
            ids, P = torch.tensor([prompt + response]), len(prompt)
            mask = torch.ones_like(ids)
            scored = reference.score(
                ids[:, :P], mask[:, :P], ids[:, P:], mask[:, P:], with_grad=name == "p2t_paper",
                with_attention=name == "abc_paper", with_prefix_rewards=name == "red_paper",
            )  # fmt: skip
            if name == "abc_paper":  # r_t = beta R alpha_t + (1 - beta) R 1[t = T], beta 0.5
                r = 0.5 * R * scored.attention[0].double()
                r[-1] += 0.5 * R
            elif name == "red_paper":  # r_t = s_t - s_{t-1}, the prefix-score differences
                r = scored.prefix_rewards[0].double()
            else:  # r_t = (e_t - 0) . g_t, P2T's attribution with the zero null
                assert scored.reward_grad is not None
                attribution = reference.attribution(
                    scored.reward_grad, ids[:, P:], mask[:, P:], "zero"
                )
                r = attribution[0].double()
            token_rewards.append(r)
        totals = [float(r.sum()) for r in token_rewards]
        expected = _group_return_advantages(token_rewards, totals)
    for i, want_i in enumerate(expected):
        torch.testing.assert_close(got[i].double(), want_i.double(), rtol=1e-5, atol=1e-6)
    assert any(float((g - g.mean()).abs().max()) > 1e-3 for g in got.values())  # not uniform


def test_a_strategy_reading_groups_needs_two_samples_per_prompt() -> None:
    with pytest.raises(
        CreditError,
        match=r"--rollout.n_samples_per_prompt: 1; strategy 'ktae' reads the response rewards "
        r"within each prompt's group of samples and needs >= 2",
    ):
        resolved("ktae", ["--rollout.n_samples_per_prompt", "1"])
