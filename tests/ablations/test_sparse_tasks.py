"""The sparse-credit settings (5 ``positional_sparse``, 6 ``keyword_sparse``) and the exact
per-token rules of the probed settings (``ablations.sparse_tasks``).

- Exact scores and exact token credit on literal examples (hand-computed).
- Each rule is the exact decomposition of its score: sum_t V_t[y_t] equals the target-token
  score, the keyword score and the positional RM's reward on sampled responses.
- Both sparse settings build offline with tiny sizes; their reward sections build a
  direction model whose reward is the rule's (setting 5) / is trained on it (setting 6).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ablations import sparse_tasks, word_tasks
from ablations.credit_probes import exact_token_credit
from ablations.settings import SETTINGS
from adapters.config import build_direction_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

WORDS = word_tasks.target_words()
IDS = sparse_tasks.word_ids(WORDS)
VOCAB = len(IDS)


def _ids(text: str) -> torch.Tensor:
    return torch.tensor([[IDS[w] for w in text.split()]])


def test_keyword_score_on_literal_examples() -> None:
    filler = ["the"] * 24
    assert sparse_tasks.keyword_score(" ".join(filler)) == 0.0
    words = list(filler)
    words[2], words[9], words[5] = "rain", "snow", "fog"  # position 5 is not scored
    assert sparse_tasks.keyword_score(" ".join(words)) == pytest.approx(2 / 3)
    assert sparse_tasks.keyword_score("the the rain") == pytest.approx(1 / 3)  # cut short
    assert sparse_tasks.keyword_scorer(["a :"], ["cat dog sun"]) == [pytest.approx(1 / 3)]


def test_exact_token_credit_of_the_rules_on_literal_examples() -> None:
    response = "the cat rain dog"  # rain at scored position 2
    ids = _ids(response)
    probs = torch.full((1, 4, VOCAB), 1.0 / VOCAB, dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    p_target = 8 / VOCAB  # 8 weather words, uniform policy
    keyword = sparse_tasks.keyword_rule().values(["a :"], ids, VOCAB)
    c = exact_token_credit(keyword, probs, ids, mask)
    torch.testing.assert_close(
        c, torch.tensor([[0.0, 0.0, (1 - p_target) / 3, 0.0]], dtype=torch.float64)
    )
    target = sparse_tasks.target_rule().values(["a :"], ids, VOCAB)
    c = exact_token_credit(target, probs, ids, mask)
    want = torch.tensor([[-p_target, -p_target, 1 - p_target, -p_target]]) / 8
    torch.testing.assert_close(c, want.double())
    sort_words = word_tasks.sort_words()
    sort_ids = sparse_tasks.word_ids(sort_words)
    rule = sparse_tasks.SortTokenRule(sort_ids)
    y = torch.tensor([[sort_ids[w] for w in ["1", "3", "3", "4"]]])
    v = rule.values(["sort 3 1 4 1 ="], y, len(sort_ids))
    got = v.gather(2, y.unsqueeze(2)).squeeze(2) * word_tasks.SORT_DIGITS
    # sorted answer 1 1 3 4: right at positions 0, 2, 3
    torch.testing.assert_close(got, torch.tensor([[1.0, 0.0, 1.0, 1.0]], dtype=torch.float64))


def _rule_score(
    rule: sparse_tasks.TokenRule, ids: torch.Tensor, prompts: list[str]
) -> torch.Tensor:
    v = rule.values(prompts, ids, VOCAB)
    return v.gather(2, ids.unsqueeze(2)).squeeze(2).sum(dim=1)


def test_rules_decompose_their_scores_exactly() -> None:
    gen = torch.Generator().manual_seed(0)
    content = [IDS[w] for w in WORDS if w != ":"]
    ids = torch.tensor(content)[torch.randint(0, len(content), (16, 24), generator=gen)]
    texts = [" ".join(WORDS[i - len(word_tasks.SPECIALS)] for i in row.tolist()) for row in ids]
    prompts = ["a :"] * 16
    keyword = _rule_score(sparse_tasks.keyword_rule(), ids, prompts)
    torch.testing.assert_close(
        keyword, torch.tensor([sparse_tasks.keyword_score(t) for t in texts], dtype=torch.float64)
    )
    target = _rule_score(sparse_tasks.target_rule(), ids, prompts)
    torch.testing.assert_close(
        target, torch.tensor([word_tasks.target_score(t) for t in texts], dtype=torch.float64)
    )
    rm, table = sparse_tasks.positional_reward_model(VOCAB, [2, 9, 17], 16, 0)
    with torch.no_grad():
        reward = rm(table[ids], torch.ones_like(ids)).double()
    positional = _rule_score(sparse_tasks.positional_rule(rm), ids, prompts)
    torch.testing.assert_close(positional, reward, rtol=1e-5, atol=1e-5)


TINY = {
    "num_train": 16,
    "num_held_out": 4,
    "num_pretrain": 32,
    "pretrain": {"steps": 2, "batch_size": 4},
}


def test_sparse_settings_build_offline(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    params = {
        "positional_sparse": TINY,
        "keyword_sparse": {
            **TINY,
            "rm": {"examples": 32, "steps": 2, "batch_size": 8, "hidden": 16},
        },
    }
    for name, p in params.items():
        kind = SETTINGS[name]
        assets = kind.build(kind.params.model_validate(p), "llama", tmp_path)
        assert assets.train == {"rollout": {"max_new_tokens": 24}}
        assert assets.token_rule is not None
        tok = AutoTokenizer.from_pretrained(assets.policy_dir / "tokenizer", local_files_only=True)
        dm = build_direction_model(assets.reward["direction_model"], tok, policy_vocab_size=VOCAB)
        words = ["the"] * 24
        words[9] = "storm"
        response = _ids(" ".join(words))
        prompt = _ids("cat dog red rain :")
        out = dm.score(
            prompt, torch.ones_like(prompt), response, torch.ones_like(response), with_grad=True
        )
        assert out.reward_grad is not None and out.reward_grad.shape == (1, 24, dm.embed_dim)
        if name == "positional_sparse":
            exact = _rule_score(assets.token_rule, response, ["x"])
            torch.testing.assert_close(out.rewards.double(), exact, rtol=1e-5, atol=1e-5)
        else:
            assert list(assets.extra_eval) == ["task_score"]
            assert assets.extra_eval["task_score"](["x"], [" ".join(words)]) == [
                pytest.approx(1 / 3)
            ]
