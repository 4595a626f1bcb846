"""The token-credit experience maker on fabricated batches of OpenRLHF's own ``Experience``
objects, through OpenRLHF's real ``compute_advantages_and_returns``."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from scipy.stats import spearmanr

from adapters.policy import response_logprobs_and_stats
from adapters.tiny import tiny_causal_lm
from backends.common.credit import CreditRun
from backends.openrlhf.actor_side import ActorSignals, reduce_policy_stats, reward_grad_for_actions
from backends.openrlhf.compat import BACKEND, ResolvedCredit, resolve_credit
from backends.openrlhf.settings import OpenRLHFCreditConfig
from credit_core import CreditBatch, CreditConfig, CreditError, CreditStrategy, get_strategy
from credit_core.plan import CreditPlan
from tests.helpers.openrlhf import (
    TinyDirectionModel,
    multi_turn_sample,
    openrlhf_args,
    rollout_samples,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

VOCAB = 89
G = 4
PROMPTS = [[3, 4, 5], [6, 7]]
RESPONSES = [
    [10, 11, 12, 13, 14],
    [15, 16],
    [17, 18, 19],
    [20],
    [21, 22, 23, 24],
    [25, 26, 27],
    [28, 29],
    [30, 31, 32, 33, 34, 35],
]
REWARDS = [1.0, 0.0, 0.5, 0.25, 2.0, -1.0, 0.0, 1.5]
GRPO_FLAGS = [
    "--algo.advantage.estimator",
    "group_norm",
    "--rollout.n_samples_per_prompt",
    str(G),
    "--rollout.micro_batch_size",
    "3",
    "--algo.kl.use_loss",
    "--algo.kl.estimator",
    "k3",
]


def prompts_of_samples() -> list[list[int]]:
    return [PROMPTS[i // G] for i in range(len(RESPONSES))]


def maker(cls: type, args: Any, **kwargs: Any) -> Any:
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    strategy = type("Strategy", (), {"args": args})()
    tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()
    kl = FixedKLController(args.algo.kl.init_coef)
    return cls(None, None, None, None, kl, strategy, tokenizer, **kwargs)


def micro_batches(args: Any, actor: Any, with_kl: bool = False) -> list[Any]:
    """Rollout samples split into micro-batches by OpenRLHF, with what make_experience adds."""
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    samples = rollout_samples(prompts_of_samples(), RESPONSES, REWARDS)
    batches = maker(RemoteExperienceMaker, args).split_rollout_samples(samples)
    gen = torch.Generator().manual_seed(11)
    for exp in batches:
        with torch.no_grad():
            exp.action_log_probs = actor(exp.sequences, exp.action_mask, exp.attention_mask)
        kl = torch.rand(exp.action_mask.shape, generator=gen) if with_kl else None
        exp.kl = kl if with_kl else torch.zeros_like(exp.action_log_probs)
    return batches


@pytest.fixture(scope="module")
def policy() -> Any:
    from openrlhf.models import Actor

    actor = Actor(tiny_causal_lm("qwen2", VOCAB, seed=21))
    actor.packing_samples = False
    return actor


@pytest.fixture(scope="module")
def direction() -> TinyDirectionModel:
    return TinyDirectionModel(VOCAB, dim=6, seed=22)


@pytest.fixture(scope="module")
def grpo_args() -> Any:
    return openrlhf_args(GRPO_FLAGS)


@pytest.fixture
def strategies_built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every credit strategy constructed while the test runs (issue 47: one
    instance per process, the experience maker's)."""
    built: list[str] = []
    init = CreditStrategy.__init__

    def counting(self: CreditStrategy, params: Any = None) -> None:
        built.append(self.name)
        init(self, params)

    monkeypatch.setattr(CreditStrategy, "__init__", counting)
    return built


def local_signals(actor: Any, rm: TinyDirectionModel) -> Any:
    """Runs the actor-side functions in-process instead of through Ray."""

    def gather(experiences: Sequence[Any]) -> list[ActorSignals]:
        out = []
        for exp in experiences:
            stats = reduce_policy_stats(
                actor, exp.sequences, exp.action_mask, exp.attention_mask, rm.reward_embedding
            )
            grad, reward = reward_grad_for_actions(
                rm, exp.sequences, exp.attention_mask, exp.action_mask
            )
            out.append(ActorSignals(stats, grad, reward))
        return out

    return gather


def credit_maker(args: Any, name: str, actor: Any, rm: TinyDirectionModel, **params: Any) -> Any:
    from backends.openrlhf.experience_maker import TokenCreditExperienceMaker

    cfg = OpenRLHFCreditConfig(credit=CreditConfig.parse({"name": name, **params}))
    plan = CreditPlan.build(cfg.credit, BACKEND)  # the strategy's requires
    credit = ResolvedCredit(cfg, plan, "policy", {"kind": "test"}, 1, False)
    return maker(
        TokenCreditExperienceMaker, args, credit=credit, gather_signals=local_signals(actor, rm)
    )


def stock_result(args: Any, batches: list[Any]) -> list[Any]:
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    return maker(RemoteExperienceMaker, args).compute_advantages_and_returns(copy.deepcopy(batches))


@pytest.mark.parametrize(
    "flags",
    [
        GRPO_FLAGS,
        ["--algo.advantage.estimator", "dr_grpo", *GRPO_FLAGS[2:]],
        ["--algo.advantage.estimator", "rloo", *GRPO_FLAGS[2:]],
        ["--algo.advantage.estimator", "reinforce_baseline", *GRPO_FLAGS[2:6]],
    ],
    ids=["group_norm", "dr_grpo", "rloo", "reinforce_baseline+kl_in_reward"],
)
def test_uniform_leaves_openrlhf_advantages_bitwise_unchanged(
    flags: list[str], policy: Any, direction: TinyDirectionModel
) -> None:
    args = openrlhf_args(flags)
    calls_before = direction.calls
    batches = micro_batches(args, policy, with_kl="--algo.kl.use_loss" not in flags)
    assert [len(b.sequences) for b in batches] == [3, 3, 2]
    stock = stock_result(args, batches)
    ours = credit_maker(args, "uniform", policy, direction).compute_advantages_and_returns(
        copy.deepcopy(batches)
    )
    for s, o in zip(stock, ours, strict=True):
        assert o.advantages.dtype == s.advantages.dtype
        assert torch.equal(o.advantages, s.advantages)
        assert torch.equal(o.returns, s.returns)
        assert o.info["credit/weight_entropy"].tolist() == [1.0] * len(o.sequences)
    assert direction.calls == calls_before  # uniform gathers nothing


def test_uniform_with_packed_samples_and_dynamic_batches_is_bitwise_stock(
    strategies_built: list[str],
) -> None:
    """``--ds.packing_samples --train.dynamic_batch_enable``: OpenRLHF regroups the rollout
    by token count and its ``Actor`` packs each micro-batch; ``uniform``, resolved on those
    flags, leaves every advantage and return exactly as stock OpenRLHF computes them. The
    trainer actor's process builds one strategy: ``resolve_credit``'s, which the maker's
    ``CreditRun`` shares."""
    from openrlhf.models import Actor

    from backends.openrlhf.experience_maker import TokenCreditExperienceMaker

    flags = [
        *GRPO_FLAGS,
        "--ds.packing_samples",
        "--train.dynamic_batch_enable",
        "--rollout.max_tokens_per_gpu",
        "16",
        "--actor.num_gpus_per_node",
        "1",
    ]
    args = openrlhf_args(flags)
    packed = Actor(tiny_causal_lm("qwen2", VOCAB, seed=21))  # OpenRLHF's packing Actor
    packed.packing_samples = True
    packed.model.config.use_cache = False  # as Actor.__init__ sets it when it loads a model
    batches = micro_batches(args, packed)
    assert sorted(len(b.sequences) for b in batches) != [2, 3, 3]  # regrouped by tokens
    credit = resolve_credit(args, OpenRLHFCreditConfig())
    assert credit.requires == frozenset()
    stock = stock_result(args, batches)
    ours = maker(TokenCreditExperienceMaker, args, credit=credit).compute_advantages_and_returns(
        copy.deepcopy(batches)
    )
    for s, o in zip(stock, ours, strict=True):
        assert o.advantages.dtype == s.advantages.dtype
        assert torch.equal(o.advantages, s.advantages)
        assert torch.equal(o.returns, s.returns)
    assert strategies_built == ["uniform"]


def test_datc_gives_credit_core_token_advantages_on_action_tokens(
    grpo_args: Any, policy: Any, direction: TinyDirectionModel
) -> None:
    batches = micro_batches(grpo_args, policy)
    stock = stock_result(grpo_args, batches)
    ours = credit_maker(
        grpo_args, "datc", policy, direction, beta=2.0
    ).compute_advantages_and_returns(copy.deepcopy(batches))
    # Expected, computed independently: group_norm advantages from credit_core, signals from
    # the adapters' layout built directly from the fabricated prompt/response lists.
    from credit_core import group_advantages

    A = group_advantages(torch.tensor(REWARDS), G, "group_norm", eps=1e-9)
    strategy = get_strategy("datc", beta=2.0)
    row = 0
    for s, o in zip(stock, ours, strict=True):
        acts = o.action_mask.bool()
        assert torch.equal(o.returns, s.returns)  # returns untouched
        assert float(o.advantages[~acts].abs().max()) == 0.0  # zero off the action tokens
        for b in range(len(o.sequences)):
            i = int(o.index[b])
            prompt, response = prompts_of_samples()[i], RESPONSES[i]
            ids = torch.tensor([prompt + response])
            mask = torch.ones_like(ids)
            R = len(response)
            with torch.no_grad():
                _, stats = response_logprobs_and_stats(
                    policy.model, ids, mask, R, reward_embedding=direction.reward_embedding
                )
            out = direction.score(
                ids[:, : len(prompt)],
                mask[:, : len(prompt)],
                ids[:, len(prompt) :],
                mask[:, len(prompt) :],
                with_grad=True,
            )
            batch = CreditBatch(
                advantages=A[i : i + 1],
                mask=torch.ones(1, R, dtype=torch.bool),
                token_ids=ids[:, len(prompt) :],
                reward_grad=out.reward_grad,
                policy_stats=stats,
            )
            want = strategy.assign(batch)[0]
            got = o.advantages[b, len(prompt) - 1 : len(prompt) - 1 + R]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
            # DESIGN invariants: per-response mean and sign of the advantage are kept.
            torch.testing.assert_close(got.mean(), A[i], rtol=1e-5, atol=1e-6)
            assert bool((torch.sign(got) == torch.sign(A[i])).all())
            row += 1
    assert row == len(RESPONSES)


def test_diagnostics_reach_info_and_survive_openrlhf_batch_splitting(
    grpo_args: Any, policy: Any, direction: TinyDirectionModel, strategies_built: list[str]
) -> None:
    from openrlhf.trainer.ppo_utils.experience import make_experience_batch, split_experience_batch

    batches = micro_batches(grpo_args, policy)
    ours = credit_maker(grpo_args, "datc", policy, direction).compute_advantages_and_returns(
        batches
    )
    assert strategies_built == ["datc"]  # the plan's: the maker and its step build none
    keys = {
        "credit/weight_max",
        "credit/weight_min",
        "credit/weight_entropy",
        "credit/frac_upweighted",
        "credit/nonfinite_fallbacks",
        "credit/uniform_fallbacks",
        "credit/signal_time_s",
        "credit/direction_reward",
        "credit/direction_is_reward",
        "credit/direction_agreement",
        "credit/agreement_groups",
        "credit/agreement_skipped",
    }
    for exp in ours:
        assert keys <= set(exp.info)
        for key in keys:
            assert exp.info[key].shape == (len(exp.sequences),)
        assert (
            float(exp.info["credit/weight_max"][0]) > 1.0 > float(exp.info["credit/weight_min"][0])
        )
    # issue 46: the direction model's own scores against the step's rewards, Spearman within
    # each prompt's group, measured once over the whole step (the micro-batches of 3, 3, 2
    # split the groups of 4) and logged the same in every micro-batch
    index = torch.cat([torch.as_tensor(exp.index) for exp in ours])
    scores = torch.cat([exp.info["credit/direction_reward"] for exp in ours])
    rewards = torch.tensor(REWARDS)[index]
    rhos = [
        spearmanr(scores[index // G == g].numpy(), rewards[index // G == g].numpy()).statistic
        for g in range(len(PROMPTS))
    ]
    for exp in ours:
        B = len(exp.sequences)
        assert exp.info["credit/direction_is_reward"].tolist() == [0.0] * B
        assert exp.info["credit/agreement_groups"].tolist() == [len(PROMPTS)] * B
        assert exp.info["credit/agreement_skipped"].tolist() == [0.0] * B
        agreement = exp.info["credit/direction_agreement"]
        torch.testing.assert_close(agreement, torch.full((B,), float(sum(rhos) / len(rhos))))
    # OpenRLHF's dynamic-batch path splits per sample and re-merges: advantages and info
    # come through (no extra attribute is needed).
    items = [item for exp in ours for item in split_experience_batch(exp)]
    merged = make_experience_batch(items[:4])
    assert torch.equal(merged.advantages[0, : ours[0].advantages.shape[1]], ours[0].advantages[0])
    assert len(merged.info["credit/weight_max"]) == 4


def test_kl_penalty_in_the_reward_is_refused_for_datc(
    policy: Any, direction: TinyDirectionModel
) -> None:
    args = openrlhf_args(GRPO_FLAGS[:6])  # no --algo.kl.use_loss: KL (init_coef 0.01) in reward
    batches = micro_batches(args, policy, with_kl=True)
    with pytest.raises(CreditError, match=r"responses \[0, 1, 2\] have different advantages"):
        credit_maker(args, "datc", policy, direction).compute_advantages_and_returns(batches)


def test_multi_turn_sample_gets_credit_only_on_its_actions(
    grpo_args: Any, policy: Any, direction: TinyDirectionModel
) -> None:
    from openrlhf.trainer.ppo_utils.experience import Experience

    turns = [([40, 41, 42], True), ([50, 51], False), ([43, 44], True)]
    samples = [multi_turn_sample([3, 4], turns, r) for r in (1.0, 0.0, 0.5, 0.2)]
    for i, s in enumerate(samples):
        s.index = [i]
    exp = Experience.concat_experiences(samples, 0)
    exp.kl = torch.zeros(exp.action_mask.shape)
    [out] = credit_maker(grpo_args, "datc", policy, direction).compute_advantages_and_returns([exp])
    acts = out.action_mask.bool()
    assert acts[0].tolist() == [False, True, True, True, False, False, True, True]
    assert float(out.advantages[~acts].abs().max()) == 0.0
    A = torch.tensor([1.0, 0.0, 0.5, 0.2])
    A = (A - A.mean()) / (A.std() + 1e-9)
    torch.testing.assert_close(out.advantages.sum(1) / acts.sum(1), A, rtol=1e-5, atol=1e-6)


def test_compat_accepts_grpo_and_names_every_misfit() -> None:
    cfg = OpenRLHFCreditConfig(credit=CreditConfig.parse("saliency"), direction=None)
    rm_flags = ["--reward.model_name_or_path", "/models/rm"]
    ok = resolve_credit(openrlhf_args([*GRPO_FLAGS, *rm_flags]), cfg)
    assert ok.placement == "reward" and ok.direction is not None
    assert ok.direction["path"] == "/models/rm"
    assert ok.direction_is_reward  # OpenRLHF's one reward model: agreement 1 by construction
    two_rms = ["--reward.model_name_or_path", "/models/rm,/models/other"]
    assert not resolve_credit(openrlhf_args([*GRPO_FLAGS, *two_rms]), cfg).direction_is_reward
    remote = resolve_credit(
        openrlhf_args([*GRPO_FLAGS, "--reward.remote_url", "http://x"]),
        cfg.model_copy(update={"direction": ok.direction}),
    )
    assert remote.placement == "policy" and not remote.direction_is_reward
    with pytest.raises(CreditError) as info:
        resolve_credit(
            openrlhf_args(
                [
                    "--algo.advantage.estimator",
                    "gae",
                    "--reward.remote_url",
                    "http://x",
                    "--ds.ring_attn_size",
                    "2",
                ]
            ),
            OpenRLHFCreditConfig(credit=CreditConfig.parse("datc"), placement="reward"),
        )
    text = str(info.value)
    for fragment in (
        "--rollout.n_samples_per_prompt: 1; under a critic",  # gae serves datc, KL in reward
        "--ds.ring_attn_size > 1",
        "--credit.placement reward",
        "needs a differentiable reward model",
    ):
        assert fragment in text
    for name in ("datc_mid", "datc_ig"):  # m1 from the policy's own forward, either placement
        for placement in ("reward", "policy"):
            path = resolve_credit(
                openrlhf_args([*GRPO_FLAGS, *rm_flags]),
                OpenRLHFCreditConfig(credit=CreditConfig.parse(name), placement=placement),
            )
            assert path.requires == {"policy_stats", "reward_grad"}  # never W0: g needs m1
            assert path.placement == placement and not path.one_pass
    uniform = resolve_credit(
        openrlhf_args(["--algo.advantage.estimator", "gae"]), OpenRLHFCreditConfig()
    )
    assert uniform.placement is None and uniform.requires == frozenset()


def test_prime_is_refused_at_start_up_it_needs_a_second_trainable_model() -> None:
    """docs/openrlhf.md: PRIME's implicit PRM is a second model trained every step, which the
    plugin cannot host; the refusal comes from ``resolve_credit``, run when OpenRLHF's
    arguments are parsed (before any actor starts), whatever the other settings."""
    cfg = OpenRLHFCreditConfig(credit=CreditConfig.parse("prime"))
    with pytest.raises(CreditError) as info:
        resolve_credit(openrlhf_args(GRPO_FLAGS), cfg)
    text = str(info.value)
    assert text.startswith(
        "--credit: strategy 'prime' is not served: it reads ['implicit_log_ratio']"
    )
    assert "the log-probs of a second trainable model" in text
    assert "which the OpenRLHF backend does not provide" in text
    assert "the native or TRL backend" in text


def test_the_logged_weight_extremes_average_to_the_steps_max_and_min(
    grpo_args: Any, policy: Any, direction: TinyDirectionModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenRLHF's policy actors average every ``info`` entry over samples: what they log for
    ``credit/weight_max`` / ``weight_min`` is the largest / smallest weight of the step."""
    per_batch: list[Any] = []
    apply = CreditRun.apply

    def recording(self: CreditRun, *args: Any, **kwargs: Any) -> Any:
        step = apply(self, *args, **kwargs)
        per_batch.append(step.result.diagnostics)
        return step

    monkeypatch.setattr(CreditRun, "apply", recording)
    batches = micro_batches(grpo_args, policy)
    ours = credit_maker(grpo_args, "datc", policy, direction).compute_advantages_and_returns(
        batches
    )
    assert len(per_batch) == len(batches)  # datc: one micro-batch at a time
    assert len({d.weight_max for d in per_batch}) > 1  # the micro-batches differ
    for key, extreme in (("weight_max", max), ("weight_min", min)):
        logged = torch.cat([exp.info[f"credit/{key}"] for exp in ours])
        want = extreme(getattr(d, key) for d in per_batch)
        assert float(logged.mean()) == pytest.approx(want, rel=1e-6)
