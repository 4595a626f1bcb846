"""``resolve_credit``'s sampling check: a strategy whose signals reduce the distribution the
batch was sampled from (DATC's policy statistics or W0) refuses OpenRLHF's truncated
sampling (``--rollout.top_p`` < 1), naming the flag, as the native, TRL and verl backends
refuse theirs (``CreditPlan.sampling_problem``); strategies that read no such signal, and
``uniform``, start."""

from __future__ import annotations

import pytest
import ray

from backends.openrlhf import launcher
from backends.openrlhf.compat import resolve_credit
from backends.openrlhf.settings import OpenRLHFCreditConfig
from credit_core import CreditConfig, CreditError
from tests.helpers.openrlhf import openrlhf_args

GRPO = [
    "--algo.advantage.estimator",
    "group_norm",
    "--algo.kl.use_loss",
    "--rollout.n_samples_per_prompt",
    "2",
    "--reward.model_name_or_path",
    "/models/rm",
]


def credit(name: str) -> OpenRLHFCreditConfig:
    return OpenRLHFCreditConfig(credit=CreditConfig.parse(name))


@pytest.mark.parametrize("name", ["datc", "datc_mid"])
@pytest.mark.parametrize("placement", ["reward", "policy"])
def test_top_p_below_one_is_refused_for_a_strategy_reading_the_sampled_distribution(
    name: str, placement: str
) -> None:
    cfg = credit(name).model_copy(update={"placement": placement})
    resolve_credit(openrlhf_args([*GRPO, "--rollout.top_p", "1.0"]), cfg)  # the full softmax
    with pytest.raises(CreditError) as info:
        resolve_credit(openrlhf_args([*GRPO, "--rollout.top_p", "0.9"]), cfg)
    assert (
        f"--rollout.top_p: 0.9 truncates the sampling distribution, but credit strategy "
        f"{name!r} reads the distribution actually sampled from"
    ) in str(info.value)
    assert "leave top_p off" in str(info.value)


def test_a_top_k_setting_is_checked_where_the_arguments_have_one() -> None:
    """OpenRLHF 0.11.2's parser has no ``--rollout.top_k`` (its generator samples with vLLM's
    top_k -1); a namespace that carries one is checked like top_p."""
    args = openrlhf_args(GRPO)
    resolve_credit(args, credit("datc"))
    args.rollout.top_k = -1
    resolve_credit(args, credit("datc"))
    args.rollout.top_k = 50
    with pytest.raises(CreditError, match=r"--rollout\.top_k: 50 truncates"):
        resolve_credit(args, credit("datc"))


@pytest.mark.parametrize("name", ["uniform", "p2t", "entropy_top"])
def test_strategies_not_reading_the_sampled_distribution_start_with_top_p(name: str) -> None:
    found = resolve_credit(openrlhf_args([*GRPO, "--rollout.top_p", "0.9"]), credit(name))
    assert found.plan.strategy.name == name


def test_the_refusal_stops_credit_openrlhf_before_ray_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the launcher: OpenRLHF's parser runs, the check refuses, exit status 2."""

    def no_ray(*args: object, **kwargs: object) -> None:
        raise AssertionError("ray.init must not be reached")

    monkeypatch.setattr(ray, "init", no_ray)
    argv = ["--credit", "datc", *GRPO, "--rollout.top_p", "0.95"]
    assert launcher.main(argv) == 2
    assert "--rollout.top_p: 0.95 truncates the sampling distribution" in capsys.readouterr().err
