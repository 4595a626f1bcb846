"""Setting 8 (``preference``): the hidden two-span rule, the noisy labeller, the
Bradley-Terry reward model and its held-out accuracy, the swap credit of the probes
(ablations/preference_task.py, ablations/rm_train.py), and the setting's offline build."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from ablations import preference_task, sparse_tasks, word_tasks
from ablations.rm_train import RMTrainConfig, train_preference_model
from ablations.settings import SETTINGS
from adapters.config import build_direction_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

WORDS = word_tasks.target_words()
IDS = sparse_tasks.word_ids(WORDS)
VOCAB = len(IDS)
L, H = preference_task.RESPONSE_WORDS, preference_task.HALF


def _ids(text: str) -> torch.Tensor:
    return torch.tensor([[IDS[w] for w in text.split()]])


def _response(first: int, second: int, *, swap_halves: bool = False) -> str:
    """``first`` weather words in the first half, ``second`` animals in the second."""
    a = ["rain"] * first + ["the"] * (H - first)
    b = ["cat"] * second + ["the"] * (H - second)
    return " ".join([*b, *a] if swap_halves else [*a, *b])


def test_the_hidden_rule_is_the_smaller_span_count_and_not_a_sum() -> None:
    assert preference_task.hidden_score(_response(3, 5)) == 3 / H
    assert preference_task.hidden_score(_response(5, 3)) == 3 / H
    assert preference_task.hidden_score(_response(6, 0)) == 0.0  # one span alone is worth 0
    assert preference_task.hidden_score(_response(4, 4, swap_halves=True)) == 0.0  # wrong halves
    assert preference_task.hidden_score(" ".join(["rain"] * H)) == 0.0  # cut short
    # not additive over positions: swapping second halves keeps every (position, token) of the
    # pair but changes the total, which no per-position sum allows
    a, b = _response(4, 0).split(), _response(0, 4).split()
    mixed_ab, mixed_ba = " ".join(a[:H] + b[H:]), " ".join(b[:H] + a[H:])
    h = preference_task.hidden_score
    assert h(" ".join(a)) + h(" ".join(b)) == 0.0
    assert h(mixed_ab) + h(mixed_ba) == 4 / H
    assert preference_task.hidden_scorer(["x :"], [_response(2, 2)]) == [2 / H]
    with pytest.raises(ValueError, match="as many prompts"):
        preference_task.hidden_scorer([], ["rain"])


def test_the_labeller_prefers_by_the_hidden_rule_with_logistic_noise() -> None:
    pairs = preference_task.preference_pairs(["a b c d :"], 4000, seed=0, temperature=0.05)
    gaps = [
        preference_task.hidden_score(p.chosen) - preference_task.hidden_score(p.rejected)
        for p in pairs
    ]
    decided = [g for g in gaps if g != 0]
    agree = sum(g > 0 for g in decided) / len(decided)
    # the expected agreement under P(chosen) = sigmoid(|dh| / T), from the same pairs
    expected = sum(1 / (1 + math.exp(-abs(g) / 0.05)) for g in decided) / len(decided)
    assert agree == pytest.approx(expected, abs=0.03)
    assert 0.6 < agree < 0.99  # noisy, but informative
    with pytest.raises(ValueError, match="temperature must be > 0"):
        preference_task.preference_pairs(["a :"], 1, seed=0, temperature=0.0)


def test_rule_agreement_counts_only_pairs_the_rule_orders() -> None:
    pairs = [
        preference_task.PreferencePair("x :", _response(3, 3), _response(1, 1)),
        preference_task.PreferencePair("x :", _response(1, 1), _response(3, 3)),
        preference_task.PreferencePair("x :", _response(2, 0), _response(0, 2)),  # tie: skipped
    ]
    assert preference_task.rule_agreement(pairs, [(1.0, 0.0), (1.0, 0.0), (0.0, 9.0)]) == 0.5


def test_a_bradley_terry_model_learns_the_preferences(tmp_path: Path) -> None:
    prompts = ["a b c d :"]
    train = preference_task.preference_pairs(prompts, 512, seed=1, temperature=0.02)
    test = preference_task.preference_pairs(prompts, 128, seed=2, temperature=0.02)
    cfg = RMTrainConfig(steps=120, batch_size=32, hidden=32)
    fit, scores = train_preference_model(
        tmp_path,
        rm_tokenizer=word_tasks.word_tokenizer(WORDS, pair_template=True),
        train_pairs=[(p.prompt, p.chosen, p.rejected) for p in train],
        test_pairs=[(p.prompt, p.chosen, p.rejected) for p in test],
        cfg=cfg,
    )
    assert len(scores) == len(test)
    assert fit["train_bt_loss"] < math.log(2)  # below chance
    assert fit["test_label_accuracy"] == pytest.approx(sum(c > r for c, r in scores) / len(scores))
    assert preference_task.rule_agreement(test, scores) > 0.7
    assert (tmp_path / "model.safetensors").exists()


def _brute_swap(response: list[str], t: int, word: str) -> float:
    swapped = list(response)
    swapped[t] = word
    return preference_task.hidden_score(" ".join(swapped))


def test_swap_credit_is_the_hidden_score_with_one_token_replaced() -> None:
    rng = random.Random(0)
    rule = preference_task.PreferenceSwapRule(IDS)
    responses = [preference_task.draw_response(rng, 0.3, 0.3).split() for _ in range(3)]
    ids = torch.tensor([[IDS[w] for w in r] for r in responses])
    v = rule.values(["x :"] * 3, ids, VOCAB)
    assert v.shape == (3, L, VOCAB) and v.dtype == torch.float64
    for b, response in enumerate(responses):
        for t in range(0, L, 5):
            for word in ("rain", "cat", "the", "bread"):
                assert v[b, t, IDS[word]].item() == pytest.approx(_brute_swap(response, t, word))
    with pytest.raises(ValueError, match="2 prompts for response_ids of 3 rows"):
        rule.values(["x :"] * 2, ids, VOCAB)
    with pytest.raises(ValueError, match="PreferenceSwapRule: response_ids hold ids >= vocab"):
        rule.values(["x :"] * 3, ids, int(ids.max()))


def test_the_setting_builds_offline_and_reports_the_hidden_rule(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    kind = SETTINGS["preference"]
    assert kind.primary == "extra_hidden_score_sampled"
    params = kind.params.model_validate(
        {
            "num_train": 16,
            "num_held_out": 4,
            "num_pretrain": 32,
            "pretrain": {"steps": 2, "batch_size": 4},
            "rm": {"examples": 32, "steps": 2, "batch_size": 8, "hidden": 16},
        }
    )
    assets = kind.build(params, "llama", tmp_path)
    assert assets.train == {"rollout": {"max_new_tokens": L}}
    assert list(assets.extra_eval) == ["hidden_score"]
    fit = assets.info["preference_fit"]
    assert set(fit) == {"train_bt_loss", "test_label_accuracy", "test_rule_accuracy"}
    tok = AutoTokenizer.from_pretrained(assets.policy_dir / "tokenizer", local_files_only=True)
    dm = build_direction_model(assets.reward["direction_model"], tok, policy_vocab_size=VOCAB)
    response, prompt = _ids(_response(2, 3)), _ids("cat dog red rain :")
    out = dm.score(
        prompt, torch.ones_like(prompt), response, torch.ones_like(response), with_grad=True
    )
    assert out.reward_grad is not None and out.reward_grad.shape == (1, L, dm.embed_dim)
