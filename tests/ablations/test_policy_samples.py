"""The step-0 policy-sample fit (ablations/policy_samples.py): the correlation and pair
accuracy against loops, the entropy of a uniform policy is log V, the RM's fit is measured on
the rows the exact rule scored, and building it leaves the global random state alone."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from ablations import word_tasks
from ablations.policy_samples import draw_samples, pair_accuracy, pearson, sample_fit
from ablations.pretrain import PretrainConfig, pretrain_policy
from ablations.rm_train import RMTrainConfig, train_reward_model
from adapters.config import build_direction_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

WORDS = word_tasks.target_words()
TARGETS = set(word_tasks.CATEGORIES[word_tasks.TARGET_CATEGORY])
PROMPTS = ["cat dog red rain :", "sun the blue cat :", "dog dog red sun :"]


def brute_pair_accuracy(m: list[float], e: list[float], g: list[int]) -> float:
    pairs = [
        (i, j) for i in range(len(m)) for j in range(i + 1, len(m)) if g[i] == g[j] and e[i] != e[j]
    ]
    if not pairs:
        return math.nan
    agree = sum((m[i] > m[j]) == (e[i] > e[j]) and m[i] != m[j] for i, j in pairs)
    return agree / len(pairs)


@given(seed=st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_pair_accuracy_and_correlation_are_the_formulas(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    m = [float(rng.randint(0, 3)) for _ in range(n)]  # ties in the model count as wrong
    e = [float(rng.randint(0, 2)) for _ in range(n)]
    g = [rng.randint(0, 2) for _ in range(n)]
    got = pair_accuracy(torch.tensor(m), torch.tensor(e), torch.tensor(g))
    want = brute_pair_accuracy(m, e, g)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)
    x, y = torch.tensor(m, dtype=torch.float64), torch.tensor(e, dtype=torch.float64)
    if float(x.std()) > 0 and float(y.std()) > 0:
        assert pearson(x, y) == pytest.approx(float(torch.corrcoef(torch.stack([x, y]))[0, 1]))
    else:
        assert math.isnan(pearson(x, y))


def target_count(prompts: list[str], responses: list[str]) -> list[float]:
    return [float(sum(w in TARGETS for w in r.split())) for r in responses]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny policy with a zero LM head (the uniform distribution) and a tiny RM."""
    root = tmp_path_factory.mktemp("sample_fit")
    texts = [f"{p} {' '.join(random.Random(i).choices(WORDS, k=8))}" for i, p in enumerate(PROMPTS)]
    policy = root / "policy"
    pretrain_policy(
        policy,
        family="llama",
        tokenizer=word_tasks.word_tokenizer(WORDS),
        texts=texts,
        cfg=PretrainConfig(steps=2, batch_size=2),
    )
    weights = load_file(str(policy / "model.safetensors"))
    heads = [k for k in weights if k.startswith("lm_head")] or ["model.embed_tokens.weight"]
    for k in heads:  # tied or not: every logit 0
        weights[k] = torch.zeros_like(weights[k])
    save_file(weights, str(policy / "model.safetensors"), metadata={"format": "pt"})
    rm = root / "rm"
    examples = [
        (PROMPTS[0], " ".join(random.Random(i).choices(WORDS, k=8)), 0.1 * i) for i in range(16)
    ]
    train_reward_model(
        rm,
        rm_tokenizer=word_tasks.word_tokenizer(WORDS, pair_template=True),
        train_examples=examples,
        test_examples=examples,
        cfg=RMTrainConfig(examples=16, steps=2, batch_size=8, hidden=16),
    )
    return policy, rm


def test_sample_fit_of_a_uniform_policy_on_its_own_rows(models: tuple[Path, Path]) -> None:
    policy, rm = models
    reward = {"direction_model": {"kind": "seq_classification", "path": str(rm)}}
    kw = {"samples_per_prompt": 4, "max_new_tokens": 10, "seed": 3}
    state = torch.random.get_rng_state()
    fit = sample_fit(policy, reward, target_count, PROMPTS, **kw)
    assert torch.equal(torch.random.get_rng_state(), state)
    vocab = len(WORDS) + len(word_tasks.SPECIALS)
    assert fit.samples == 12
    assert fit.log_vocab == pytest.approx(math.log(vocab))
    assert fit.entropy == pytest.approx(math.log(vocab), abs=1e-5)  # zero logits: uniform
    # the same draws, each row scored alone (its own unpadded tensors) by the RM and the rule
    drawn = draw_samples(policy, PROMPTS, **kw)
    b = drawn.batch
    dm = build_direction_model(reward["direction_model"], drawn.tokenizer)
    rm_scores, exact = [], []
    for i in range(b.size):
        p_ids = b.prompt_ids[i : i + 1, b.prompt_mask[i]]
        r_ids = b.response_ids[i : i + 1, b.response_mask[i]]
        out = dm.score(
            p_ids,
            torch.ones_like(p_ids, dtype=torch.bool),
            r_ids,
            torch.ones_like(r_ids, dtype=torch.bool),
            with_grad=False,
        )
        rm_scores.append(float(out.rewards[0]))
        text = drawn.tokenizer.decode(r_ids[0], skip_special_tokens=True)
        exact.append(float(sum(w in TARGETS for w in text.split())))
    assert fit.exact_mean == pytest.approx(sum(exact) / b.size)
    groups = b.group.tolist()
    assert fit.rm_pair_accuracy == pytest.approx(brute_pair_accuracy(rm_scores, exact, groups))
    x, y = torch.tensor(rm_scores, dtype=torch.float64), torch.tensor(exact, dtype=torch.float64)
    # the batched pass pads, the brute force does not: float32 differences of the scores,
    # enlarged by their small spread on a uniform policy's samples (corr near 0)
    assert fit.rm_corr == pytest.approx(float(torch.corrcoef(torch.stack([x, y]))[0, 1]), abs=1e-4)
    assert sample_fit(policy, reward, target_count, PROMPTS, **kw) == fit


def test_sample_fit_needs_prompts_and_a_direction_model(models: tuple[Path, Path]) -> None:
    policy, rm = models
    reward = {"direction_model": {"kind": "seq_classification", "path": str(rm)}}
    with pytest.raises(ValueError, match="at least one prompt"):
        sample_fit(policy, reward, target_count, [], samples_per_prompt=2, max_new_tokens=4, seed=0)
    with pytest.raises(ValueError, match="no direction_model"):
        sample_fit(
            policy, {}, target_count, PROMPTS, samples_per_prompt=2, max_new_tokens=4, seed=0
        )
