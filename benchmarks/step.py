"""Benchmark 3: the torch backend's full GRPO step, ``uniform`` vs ``datc`` vs ``saliency`` vs
``oar_g`` (whose signal is an extra policy pass: one no-grad forward and one forward +
backward to the input embeddings, docs/performance.md).

One ``backends.torch.GRPORecipe`` per strategy is built in this process from the same config
(only ``credit`` differs; same seed, so the same initial policy and prompts). Their
``train_step()`` calls are then alternated, the order rotating every round, so that a slow
phase of the machine hits every strategy alike. A step is the whole step: rollout
(generation), rewards, advantages, the strategy's signals, credit, the clipped-loss update.

Signal computation is measured, not assumed: while the steps run, ``adapters.policy``'s
policy-side statistics (``POLICY_SIDE``) and every recipe's direction-model
``score(..., with_grad=True)`` are wrapped with timers (``SignalSpy``), and the trainer's
own counters (``signals/policy_stats_rows``, ``signals/reward_grad_rows``) are read from its
step metrics. ``uniform`` passes when both are zero; the check is void unless ``datc``'s are not.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from benchmarks import timing

STRATEGIES = ("uniform", "datc", "saliency", "oar_g")
#: The answer span of the benchmark's task for a strategy that reads one (``oar_g``): the
#: positional task has no final answer, so its responses' last token stands in for one.
ANSWER_SPAN = {"last": 1}
REPO = Path(__file__).resolve().parents[1]
#: What ``adapters.policy`` calls for the old policy's statistics: ``PolicyStats``, or DATC's
#: W0 streamed from the reward gradient (fused with the log-probs, or on its own).
POLICY_SIDE = ("policy_stats", "streamed_work_and_logprobs", "unsigned_work")
#: Target on the full step: datc / uniform ratio of medians.
STEP_TARGET = 1.15


@dataclass(frozen=True)
class StepConfig:
    """A base training config (YAML) and ``--set``-style overrides applied to it."""

    name: str
    path: Path
    overrides: tuple[str, ...] = ()


FULL_CONFIGS: tuple[StepConfig, ...] = (
    StepConfig("tiny", REPO / "configs" / "torch" / "tiny_datc.yaml"),
)
QUICK_CONFIGS: tuple[StepConfig, ...] = (
    StepConfig(
        "tiny-quick",
        REPO / "configs" / "torch" / "tiny_datc.yaml",
        ("rollout.group_size=2", "rollout.prompts_per_step=2", "rollout.max_new_tokens=4"),
    ),
)


@dataclass
class SignalTimes:
    """Calls and seconds spent in the credit signals, per strategy."""

    policy_stats_calls: int = 0
    policy_stats_seconds: float = 0.0
    reward_grad_calls: int = 0
    reward_grad_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        return self.policy_stats_seconds + self.reward_grad_seconds

    @property
    def calls(self) -> int:
        return self.policy_stats_calls + self.reward_grad_calls


@dataclass
class SignalSpy:
    """Timers around the two signal computations; ``current`` names the running strategy."""

    device: torch.device
    current: str = ""
    times: dict[str, SignalTimes] = field(default_factory=dict)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _timed(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kind == "reward_grad" and not kwargs.get("with_grad", False):
                return fn(*args, **kwargs)
            self._sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self._sync()
            rec = self.times.setdefault(self.current, SignalTimes())
            dt = time.perf_counter() - t0
            if kind == "policy_stats":
                rec.policy_stats_calls += 1
                rec.policy_stats_seconds += dt
            else:
                rec.reward_grad_calls += 1
                rec.reward_grad_seconds += dt
            return out

        return wrapper

    def take(self, name: str) -> SignalTimes:
        """The figures gathered for ``name`` since the last ``take``, reset to zero."""
        return self.times.pop(name, SignalTimes())

    @contextlib.contextmanager
    def installed(self, recipes: dict[str, Any]) -> Iterator[None]:
        """Wrap the policy-side statistics ``adapters.policy`` calls (``policy_stats`` and
        the streamed W0 kernels) and each recipe's direction model."""
        import adapters.policy as policy_mod

        originals = {name: getattr(policy_mod, name) for name in POLICY_SIDE}
        for name, fn in originals.items():
            setattr(policy_mod, name, self._timed(fn, "policy_stats"))
        wrapped = []
        for recipe in recipes.values():
            dm = recipe.reward.direction
            if dm is not None and "score" not in vars(dm):
                dm.score = self._timed(dm.score, "reward_grad")
                wrapped.append(dm)
        try:
            yield
        finally:
            for name, fn in originals.items():
                setattr(policy_mod, name, fn)
            for dm in wrapped:
                del dm.score


def _train_config(base: StepConfig, strategy: str, out_dir: Path, device: str) -> Any:
    from backends.torch.config import config_from_dict
    from credit_core import strategy_class

    raw = yaml.safe_load(base.path.read_text()) or {}
    base_credit = raw.get("credit")
    base_name = base_credit.get("name") if isinstance(base_credit, dict) else base_credit
    raw["credit"] = base_credit if base_name == strategy else strategy
    if strategy_class(strategy).reads_answer_span:
        raw["data"] = {**raw.get("data", {}), "answer_span": ANSWER_SPAN}
    raw.update(
        output_dir=str(out_dir / strategy),
        steps=1_000_000,
        device=device,
        eval={"interval": 0},
        checkpoint={"interval": 0},
        logging={"progress": False, "tensorboard": False},
    )
    return config_from_dict(raw, list(base.overrides), source=str(base.path))


def _step(recipe: Any, device: torch.device) -> tuple[float, dict[str, float]]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    metrics = recipe.train_step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        metrics["_peak_memory_bytes"] = float(torch.cuda.max_memory_allocated(device))
    return time.perf_counter() - t0, metrics


def run_config(
    base: StepConfig,
    *,
    device: torch.device,
    pairs: int,
    warmup: int = 1,
    strategies: Sequence[str] = STRATEGIES,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Alternate ``pairs`` timed steps (after ``warmup``) of every strategy on ``base``."""
    from backends.torch.trainer import GRPORecipe

    names = list(strategies)
    with tempfile.TemporaryDirectory(prefix="credit-bench-step-") as tmp:
        recipes = {s: GRPORecipe(_train_config(base, s, Path(tmp), device.type)) for s in names}
        spy = SignalSpy(device)
        wall: dict[str, list[float]] = {s: [] for s in names}
        records: dict[str, list[dict[str, float]]] = {s: [] for s in names}
        signal: dict[str, list[SignalTimes]] = {s: [] for s in names}
        try:
            with spy.installed(recipes):
                for r in range(warmup + pairs):
                    k = r % len(names)
                    for name in names[k:] + names[:k]:
                        spy.current = name
                        seconds, metrics = _step(recipes[name], device)
                        sig = spy.take(name)
                        if r >= warmup:
                            wall[name].append(seconds)
                            records[name].append(metrics)
                            signal[name].append(sig)
                    if r >= warmup:
                        log(
                            f"step: {base.name} round {r - warmup + 1}/{pairs}: "
                            + ", ".join(f"{s} {wall[s][-1]:.3f}s" for s in names)
                        )
        finally:
            for recipe in recipes.values():
                recipe.logger.close()
                recipe.close()
    return _summarize(base, names, wall, records, signal)


def _summarize(
    base: StepConfig,
    names: list[str],
    wall: dict[str, list[float]],
    records: dict[str, list[dict[str, float]]],
    signal: dict[str, list[SignalTimes]],
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": base.name,
        "config": str(base.path.relative_to(REPO) if base.path.is_relative_to(REPO) else base.path),
        "overrides": list(base.overrides),
        "strategies": {},
        "ratio_to_uniform": {},
    }
    for name in names:
        recs, sig = records[name], signal[name]
        phases = {
            key.removeprefix("time/"): timing.Summary.of([m[key] for m in recs]).median
            for key in ("time/rollout", "time/signals", "time/update", "time/step")
            if all(key in m for m in recs)
        }
        counters = {
            key.removeprefix("signals/"): sum(m.get(key, 0.0) for m in recs)
            for key in ("signals/policy_stats_rows", "signals/reward_grad_rows")
        }
        row: dict[str, Any] = {
            "seconds": timing.Summary.of(wall[name]).to_dict(),
            "trainer_phase_medians": phases,
            "trainer_counters": counters,
            "signal_seconds": timing.Summary.of([s.seconds for s in sig]).to_dict(),
            "signal_calls": sum(s.calls for s in sig),
            "policy_stats_seconds_total": sum(s.policy_stats_seconds for s in sig),
            "reward_grad_seconds_total": sum(s.reward_grad_seconds for s in sig),
            "response_length": timing.Summary.of(
                [m.get("response/length_mean", 0.0) for m in recs]
            ).median,
        }
        peaks = [m["_peak_memory_bytes"] for m in recs if "_peak_memory_bytes" in m]
        if peaks:
            row["peak_memory_bytes"] = int(max(peaks))
        out["strategies"][name] = row
        if name != "uniform" and "uniform" in wall:
            out["ratio_to_uniform"][name] = timing.ratio(wall[name], wall["uniform"]).to_dict()
    return out


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's two step targets, per config."""
    out = []
    for cfg in section["configs"]:
        strat = cfg["strategies"]
        if "datc" in cfg["ratio_to_uniform"]:
            r = cfg["ratio_to_uniform"]["datc"]
            n = strat["datc"]["seconds"]["n"]
            out.append(
                {
                    "target": f"full step datc / uniform <= {STEP_TARGET} ({cfg['name']}, "
                    f"median of {n} paired steps)",
                    "measured": f"{r['of_medians']:.3f} of medians; paired median "
                    f"{r['paired_median']:.3f} (quartiles {r['paired_q25']:.3f}-"
                    f"{r['paired_q75']:.3f})",
                    "holds": max(r["of_medians"], r["paired_median"]) <= STEP_TARGET and n >= 5,
                }
            )
        if "uniform" in strat and "datc" in strat:
            u, d = strat["uniform"], strat["datc"]
            zero = u["signal_calls"] == 0 and all(v == 0 for v in u["trainer_counters"].values())
            probe_works = d["signal_calls"] > 0 and all(
                v > 0 for v in d["trainer_counters"].values()
            )
            out.append(
                {
                    "target": f"uniform spends no time in signal computation ({cfg['name']})",
                    "measured": f"uniform: {u['signal_calls']} signal calls, "
                    f"{u['policy_stats_seconds_total'] + u['reward_grad_seconds_total']:.4f} s, "
                    f"trainer counters {u['trainer_counters']}; datc: {d['signal_calls']} calls",
                    "holds": zero and probe_works,
                }
            )
    return out


def run(
    configs: Sequence[StepConfig],
    *,
    device: torch.device,
    pairs: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every config; ``configs`` results plus the targets evaluated on them."""
    results = [run_config(c, device=device, pairs=pairs, log=log) for c in configs]
    section: dict[str, Any] = {"configs": results, "pairs": pairs}
    section["targets"] = targets(section)
    return section
