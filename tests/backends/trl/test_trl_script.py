"""TRL's own GRPO script (``trl/scripts/grpo.py``, what ``trl grpo`` launches) with ``credit``.

The script is run as ``__main__`` in its own order: ``TrlParser`` reads the YAML, ``main``
loads the dataset, ``GRPOTrainer`` loads the policy and the reward model from their paths
with the script's ``model_init_kwargs`` (``dtype`` included), ``train()``, then
``save_model``. The only change is the one docs/trl.md asks of a TRL user: ``GRPOConfig`` and
``GRPOTrainer`` are the backend's (``from backends.trl import CreditGRPOConfig as
GRPOConfig, CreditGRPOTrainer as GRPOTrainer``). Nothing is handed to the trainer by hand:
the direction model is the reward model TRL itself loaded (no ``direction``).

- ``credit: datc`` with a float32 policy and reward model reaches step 2, the credit's
  diagnostics logged at steps 1 and 2, the gradient taken in TRL's own reward pass, the
  strategy constructed once in the whole process (parse, trainer, training, save), and
  ``credit/direction_is_reward`` logged (TRL's only reward is the direction model's);
- ``credit: datc_mid`` with ``dtype: bfloat16`` (TRL then loads the reward model in bf16, as
  DeepSpeed's bf16 configs cast it) reaches step 2: the path gradient feeds a bf16 reward
  model in its own dtype (issue 44, finding 2; before, its first matmul failed on dtype);
- ``credit: datc_ig`` with a float32 run and ``direction.dtype: bfloat16`` reaches step 2,
  logging the agreement of that direction model of its own with TRL's reward.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import trl
import yaml

from adapters.reward_models import SeqClassificationRM
from adapters.tiny import tiny_causal_lm, tiny_seq_classifier, train_bpe_tokenizer
from backends.samples.records import SAMPLES_FILE, read_samples
from backends.trl import CreditGRPOConfig, CreditGRPOTrainer
from backends.trl.reward_pass import GradientRewardModel
from credit_core.registry import strategy_class

PROMPTS = ["the cat sat", "a dog ran", "red ball", "the park is", "sunny day", "it was"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random Llama policy and a tiny Llama reward model (float32) saved with one
    BPE tokenizer, and a local JSON-lines dataset of prompts, as TRL's script reads them."""
    root = tmp_path_factory.mktemp("trl_script")
    tokenizer = train_bpe_tokenizer(vocab_size=256)
    paths = {"policy": root / "policy", "rm": root / "rm", "data": root / "data"}
    tiny_causal_lm(
        "llama",
        len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    ).save_pretrained(paths["policy"])
    tiny_seq_classifier(
        "llama", len(tokenizer), seed=1, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(paths["rm"])
    for name in ("policy", "rm"):
        tokenizer.save_pretrained(paths[name])
    paths["data"].mkdir()
    rows = "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS * 2)
    (paths["data"] / "train.jsonl").write_text(rows)
    return paths


class SeenTrainer(CreditGRPOTrainer):
    """``CreditGRPOTrainer`` that keeps the instance the script built, to be inspected."""

    seen: ClassVar[list[CreditGRPOTrainer]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        SeenTrainer.seen.append(self)


def run_trl_grpo_script(
    config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[CreditGRPOTrainer, list[dict[str, Any]]]:
    """``trl/scripts/grpo.py`` run as ``__main__`` with ``--config`` (``config`` as YAML),
    the backend's classes in place of TRL's; the trainer it built and the log history of
    the checkpoint it saved at step 2 (``trainer_state.json``)."""
    monkeypatch.setattr(trl, "GRPOConfig", CreditGRPOConfig)
    monkeypatch.setattr(trl, "GRPOTrainer", SeenTrainer)
    monkeypatch.setattr(SeenTrainer, "seen", [])
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    script = Path(trl.__file__).parent / "scripts" / "grpo.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--config", str(path)])
    runpy.run_path(str(script), run_name="__main__")
    state = json.loads((tmp_path / "out" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    (trainer,) = SeenTrainer.seen
    return trainer, state["log_history"]


def script_config(saved: dict[str, Path], out: Path, **settings: Any) -> dict[str, Any]:
    """The YAML of a two-step CPU run of the saved models, plus ``settings``."""
    return {
        "model_name_or_path": str(saved["policy"]),
        "reward_model_name_or_path": str(saved["rm"]),
        "dataset_name": str(saved["data"]),
        "output_dir": str(out),
        "use_cpu": True,
        "bf16": False,
        "seed": 0,
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 8,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": 2,
        "report_to": "none",
        "disable_tqdm": True,
        **settings,
    }


def credit_steps(history: list[dict[str, Any]]) -> list[int]:
    """The steps whose logged metrics carry the credit's diagnostics."""
    return [entry["step"] for entry in history if "credit/weight_max" in entry]


@pytest.mark.parametrize(
    ("credit", "dtype"),
    [("datc", "float32"), ("datc_mid", "bfloat16")],
    ids=["datc", "datc_mid_bf16"],
)
def test_trls_grpo_script_trains_with_credit_to_step_2(
    saved: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    credit: str,
    dtype: str,
) -> None:
    built: list[Any] = []
    cls = strategy_class(credit)
    real_init = cls.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counted)
    config = script_config(saved, tmp_path / "out", dtype=dtype, credit=credit)
    trainer, history = run_trl_grpo_script(config, tmp_path, monkeypatch)
    assert built == [trainer.credit.run.strategy]  # one strategy instance in the process
    # the direction model reads the reward model TRL loaded itself, in the script's dtype
    # (datc shares TRL's reward pass: TRL's reward function is then its GradientRewardModel)
    loaded = trainer.reward_funcs[0]
    if credit == "datc":
        assert isinstance(loaded, GradientRewardModel)
        loaded = loaded.model
    assert isinstance(trainer.direction, SeqClassificationRM)
    assert trainer.direction.model is loaded
    assert trainer.direction.model.dtype == getattr(torch, dtype)
    assert trainer.alphas == ([0.5] if credit == "datc_mid" else [])
    assert credit_steps(history) == [1, 2]
    logged = [e for e in history if "credit/weight_max" in e]
    assert all(e["credit/direction_is_reward"] == 1.0 for e in logged)
    assert not any("credit/direction_agreement" in e for e in logged)
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_a_bf16_direction_model_of_its_own_takes_the_path_gradient(
    saved: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 run whose ``direction`` is the reward model loaded in bf16
    (``direction.dtype: bfloat16``) with ``datc_ig`` (2 points) reaches step 2."""
    direction = {"kind": "seq_classification", "path": str(saved["rm"]), "dtype": "bfloat16"}
    credit = {"name": "datc_ig", "points": 2}
    config = script_config(
        saved, tmp_path / "out", credit=credit, direction=direction, credit_samples_steps=2
    )
    trainer, history = run_trl_grpo_script(config, tmp_path, monkeypatch)
    assert isinstance(trainer.direction, SeqClassificationRM)
    assert trainer.direction.model.dtype == torch.bfloat16
    assert trainer.alphas == [0.25, 0.75]
    assert credit_steps(history) == [1, 2]
    # its own model (not TRL's reward function): one group of 4 per step, measured against
    # TRL's reward by the scores of a pass without grad (its path passes score no sample)
    for entry in (e for e in history if "credit/weight_max" in e):
        assert entry["credit/direction_is_reward"] == 0.0
        assert entry["credit/agreement_groups"] + entry["credit/agreement_skipped"] == 1
        assert entry["credit/agreement_groups"] == 1
        assert -1.0 <= entry["credit/direction_agreement"] <= 1.0
    # the step-2 credit samples carry that step's agreement (credit-view shows it)
    (record,) = read_samples(tmp_path / "out" / SAMPLES_FILE)
    logged = next(e for e in history if "credit/weight_max" in e and e["step"] == 2)
    assert record.step == 2 and record.agreement is not None
    assert record.agreement.groups == 1 and not record.agreement.direction_is_reward
    assert record.agreement.agreement == pytest.approx(
        logged["credit/direction_agreement"], rel=1e-5
    )
