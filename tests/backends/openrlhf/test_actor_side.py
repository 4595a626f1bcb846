"""What runs inside OpenRLHF's actors: layout conversions, policy statistics reduced through
OpenRLHF's own ``Actor`` wrapper, reward gradients moved to action coordinates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from adapters.policy import response_logprobs_and_stats
from adapters.tiny import tiny_causal_lm
from backends.openrlhf.actor_side import (
    ActorCreditState,
    bind_credit_methods,
    export_reward_embedding,
    import_reward_embedding,
    reduce_policy_stats,
    reward_grad_for_actions,
    signals_method,
)
from backends.openrlhf.layout import (
    action_token_ids,
    response_to_action_coords,
    split_prompt_response,
)
from credit_core import CreditError, PolicyStats
from tests.helpers.openrlhf import TinyDirectionModel, multi_turn_sample, rollout_samples

pytestmark = pytest.mark.usefixtures("single_torch_thread")

VOCAB = 97
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
RESPONSES = [[20, 21, 22, 23], [24, 25], [26], [27, 28, 29]]


def openrlhf_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A micro-batch concatenated the way OpenRLHF does it (right padding, pad id 0)."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    samples = rollout_samples(PROMPTS, RESPONSES, [0.0] * len(PROMPTS))
    batch = Experience.concat_experiences(samples, 0)
    return batch.sequences, batch.attention_mask, batch.action_mask


def adapters_batch(reward_embedding: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """The same samples in the adapters' layout, built directly from the lists."""
    P = max(map(len, PROMPTS))
    R = max(map(len, RESPONSES))
    ids = torch.zeros(len(PROMPTS), P + R, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        ids[b, P - len(p) : P] = torch.tensor(p)
        ids[b, P : P + len(r)] = torch.tensor(r)
        mask[b, P - len(p) : P + len(r)] = 1
    return ids, mask, torch.tensor(R)


def to_action_coords(values: torch.Tensor, A: int) -> torch.Tensor:
    """Response-layout (B, R, ...) values placed by hand at OpenRLHF's action columns."""
    out = values.new_zeros(values.shape[0], A, *values.shape[2:])
    for b, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        out[b, len(p) - 1 : len(p) - 1 + len(r)] = values[b, : len(r)]
    return out


def openrlhf_actor(model: torch.nn.Module, temperature: float = 1.0):  # type: ignore[no-untyped-def]
    from openrlhf.models import Actor

    actor = Actor(model, temperature=temperature)
    actor.packing_samples = False  # set by Actor.__init__ only when it loads from a path
    return actor


def test_layout_split_and_back_on_a_concatenated_openrlhf_batch() -> None:
    seqs, attn, acts = openrlhf_batch()
    assert seqs.shape == (4, 7) and acts.shape == (4, 6)
    split = split_prompt_response(seqs, attn, acts)
    expected_ids, expected_mask, R = adapters_batch()
    P = expected_ids.shape[1] - int(R)
    assert torch.equal(split.prompt_ids, expected_ids[:, :P])
    assert torch.equal(split.prompt_mask, expected_mask[:, :P])
    assert torch.equal(split.response_ids, expected_ids[:, P:])
    assert torch.equal(split.response_mask, expected_mask[:, P:])
    assert split.start.tolist() == [3, 2, 4, 1] and split.length.tolist() == [4, 2, 1, 3]
    tokens = action_token_ids(seqs, acts)
    for b, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        assert tokens[b, len(p) - 1 : len(p) - 1 + len(r)].tolist() == r
    values = torch.arange(4 * int(R) * 2, dtype=torch.float32).view(4, int(R), 2) + 1
    moved = response_to_action_coords(values, split, acts)
    assert torch.equal(moved, to_action_coords(values, acts.shape[1]))


def test_layout_multi_turn_sample_keeps_observations_in_the_response_but_out_of_actions() -> None:
    sample = multi_turn_sample([3, 4], [([30, 31], True), ([40, 41, 42], False), ([32], True)], 1.0)
    seqs, attn, acts = sample.sequences, sample.attention_mask, sample.action_mask
    split = split_prompt_response(seqs, attn, acts)
    assert split.prompt_ids.tolist() == [[3, 4]]
    assert split.response_ids.tolist() == [[30, 31, 40, 41, 42, 32]]
    values = torch.arange(1.0, 7.0).view(1, 6)
    moved = response_to_action_coords(values, split, acts)
    assert moved.tolist() == [[0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 6.0]]


def test_layout_rejects_inconsistent_shapes() -> None:
    seqs, attn, acts = openrlhf_batch()
    with pytest.raises(CreditError, match="attention_mask: expected shape"):
        split_prompt_response(seqs, attn[:, :-1], acts)
    with pytest.raises(CreditError, match="action_mask: expected shape"):
        split_prompt_response(seqs, attn, torch.ones_like(seqs))
    split = split_prompt_response(seqs, attn, acts)
    with pytest.raises(CreditError, match="values: expected leading shape"):
        response_to_action_coords(torch.zeros(4, 2), split, acts)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_actor_stats_equal_the_adapters_stats_and_openrlhf_logprobs(temperature: float) -> None:
    model = tiny_causal_lm("qwen2", VOCAB, seed=1)
    E = torch.randn(VOCAB, 6, generator=torch.Generator().manual_seed(2))
    seqs, attn, acts = openrlhf_batch()
    actor = openrlhf_actor(model, temperature)
    stats = reduce_policy_stats(actor, seqs, acts, attn, E, chunk_size=32)
    ids, mask, R = adapters_batch()
    with torch.no_grad():
        logp, expected = response_logprobs_and_stats(
            model, ids, mask, int(R), temperature=temperature, reward_embedding=E, chunk_size=32
        )
    assert expected is not None
    A = acts.shape[1]
    for name in ("p_sampled", "p_sq", "m1", "m2", "sampled_emb"):
        want = to_action_coords(getattr(expected, name), A)
        torch.testing.assert_close(getattr(stats, name), want, rtol=1e-5, atol=1e-6)
    # OpenRLHF's own action log-probs from the same forward: p_sampled = exp(log p).
    with torch.no_grad():
        openrlhf_logp = actor(seqs, acts, attn)
    on = acts.bool()
    torch.testing.assert_close(stats.p_sampled[on], openrlhf_logp[on].exp(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(to_action_coords(logp, A)[on], openrlhf_logp[on])
    assert float(stats.m1[~on].abs().max()) == 0.0


def test_actor_stats_in_bf16_as_openrlhf_loads_a_policy(tmp_path: Path) -> None:
    """OpenRLHF's Actor loads bf16/fp16 weights only; the stats follow its float32 logits."""
    from openrlhf.models import Actor

    tiny_causal_lm("llama", VOCAB, seed=3).save_pretrained(tmp_path)
    actor = Actor(str(tmp_path), attn_implementation="eager", param_dtype="bf16")
    assert next(actor.parameters()).dtype == torch.bfloat16
    E = torch.randn(VOCAB, 4, generator=torch.Generator().manual_seed(4))
    seqs, attn, acts = openrlhf_batch()
    stats = reduce_policy_stats(actor, seqs, acts, attn, E, chunk_size=40)
    ids, mask, R = adapters_batch()
    with torch.no_grad():
        _, expected = response_logprobs_and_stats(
            actor.model, ids, mask, int(R), reward_embedding=E
        )
    assert expected is not None
    for name in ("p_sampled", "p_sq", "m1", "m2"):
        want = to_action_coords(getattr(expected, name), acts.shape[1])
        torch.testing.assert_close(getattr(stats, name), want, rtol=0.05, atol=2e-3)
    with torch.no_grad():
        openrlhf_logp = actor(seqs, acts, attn)
    on = acts.bool()
    torch.testing.assert_close(stats.p_sampled[on], openrlhf_logp[on].exp(), rtol=1e-5, atol=1e-7)


def test_actor_stats_of_packed_samples_equal_the_unpacked_ones() -> None:
    """``--ds.packing_samples``: the ``Actor`` packs the micro-batch into one row (logits
    (1, N, V)); the statistics read each sample's rows of it and equal the unpacked ones."""
    seqs, attn, acts = openrlhf_batch()
    assert bool((attn == 0).any())  # padding: the packed row differs from the padded batch
    actor = openrlhf_actor(tiny_causal_lm("qwen2", VOCAB, seed=5), temperature=0.8)
    actor.model.config.use_cache = False  # as Actor.__init__ sets it when it loads a model
    actor.eval()
    table = torch.randn(VOCAB, 3, generator=torch.Generator().manual_seed(6))
    want = reduce_policy_stats(actor, seqs, acts, attn, table)
    actor.packing_samples = True
    with torch.no_grad():
        _, output = actor(seqs, acts, attn, return_output=True)
    assert tuple(output["logits"].shape) == (1, int(attn.sum()), VOCAB)
    got = reduce_policy_stats(actor, seqs, acts, attn, table)
    for name in ("p_sampled", "p_sq", "m1", "m2", "sampled_emb"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-6)
    assert float(want.m1[acts.bool()].abs().min()) > 0.0


def test_actor_stats_reject_foreign_vocabularies() -> None:
    model = tiny_causal_lm("gpt2", VOCAB, seed=5)
    seqs, attn, acts = openrlhf_batch()
    actor = openrlhf_actor(model)
    with pytest.raises(CreditError, match="indexed by the policy vocabulary"):
        reduce_policy_stats(actor, seqs, acts, attn, torch.zeros(VOCAB + 1, 3))


def test_reward_grad_lands_on_the_action_tokens() -> None:
    rm = TinyDirectionModel(VOCAB, dim=5, seed=6)
    seqs, attn, acts = openrlhf_batch()
    grad, reward = reward_grad_for_actions(rm, seqs, attn, acts)
    ids, mask, R = adapters_batch()
    P = ids.shape[1] - int(R)
    out = rm.score(ids[:, :P], mask[:, :P], ids[:, P:], mask[:, P:], with_grad=True)
    torch.testing.assert_close(reward, out.rewards)
    torch.testing.assert_close(grad, to_action_coords(out.reward_grad, acts.shape[1]))
    assert grad.shape == (4, acts.shape[1], 5)
    assert float(grad[~acts.bool()].abs().max()) == 0.0


class FakeActor:
    """An object standing in for a Ray actor instance (what ``__ray_call__`` receives)."""

    def __init__(self) -> None:
        self.actor = openrlhf_actor(tiny_causal_lm("llama", VOCAB, seed=7))
        self.strategy = None


def test_bound_signals_method_runs_like_an_actor_method() -> None:
    """What OpenRLHF's ``execute_batch`` does with it: getattr by name + keyword call."""
    host = FakeActor()
    rm = TinyDirectionModel(VOCAB, dim=3, seed=8)
    state = ActorCreditState(
        computes=frozenset({"policy_stats", "reward_grad"}),
        direction={"kind": "module", "factory": "x:y"},
        tokenizer=None,
        stats_chunk_size=16,
        direction_model=rm,
    )
    where = bind_credit_methods(host, "policy", state)
    assert where.startswith("FakeActor@")
    seqs, attn, acts = openrlhf_batch()
    method = getattr(host, signals_method("policy"))
    signals = method(sequences=seqs, action_mask=acts, attention_mask=attn)
    assert isinstance(signals.policy_stats, PolicyStats)
    assert signals.policy_stats.m1.shape == (4, acts.shape[1], 3)
    assert signals.reward_grad is not None and signals.reward_grad.shape == (4, acts.shape[1], 3)
    assert signals.direction_reward is not None and signals.direction_reward.shape == (4,)
    assert host.actor.training  # restored after the eval-mode forward
    # the values: what the two reductions give when called directly
    host.actor.eval()
    want = reduce_policy_stats(host.actor, seqs, acts, attn, rm.reward_embedding, chunk_size=16)
    host.actor.train()
    grad, reward = reward_grad_for_actions(rm, seqs, attn, acts)
    torch.testing.assert_close(signals.policy_stats.m1, want.m1)
    torch.testing.assert_close(signals.policy_stats.p_sampled, want.p_sampled)
    torch.testing.assert_close(signals.reward_grad, grad)
    torch.testing.assert_close(signals.direction_reward, reward)


def test_reward_role_shares_its_embedding_with_the_policy_role() -> None:
    policy_host, reward_host = FakeActor(), FakeActor()
    rm = TinyDirectionModel(VOCAB, dim=4, seed=9)
    bind_credit_methods(
        reward_host,
        "reward",
        ActorCreditState(frozenset({"reward_grad"}), {"kind": "module"}, None, 16, rm),
    )
    bind_credit_methods(
        policy_host, "policy", ActorCreditState(frozenset({"policy_stats"}), None, None, 16)
    )
    seqs, attn, acts = openrlhf_batch()
    with pytest.raises(CreditError, match="was not shared with this actor"):
        policy_host.credit_policy_signals(sequences=seqs, action_mask=acts, attention_mask=attn)  # type: ignore[attr-defined]
    import_reward_embedding(policy_host, export_reward_embedding(reward_host))
    stats = policy_host.credit_policy_signals(
        sequences=seqs, action_mask=acts, attention_mask=attn
    ).policy_stats  # type: ignore[attr-defined]
    reward = reward_host.credit_reward_signals(
        sequences=seqs, action_mask=acts, attention_mask=attn
    )  # type: ignore[attr-defined]
    assert stats is not None and reward.policy_stats is None and reward.reward_grad is not None
    assert stats.sampled_emb.shape[2] == reward.reward_grad.shape[2] == 4
    on = acts.bool()  # the policy side reads the reward side's own table
    shared = rm.reward_embedding[action_token_ids(seqs, acts)]
    assert torch.equal(stats.sampled_emb[on], shared[on].to(stats.sampled_emb.dtype))
    with pytest.raises(CreditError, match="has no 'reward' credit state"):
        export_reward_embedding(policy_host)


def test_a_narrower_embedding_table_is_padded_to_the_lm_head_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The RM table has fewer rows than the policy's head (a padded vocabulary): it is
    padded the first time, and every later micro-batch reads that same (V, d) table."""
    from backends.openrlhf import actor_side

    host = FakeActor()
    rm = TinyDirectionModel(VOCAB - 7, dim=3, seed=8)
    state = ActorCreditState(frozenset({"policy_stats"}), None, None, 16)
    bind_credit_methods(host, "policy", state)
    import_reward_embedding(host, rm.reward_embedding)
    tables: list[torch.Tensor] = []
    stats_from_logits = actor_side.stats_from_logits

    def recording(*args: Any, **kwargs: Any) -> Any:
        tables.append(args[4])
        return stats_from_logits(*args, **kwargs)

    monkeypatch.setattr(actor_side, "stats_from_logits", recording)
    seqs, attn, acts = openrlhf_batch()
    for _ in range(2):
        host.credit_policy_signals(sequences=seqs, action_mask=acts, attention_mask=attn)  # type: ignore[attr-defined]
    first, second = tables
    assert first.shape == (VOCAB, 3) and second is first
    torch.testing.assert_close(first[: VOCAB - 7], rm.reward_embedding)
    assert not first[VOCAB - 7 :].any()


def test_reward_grad_from_an_adapters_seq_classification_model(tmp_path: Path) -> None:
    """The real ``DirectionModel`` an OpenRLHF run builds by default (RM folder as a one-label
    sequence classifier, policy tokenizer), scored through the OpenRLHF layout."""
    from adapters.config import build_direction_model
    from adapters.tiny import tiny_seq_classifier, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(vocab_size=300)
    tiny_seq_classifier("llama", len(tokenizer), hidden=16, seed=10).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    rm = build_direction_model({"kind": "seq_classification", "path": str(tmp_path)}, tokenizer)
    seqs, attn, acts = openrlhf_batch()
    seqs = seqs + 40  # real text tokens (ids 0 and 1 are the special tokens)
    grad, reward = reward_grad_for_actions(rm, seqs, attn, acts)
    ids, mask, R = adapters_batch()
    ids = torch.where(mask.bool(), ids + 40, 1)
    P = ids.shape[1] - int(R)
    out = rm.score(ids[:, :P], mask[:, :P], ids[:, P:], mask[:, P:], with_grad=True)
    assert out.reward_grad is not None
    torch.testing.assert_close(reward, out.rewards)
    torch.testing.assert_close(grad, to_action_coords(out.reward_grad, acts.shape[1]))
    assert float(grad[acts.bool()].abs().sum()) > 0.0
