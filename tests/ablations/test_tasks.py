"""The built-in settings' ingredients: word tokenizers, the two synthetic tasks and their
exact scores, the reward-model training data, the docstring corpus and the build cache."""

from __future__ import annotations

import pytest

from ablations import word_tasks
from ablations.corpus import docstring_sentences


def test_word_tokenizers_share_ids_and_differ_only_in_special_tokens() -> None:
    policy = word_tasks.word_tokenizer(word_tasks.sort_words())
    rm = word_tasks.word_tokenizer(word_tasks.sort_words(), pair_template=True)
    assert policy.get_vocab() == rm.get_vocab()
    ids = policy("sort 3 1 =")["input_ids"]
    assert policy.convert_ids_to_tokens(ids) == ["sort", "3", "1", "="]
    pair = rm("sort 3 1 =", "1 3")["input_ids"]
    assert rm.convert_ids_to_tokens(pair) == [
        "[CLS]",
        "sort",
        "3",
        "1",
        "=",
        "[SEP]",
        "1",
        "3",
        "[SEP]",
    ]
    eos = policy.eos_token_id
    assert policy.decode([*policy("1 3")["input_ids"], eos], skip_special_tokens=True) == "1 3"
    with pytest.raises(ValueError, match="distinct"):
        word_tasks.word_tokenizer(["a", "a"])


def test_target_score_counts_target_words_in_the_first_eight() -> None:
    assert word_tasks.TARGET_CATEGORY == "weather"
    assert word_tasks.target_score("rain snow the cat") == 2 / 8
    assert word_tasks.target_score(" ".join(["sun"] * 12)) == 1.0  # only 8 words count
    assert word_tasks.target_score("") == 0.0
    assert word_tasks.target_scorer(["a :", "b :"], ["fog", "dog"]) == [1 / 8, 0.0]


def test_target_task_prompts_are_disjoint_and_pretraining_uses_training_prompts() -> None:
    data = word_tasks.target_task(
        num_train=40, num_held_out=10, num_pretrain=200, target_rate=0.5, seed=3
    )
    train = {r["prompt"] for r in data.train}
    held = {r["prompt"] for r in data.held_out}
    assert len(train) == 40 and len(held) == 10 and not train & held
    for text in data.pretrain_texts:
        words = text.split()
        assert " ".join(words[: word_tasks.PROMPT_WORDS + 1]) in train
        assert len(words) == word_tasks.PROMPT_WORDS + 1 + word_tasks.RESPONSE_WORDS
    rate = sum(
        word_tasks.target_score(" ".join(t.split()[word_tasks.PROMPT_WORDS + 1 :]))
        for t in data.pretrain_texts
    ) / len(data.pretrain_texts)
    assert 0.4 < rate < 0.6  # target_rate 0.5
    same = word_tasks.target_task(
        num_train=40, num_held_out=10, num_pretrain=200, target_rate=0.5, seed=3
    )
    assert same == data


def test_sort_checker_and_partial_score() -> None:
    assert word_tasks.sort_checker(["sort 3 1 2 2 ="] * 3, ["1 2 2 3", "1 2 3 2", "1 2 2 3 4"]) == [
        1.0,
        0.0,
        0.0,
    ]
    assert word_tasks.sort_partial_score("sort 3 1 2 2 =", "1 2 3 2") == 0.5
    assert word_tasks.sort_partial_score("sort 3 1 2 2 =", "1 2") == 0.5
    assert word_tasks.sort_partial_score("sort 3 1 2 2 =", "1 2 2 3 9") == 4 / 5
    with pytest.raises(ValueError, match="not a task prompt"):
        word_tasks.sort_checker(["3 1 ="], ["1 3"])


def test_sort_task_pools_are_disjoint_and_pretraining_is_correct() -> None:
    data = word_tasks.sort_task(num_train=50, num_held_out=20, num_pretrain=100, seed=1)
    train = {r["prompt"] for r in data.train}
    held = {r["prompt"] for r in data.held_out}
    assert len(train) == 50 and len(held) == 20 and not train & held
    for text in data.pretrain_texts:
        prompt, answer = text.split(" = ")
        assert prompt + " =" in train
        assert word_tasks.sort_checker([prompt + " ="], [answer]) == [1.0]


def test_reward_model_examples_carry_their_exact_scores() -> None:
    prompts = [
        r["prompt"]
        for r in word_tasks.sort_task(num_train=8, num_held_out=1, num_pretrain=1, seed=0).train
    ]
    sort_ex = word_tasks.sort_rm_examples(prompts, 300, seed=2)
    assert all(s == word_tasks.sort_partial_score(p, r) for p, r, s in sort_ex)
    assert {s for _, _, s in sort_ex} >= {0.0, 1.0}
    target_ex = word_tasks.target_rm_examples(["a b c d :"], 300, seed=2)
    assert all(s == word_tasks.target_score(r) for _, r, s in target_ex)
    scores = [s for _, _, s in target_ex]
    assert min(scores) == 0.0 and max(scores) == 1.0  # the whole range is covered


def test_docstring_corpus_is_plain_sentences() -> None:
    sentences = docstring_sentences()
    assert len(sentences) > 500
    assert list(sentences) == sorted(set(sentences))
    assert all(s[0].isupper() and s.endswith(".") and 5 <= len(s.split()) <= 25 for s in sentences)


def test_docstring_corpus_ignores_what_other_imports_patch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Libraries replace stdlib functions at import time; the corpus (and so the cache keys
    and pretrained policies) must not depend on what the process imported before."""
    import inspect

    fresh = docstring_sentences.__wrapped__()
    assert "Return true if the object is a generator." in fresh

    def isgenerator(obj: object) -> bool:
        return False

    monkeypatch.setattr(inspect, "isgenerator", isgenerator)
    assert docstring_sentences.__wrapped__() == fresh
