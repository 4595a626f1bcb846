"""Prompt files, the resumable prompt stream, rank sharding, built-in tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.common.data import PromptSampler, load_jsonl, shard
from backends.common.errors import ConfigError
from backends.common.tasks import get_task


def test_jsonl_prompts_and_labels(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b", "label": 3}\n')
    prompts = load_jsonl(path)
    assert [(p.text, p.label) for p in prompts] == [("a", None), ("b", 3)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not valid JSON"),
        ('{"text": "a"}', "string field 'prompt'"),
        ('{"prompt": "a", "answer": 1}', "unknown fields \\['answer'\\]"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(ConfigError, match=f"p.jsonl:2: .*{message}"):
        load_jsonl(path)


def test_sampler_visits_every_prompt_once_per_epoch_and_spans_epochs() -> None:
    sampler = PromptSampler(5, 2, seed=3)
    batches = [sampler.next_batch() for _ in range(5)]  # 10 indices = 2 epochs
    flat = [i for b in batches for i in b]
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:]) == list(range(5))
    assert flat[:5] != flat[5:]  # a new permutation per epoch


def test_sampler_resumes_exactly() -> None:
    a = PromptSampler(7, 3, seed=1)
    for _ in range(4):
        a.next_batch()
    b = PromptSampler(7, 3, seed=1)
    b.load_state_dict(a.state_dict())
    assert [a.next_batch() for _ in range(5)] == [b.next_batch() for _ in range(5)]


def test_sampler_refuses_a_state_from_another_dataset() -> None:
    state = PromptSampler(7, 3, seed=1).state_dict()
    with pytest.raises(ConfigError, match="data position"):
        PromptSampler(8, 3, seed=1).load_state_dict(state)


def test_shard_gives_whole_contiguous_shares_and_rejects_uneven_splits() -> None:
    items = list(range(6))
    assert [shard(items, r, 3) for r in range(3)] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ConfigError, match="multiple of the number of processes"):
        shard(items, 0, 4)


def test_positional_task_is_deterministic_and_held_out_prompts_are_new() -> None:
    a = get_task("positional", {"num_prompts": 8, "num_eval_prompts": 4}, vocab_size=50)
    b = get_task("positional", {"num_prompts": 8, "num_eval_prompts": 4}, vocab_size=50)
    assert a.train_prompts == b.train_prompts and a.eval_prompts == b.eval_prompts
    assert not {p.text for p in a.train_prompts} & {p.text for p in a.eval_prompts}


def test_task_errors_name_the_parameter() -> None:
    with pytest.raises(ConfigError, match="unknown task 'nope'"):
        get_task("nope", {}, vocab_size=50)
    with pytest.raises(ConfigError, match=r"data\.task_params\.positions"):
        get_task("positional", {"positions": [1, 1]}, vocab_size=50)
