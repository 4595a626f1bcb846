"""End to end: tiny policy rollouts -> MiniLM reward + gradient -> DATC token advantages.

Once with a policy that shares MiniLM's tokenizer (the fast path), once with a byte-level
BPE policy (the bridge), once built from configuration with a rule reward.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from adapters.config import RewardSignalsConfig, build_reward_signals
from adapters.policy import response_logprobs_and_stats
from adapters.reward_models import EncoderSimilarityRM
from adapters.tiny import tiny_causal_lm
from credit_core import CreditBatch, get_strategy, group_advantages
from tests.helpers.adapters import TARGET, bpe_tokenizer, encode, minilm

pytestmark = pytest.mark.usefixtures("single_torch_thread")

G = 4
PROMPTS = ("Tell me about a dog.", "How is the weather?", "Describe the park.")


def rollout(policy: Any, tokenizer: Any, eos: int, pad: int, seed: int) -> dict[str, Any]:
    """G sampled responses per prompt; rows cut after an EOS placed at varying lengths."""
    prompts = encode(tokenizer, [p for p in PROMPTS for _ in range(G)])
    P = max(map(len, prompts))
    ids = torch.full((len(prompts), P), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, P - len(p) :], mask[b, P - len(p) :] = torch.tensor(p), 1
    torch.manual_seed(seed)
    with torch.no_grad():
        out = policy.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            top_k=0,
            top_p=1.0,
            max_new_tokens=8,
            min_new_tokens=8,
            pad_token_id=pad,
            eos_token_id=eos,
        )
    response = out[:, P:].clone()
    lengths = torch.arange(len(prompts)) % response.shape[1] + 1  # 1..8 tokens
    j = torch.arange(response.shape[1]).unsqueeze(0)
    response[j == (lengths - 1).unsqueeze(1)] = eos
    response[j >= lengths.unsqueeze(1)] = pad
    response_mask = (j < lengths.unsqueeze(1)).long()
    return {
        "input_ids": torch.cat([ids, response], dim=1),
        "attention_mask": torch.cat([mask, response_mask], dim=1),
        "prompt_ids": ids,
        "prompt_mask": mask,
        "response_ids": response,
        "response_mask": response_mask,
    }


def credit(
    policy: Any, dm: Any, r: dict[str, Any], reward: torch.Tensor | None = None
) -> dict[str, Any]:
    R = r["response_ids"].shape[1]
    with torch.no_grad():
        _, stats = response_logprobs_and_stats(
            policy, r["input_ids"], r["attention_mask"], R, reward_embedding=dm.reward_embedding
        )
    out = dm.score(
        r["prompt_ids"], r["prompt_mask"], r["response_ids"], r["response_mask"], with_grad=True
    )
    rewards = out.rewards if reward is None else reward
    adv = group_advantages(rewards, G)
    batch = CreditBatch(
        advantages=adv,
        mask=r["response_mask"].bool(),
        token_ids=r["response_ids"],
        reward_grad=out.reward_grad,
        policy_stats=stats,
    )
    return {
        "out": out,
        "adv": adv,
        "mask": batch.mask,
        "datc": get_strategy("datc").assign(batch),
        "uniform": get_strategy("uniform").assign(batch),
    }


def check_datc(c: dict[str, Any]) -> None:
    datc, uniform, adv, mask = c["datc"], c["uniform"], c["adv"], c["mask"]
    assert torch.isfinite(datc).all()
    assert torch.all(datc[~mask] == 0)
    # sign kept: every valid token has the sign of its response's advantage
    assert torch.all(torch.sign(datc[mask]) == torch.sign(adv.unsqueeze(1).expand_as(mask)[mask]))
    # per-response mean kept
    mean = datc.sum(dim=1) / mask.sum(dim=1)
    torch.testing.assert_close(mean, adv.float(), rtol=1e-5, atol=1e-6)
    # and not uniform: responses with an RM gradient at several tokens get uneven credit
    # (a response whose tokens all lack a gradient, e.g. bridge-empty ones, stays uniform)
    signal = (c["out"].reward_grad.abs().sum(dim=2) > 0) & mask
    multi = (signal.sum(dim=1) > 1) & (adv.abs() > 1e-3)
    assert multi.sum() >= len(mask) // 3  # not vacuous
    spread = (datc - uniform).abs().amax(dim=1)
    assert torch.all(spread[multi] > 1e-4 * adv.abs()[multi])


def test_minilm_reward_with_a_policy_sharing_its_tokenizer() -> None:
    model, tok = minilm()
    policy = tiny_causal_lm(
        "llama", len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id
    )
    dm = EncoderSimilarityRM(model, tok, tok, TARGET)
    assert dm.identical_vocab
    r = rollout(policy, tok, eos=tok.sep_token_id, pad=tok.pad_token_id, seed=0)
    c = credit(policy, dm, r)
    assert c["out"].reward_grad.shape == (*r["response_ids"].shape, 384)
    check_datc(c)


def test_minilm_reward_with_a_byte_level_bpe_policy_through_the_bridge() -> None:
    model, tok = minilm()
    bpe = bpe_tokenizer()
    policy = tiny_causal_lm(
        "gpt2", len(bpe), tie=False, pad_token_id=bpe.pad_token_id, eos_token_id=bpe.eos_token_id
    )
    dm = EncoderSimilarityRM(model, tok, bpe, TARGET)
    assert not dm.identical_vocab and dm.reward_embedding.shape == (len(bpe), 384)
    r = rollout(policy, bpe, eos=bpe.eos_token_id, pad=bpe.pad_token_id, seed=1)
    c = credit(policy, dm, r)
    assert "bridge/dropped_rm_tokens" in c["out"].diagnostics
    check_datc(c)


def length_reward(prompts: list[str], responses: list[str], scale: float = 1.0) -> list[float]:
    """A rule reward for the config test: characters in the response, times ``scale``."""
    return [scale * len(r) for r in responses]


def test_reward_and_direction_model_configured_apart() -> None:
    bpe = bpe_tokenizer()
    cfg = RewardSignalsConfig.model_validate(
        {
            "direction_model": {"kind": "encoder_similarity", "target_text": TARGET},
            "reward": {
                "kind": "callable",
                "function": "tests.adapters.test_e2e:length_reward",
                "kwargs": {"scale": 0.5},
            },
        }
    )
    signals = build_reward_signals(cfg, bpe)
    assert signals.direction_model is not None
    policy = tiny_causal_lm(
        "qwen2", len(bpe), pad_token_id=bpe.pad_token_id, eos_token_id=bpe.eos_token_id
    )
    r = rollout(policy, bpe, eos=bpe.eos_token_id, pad=bpe.pad_token_id, seed=2)
    args = (r["prompt_ids"], r["prompt_mask"], r["response_ids"], r["response_mask"])
    out = signals.compute(*args, with_grad=True)
    texts = bpe.batch_decode(
        [
            row[m.bool()].tolist()
            for row, m in zip(r["response_ids"], r["response_mask"], strict=True)
        ],
        skip_special_tokens=True,
    )
    torch.testing.assert_close(out.rewards, torch.tensor([0.5 * len(t) for t in texts]))
    assert out.reward_grad is not None and torch.isfinite(out.reward_grad).all()
    check_datc(credit(policy, signals.direction_model, r, reward=out.rewards))

    # without `reward`, the direction model's own reward sets the advantage, in one RM pass
    same = build_reward_signals({"direction_model": cfg.direction_model}, bpe)
    own = same.compute(*args, with_grad=False)
    assert own.reward_grad is None
    dm: Any = same.direction_model
    direct = dm.score(*args, with_grad=False)
    torch.testing.assert_close(own.rewards, direct.rewards)
    passes: list[bool] = []
    score = dm.score
    dm.score = lambda *a, with_grad: passes.append(with_grad) or score(*a, with_grad=with_grad)
    both = same.compute(*args, with_grad=True)
    assert passes == [True]  # rewards and gradient from one forward + backward
    assert both.reward_grad is not None
    torch.testing.assert_close(both.rewards, direct.rewards)


def wrong_count_reward(prompts: list[str], responses: list[str]) -> list[float]:
    """A broken rule reward: one number for the whole batch."""
    return [1.0]


def test_a_second_reward_model_can_set_the_reward_and_bad_scorers_fail_clearly() -> None:
    bpe = bpe_tokenizer()
    other = {"kind": "encoder_similarity", "target_text": "rain and clouds"}
    signals = build_reward_signals(
        {
            "direction_model": {"kind": "encoder_similarity", "target_text": TARGET},
            "reward": {"kind": "model", "model": other},
        },
        bpe,
    )
    assert signals.direction_model is not None
    scorer_model = signals.scorer.model  # type: ignore[attr-defined]
    assert scorer_model is not signals.direction_model
    r = rollout(
        tiny_causal_lm("gpt2", len(bpe)), bpe, eos=bpe.eos_token_id, pad=bpe.pad_token_id, seed=3
    )
    args = (r["prompt_ids"], r["prompt_mask"], r["response_ids"], r["response_mask"])
    out = signals.compute(*args, with_grad=True)
    torch.testing.assert_close(out.rewards, scorer_model.score(*args, with_grad=False).rewards)
    own = signals.direction_model.score(*args, with_grad=True)
    assert out.reward_grad is not None and torch.equal(out.reward_grad, own.reward_grad)
    assert not torch.allclose(out.rewards, own.rewards)

    from credit_core import CreditError

    broken = build_reward_signals(
        {"reward": {"kind": "callable", "function": "tests.adapters.test_e2e:wrong_count_reward"}},
        bpe,
    )
    with pytest.raises(CreditError, match=r"expected 12 rewards .* got shape \(1,\)"):
        broken.compute(*args, with_grad=False)
    with pytest.raises(CreditError, match="no direction model is configured"):
        broken.compute(*args, with_grad=True)


def labelled_reward(prompts: list[str], responses: list[str], labels: list[int]) -> list[float]:
    return [float(label) for label in labels]


def test_a_text_scorer_that_takes_labels_gets_one_per_row_or_a_clear_error() -> None:
    from adapters.signature import accepts_keyword

    def wants_labels(fn: object) -> bool:
        return accepts_keyword(fn, "labels", via_var_keyword=True)  # type: ignore[arg-type]

    from credit_core import CreditError

    assert wants_labels(labelled_reward) and not wants_labels(wrong_count_reward)
    bpe = bpe_tokenizer()
    signals = build_reward_signals(
        {"reward": {"kind": "callable", "function": "tests.adapters.test_e2e:labelled_reward"}}, bpe
    )
    r = rollout(
        tiny_causal_lm("gpt2", len(bpe)), bpe, eos=bpe.eos_token_id, pad=bpe.pad_token_id, seed=3
    )
    args = (r["prompt_ids"], r["prompt_mask"], r["response_ids"], r["response_mask"])
    B = args[0].shape[0]
    out = signals.compute(*args, with_grad=False, labels=list(range(B)))
    assert out.rewards.tolist() == [float(i) for i in range(B)]
    with pytest.raises(CreditError, match=f"takes labels, expected {B} .*got none"):
        signals.compute(*args, with_grad=False)
    with pytest.raises(CreditError, match=f"takes labels, expected {B} .*got 2"):
        signals.compute(*args, with_grad=False, labels=[0, 1])


def id_rewards(prompts: list[str], responses: list[str], response_ids: list[list[int]]) -> list:
    """Per-token rewards (each token's id), the first response's given with an outcome."""
    rows: list[object] = [[float(i) for i in ids] for ids in response_ids]
    rows[0] = {"outcome": -1.0, "token_rewards": rows[0]}
    return rows


def test_a_text_scorer_that_takes_response_ids_may_return_token_rewards() -> None:
    """The token ids it is given are the positions of its token rewards; the rewards are
    each response's outcome (given, or its token rewards' sum)."""
    bpe = bpe_tokenizer()
    signals = build_reward_signals(
        {"reward": {"kind": "callable", "function": "tests.adapters.test_e2e:id_rewards"}}, bpe
    )
    r = rollout(
        tiny_causal_lm("gpt2", len(bpe)), bpe, eos=bpe.eos_token_id, pad=bpe.pad_token_id, seed=3
    )
    args = (r["prompt_ids"], r["prompt_mask"], r["response_ids"], r["response_mask"])
    out = signals.compute(*args, with_grad=False)
    mask = r["response_mask"].bool()
    assert out.token_rewards is not None
    assert torch.equal(out.token_rewards.given, mask)
    ids = torch.where(mask, r["response_ids"], 0).double()
    assert torch.equal(out.token_rewards.values, ids)
    sums = ids.sum(dim=1).float()
    assert out.rewards[0] == -1.0 and torch.equal(out.rewards[1:], sums[1:])


def test_config_errors_name_the_key() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="target_txt"):
        RewardSignalsConfig.model_validate(
            {"direction_model": {"kind": "encoder_similarity", "target_txt": "x"}}
        )
    with pytest.raises(ValidationError, match="target_text: required"):
        RewardSignalsConfig.model_validate({"direction_model": {"kind": "encoder_similarity"}})
    with pytest.raises(ValidationError, match="padding_side: not a setting of kind"):
        RewardSignalsConfig.model_validate(
            {
                "direction_model": {
                    "kind": "encoder_similarity",
                    "target_text": "x",
                    "padding_side": "left",
                }
            }
        )
    with pytest.raises(ValidationError, match="function: required"):
        RewardSignalsConfig.model_validate({"reward": {"kind": "callable"}})
    with pytest.raises(ValidationError, match="reward: required when no direction_model"):
        RewardSignalsConfig.model_validate({})
    with pytest.raises(ValidationError, match="kind"):
        RewardSignalsConfig.model_validate({"direction_model": {"kind": "magic", "path": "x"}})
    with pytest.raises(ValidationError, match="unknown"):
        RewardSignalsConfig.model_validate({"reward": {"kind": "model"}, "unknown": 1})
    from credit_core import CreditError

    with pytest.raises(CreditError, match="has no attribute 'nope'"):
        build_reward_signals(
            {"reward": {"kind": "callable", "function": "tests.adapters.test_e2e:nope"}},
            bpe_tokenizer(),
        )
