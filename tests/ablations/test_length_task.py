"""Setting 9 (``length_sweep``): the span-product rule against brute force, that it does not
decompose over prefixes, the swap credit of the probes, the named settings of one kind in an
ablation config, and the setting's offline build (ablations/length_task.py)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import torch

from ablations import length_task, sparse_tasks, word_tasks
from ablations.ablation_config import AblateConfig
from ablations.credit_probes import exact_token_credit
from ablations.settings import SETTINGS
from adapters.config import build_direction_model
from backends.common.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_torch_thread")

WORDS = word_tasks.target_words()
IDS = sparse_tasks.word_ids(WORDS)
VOCAB = len(IDS)
TARGETS = set(word_tasks.CATEGORIES[word_tasks.TARGET_CATEGORY])
HIT, MISS = "rain", "the"  # a target word, another word


def _brute(words: list[str], response_len: int) -> float:
    """The rule written out: the product of the two spans' target counts over 4."""
    f = [1 / 8, 3 / 8, 5 / 8, 7 / 8]
    at = [int(x * response_len) for x in f]
    hit = [t < len(words) and words[t] in TARGETS for t in at]
    return (hit[0] + hit[1]) * (hit[2] + hit[3]) / 4


def _with(response_len: int, decisive: dict[int, str], fill: str = MISS) -> list[str]:
    words = [fill] * response_len
    for i, w in decisive.items():
        words[length_task.decisive_positions(response_len)[i]] = w
    return words


@pytest.mark.parametrize("length", length_task.SWEEP_LENGTHS)
def test_the_rule_is_the_product_of_the_two_span_counts(length: int) -> None:
    assert length_task.decisive_positions(length) == tuple(length * k // 8 for k in (1, 3, 5, 7))
    # every assignment of hit/miss to the 4 decisive positions, the other positions all
    # target words ("sun"), which never count
    for pattern in itertools.product([HIT, MISS], repeat=4):
        words = _with(length, dict(enumerate(pattern)), fill="sun")
        c_a, c_b = sum(w == HIT for w in pattern[:2]), sum(w == HIT for w in pattern[2:])
        assert length_task.span_product(" ".join(words), length) == c_a * c_b / 4
    rng = random.Random(length)
    for _ in range(200):  # random responses, some cut short, against the written-out rule
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, length))]
        assert length_task.span_product(" ".join(words), length) == _brute(words, length)
    assert length_task.span_checker(
        ["x :"], [" ".join(_with(length, {0: HIT, 3: HIT}))], length
    ) == [0.25]
    with pytest.raises(ValueError, match="as many prompts"):
        length_task.span_checker([], ["rain"], length)
    with pytest.raises(ValueError, match="response_len must be >= 8"):
        length_task.decisive_positions(7)


def test_the_rule_does_not_decompose_over_tokens_or_prefixes() -> None:
    L = 96
    r = length_task.span_product
    a, b = _with(L, {0: HIT, 1: HIT}), _with(L, {2: HIT, 3: HIT})
    half = L // 2
    # for any r(y) = sum_t V_t[y_t], swapping the second halves of two responses keeps the
    # pair's total, since every (position, token) stays in the pair; here it does not
    assert r(" ".join(a), L) + r(" ".join(b), L) == 0.0
    assert r(" ".join(a[:half] + b[half:]), L) + r(" ".join(b[:half] + a[half:]), L) == 1.0
    # the value of span A's token depends on the tokens after it: no prefix decomposition
    full = _with(L, {0: HIT, 2: HIT})
    first_b = length_task.decisive_positions(L)[2]
    prefix_scores = [r(" ".join(full[: t + 1]), L) for t in range(L)]
    assert set(prefix_scores[:first_b]) == {0.0}  # every prefix before span B scores 0 ...
    with_hit = r(" ".join(full), L)
    without = r(" ".join(_with(L, {2: HIT})), L)
    assert with_hit - without == 0.25  # ... though span A's hit is worth 1/4 of the reward


@pytest.mark.parametrize("length", [24, 96])
def test_swap_credit_is_the_rule_with_one_token_replaced(length: int) -> None:
    rng = random.Random(1)
    rule = length_task.SpanSwapRule(IDS, length)
    responses = [[rng.choice([HIT, MISS, "sun", "cat"]) for _ in range(length)] for _ in range(4)]
    ids = torch.tensor([[IDS[w] for w in r] for r in responses])
    v = rule.values(["x :"] * 4, ids, VOCAB)
    assert v.shape == (4, length, VOCAB) and v.dtype == torch.float64
    for b, response in enumerate(responses):
        for t in range(length):
            for word in (HIT, MISS, "sun", "bread"):
                swapped = list(response)
                swapped[t] = word
                want = length_task.span_product(" ".join(swapped), length)
                assert v[b, t, IDS[word]].item() == want, (b, t, word)
    # exact credit is zero away from the decisive positions, whatever the policy
    probs = torch.softmax(torch.randn(4, length, VOCAB, dtype=torch.float64), dim=2)
    c = exact_token_credit(v, probs, ids, torch.ones(4, length, dtype=torch.bool))
    decisive = list(length_task.decisive_positions(length))
    off = torch.ones(length, dtype=torch.bool)
    off[decisive] = False
    assert c[:, off].abs().max().item() < 1e-12
    assert c[:, decisive].abs().max().item() > 0.0


def test_swap_credit_of_short_rows_and_bad_inputs() -> None:
    rule = length_task.SpanSwapRule(IDS, 24)
    ids = torch.tensor([[IDS[HIT]] * 10])  # cut short before span B: r = 0 everywhere but B
    v = rule.values(["x :"], ids, VOCAB)
    assert v.shape == (1, 10, VOCAB)
    assert v.abs().max().item() == 0.0  # span B is past the end: c_B = 0 for every swap
    with pytest.raises(ValueError, match="2 prompts for response_ids of 1 rows"):
        rule.values(["x :"] * 2, ids, VOCAB)
    with pytest.raises(ValueError, match="SpanSwapRule: response_ids hold ids >= vocab"):
        rule.values(["x :"], ids, IDS[HIT])


def test_rm_examples_cover_every_reward_level() -> None:
    examples = length_task.span_rm_examples(["a b c d :"], 600, seed=0, response_len=96)
    assert {s for _, _, s in examples} == {0.0, 0.25, 0.5, 1.0}
    assert all(s == length_task.span_product(r, 96) for _, r, s in examples)
    assert any(len(r.split()) < 96 for _, r, _ in examples)  # some cut short


def _sweep_config(**extra: object) -> dict[str, object]:
    return {
        "strategies": ["uniform", "datc"],
        "settings": {
            "sweep_24": {"kind": "length_sweep", "params": {"response_len": 24}},
            "sweep_192": {"kind": "length_sweep", "params": {"response_len": 192}},
            **extra,
        },
    }


def test_a_config_names_several_settings_of_the_length_sweep_kind() -> None:
    from ablations.results import RunKey
    from ablations.runner import run_fingerprint

    cfg = AblateConfig.model_validate(_sweep_config())
    assert cfg.setting_kind("sweep_192") is SETTINGS["length_sweep"]
    assert cfg.setting_params("sweep_192").response_len == 192
    assert cfg.setting_title("sweep_24").startswith("9. length sweep, 24 words")
    assert cfg.setting_title("sweep_192").startswith("9. length sweep, 192 words")
    assert "(sweep_24)" not in cfg.setting_title("sweep_24")
    a, b = (RunKey(s, "llama", "datc", 0) for s in ("sweep_24", "sweep_192"))
    assert run_fingerprint(cfg, a) != run_fingerprint(cfg, b)
    with pytest.raises(ValueError, match=r"unknown settings \['chess'\]"):
        AblateConfig.model_validate(_sweep_config(x={"kind": "chess"}))
    bad = _sweep_config()
    bad["settings"]["sweep_24"]["params"]["pretrain"] = {"max_len": 29}  # type: ignore[index]
    with pytest.raises((ValueError, ConfigError), match=r"pretrain\.max_len: 29 cuts"):
        AblateConfig.model_validate(bad)


def test_settings_that_differ_only_in_the_direction_model_get_their_names_in_the_title() -> None:
    cfg = AblateConfig.model_validate(
        _sweep_config(
            proxy_24={"kind": "length_sweep", "params": {"response_len": 24, "rm_proxy": 0.5}}
        )
    )
    assert cfg.setting_title("sweep_24").endswith(" (sweep_24)")
    assert cfg.setting_title("proxy_24").endswith(" (proxy_24)")
    assert cfg.setting_title("sweep_24").startswith("9. length sweep, 24 words")
    assert not cfg.setting_title("sweep_192").endswith(")")


def test_the_setting_builds_offline_with_the_exact_rule_as_reward(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    kind = SETTINGS["length_sweep"]
    assert kind.primary == "eval_reward_sampled"
    params = kind.params.model_validate(
        {
            "response_len": 96,
            "num_train": 16,
            "num_held_out": 4,
            "num_pretrain": 16,
            "pretrain": {"steps": 2, "batch_size": 4, "max_len": 102},
            "rm": {"examples": 32, "steps": 2, "batch_size": 8, "hidden": 16},
        }
    )
    assets = kind.build(params, "gpt2", tmp_path)
    assert assets.train == {"rollout": {"max_new_tokens": 96}}
    assert assets.reward["reward"] == {
        "kind": "callable",
        "function": "ablations.length_task:span_checker",
        "kwargs": {"response_len": 96},
    }
    assert assets.info["decisive positions"] == [12, 36, 60, 84]
    assert isinstance(assets.token_rule, length_task.SpanSwapRule)
    assert assets.token_rule.response_len == 96
    tok = AutoTokenizer.from_pretrained(assets.policy_dir / "tokenizer", local_files_only=True)
    dm = build_direction_model(assets.reward["direction_model"], tok, policy_vocab_size=VOCAB)
    response = torch.tensor([[IDS[w] for w in _with(96, {0: HIT, 2: HIT})]])
    prompt = torch.tensor([[IDS[w] for w in ["cat", "dog", "red", "rain", ":"]]])
    out = dm.score(
        prompt, torch.ones_like(prompt), response, torch.ones_like(response), with_grad=True
    )
    assert out.reward_grad is not None and out.reward_grad.shape == (1, 96, dm.embed_dim)
    assert assets.info["rm_fit"]["test_mse"] >= 0.0
