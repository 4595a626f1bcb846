"""The one-pass path: where the direction model is OpenRLHF's reward model (no
``--credit.direction.*``) on its reward-model actors and the strategy takes the gradient at
the sampled tokens (``datc``), OpenRLHF's reward and its input gradient come from ONE forward
and ONE backward pass of OpenRLHF's own ``RewardModel`` in the reward actor's forward; no
direction model is built and nothing runs a second RM forward.

The reward-model actor is ``RewardHost`` (OpenRLHF's ``RewardModelActor.forward`` and
``execute_batch`` around a ``RewardModel`` loaded by OpenRLHF's
``get_llm_for_sequence_regression``, with ``--reward.normalize_enable``'s mean and std in its
config), the policy actor ``PolicyHost``, both in-process as in ``test_baselines.py``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from adapters.policy import response_logprobs_and_stats
from adapters.tiny import tiny_seq_classifier
from backends.openrlhf.compat import one_pass_problem
from credit_core import CreditBatch, get_strategy
from tests.backends.openrlhf.policy_host import PolicyHost, RewardHost
from tests.backends.openrlhf.test_baselines import (
    PROMPTS,
    RESPONSES,
    RM_FLAGS,
    VOCAB,
    credit_maker,
    micro_batches,
    resolved,
    stock_advantages,
    with_logprobs,
)
from tests.helpers.openrlhf import openrlhf_args

pytestmark = pytest.mark.usefixtures("single_torch_thread")

MEAN, STD, TEMPERATURE = 0.3, 2.5, 0.8


@pytest.fixture(autouse=True)
def actors_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The actors' ``forward`` on the CPU; ``ray.get`` of a ``LocalGroup``'s results."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(ray, "get", lambda results: results)


def openrlhf_reward_model(folder: Path, dtype: torch.dtype) -> Any:
    """OpenRLHF's ``RewardModel`` as its reward-model actor loads it (bf16, reward
    normalization on, mean and std from config.json), cast to ``dtype``."""
    from openrlhf.models import get_llm_for_sequence_regression

    classifier = tiny_seq_classifier("llama", VOCAB, hidden=16, seed=31)
    classifier.config.mean, classifier.config.std = MEAN, STD
    classifier.save_pretrained(folder)
    model = get_llm_for_sequence_regression(
        str(folder), "reward", normalize_reward=True, attn_implementation="eager"
    )
    # RewardModel.__init__ copies mean and std from the config into non-persistent buffers;
    # loaded through the meta device here (transformers 5) they come back uninitialized, so
    # they are set again as that __init__ sets them
    model.mean[0], model.std[0] = MEAN, STD
    assert model.normalize_reward
    return model.to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_pass_gives_openrlhfs_reward_and_the_gradient_from_one_forward_and_backward(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    batches = micro_batches()
    reward = RewardHost(openrlhf_reward_model(tmp_path, dtype))
    stock_rewards = reward.run(batches)  # stock OpenRLHF: one RM forward per micro-batch
    assert (reward.forwards, reward.backwards) == (len(batches), 0)

    credit = resolved("datc", [*RM_FLAGS, "--rollout.temperature", str(TEMPERATURE)])
    assert credit.placement == "reward" and credit.one_pass
    assert credit.requires == {"policy_stats", "reward_grad"}
    policy = PolicyHost(VOCAB, seed=2, temperature=TEMPERATURE)
    maker = credit_maker(credit, policy, reward)
    reward.forwards = 0
    rewards = reward.run(batches)  # make_experience's reward dispatch, now one-pass
    assert (reward.forwards, reward.backwards) == (len(batches), len(batches))
    for got, want in zip(rewards, stock_rewards, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # OpenRLHF's reward, exactly
    batches = with_logprobs(batches, policy.run("forward", batches))
    out = maker.compute_advantages_and_returns(copy.deepcopy(batches))
    assert (reward.forwards, reward.backwards) == (len(batches), len(batches))  # nothing more
    assert reward._credit_states["reward"].direction_model is None  # none was built
    assert all(p.requires_grad for p in reward.model.parameters())  # as OpenRLHF left them
    assert policy.forwards == len(batches)
    for got, want in zip(out, rewards, strict=True):  # the logged reward is OpenRLHF's
        assert torch.equal(got.info["credit/direction_reward"], want.float())


def test_one_pass_datc_equals_a_recomputation_from_the_reward_models_own_layers(
    tmp_path: Path,
) -> None:
    """Independently, per response: the RM's embedding rows of the plain prompt | response
    through its transformer and value head (reward at the last token, then (r - mean) / std
    with the model's normalization buffers), dR/dx by autograd, the policy's statistics from
    a plain forward with the RM's table, and credit_core's datc."""
    batches = micro_batches()
    model = openrlhf_reward_model(tmp_path, torch.float32)
    reward = RewardHost(model)
    credit = resolved("datc", [*RM_FLAGS, "--rollout.temperature", str(TEMPERATURE)])
    policy = PolicyHost(VOCAB, seed=2, temperature=TEMPERATURE)
    maker = credit_maker(credit, policy, reward)
    reward.run(batches)
    batches = with_logprobs(batches, policy.run("forward", batches))
    out = maker.compute_advantages_and_returns(copy.deepcopy(batches))

    table = model.get_input_embeddings().weight.detach()
    strategy = get_strategy("datc")
    policy.actor.eval()
    checked = 0
    for exp, got, adv in zip(batches, out, stock_advantages(batches), strict=True):
        for b, i in enumerate(map(int, exp.index)):
            prompt, response = PROMPTS[i], RESPONSES[i]
            ids, P, R = torch.tensor([prompt + response]), len(prompt), len(response)
            x = table[ids].clone().requires_grad_(True)
            hidden = model.model(inputs_embeds=x).last_hidden_state
            r = (model.score(hidden)[0, -1, 0] - model.mean[0]) / model.std[0]
            (g,) = torch.autograd.grad(r, x)
            torch.testing.assert_close(
                got.info["credit/direction_reward"][b], r.detach(), rtol=1e-5, atol=1e-6
            )
            with torch.no_grad():
                _, stats = response_logprobs_and_stats(
                    policy.actor.model,
                    ids,
                    torch.ones_like(ids),
                    R,
                    temperature=TEMPERATURE,
                    reward_embedding=table,
                )
            assert stats is not None
            batch = CreditBatch(
                advantages=adv[b, P - 1 : P].float(),
                mask=torch.ones(1, R, dtype=torch.bool),
                token_ids=ids[:, P:],
                reward_grad=g[:, P:],
                policy_stats=stats,
            )
            span = got.advantages[b, P - 1 : P - 1 + R]
            torch.testing.assert_close(span, strategy.assign(batch)[0], rtol=1e-4, atol=1e-6)
            checked += 1
    assert checked == len(RESPONSES)


def test_two_passes_stay_where_the_direction_model_is_not_openrlhfs_reward_model() -> None:
    """The one-pass path needs OpenRLHF's RM as the direction model, on its actors, the
    gradient at the samples and each micro-batch whole on its actor (ZeRO-3 is served, ring
    attention is not); each other case says why not."""
    base = ["--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss", *RM_FLAGS]
    datc = resolved("datc", RM_FLAGS)
    assert datc.one_pass
    cases = {
        "another direction model": (
            resolved("datc", RM_FLAGS, direction={"kind": "seq_classification", "path": "/rm"}),
            "--credit.direction.* gives another direction model",
        ),
        "policy placement": (
            resolved("datc", RM_FLAGS, placement="policy"),
            "the direction model runs on the policy actors",
        ),
        "path gradient": (
            resolved("datc_mid", RM_FLAGS),
            "the path gradient is taken away from the sampled tokens",
        ),
        "attention": (resolved("abc", RM_FLAGS), "the strategy reads no reward gradient"),
    }
    for name, (credit, reason) in cases.items():
        assert not credit.one_pass, name
        problem = one_pass_problem(
            openrlhf_args(base),
            credit.config,
            credit.requires,
            credit.placement,
            credit.plan.reward_grad_points,
        )
        assert problem is not None and reason in problem, name
    assert resolved("datc", [*RM_FLAGS, "--ds.zero_stage", "3"]).one_pass
    ring = ["--ds.ring_attn_size", "2", "--ds.packing_samples"]
    problem = one_pass_problem(
        openrlhf_args([*base, *ring]), datc.config, datc.requires, "reward", 0
    )
    assert problem == "ring attention splits the reward model's input over ranks"


def test_one_pass_shares_the_reward_models_own_table_cut_to_the_policy_tokenizer(
    tmp_path: Path,
) -> None:
    """The policy statistics read OpenRLHF's RM input-embedding table; rows past the policy
    tokenizer (a padded RM vocabulary) are never text and are left out."""
    from backends.openrlhf.actor_side import (
        ActorCreditState,
        bind_credit_methods,
        export_reward_embedding,
    )

    model = openrlhf_reward_model(tmp_path, torch.bfloat16)
    reward = RewardHost(model)
    tokenizer = type("Tokenizer", (), {"__len__": lambda self: VOCAB - 5})()
    state = ActorCreditState(frozenset({"reward_grad"}), None, tokenizer, 16, one_pass=True)
    bind_credit_methods(reward, "reward", state)
    table = export_reward_embedding(reward)
    want = model.get_input_embeddings().weight.detach()[: VOCAB - 5].float()
    assert table.dtype == torch.float32 and torch.equal(table, want)


def test_a_micro_batch_whose_reward_forward_was_not_seen_takes_one_pass_then(
    tmp_path: Path,
) -> None:
    """The gradient of a micro-batch the one-pass forward did not see (OpenRLHF's rewards
    given another way) comes from one forward + backward when the signals are gathered,
    equal to what the forward would have kept."""
    from backends.openrlhf.actor_side import ActorCreditState, bind_credit_methods

    [batch, *_] = micro_batches()
    reward = RewardHost(openrlhf_reward_model(tmp_path, torch.float32))
    state = ActorCreditState(frozenset({"reward_grad"}), None, None, 16, one_pass=True)
    bind_credit_methods(reward, "reward", state)
    tensors = {
        "sequences": batch.sequences,
        "action_mask": batch.action_mask,
        "attention_mask": batch.attention_mask,
    }
    late = reward.credit_reward_signals(**tensors)  # type: ignore[attr-defined]
    assert (reward.forwards, reward.backwards) == (1, 1)
    reward.run([batch])
    kept = reward.credit_reward_signals(**tensors)  # type: ignore[attr-defined]
    assert (reward.forwards, reward.backwards) == (2, 2)
    assert late.reward_grad is not None and kept.reward_grad is not None
    assert torch.equal(late.reward_grad, kept.reward_grad)
    assert torch.equal(late.direction_reward, kept.direction_reward)
    assert float(kept.reward_grad[~batch.action_mask.bool()].abs().sum()) == 0.0
    assert float(kept.reward_grad[batch.action_mask.bool()].abs().min()) > 0.0


@pytest.mark.slow
def test_one_pass_under_real_deepspeed_zero3_gives_stock_rewards_and_the_whole_models_gradient(
    tmp_path: Path,
) -> None:
    """Two gloo processes, each a reward-model actor holding OpenRLHF's ``RewardModel``
    under real DeepSpeed ZeRO-3 (CPU accelerator; shape-[0] partitions), scoring micro-batches
    of their own: the one-pass rewards are bitwise stock OpenRLHF's (the engine under
    no_grad), the gradient equals the unpartitioned model's, every process runs one forward
    and one backward per micro-batch and no more when the signals are gathered; a
    micro-batch whose forward one process did not see costs one pass on BOTH (the other
    drops its result: the passes are collectives); the embedding table is gathered whole on
    every process (one copy kept); the weights are partitions again after all of it."""
    from tests.backends.openrlhf import zero3_worker
    from tests.helpers.gloo_ranks import run_ranks

    classifier = tiny_seq_classifier("llama", VOCAB, hidden=16, seed=31)
    classifier.config.mean, classifier.config.std = zero3_worker.MEAN, zero3_worker.STD
    classifier.save_pretrained(tmp_path / "rm")
    args = (str(tmp_path / "rm"), VOCAB - 5, str(tmp_path))
    run_ranks(zero3_worker.main, tmp_path, args, timeout=240)
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    for rank in ranks:
        assert rank["partitioned"]
        assert rank["released_after_passes"] and rank["released_after_export"]
        assert rank["rewards_bitwise"] and rank["grad_equals_unpartitioned"]
        assert rank["passes"] == rank["passes_after_signals"] == [2, 2]
        assert rank["late_passes"] == [1, 1]
    assert ranks[0]["table"] is True and ranks[1]["table"] is None
