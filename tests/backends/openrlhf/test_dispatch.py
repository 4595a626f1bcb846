"""The signals' dispatch: the same calls on the same actors as OpenRLHF's
``RayActorGroup.async_run_method_batch``, one result object per micro-batch, so that the
trainer actor holds one micro-batch's (B, A, d) signals at a time, whatever the step's size.
"""

from __future__ import annotations

import copy
import weakref
from types import SimpleNamespace
from typing import Any

import pytest
import ray
import torch

from backends.common import credit as common_credit
from backends.openrlhf.actor_side import ActorSignals
from backends.openrlhf.dispatch import blocks, run_method_per_item
from credit_core import CreditError
from tests.backends.openrlhf.policy_host import PolicyHost, StoredGroup, stored_get
from tests.backends.openrlhf.test_baselines import (
    RM_FLAGS,
    VOCAB,
    credit_maker,
    direction,
    resolved,
    stock_maker,
    with_logprobs,
)
from tests.helpers.openrlhf import rollout_samples

pytestmark = pytest.mark.usefixtures("single_torch_thread")


class RecordingHandle:
    """A Ray actor handle that records the calls OpenRLHF's dispatch and ours make."""

    def __init__(self, rank: int, calls: list[tuple[int, list[int]]]) -> None:
        def execute_batch(method: str, data: Any, start: int, end: int) -> list[int]:
            items = data["item"][start:end]
            calls.append((rank, items))
            return items

        def ray_call(f: Any, *args: Any) -> Any:
            return f(SimpleNamespace(execute_batch=execute_batch), *args)

        def options(num_returns: int = 1) -> Any:
            if num_returns == 1:
                return SimpleNamespace(remote=ray_call)
            return SimpleNamespace(remote=lambda f, *args: list(ray_call(f, *args)))

        self.execute_batch = SimpleNamespace(remote=execute_batch)
        self.__ray_call__ = SimpleNamespace(remote=ray_call, options=options)


@pytest.mark.parametrize(("total", "actors", "duplicates"), [(8, 2, 1), (5, 4, 1), (6, 2, 2)])
def test_each_actor_gets_the_micro_batches_openrlhfs_dispatch_gives_it(
    total: int, actors: int, duplicates: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from openrlhf.trainer.ray.launcher import RayActorGroup

    monkeypatch.setattr(ray, "put", lambda value: value)
    stock: list[tuple[int, list[int]]] = []
    ours: list[tuple[int, list[int]]] = []
    n = actors * duplicates
    group = SimpleNamespace(
        _actor_handlers=[RecordingHandle(r, stock) for r in range(n)], duplicate_actors=duplicates
    )
    items = list(range(total))
    RayActorGroup.async_run_method_batch(group, "forward", item=items)
    group._actor_handlers = [RecordingHandle(r, ours) for r in range(n)]
    refs = run_method_per_item(group, "forward", duplicates, item=items)
    assert [call for call in ours if call[1]] == [call for call in stock if call[1]]
    assert refs == items  # one result per micro-batch, in order, duplicates' dropped
    assert [len(b) for b in blocks(total, actors)] == [len(call[1]) for call in stock[::duplicates]]


def test_fewer_micro_batches_than_actors_is_refused() -> None:
    with pytest.raises(CreditError, match="3 micro-batches cannot be spread over 4 actors"):
        blocks(3, 4)


def wide_tensors(value: Any) -> list[torch.Tensor]:
    """The (B, A, d) tensors of fetched signals (one ``ActorSignals`` or a list of them)."""
    if isinstance(value, list):
        return [t for item in value for t in wide_tensors(item)]
    if not isinstance(value, ActorSignals):
        return []
    found = [] if value.reward_grad is None else [value.reward_grad]
    if value.policy_stats is not None:
        stats = value.policy_stats
        found += [stats.m1, stats.m2, stats.sampled_emb]
    return found


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def datc_step(samples: int, monkeypatch: pytest.MonkeyPatch, stored: bool) -> dict[str, Any]:
    """One DATC step (the direction model on the reward-model host: the policy's (B, A, d)
    statistics and the (B, A, d) reward gradient cross to the trainer) over the first
    ``samples`` responses in micro-batches of 1, the actors' results in an object store
    (``stored``) or handed over in-process; with the largest (B, A, d) bytes fetched and
    alive in the trainer at a credit call, and the bytes each micro-batch's signals have."""
    from tests.backends.openrlhf.test_baselines import PROMPTS, RESPONSES, REWARDS

    alive: list[weakref.ref[torch.Tensor]] = []
    per_fetch: list[int] = []

    def on_fetch(value: Any) -> None:
        tensors = wide_tensors(value)
        per_fetch.append(nbytes(tensors))
        alive.extend(weakref.ref(t) for t in tensors)

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # the hosts' forward
    monkeypatch.setattr(ray, "get", stored_get(on_fetch))
    peak: list[int] = []
    assign = common_credit.assign_credit  # where CreditRun.apply, the backend's one, calls it

    def measuring(*args: Any, **kwargs: Any) -> Any:
        peak.append(nbytes([t for ref in alive if (t := ref()) is not None]))
        return assign(*args, **kwargs)

    monkeypatch.setattr(common_credit, "assign_credit", measuring)
    credit = resolved(
        "datc",
        [*RM_FLAGS, "--rollout.micro_batch_size", "1"],
        direction=direction(attention=False),
        placement="reward",
    )
    assert credit.requires == {"policy_stats", "reward_grad"}
    policy = PolicyHost(VOCAB, seed=2, temperature=1.0)
    maker = credit_maker(credit, policy, PolicyHost(VOCAB, seed=4, temperature=1.0))
    if stored:
        maker.actor_model_group = StoredGroup(policy)
        maker.reward_model_group = StoredGroup(maker.reward_model_group.host)
    rollout = rollout_samples(PROMPTS[:samples], RESPONSES[:samples], REWARDS[:samples])
    stock = stock_maker()
    stock.args.rollout.micro_batch_size = 1
    batches = stock.split_rollout_samples(rollout)
    batches = with_logprobs(batches, policy.run("forward", batches))
    out = maker.compute_advantages_and_returns(copy.deepcopy(batches))
    return {"advantages": [e.advantages for e in out], "peak": max(peak), "fetched": per_fetch}


def test_the_trainer_holds_one_micro_batchs_wide_signals_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/openrlhf.md, "Host memory": at a credit call no more than the current and the
    previous micro-batch's (B, A, d) signals are alive in the trainer, so a step of 8
    micro-batches peaks where a step of 2 does, far below the step's total; each fetch is one
    micro-batch of one host; the advantages are the in-process path's, bit for bit."""
    steps = {samples: datc_step(samples, monkeypatch, stored=True) for samples in (2, 8)}
    small, large = steps[2], steps[8]
    total = sum(large["fetched"])
    assert large["peak"] <= small["peak"] * 1.5 < total / 2  # does not grow with the step
    for samples, step in steps.items():
        assert len(step["fetched"]) == 2 * samples  # one object per micro-batch and host
        plain = datc_step(samples, monkeypatch, stored=False)
        for got, want in zip(step["advantages"], plain["advantages"], strict=True):
            assert torch.equal(got, want)
