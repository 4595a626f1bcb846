"""Packed samples (``--ds.packing_samples``) and dynamic batches
(``--train.dynamic_batch_enable``) under OpenRLHF, for every strategy that reads the
policy's logits.

OpenRLHF's ``Actor`` packs a padded micro-batch itself (``ring_attn_utils
.unpad_and_slice_tensor``: the attended tokens of all samples in one row, position ids
restarting per sample), so its logits are (1, N, V); the credit's streamed reductions
read each sample's rows of that packed output (``backends.openrlhf.packing``), no unpacked
copy. Dynamic batching regroups the rollout into micro-batches by token count
(``split_rollout_samples`` with ``get_seqlen_balanced_partitions``). Each test runs the
token-credit maker as in ``test_baselines.py`` (OpenRLHF's own ``PolicyModelActor.forward``
and ``execute_batch`` around a real ``Actor``, in-process) once unpacked on fixed
micro-batches and once packed (and regrouped), and checks the token advantages of every
response agree to float tolerance; the flash-attn padding helpers are the test stubs'
pure-torch ``bert_padding`` (tests/stubs).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

import backends.openrlhf.actor_side as actor_side
from backends.openrlhf.compat import LOGITS_SIGNALS, ResolvedCredit
from backends.openrlhf.packing import OutputRows, output_rows, packed_rank, to_padded
from credit_core import CreditError
from tests.backends.openrlhf.policy_host import PolicyHost, RewardHost
from tests.backends.openrlhf.test_baselines import (
    FLAGS,
    PROMPTS,
    REMOTE_FLAGS,
    RESPONSES,
    REWARDS,
    RM_FLAGS,
    VOCAB,
    credit_maker,
    micro_batches,
    resolved,
    with_logprobs,
)
from tests.backends.openrlhf.test_one_pass import openrlhf_reward_model
from tests.helpers.openrlhf import openrlhf_args, rollout_samples

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TEMPERATURE = 0.7
PACKED = ["--ds.packing_samples"]
#: 47 tokens in the rollout, at most 16 per micro-batch on one policy actor: OpenRLHF
#: regroups them into 4 micro-batches of balanced token counts
DYNAMIC = [
    *PACKED,
    "--train.dynamic_batch_enable",
    "--rollout.max_tokens_per_gpu",
    "16",
    "--actor.num_gpus_per_node",
    "1",
]
PATH_DIRECTION = {
    "kind": "module",
    "factory": "tests.backends.openrlhf.signal_direction:path_direction_model",
    "factory_kwargs": {"vocab": VOCAB, "dim": 6, "seed": 13},
}
#: Every servable strategy reading a signal reduced from the policy's logits, with settings.
LOGITS_STRATEGIES: list[tuple[Any, dict[str, Any]]] = [
    ({"name": "entropy_top", "rho": 0.3}, {}),
    ("datc", {"direction": PATH_DIRECTION}),
    ("datc_unsigned", {"direction": PATH_DIRECTION}),
    ("datc_nosign", {"direction": PATH_DIRECTION}),
    ("datc_inverse", {"direction": PATH_DIRECTION}),
    ("datc_shuffled", {"direction": PATH_DIRECTION}),
    ("datc_mid", {"direction": PATH_DIRECTION}),
    ({"name": "datc_ig", "points": 2}, {"direction": PATH_DIRECTION}),
]


@pytest.fixture(autouse=True)
def actors_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The actors' ``forward`` on the CPU; ``ray.get`` of a ``LocalGroup``'s results."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(ray, "get", lambda results: results)


@pytest.fixture
def layouts_read(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """``OutputRows.packed`` of every logits layout the streamed reductions read, for
    micro-batches of more than one sample (one sample without padding reads the same
    either way: (1, T) is (1, N))."""
    seen: list[bool] = []

    def spy(output: torch.Tensor, attention_mask: torch.Tensor) -> OutputRows:
        rows = output_rows(output, attention_mask)
        if attention_mask.shape[0] > 1:
            seen.append(rows.packed)
        return rows

    monkeypatch.setattr(actor_side, "output_rows", spy)
    return seen


def split(flags: list[str]) -> list[Any]:
    """The rollout split into micro-batches by OpenRLHF's own ``split_rollout_samples``
    under ``FLAGS`` + ``flags`` (fixed size 3, or regrouped by token count)."""
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    strategy = type("Strategy", (), {"args": openrlhf_args([*FLAGS, *flags])})()
    tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()
    stock = RemoteExperienceMaker(
        None, None, None, None, FixedKLController(0.0), strategy, tokenizer
    )
    return stock.split_rollout_samples(rollout_samples(PROMPTS, RESPONSES, REWARDS))


def per_response(experiences: list[Any], field: str = "advantages") -> dict[int, torch.Tensor]:
    """Each response's values of ``field`` on its action tokens, by its rollout index."""
    out = {}
    for exp in experiences:
        values = getattr(exp, field)
        for b, i in enumerate(map(int, exp.index)):
            out[i] = values[b][exp.action_mask[b].bool()]
    return out


def run(
    credit: ResolvedCredit, batches: list[Any], packing: bool, reward: Any = None
) -> tuple[list[Any], PolicyHost]:
    """``make_experience``'s policy forward and ``compute_advantages_and_returns`` of the
    token-credit maker on ``batches``, the policy (seed 2) packing or not; with a
    placement ``reward`` and no ``reward`` host, a second ``PolicyHost`` hosts the
    direction model."""
    policy = PolicyHost(VOCAB, seed=2, temperature=TEMPERATURE, packing=packing)
    if credit.placement == "reward" and reward is None:
        reward = PolicyHost(VOCAB, seed=4, temperature=1.0)
    maker = credit_maker(credit, policy, reward)
    if isinstance(reward, RewardHost):
        reward.run(batches)  # make_experience's reward dispatch (the one-pass forward)
    batches = with_logprobs(batches, policy.run("forward", batches))
    return maker.compute_advantages_and_returns(copy.deepcopy(batches)), policy


def assert_same_credit(unpacked: list[Any], packed: list[Any], permuted: bool = False) -> None:
    """Same log-probs and token advantages, response by response, to float tolerance; the
    advantages are not all one value per response (the credit did something). ``permuted``:
    the same advantages of each response in any order (``datc_shuffled`` draws its
    permutations from one stream over the step's micro-batches, so regrouping them draws
    others)."""
    want, got = per_response(unpacked), per_response(packed)
    assert sorted(got) == sorted(want) == list(range(len(RESPONSES)))
    logp_want = per_response(unpacked, "action_log_probs")
    logp_got = per_response(packed, "action_log_probs")
    spread = 0.0
    for i in want:
        torch.testing.assert_close(logp_got[i], logp_want[i], rtol=1e-5, atol=1e-6)
        if permuted:
            got[i], want[i] = got[i].sort().values, want[i].sort().values
        torch.testing.assert_close(got[i], want[i], rtol=1e-4, atol=1e-6)
        spread = max(spread, float(want[i].max() - want[i].min()))
    assert spread > 1e-3


def test_packed_rows_follow_openrlhfs_own_unpadding() -> None:
    """``packed_rank`` puts position (b, t) where OpenRLHF's ``unpad_and_slice_tensor`` puts
    its token, and ``to_padded`` scatters back as its ``gather_and_pad_tensor`` does."""
    from openrlhf.models.ring_attn_utils import gather_and_pad_tensor, unpad_and_slice_tensor

    [batch, *_] = micro_batches()
    seqs, attn = batch.sequences, batch.attention_mask
    assert bool((attn == 0).any())  # padding in the micro-batch: the packed row is shorter
    packed, _, _, pad_len, indices = unpad_and_slice_tensor(seqs, attn, None)
    rank = packed_rank(attn)
    on = attn.bool()
    assert torch.equal(packed[0, rank[on]], seqs[on])
    assert torch.equal(rank.flatten()[indices], torch.arange(int(on.sum())))
    assert bool((rank[~on] == -1).all())
    per_token = torch.randn(1, packed.shape[1])  # as OpenRLHF pads its log-probs back
    want = gather_and_pad_tensor(per_token, None, pad_len, indices, *seqs.shape)
    assert torch.equal(to_padded(per_token, attn), want)
    values = torch.randn(1, packed.shape[1], 5)  # (1, N, d): per-token rows move alike
    assert torch.equal(to_padded(values, attn)[on], values[0])
    assert float(to_padded(values, attn)[~on].abs().sum()) == 0.0
    rows = output_rows(values, attn)
    assert rows.packed
    b, t0 = 1, 0
    span = rows.span(values, b, t0, t0 + 2)
    assert span.data_ptr() == values[0, int(rank[b, t0])].data_ptr()  # a view, no copy
    assert torch.equal(span[0], values[0, rank[b, t0 : t0 + 2]])
    assert not output_rows(torch.zeros(*seqs.shape, 5), attn).packed
    with pytest.raises(CreditError, match=r"packed, \(1, N=\d+, \.\.\.\)"):
        output_rows(torch.zeros(1, packed.shape[1] + 1, 5), attn)
    hole = attn.clone()
    hole[0, 1] = 0
    with pytest.raises(CreditError, match="not all attended"):
        OutputRows(True, packed_rank(hole)).span(values, 0, 0, 3)


@pytest.mark.parametrize(("credit", "settings"), LOGITS_STRATEGIES, ids=lambda c: str(c)[:20])
@pytest.mark.parametrize("flags", [PACKED, DYNAMIC], ids=["packed", "dynamic"])
def test_packed_and_unpacked_runs_give_the_same_token_advantages(
    credit: Any, settings: dict[str, Any], flags: list[str], layouts_read: list[bool]
) -> None:
    temperature = ["--rollout.temperature", str(TEMPERATURE)]
    unpacked_credit = resolved(credit, [*REMOTE_FLAGS, *temperature], **settings)
    packed_credit = resolved(credit, [*REMOTE_FLAGS, *temperature, *flags], **settings)
    assert packed_credit.requires == unpacked_credit.requires
    assert packed_credit.requires & LOGITS_SIGNALS
    unpacked, _ = run(unpacked_credit, micro_batches(), packing=False)
    assert layouts_read and not any(layouts_read)
    layouts_read.clear()
    regrouped = split(flags)
    if flags is DYNAMIC:  # OpenRLHF regrouped the rollout by token count
        assert sorted(len(b.sequences) for b in regrouped) != [2, 3, 3]
    packed, policy = run(packed_credit, regrouped, packing=True)
    assert layouts_read and all(layouts_read)  # read from OpenRLHF's packed logits
    assert policy.forwards == len(regrouped)  # no policy forward beyond OpenRLHF's own
    for exp in packed:
        assert exp.info["credit/extra_policy_forwards"].tolist() == [0.0] * len(exp.sequences)
    assert_same_credit(unpacked, packed, permuted=credit == "datc_shuffled" and flags is DYNAMIC)


@pytest.mark.parametrize("credit", ["datc", "datc_mid"])
def test_packed_policy_statistics_reach_the_reward_model_actors(
    credit: str, layouts_read: list[bool]
) -> None:
    """Placement ``reward``: the policy actors stream ``PolicyStats`` from the packed logits
    (and m1 for the path of ``datc_mid``), the direction model's own unpacked pass on the
    reward-model actors gives g."""
    flags = [*RM_FLAGS, "--rollout.temperature", str(TEMPERATURE)]
    settings = {"direction": PATH_DIRECTION, "placement": "reward"}
    unpacked_credit = resolved(credit, flags, **settings)
    packed_credit = resolved(credit, [*flags, *DYNAMIC], **settings)
    assert packed_credit.requires == {"policy_stats", "reward_grad"}
    unpacked, _ = run(unpacked_credit, micro_batches(), packing=False)
    layouts_read.clear()
    packed, _ = run(packed_credit, split(DYNAMIC), packing=True)
    assert layouts_read and all(layouts_read)
    assert_same_credit(unpacked, packed)


def test_one_pass_datc_goes_through_the_reward_models_packed_forward(tmp_path: Path) -> None:
    """The one-pass path under packing: OpenRLHF's ``RewardModel`` packs the micro-batch
    itself, its input gradient comes back (1, N, d) and is scattered to the padded layout;
    the reward is OpenRLHF's packed reward exactly, and the credit equals the unpacked
    one-pass run's."""
    flags = [*RM_FLAGS, "--rollout.temperature", str(TEMPERATURE)]
    unpacked_credit = resolved("datc", flags)
    packed_credit = resolved("datc", [*flags, *DYNAMIC])
    assert unpacked_credit.one_pass and packed_credit.one_pass

    model = openrlhf_reward_model(tmp_path, torch.float32)
    stock_packed = RewardHost(copy.deepcopy(model))
    stock_packed.model.packing_samples = True
    regrouped = split(DYNAMIC)
    stock_rewards = stock_packed.run(regrouped)

    unpacked, _ = run(unpacked_credit, micro_batches(), False, RewardHost(copy.deepcopy(model)))
    packed_host = RewardHost(copy.deepcopy(model))
    packed_host.model.packing_samples = True
    embeddings: list[tuple[int, ...]] = []
    packed_host.model.get_input_embeddings().register_forward_hook(
        lambda _m, _a, out: embeddings.append(tuple(out.shape))
    )
    packed, _ = run(packed_credit, regrouped, True, packed_host)
    assert (packed_host.forwards, packed_host.backwards) == (len(regrouped), len(regrouped))
    assert all(shape[0] == 1 for shape in embeddings)  # the RM's packed forward
    assert packed_host._credit_states["reward"].direction_model is None
    for exp, want in zip(packed, stock_rewards, strict=True):
        assert torch.equal(exp.info["credit/direction_reward"], want.float())
    assert_same_credit(unpacked, packed)
