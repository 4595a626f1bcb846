"""``reward: {kind: prm}``: a reward model as step scorer (``adapters.scorers.PRMScorer``;
docs/reward_models.md, "A process reward model"). Its token rewards are, brute force, the
model's own score of each prompt + response prefix that ends a step, placed at the step's
last token, in ceil(S / B) passes; its config errors name the key."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pydantic import ValidationError

from adapters.config import ScorerConfig, build_scorer
from adapters.direction import DirectionModel, RewardOutput
from adapters.reward_models import SeqClassificationRM
from adapters.scorers import PRMScorer
from adapters.tiny import tiny_seq_classifier
from credit_core import CreditError
from tests.helpers.adapters import bpe_tokenizer, encode, rollout_batch

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PROMPTS = ["Add 2 and 3.", "Count to three.", "Say hi.", "Name a colour."]
#: Two, three, one and no steps ("\n" ends a step; so does the last token).
RESPONSES = ["2 plus 3\nis 5", "one\ntwo\nthree\n", "hi", ""]


def tiny_rm() -> DirectionModel:
    """A tiny random Llama sequence classifier on the test tokenizer (a ``kind: module``
    factory: the PRM built from a config, without a model folder)."""
    tok = bpe_tokenizer()
    model = tiny_seq_classifier("llama", len(tok), pad_token_id=int(tok.pad_token_id), seed=3)
    return SeqClassificationRM(model, tok, tok)


#: ``reward.reward`` of a PRM on ``tiny_rm`` ending a step at each newline.
PRM = {
    "kind": "prm",
    "model": {"kind": "module", "factory": f"{__name__}:tiny_rm"},
    "step_separator": "\n",
}


def brute_force(
    model: DirectionModel, tok: Any, prompt: list[int], response: list[int]
) -> list[tuple[int, float]]:
    """(last token, score) of each step of one response, each prefix scored alone."""
    ends = [k for k, t in enumerate(response[:-1]) if "\n" in tok.decode([t])]
    ends += [len(response) - 1] if response else []
    steps = []
    for end in ends:
        p, pm, r, rm = rollout_batch([prompt], [response[: end + 1]])
        steps.append((end, float(model.score(p, pm, r, rm, with_grad=False).rewards[0])))
    return steps


def test_step_rewards_are_the_model_s_score_of_each_step_s_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tok = bpe_tokenizer()
    scorer = build_scorer(PRM, tok, None)
    assert isinstance(scorer, PRMScorer)
    prompts, responses = encode(tok, PROMPTS), encode(tok, RESPONSES)
    batch = rollout_batch(prompts, responses)
    passes: list[int] = []
    real = type(scorer.model).score

    def counted(self: DirectionModel, *args: Any, **kwargs: Any) -> RewardOutput:
        passes.append(int(args[2].shape[0]))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(scorer.model), "score", counted)
    rewards, token_rewards = scorer.score(*batch)
    monkeypatch.setattr(type(scorer.model), "score", real)
    assert token_rewards is not None
    B, R = batch[2].shape
    expected = torch.zeros(B, R, dtype=torch.float64)
    given = torch.zeros(B, R, dtype=torch.bool)
    outcome = []
    for b in range(B):
        steps = brute_force(scorer.model, tok, prompts[b], responses[b])
        for end, score in steps:
            expected[b, end], given[b, end] = score, True
        if steps:
            outcome.append(steps[-1][1])
        else:  # no step: the score of the prompt alone
            p, pm, r, rm = rollout_batch([prompts[b]], [[]])
            outcome.append(float(scorer.model.score(p, pm, r, rm, with_grad=False).rewards[0]))
    assert [int(g.sum()) for g in given] == [2, 3, 1, 0]  # the hand-made steps
    assert torch.equal(token_rewards.given, given)
    torch.testing.assert_close(token_rewards.values, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rewards, torch.tensor(outcome), rtol=1e-5, atol=1e-5)
    assert rewards.dtype == torch.float32
    # S = 2 + 3 + 1 steps + 1 empty response = 7 prefix rows in ceil(7 / B) = 2 passes of <= B
    assert passes == [4, 3]
    torch.testing.assert_close(scorer(*batch), rewards)


def test_config_errors_name_the_key() -> None:
    model = {"kind": "module", "factory": "pkg.mod:build"}
    bad: list[tuple[dict[str, Any], str]] = [
        ({"kind": "prm", "step_separator": "\n"}, r"model: required for kind 'prm'"),
        ({"kind": "prm", "model": model}, r"step_separator: required for kind 'prm'"),
        ({"kind": "prm", "model": model, "step_separator": ""}, r"step_separator: expected a"),
        (
            {"kind": "prm", "model": model, "step_separator": "\n", "function": "a:b"},
            r"function: not a setting of kind 'prm'",
        ),
        ({"kind": "prm", "model": model, "separator": "\n"}, r"separator\n +Extra inputs"),
        ({"kind": "model", "step_separator": "\n"}, r"step_separator: not a setting of kind"),
    ]
    for cfg, message in bad:
        with pytest.raises(ValidationError, match=message):
            ScorerConfig.model_validate(cfg)
    with pytest.raises(CreditError, match=r"step_separator: expected a non-empty string"):
        PRMScorer(_Constant(), None, "")


class _Constant(DirectionModel):
    """A direction model that scores 1 everywhere (for the constructor's check)."""

    reward_embedding = torch.zeros(1, 1)

    def score(self, *args: Any, **kwargs: Any) -> RewardOutput:
        return RewardOutput(torch.ones(args[2].shape[0]))
