"""Setting 7 (``outcome_chain``): the recurrence, the exact binary outcome, the demos, the
binary-label RM data, the step credit of the probes (ablations/chain_task.py), and the
setting's offline build (ablations/settings.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from ablations import chain_task, sparse_tasks
from ablations.credit_probes import exact_token_credit
from ablations.settings import SETTINGS
from adapters.config import build_direction_model
from backends.torch.answer_span import build_answer_span
from backends.torch.config import AnswerSpanConfig

pytestmark = pytest.mark.usefixtures("single_torch_thread")

S = chain_task.CHAIN_STEPS
IDS = sparse_tasks.word_ids(chain_task.chain_words())
VOCAB = len(IDS)


def _brute_chain(a: int, b: int, steps: int) -> list[int]:
    seq = [a, b]
    while len(seq) < steps + 2:
        seq.append((seq[-1] + seq[-2]) % 10)
    return seq[2:]


def _ids(response: str) -> torch.Tensor:
    return torch.tensor([[IDS[w] for w in response.split()]])


def test_the_chain_is_the_fibonacci_recurrence_modulo_10() -> None:
    for a in range(10):
        for b in range(10):
            assert chain_task.chain_values(a, b) == _brute_chain(a, b, S)
    assert chain_task.chain_values(1, 1, 5) == [2, 3, 5, 8, 3]
    assert chain_task.chain_answer("fib 1 1 :") == str(_brute_chain(1, 1, S)[-1])


def test_the_outcome_is_the_word_after_the_first_equals_sign_and_nothing_else() -> None:
    prompt = "fib 1 1 :"
    right = (
        " ".join(map(str, chain_task.chain_values(1, 1))) + " = " + chain_task.chain_answer(prompt)
    )
    assert chain_task.chain_outcome(prompt, right) == 1.0
    wrong_answer = right[:-1] + str((int(right[-1]) + 1) % 10)
    assert chain_task.chain_outcome(prompt, wrong_answer) == 0.0
    # the scratchpad is not checked: a wrong chain with the right answer counts
    assert chain_task.chain_outcome(prompt, "0 0 0 = " + chain_task.chain_answer(prompt)) == 1.0
    assert chain_task.chain_outcome(prompt, right.replace(" =", "")) == 0.0  # no "="
    assert chain_task.chain_outcome(prompt, "1 2 =") == 0.0  # nothing after it
    assert chain_task.chain_checker([prompt, prompt], [right, "="]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="as many prompts"):
        chain_task.chain_checker([prompt], [])
    with pytest.raises(ValueError, match="not a task prompt"):
        chain_task.chain_answer("sort 1 2 =")


def test_demos_carry_errors_forward_and_answer_with_their_last_digit() -> None:
    data = chain_task.chain_task(num_held_out=20, num_pretrain=200, error_rate=0.0, seed=3)
    train = {r["prompt"] for r in data.train}
    held = {r["prompt"] for r in data.held_out}
    assert len(train) == 80 and len(held) == 20 and not train & held
    for text in data.pretrain_texts:
        words = text.split()
        prompt, response = " ".join(words[:4]), " ".join(words[4:])
        assert prompt in train and len(words[4:]) == S + 2
        assert chain_task.chain_outcome(prompt, response) == 1.0  # error rate 0: all right
    rng = random.Random(0)
    noisy = chain_task.noisy_chain(2, 7, 0.2, rng)
    seq = [2, 7, *noisy]
    steps_ok = [(seq[i] + seq[i + 1]) % 10 == seq[i + 2] for i in range(S)]
    assert 0 < steps_ok.count(False) < S  # errors happen, and later steps follow the digits written
    assert noisy != chain_task.chain_values(2, 7)


def test_the_reward_model_sees_only_the_binary_outcome_label() -> None:
    prompts = [
        r["prompt"]
        for r in chain_task.chain_task(
            num_held_out=20, num_pretrain=0, error_rate=0.0, seed=0
        ).train
    ]
    examples = chain_task.chain_rm_examples(prompts, 400, seed=1)
    labels = [y for _, _, y in examples]
    assert set(labels) == {0.0, 1.0}
    assert all(y == chain_task.chain_outcome(p, r) for p, r, y in examples)
    assert 0.1 < sum(labels) / len(labels) < 0.6  # both classes well represented


def test_step_credit_values_a_digit_by_the_two_digits_before_it() -> None:
    rule = chain_task.ChainStepRule(IDS)
    digits = chain_task.chain_values(3, 4)
    digits[10] = (digits[10] + 1) % 10  # one step error; later steps follow the wrong digit
    for i in range(11, S):
        digits[i] = (digits[i - 1] + digits[i - 2]) % 10
    response = " ".join(map(str, digits)) + " = " + str(digits[-1])
    ids = _ids(response)
    v = rule.values(["fib 3 4 :"], ids, VOCAB)
    assert v.shape == (1, S + 2, VOCAB) and v.dtype == torch.float64
    taken = v.gather(2, ids.unsqueeze(2)).squeeze(2) * (S + 1)
    want = torch.ones(S + 2, dtype=torch.float64)
    want[10] = 0.0  # the error
    want[S] = 0.0  # "="
    torch.testing.assert_close(taken[0], want)
    one_per_step = torch.full((S,), 1 / (S + 1), dtype=torch.float64)
    torch.testing.assert_close(v.sum(dim=2)[0, :S], one_per_step)  # one right digit per step
    # exact credit under a uniform policy: the error is the one negative scratch token
    probs = torch.full((1, S + 2, VOCAB), 1.0 / VOCAB, dtype=torch.float64)
    c = exact_token_credit(v, probs, ids, torch.ones(1, S + 2, dtype=torch.bool))
    assert (c[0, :S] < 0).nonzero().flatten().tolist() == [10]


def test_step_credit_refuses_mismatched_inputs() -> None:
    rule = chain_task.ChainStepRule(IDS)
    with pytest.raises(ValueError, match="2 prompts for response_ids of 1 rows"):
        rule.values(["fib 1 1 :", "fib 1 2 :"], _ids("1 2"), VOCAB)
    with pytest.raises(ValueError, match="ids >= vocab"):
        rule.values(["fib 1 1 :"], torch.tensor([[VOCAB]]), VOCAB)


def test_the_setting_builds_offline_with_a_binary_reward_and_a_scratchpad_budget(
    tmp_path: Path,
) -> None:
    from transformers import AutoTokenizer

    kind = SETTINGS["outcome_chain"]
    params = kind.params.model_validate(
        {
            "num_pretrain": 16,
            "pretrain": {"steps": 2, "batch_size": 4, "max_len": 80},
            "rm": {"examples": 32, "steps": 2, "batch_size": 8, "hidden": 16},
        }
    )
    assets = kind.build(params, "llama", tmp_path)
    assert assets.train == {
        "rollout": {"max_new_tokens": S + 3},
        "data": {"answer_span": {"after": "="}},
    }
    assert assets.reward["reward"] == {
        "kind": "callable",
        "function": "ablations.chain_task:chain_checker",
    }
    assert isinstance(assets.token_rule, chain_task.ChainStepRule)
    tok = AutoTokenizer.from_pretrained(assets.policy_dir / "tokenizer", local_files_only=True)
    assert (
        tok("fib 3 4 : 7 =", add_special_tokens=False)["input_ids"]
        == _ids("fib 3 4 : 7 =")[0].tolist()
    )
    # the declared answer span is exactly the final answer of a chain, on this tokenizer
    span = build_answer_span(AnswerSpanConfig(after="="), tok, [tok.eos_token_id])
    answered = _ids(" ".join(map(str, chain_task.chain_values(3, 4))) + " = 1")
    unanswered = _ids(" ".join(map(str, chain_task.chain_values(3, 4))) + " 1 1")
    both = torch.cat([answered, unanswered])
    expected = torch.zeros_like(both, dtype=torch.bool)
    expected[0, S + 1] = True
    assert torch.equal(span.mask(both, torch.ones_like(both, dtype=torch.bool)), expected)
    dm = build_direction_model(assets.reward["direction_model"], tok, policy_vocab_size=VOCAB)
    response = _ids(" ".join(map(str, chain_task.chain_values(3, 4))) + " = 1")
    prompt = _ids("fib 3 4 :")
    out = dm.score(
        prompt, torch.ones_like(prompt), response, torch.ones_like(response), with_grad=True
    )
    assert out.reward_grad is not None and out.reward_grad.shape == (1, S + 2, dm.embed_dim)
    assert assets.info["rm_fit"]["test_mse"] >= 0.0
