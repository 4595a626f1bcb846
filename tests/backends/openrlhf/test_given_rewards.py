"""``credit: process`` on OpenRLHF's own path: a custom ``reward_func`` file, loaded and
called by OpenRLHF's ``SingleTurnAgentExecutor``, returns per-step (or per-token) rewards in
its ``extra_logs``; OpenRLHF's samples generator makes the rollout's ``Experience`` objects
of them, the token-credit maker splits them into micro-batches (OpenRLHF's concatenation)
and computes OpenRLHF's advantages, then ``process``'s token advantages, which equal the hand
formula (docs/design.md, "User-given token rewards (process supervision)"); a bad length or
a NaN is one ``CreditError`` naming the sample."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from backends.openrlhf.compat import resolve_credit
from backends.openrlhf.settings import OpenRLHFCreditConfig
from credit_core import CreditConfig, CreditError
from tests.helpers.openrlhf import openrlhf_args
from tests.helpers.process_formula import process_advantages

pytestmark = pytest.mark.usefixtures("single_torch_thread")

G = 4  # samples per prompt
PROMPTS = [[3, 4, 5], [6, 7]]
RESPONSES = [
    [10, 11, 12, 13, 14],
    [15, 16],
    [17, 18, 19],
    [20],
    [21, 22, 23, 24],
    [25, 26, 27],
    [29, 30],
    [30, 31, 32, 33, 34, 35],
]
FLAGS = [
    "--algo.advantage.estimator",
    "group_norm",
    "--rollout.n_samples_per_prompt",
    str(G),
    "--rollout.micro_batch_size",
    "3",
    "--algo.kl.use_loss",
]
OPENRLHF_EPS = 1e-9  # OpenRLHF's group_norm

#: A user's reward function file, as ``--reward.remote_url`` names it: the label picks what
#: it returns (every step rewards a multiple of 1/4, exact in OpenRLHF's float32 tensors).
REWARD_FUNC = """
import math
import torch

def steps(ids):
    half = max(len(ids) // 2, 1)
    spans = [(0, half, (ids[half - 1] % 4) / 4)]
    if half < len(ids):
        spans.append((half, len(ids), (ids[-1] % 3) / 4))
    return spans

def reward_func(queries, prompts, labels):
    entries, totals = [], []
    for query, prompt, label in zip(queries, prompts, labels):
        ids = [int(x) for x in query.split()][len(prompt.split()):]
        kind, _, bad = label.partition(":")
        spans = steps(ids)
        if kind == "tokens":
            entry = [float(t % 2) for t in ids] + ([0.0] if bad == "long" else [])
        else:
            entry = [(s, e, math.nan if bad == "nan" else r) for s, e, r in spans]
        entries.append(entry)
        totals.append(sum(r for _, _, r in spans))
    key = "token_rewards" if labels[0].startswith("tokens") else "step_rewards"
    rewards = torch.tensor(totals)
    given = entries[0] if labels[0] == "steps:flat" else entries  # flat: not one per query
    logs = {} if labels[0] == "none" else {key: given}
    return {"rewards": rewards, "scores": rewards, "extra_logs": logs}
"""


class Tokenizer:
    """Token ids written as decimal words: what OpenRLHF's executor encodes and decodes."""

    pad_token_id = 0

    def __call__(self, text: str, **kwargs: Any) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([[int(x) for x in text.split()]])}

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return " ".join(str(i) for i in ids)


class Engine:
    """Stands in for vLLM: ``generate`` samples the given response."""

    def __init__(self, response: list[int]) -> None:
        self.response = response

    async def generate(self, prompt_ids: list[int], params: Any, **kwargs: Any) -> Any:
        out = SimpleNamespace(token_ids=self.response, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[out])


def rollout(reward_file: Path, labels: list[str]) -> list[Any]:
    """The step's samples as OpenRLHF makes them: its executor runs the reward function
    file on each generated response, its samples generator turns each into an
    ``Experience``."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(str(reward_file))
    generator = object.__new__(SamplesGenerator)
    tokenizer = Tokenizer()
    params = SimpleNamespace(max_tokens=16, logprobs=None)
    samples = []
    for i, response in enumerate(RESPONSES):
        prompt = tokenizer.decode(PROMPTS[i // G])
        out = asyncio.run(
            executor.execute(prompt, labels[i // G], params, 64, tokenizer, Engine(response))
        )
        assert out["reward"] is not None  # the executor logs a failing reward function only
        samples.append(generator._process_response_into_experience(out, max_len=64))
    return samples


def process_maker(args: Any, **params: Any) -> Any:
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from backends.openrlhf.experience_maker import TokenCreditExperienceMaker

    cfg = OpenRLHFCreditConfig(credit=CreditConfig.parse({"name": "process", **params}))
    credit = resolve_credit(args, cfg)
    strategy = SimpleNamespace(args=args)
    kl = FixedKLController(args.algo.kl.init_coef)
    return TokenCreditExperienceMaker(
        None, None, None, None, kl, strategy, Tokenizer(), credit=credit
    )


#: OpenRLHF regroups the rollout by token count: a micro-batch's rows are not in rollout order.
DYNAMIC = ["--train.dynamic_batch_enable", "--rollout.max_tokens_per_gpu", "16"]


#: PPO with OpenRLHF's critic (its KL estimate is 0 below, so no KL term in the rewards).
GAE = ["--algo.advantage.estimator", "gae", *FLAGS[2:6]]


def credited(
    tmp_path: Path, labels: list[str], flags: Sequence[str] = FLAGS, **params: Any
) -> list[Any]:
    """The step's micro-batches after the maker's ``compute_advantages_and_returns``."""
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(REWARD_FUNC)
    args = openrlhf_args([*flags, "--reward.remote_url", str(reward_file)])
    maker = process_maker(args, **params)
    batches = maker.split_rollout_samples(rollout(reward_file, labels))
    for batch in batches:  # what make_experience adds: log-probs, KL, the critic's values
        batch.action_log_probs = torch.zeros(batch.action_mask.shape)
        batch.kl = torch.zeros(batch.action_mask.shape)
        batch.values = torch.zeros(batch.action_mask.shape)
    out: list[Any] = maker.compute_advantages_and_returns(batches)
    return out


def hand_formula(outcome_weight: float) -> list[torch.Tensor]:
    """Each response's token advantages (n_i,): ``process_advantages`` written out with
    loops, R_i the sum of the response's step rewards, A_i OpenRLHF's group_norm of R."""
    namespace: dict[str, Any] = {}
    exec(REWARD_FUNC, namespace)
    steps = [namespace["steps"](ids) for ids in RESPONSES]
    outcomes = [sum(r for _, _, r in s) for s in steps]
    lengths = [len(ids) for ids in RESPONSES]
    rows = process_advantages(steps, outcomes, lengths, G, outcome_weight, outcome_eps=OPENRLHF_EPS)
    return [torch.tensor(row) for row in rows]


@pytest.mark.parametrize("dynamic", [False, True], ids=["micro_batches", "dynamic"])
def test_step_rewards_of_openrlhfs_reward_func_give_the_hand_formula(
    tmp_path: Path, dynamic: bool
) -> None:
    flags = [*FLAGS, *DYNAMIC] if dynamic else FLAGS
    batches = credited(tmp_path, ["steps", "steps"], flags, outcome_weight=0.5)
    expected = hand_formula(0.5)
    order = [i for batch in batches for i in batch.index]
    assert sorted(order) == list(range(len(RESPONSES)))
    assert (order == sorted(order)) != dynamic  # dynamic batches: rows out of rollout order
    for batch in batches:
        assert "credit/given_rewards" not in batch.info  # not logged by OpenRLHF
        rows = zip(batch.index, batch.advantages, batch.action_mask.bool(), strict=True)
        for i, advantages, mask in rows:
            torch.testing.assert_close(advantages[mask], expected[i].float(), rtol=1e-5, atol=1e-6)
            assert bool((advantages[~mask] == 0).all())
    first = batches[0].advantages[0][batches[0].action_mask[0].bool()]
    assert bool((first != first[0]).any())  # not one advantage per response


def test_under_gae_openrlhfs_critic_reads_the_step_rewards_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/design.md, "Credit under a critic": with ``process``'s defaults the token rewards
    OpenRLHF's own GAE receives are the function's step rewards, each at its step's last
    token, in place of the outcome at the response's last."""
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    handed: list[torch.Tensor] = []
    original = RemoteExperienceMaker.get_advantages_and_returns

    def spy(self: Any, values: Any, rewards: torch.Tensor, *args: Any) -> Any:
        handed.append(rewards.clone())
        return original(self, values, rewards, *args)

    monkeypatch.setattr(RemoteExperienceMaker, "get_advantages_and_returns", spy)
    batches = credited(tmp_path, ["steps", "steps"], GAE)
    namespace: dict[str, Any] = {}
    exec(REWARD_FUNC, namespace)
    assert len(handed) == len(batches)
    for batch, rewards in zip(batches, handed, strict=True):
        for i, row, mask in zip(batch.index, rewards, batch.action_mask.bool(), strict=True):
            expected = torch.zeros(len(RESPONSES[i]))
            for _, end, r in namespace["steps"](RESPONSES[i]):
                expected[end - 1] = r
            assert torch.equal(row[mask], expected)
            assert bool((row[~mask] == 0).all())


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (
            ["tokens", "tokens:long"],
            r"^the reward function's extra_logs: response 4: token_rewards: expected one "
            r"reward per response token \(4\), got 5$",
        ),
        (
            ["steps", "steps:nan"],
            r"^the reward function's extra_logs: response 4: step_rewards\[0\]: reward: "
            r"expected a finite number, got nan$",
        ),
        (
            ["steps:flat", "steps"],
            r"^the reward function's extra_logs: response 0: step_rewards: expected a list with "
            r"one entry per query of the reward function's batch \(OpenRLHF calls it with one: "
            r"\[\[\.\.\.\]\]\), got 2 entries$",
        ),
        (
            ["none", "none"],
            r"^--credit: the strategy reads token rewards, but the reward function's "
            r"extra_logs of no sample has 'token_rewards' or 'step_rewards'",
        ),
    ],
    ids=["length", "nan", "not_one_per_query", "none_given"],
)
def test_a_bad_token_reward_is_one_error_naming_the_sample(
    tmp_path: Path, labels: list[str], message: str
) -> None:
    with pytest.raises(CreditError, match=message):
        credited(tmp_path, labels)


def test_process_needs_a_reward_function() -> None:
    cfg = OpenRLHFCreditConfig(credit=CreditConfig.parse("process"))
    args = openrlhf_args([*FLAGS, "--reward.model_name_or_path", "/models/rm"])
    with pytest.raises(CreditError, match=r"strategy 'process' reads the token rewards of the "):
        resolve_credit(args, cfg)
