"""The credit keys in verl's own Hydra config: parsed, refused with the key named."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

import verl
from hydra import compose, initialize_config_dir

from backends.verl.cli import verl_overrides
from backends.verl.config import (
    SEQUENCE_PARALLEL_KEYS,
    credit_settings,
    sequence_parallel_size,
    work_request,
)
from credit_core import CreditError

CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
DIRECTION = "algorithm.direction={kind:seq_classification,path:/models/rm}"
SP_ACTOR, SP_ENGINE = SEQUENCE_PARALLEL_KEYS


def verl_config(*overrides: str):
    """verl's own ``ppo_trainer`` config composed by Hydra with ``overrides`` as
    ``credit-verl`` passes them (credit keys added with ``+``)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=verl_overrides(list(overrides)))


@pytest.fixture(scope="module")
def grpo():
    return verl_config("algorithm.adv_estimator=grpo")


def test_hydra_config_reads_credit_name_and_mapping() -> None:
    cfg = verl_config("algorithm.adv_estimator=grpo", "algorithm.credit=datc", DIRECTION)
    settings = credit_settings(cfg)
    assert settings.section.credit.name == "datc"
    assert settings.section.direction is not None
    assert settings.section.direction.path == "/models/rm"
    assert settings.plan.signals == {"unsigned_work"}
    cfg = verl_config(
        "algorithm.adv_estimator=grpo",
        "algorithm.credit={name:datc,beta:2.0}",
        "algorithm.credit_stats_chunk_size=512",
        DIRECTION,
    )
    settings = credit_settings(cfg)
    assert settings.section.credit.params == {"beta": 2.0} and settings.section.chunk_size == 512


@pytest.mark.parametrize(("credit", "points"), [("datc_mid", 1), ("{name:datc_ig,points:3}", 3)])
def test_a_path_strategy_asks_the_engine_for_w0_on_the_path(credit: str, points: int) -> None:
    cfg = verl_config("algorithm.adv_estimator=grpo", f"algorithm.credit={credit}", DIRECTION)
    settings = credit_settings(cfg)
    assert settings.plan.signals == {"unsigned_work"}
    assert json.loads(work_request(settings))["points"] == points


def test_no_credit_key_is_uniform(grpo) -> None:
    settings = credit_settings(grpo)
    assert settings.section.credit.name == "uniform" and settings.plan.signals == frozenset()


def test_entropy_top_needs_no_direction(grpo) -> None:
    cfg = verl_config("algorithm.adv_estimator=grpo", "algorithm.credit=entropy_top")
    assert credit_settings(cfg).plan.signals == {"token_entropy"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.credit=nope"], "algorithm.credit: unknown credit strategy 'nope'"),
        (["algorithm.credit={name:datc,betta:1}"], "algorithm.credit:"),
        (["+algorithm.credit_chunk=3"], "algorithm.credit_chunk: unknown credit key"),
        (["algorithm.credit_stats_chunk_size=0"], "algorithm.credit_stats_chunk_size:"),
        (["algorithm.credit=datc"], "algorithm.direction: credit strategy 'datc' reads"),
        (["algorithm.credit=datc", "algorithm.direction={kind:nope}"], "algorithm.direction"),
        (["algorithm.credit=abc"], "algorithm.direction: credit strategy 'abc' reads"),
        (["algorithm.credit=red"], "algorithm.direction: credit strategy 'red' reads"),
        (["algorithm.credit=saliency"], "'saliency' is not served: it reads ['reward_grad']"),
        (["algorithm.credit=p2t"], "algorithm.direction: credit strategy 'p2t' reads"),
        (  # PRIME's implicit PRM: a second trainable model (docs/verl.md)
            ["algorithm.credit=prime"],
            "'prime' is not served: it reads ['implicit_log_ratio']",
        ),
        (
            ["algorithm.credit=datc", DIRECTION, "actor_rollout_ref.rollout.top_k=20"],
            "actor_rollout_ref.rollout.top_k: 20 truncates",
        ),
        (
            ["algorithm.credit=datc", DIRECTION, "actor_rollout_ref.model.use_fused_kernels=true"],
            "actor_rollout_ref.model.use_fused_kernels",
        ),
        (
            ["algorithm.credit=entropy_top", "algorithm.rollout_correction.bypass_mode=true"],
            "algorithm.rollout_correction.bypass_mode",
        ),
        (  # the key verl's FSDP engine reads (use_ulysses_sp)
            ["algorithm.credit=datc", DIRECTION, f"{SP_ENGINE}=2"],
            f"{SP_ENGINE}: 2; Ulysses sequence parallelism",
        ),
        (  # the deprecated actor key, copied into fsdp_config by verl
            ["algorithm.credit=datc", DIRECTION, f"{SP_ACTOR}=4"],
            f"{SP_ACTOR}: 4; Ulysses sequence parallelism",
        ),
        (  # red's prefix rewards are computed from whole sequences too
            ["algorithm.credit=red", DIRECTION, f"{SP_ENGINE}=2"],
            f"{SP_ENGINE}: 2; Ulysses sequence parallelism splits each sequence",
        ),
        (  # and so is p2t's attribution (the reward gradient of whole sequences)
            ["algorithm.credit=p2t", DIRECTION, f"{SP_ENGINE}=2"],
            f"{SP_ENGINE}: 2; Ulysses sequence parallelism splits each sequence",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_key(overrides: list[str], message: str) -> None:
    cfg = verl_config("algorithm.adv_estimator=grpo", *overrides)
    with pytest.raises(CreditError) as err:
        credit_settings(cfg)
    assert message in str(err.value)


GATE = {"name": "datc", "gate": {"agreement": [0.2, 0.6]}}
RM = "/models/rm"


def plain_config(credit: object, **extra: object) -> dict[str, object]:
    """A GRPO config as a mapping (no Hydra composition: fast) with the direction model at
    ``RM`` and ``extra`` top-level sections."""
    direction = {"kind": "seq_classification", "path": RM}
    return {
        "algorithm": {"adv_estimator": "grpo", "credit": credit, "direction": direction},
        **extra,
    }


def test_a_gate_is_applied_and_the_engine_asked_for_the_direction_models_scores() -> None:
    """``algorithm.credit.gate`` (read by Hydra as a nested mapping) builds the run's gate; a
    strategy that reads a direction model asks the engine for its scores (its agreement
    with verl's reward), one that reads none does not."""
    hydra = verl_config(
        "algorithm.adv_estimator=grpo",
        "algorithm.credit={name:datc,gate:{agreement:[0.2,0.6]}}",
        DIRECTION,
    )
    settings = credit_settings(hydra)
    assert settings.run.gate is not None and settings.run.gate.low == 0.2
    request = work_request(settings)
    assert request is not None and json.loads(request)["scores"] is True
    plain = credit_settings(plain_config("datc"))
    assert plain.run.gate is None and plain.measures
    assert not credit_settings(plain_config("entropy_top")).measures


def test_a_gate_on_the_attribution_asks_the_engine_for_it_beside_the_strategy_s_signals() -> None:
    """``gate.measure: attribution``: the engine computes ``reward_attribution`` (at the
    strategy's null) from the reward gradient DATC's W0 takes anyway, and ships the scores
    too (both agreements are logged)."""
    gate = {"name": "datc", "gate": {"agreement": [0.05, 0.4], "measure": "attribution"}}
    settings = credit_settings(plain_config(gate))
    assert settings.run.gate_measure == "attribution"
    assert settings.plan.gate_signals == {"reward_attribution"}
    request = work_request(settings)
    assert request is not None
    sent = json.loads(request)
    assert "reward_attribution" in sent["signals"] and "null" in sent
    assert sent["scores"] is True
    plain = json.loads(work_request(credit_settings(plain_config("datc"))) or "{}")
    assert "reward_attribution" not in plain["signals"]


@pytest.mark.parametrize(
    "server",
    [
        {"reward": {"reward_model": {"enable": True, "model_path": RM}}},
        {"reward_model": {"enable": True, "model": {"path": RM}}},  # verl's legacy keys
    ],
    ids=["reward", "legacy"],
)
def test_a_reward_model_serving_the_direction_model_is_the_direction_models_reward(
    server: dict[str, object],
) -> None:
    """verl's reward-model server on the direction model's path: the reward is the direction
    model's own (agreement 1 by construction), no scores are shipped, a gate is refused
    under its key; another path, or the server off, is a separate reward."""
    settings = credit_settings(plain_config("datc", **server))
    assert settings.run.direction_is_reward and not settings.measures
    request = work_request(settings)
    assert request is not None and "scores" not in json.loads(request)
    with pytest.raises(CreditError, match=r"^algorithm\.credit\.gate: the reward is the direction"):
        credit_settings(plain_config(GATE, **server))
    other = json.loads(json.dumps(server).replace(RM, "/models/other"))
    assert not credit_settings(plain_config(GATE, **other)).run.direction_is_reward
    off = json.loads(json.dumps(server).replace("true", "false"))
    assert not credit_settings(plain_config("datc", **off)).run.direction_is_reward


@pytest.mark.parametrize(
    ("credit", "signal"),
    [
        ("abc", "reward_attention"),
        ("{name:abc,mode:paper,beta:0.5}", "reward_attention"),
        ("red", "prefix_rewards"),
        ("{name:red,mode:paper}", "prefix_rewards"),
    ],
)
def test_abc_and_red_ask_the_engine_for_the_direction_models_signal(
    credit: str, signal: str
) -> None:
    cfg = verl_config("algorithm.adv_estimator=grpo", f"algorithm.credit={credit}", DIRECTION)
    settings = credit_settings(cfg)
    assert settings.plan.signals == {signal}
    request = work_request(settings)
    assert request is not None
    assert json.loads(request)["signals"] == [signal]
    assert json.loads(request)["direction"]["path"] == "/models/rm"


@pytest.mark.parametrize(
    ("credit", "null"),
    [
        (["algorithm.credit=p2t"], "pad"),
        # Hydra reads a ``null`` key inside {...} as None: the dotted key sets it
        (["algorithm.credit={name:p2t,mode:paper}", "algorithm.credit.null=zero"], "zero"),
        (["algorithm.credit.name=p2t", "algorithm.credit.null=unk"], "unk"),
    ],
)
def test_p2t_asks_the_engine_for_the_attribution_with_its_null(
    credit: list[str], null: str
) -> None:
    """P2T reads r_t = (e_t - e_null) . g_t (docs/design.md, "Gradient x input attribution
    (P2T)"): the engine computes it from the reward gradient at the sampled tokens (points
    0) with the strategy's null embedding, which the request carries."""
    cfg = verl_config("algorithm.adv_estimator=grpo", *credit, DIRECTION)
    settings = credit_settings(cfg)
    assert settings.plan.signals == {"reward_attribution"}
    request = work_request(settings)
    assert request is not None
    asked = json.loads(request)
    assert asked["signals"] == ["reward_attribution"]
    assert asked["null"] == null and asked["points"] == 0
    datc_cfg = verl_config("algorithm.adv_estimator=grpo", "algorithm.credit=datc", DIRECTION)
    datc = work_request(credit_settings(datc_cfg))
    assert datc is not None and "null" not in json.loads(datc)


def test_a_plan_without_engine_signals_sends_no_request(grpo) -> None:
    cfg = verl_config("algorithm.adv_estimator=grpo", "algorithm.credit=entropy_top")
    assert work_request(credit_settings(cfg)) is None


GAE = ("algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=4")


@pytest.mark.parametrize(
    "credit",
    [
        "uniform",
        "datc",
        "{name:red,mode:paper}",
        "abc",
        "{name:entropy_top,mode:weight}",
        "p2t",
        "{name:p2t,mode:paper}",
    ],
)
def test_a_strategy_with_a_token_reward_form_is_served_under_gae(credit: str) -> None:
    cfg = verl_config(*GAE, f"algorithm.credit={credit}", DIRECTION)
    assert credit_settings(cfg).plan.strategy.critic_reward_form in ("weights", "token_rewards")


@pytest.mark.parametrize("credit", ["ktae", "entropy_top"])
def test_a_strategy_without_a_token_reward_form_is_refused_under_gae(credit: str) -> None:
    """``ktae`` (a token score added to A_i) and ``entropy_top``'s default ``mask`` mode
    (credit dropped, not moved): the plan's message, naming the estimator's key."""
    cfg = verl_config(*GAE, f"algorithm.credit={credit}")
    with pytest.raises(CreditError) as err:
        credit_settings(cfg)
    assert str(err.value).startswith(
        f"algorithm.adv_estimator: 'gae'; credit strategy '{credit}' has no token-reward form "
        "for a critic"
    )


def test_gae_needs_two_samples_per_prompt_for_a_strategy_other_than_uniform() -> None:
    one = ("algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1")
    with pytest.raises(CreditError, match=r"^actor_rollout_ref.rollout.n: 1; .* set it to >= 2"):
        credit_settings(verl_config(*one, "algorithm.credit=datc", DIRECTION))
    assert credit_settings(verl_config(*one)).plan.name == "uniform"
    with pytest.raises(CreditError, match=r"^actor_rollout_ref.rollout.n: 1"):
        credit_settings(verl_config(*one, "algorithm.credit=red", DIRECTION))


def test_another_estimator_is_refused() -> None:
    cfg = verl_config("algorithm.adv_estimator=reinforce_plus_plus", "algorithm.credit=datc")
    with pytest.raises(CreditError, match=r"algorithm.adv_estimator: 'reinforce_plus_plus'"):
        credit_settings(cfg)


def test_overrides_get_plus_only_for_credit_keys() -> None:
    given = [
        "algorithm.credit=datc",
        "+algorithm.direction={kind:module}",
        "algorithm.credit_stats_chunk_size=8",
        "algorithm.adv_estimator=grpo",
        "trainer.total_training_steps=2",
    ]
    assert verl_overrides(given) == [
        "+algorithm.credit=datc",
        "+algorithm.direction={kind:module}",
        "+algorithm.credit_stats_chunk_size=8",
        "algorithm.adv_estimator=grpo",
        "trainer.total_training_steps=2",
    ]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], (SP_ENGINE, 1)),
        ([f"{SP_ENGINE}=2"], (SP_ENGINE, 2)),
        ([f"{SP_ACTOR}=4", f"{SP_ENGINE}=2"], (SP_ACTOR, 4)),
        ([f"{SP_ACTOR}=1", f"{SP_ENGINE}=2"], (SP_ENGINE, 2)),
    ],
)
def test_the_sequence_parallel_size_is_the_one_verls_actor_config_resolves(
    overrides: list[str], expected: tuple[str, int]
) -> None:
    """verl's own ``FSDPActorConfig`` (built from the same composed config) gives its engine
    the size that ``sequence_parallel_size`` reads: the deprecated key when above 1."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    micro = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"
    cfg = verl_config("algorithm.adv_estimator=grpo", micro, *overrides)
    actor = omega_conf_to_dataclass(OmegaConf.to_container(cfg.actor_rollout_ref.actor))
    assert sequence_parallel_size(cfg) == expected
    assert actor.fsdp_config.ulysses_sequence_parallel_size == expected[1]
