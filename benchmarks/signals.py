"""Benchmark 1: ``credit_core.policy_stats`` and the two-matmul W0 against the LM-head matmul
and a naive version.

For each shape (B x T tokens, vocabulary V, hidden H, reward-embedding width d):

- ``lm_head``: the plain ``hidden @ W.T`` producing the (B*T, V) logits, the policy's own cost;
- ``stream``: ``policy_stats`` (streamed online softmax over vocabulary chunks), the current
  path's kernel (DATC's W then costs ``token_work``, O(N d), under 0.1% of it at V = 32k:
  not timed, which favours the current path in the comparison below);
- ``two_matmul``: ``streamed_unsigned_work``, W0 with g contracted first (LM head plus one
  (N x d) x (d x V) product per tile, no (B, T, d) statistics);
- ``naive``: the statistics from a materialized (B, T, V) softmax (``naive_policy_stats``).

Reported: seconds per call (interleaved repeats), each kernel's ratio to ``lm_head`` in the
same run, ``stream / two_matmul``, the FLOP-floor ratio ``t / (t_lm_head * F / F_lm_head)``
(the floor is the time the matmul's own measured FLOP rate predicts for the kernel's FLOPs:
F_stream = 2NVH + 4NVd, F_two_matmul = 2NVH + 2NVd), peak extra memory of ``stream``,
``two_matmul`` and ``naive`` (``benchmarks.memory``), the largest relative difference of W0
between the two paths, and at small H the share of ``policy_stats``' time spent in ``exp``
(``torch.profiler``). Shapes too large for the device (time or memory) are listed as skipped
with the reason, never silently dropped.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import memory, timing
from credit_core import PolicyStats, policy_stats, streamed_unsigned_work, token_work
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE, DEFAULT_TILE_ELEMENTS

_F32 = 4  # bytes per float32


@dataclass(frozen=True)
class SignalCase:
    """One shape of the sweep: ``batch x seq`` tokens, vocabulary, hidden and RM widths."""

    batch: int
    seq: int
    vocab: int
    hidden: int
    embed: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def lm_head_flops(self) -> float:
        return 2.0 * self.tokens * self.vocab * self.hidden

    @property
    def stream_flops(self) -> float:
        """LM head plus the two (N x V) x (V x d) products."""
        return self.lm_head_flops + 4.0 * self.tokens * self.vocab * self.embed

    @property
    def two_matmul_flops(self) -> float:
        """LM head plus the one (N x d) x (d x V) product u = g E^T."""
        return self.lm_head_flops + 2.0 * self.tokens * self.vocab * self.embed

    @property
    def naive_bytes(self) -> int:
        """The (N, V) float32 tensors the naive version holds at once: logits, p, p^2."""
        return 3 * self.tokens * self.vocab * _F32

    @property
    def label(self) -> str:
        dims = (
            f"H=d={self.hidden}" if self.hidden == self.embed else f"H={self.hidden} d={self.embed}"
        )
        return f"{self.batch}x{self.seq} V={self.vocab} {dims}"


def _grid(
    shapes: Sequence[tuple[int, int]], vocabs: Sequence[int], widths: Sequence[int]
) -> list[SignalCase]:
    return [SignalCase(b, t, v, w, w) for b, t in shapes for v in vocabs for w in widths]


#: The issue's sweep, plus extra vocabulary sizes at 1 x 512 for the time/memory-vs-V plot,
#: plus H = d = 128 and 256 at 4 x 1024, V = 32k: where the two-matmul W0 overtakes
#: ``policy_stats`` (``credit_core.TWO_MATMUL_MIN_EMBED_DIM``).
FULL_CASES: tuple[SignalCase, ...] = tuple(
    sorted(
        _grid([(1, 512), (4, 1024), (8, 2048)], [32768, 151936], [64, 896])
        + _grid([(1, 512)], [8192, 65536], [64, 896])
        + _grid([(4, 1024)], [32768], [128, 256]),
        key=lambda c: (c.tokens, c.hidden, c.vocab),
    )
)
#: The case the issue's targets are stated for (B x T = 4 x 1024, V = 32k, H = d = 896).
TARGET_CASE = SignalCase(4, 1024, 32768, 896, 896)
#: Timed calls per function at ``TARGET_CASE`` (at least).
TARGET_REPEATS = 5
#: Target on peak memory: stream at most this fraction of naive at V = 32k, T = 1024.
MEMORY_TARGET = 1 / 8
#: Target on time: at most this many times the FLOP floor at ``TARGET_CASE``.
FLOOR_TARGET = 1.3
#: Target: the two-matmul W0 at least this many times faster than ``policy_stats`` at
#: ``TARGET_CASE``, with the same W0 within ``WORK_RTOL`` (relative to max |W0|).
TWO_MATMUL_SPEEDUP_TARGET = 1.15
WORK_RTOL = 1e-5
QUICK_CASES: tuple[SignalCase, ...] = (
    SignalCase(1, 64, 1024, 32, 32),
    SignalCase(1, 64, 8192, 32, 32),  # naive logits 2 MiB: above the 1 MiB mmap threshold
)


@dataclass(frozen=True)
class Limits:
    """What a device runs: ``policy_stats`` FLOPs and logits elements per call, naive bytes."""

    max_stream_flops: float
    max_logits_elements: float
    max_naive_bytes: float

    @classmethod
    def for_device(cls, device: torch.device) -> Limits:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            return cls(float("inf"), float("inf"), 0.6 * free)
        return cls(1.0e12, 1.6e9, min(2 * 2**30, 0.5 * _available_ram()))

    def skip_reason(self, case: SignalCase) -> str | None:
        if case.stream_flops > self.max_stream_flops:
            return f"{case.stream_flops / 1e12:.1f} TFLOP per call: GPU only"
        if case.tokens * case.vocab > self.max_logits_elements:
            return f"{case.tokens * case.vocab / 1e9:.1f}G logits per call: GPU only"
        return None

    def naive_skip_reason(self, case: SignalCase) -> str | None:
        if case.naive_bytes > self.max_naive_bytes:
            return f"naive: {case.naive_bytes / 2**30:.1f} GiB, GPU only"
        return None


def _available_ram() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def make_inputs(
    case: SignalCase, *, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random inputs of ``case``: logits with a standard deviation of about 2 (a peaked but
    not one-hot softmax, like a trained LM's), unit-scale reward embeddings, and a float32
    reward gradient g (the RM's gradient is float32 whatever the policy's dtype)."""
    gen = torch.Generator().manual_seed(seed)
    V, H = case.vocab, case.hidden
    hidden = torch.randn(case.batch, case.seq, H, generator=gen)
    weight = torch.randn(V, H, generator=gen).mul_(2.0 / H**0.5)
    emb = torch.randn(V, case.embed, generator=gen)
    ids = torch.randint(0, V, (case.batch, case.seq), generator=gen)
    grad = torch.randn(case.batch, case.seq, case.embed, generator=gen)
    return {
        "hidden": hidden.to(device, dtype),
        "weight": weight.to(device, dtype),
        "emb": emb.to(device, dtype),
        "ids": ids.to(device),
        "grad": grad.to(device),
    }


def naive_policy_stats(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> PolicyStats:
    """The same statistics as ``policy_stats`` from a materialized (B, T, V) softmax: the
    baseline ``policy_stats`` is measured against (time and memory), float32 throughout."""
    logits = (hidden @ lm_head_weight.T).float().div_(temperature)
    p = torch.softmax(logits, dim=-1)
    del logits
    p2 = p * p
    emb = reward_embedding.float()
    return PolicyStats(
        p_sampled=p.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1),
        p_sq=p2.sum(-1),
        m1=p @ emb,
        m2=p2 @ emb,
        sampled_emb=emb[token_ids],
    )


def _calls(x: dict[str, torch.Tensor]) -> dict[str, Callable[[], object]]:
    h2 = x["hidden"].reshape(-1, x["hidden"].shape[-1])
    return {
        "lm_head": lambda: h2 @ x["weight"].T,
        "stream": lambda: policy_stats(x["hidden"], x["weight"], x["ids"], x["emb"]),
        "two_matmul": lambda: streamed_unsigned_work(
            x["hidden"], x["weight"], x["ids"], x["emb"], x["grad"]
        ),
        "naive": lambda: naive_policy_stats(x["hidden"], x["weight"], x["ids"], x["emb"]),
    }


def _small(x: dict[str, torch.Tensor], tokens: int = 4) -> dict[str, torch.Tensor]:
    """The inputs cut to the first ``tokens`` tokens of the first row: for warm-up calls
    (kernels, library buffers; 4 tokens) and agreement checks."""
    return {
        **x,
        "hidden": x["hidden"][:1, :tokens],
        "ids": x["ids"][:1, :tokens],
        "grad": x["grad"][:1, :tokens],
    }


def memory_workload(
    case: dict[str, int], device: str, dtype: str
) -> dict[str, Callable[[], object]]:
    """A ``benchmarks.memory`` workload: the inputs of ``case`` built, the calls returned,
    each with a warm-up call on the first 4 tokens."""
    x = make_inputs(SignalCase(**case), device=torch.device(device), dtype=getattr(torch, dtype))
    calls = _calls(x)
    warm = _calls(_small(x))
    return {**calls, **{f"{k}:warmup": warm[k] for k in calls}}


def exp_share(call: Callable[[], object], device: torch.device) -> dict[str, float]:
    """Share of one call's operator time spent in ``exp`` and in matrix products (profiler)."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        totals[event.key] = totals.get(event.key, 0.0) + float(getattr(event, attr))
    total = sum(totals.values())

    def is_exp(key: str) -> bool:
        if device.type == "cuda":  # kernel names, e.g. "...exp_kernel_cuda..."
            return "exp" in key.lower() and "expand" not in key.lower()
        return key in ("aten::exp", "aten::exp_")

    exp = sum(t for k, t in totals.items() if is_exp(k))
    mm = sum(t for k, t in totals.items() if k in ("aten::mm", "aten::addmm", "aten::addmm_"))
    return {"exp": exp / total if total else 0.0, "matmul": mm / total if total else 0.0}


def _check_agreement(x: dict[str, torch.Tensor], tokens: int = 64) -> float:
    """Largest relative error of ``stream`` against ``naive`` over the five fields, on the
    first ``tokens`` tokens of the first row (the full vocabulary: every chunk is used)."""
    h, ids = x["hidden"][:1, :tokens], x["ids"][:1, :tokens]
    a = policy_stats(h, x["weight"], ids, x["emb"])
    b = naive_policy_stats(h, x["weight"], ids, x["emb"])
    worst = 0.0
    for field in ("p_sampled", "p_sq", "m1", "m2", "sampled_emb"):
        u, v = getattr(a, field).double(), getattr(b, field).double()
        worst = max(worst, float((u - v).abs().max() / v.abs().max().clamp_min(1e-30)))
    return worst


def _work_agreement(x: dict[str, torch.Tensor], tokens: int = 64) -> float:
    """Largest difference of the two-matmul W0 from ``token_work(policy_stats)``, relative
    to max |W0|, on the first ``tokens`` tokens of the first row."""
    y = _small(x, tokens)
    current = token_work(
        policy_stats(y["hidden"], y["weight"], y["ids"], y["emb"]), y["grad"], None
    )
    two = streamed_unsigned_work(y["hidden"], y["weight"], y["ids"], y["emb"], y["grad"])
    scale = current.double().abs().max().clamp_min(1e-30)
    return float((two.double() - current.double()).abs().max() / scale)


def run_case(
    case: SignalCase,
    *,
    device: torch.device,
    dtype: torch.dtype,
    limits: Limits,
    repeats: int,
    measure_memory: bool,
    profile_exp: bool,
) -> dict[str, Any]:
    """Time (and measure) one case; a skipped case returns its reason."""
    row: dict[str, Any] = {"case": asdict(case), "label": case.label}
    reason = limits.skip_reason(case)
    if reason is not None:
        row["skipped"] = reason
        return row
    naive_reason = limits.naive_skip_reason(case)
    x = make_inputs(case, device=device, dtype=dtype)
    calls = _calls(x)
    row["max_rel_err_vs_naive"] = _check_agreement(x)
    row["work_rel_err"] = _work_agreement(x)
    if naive_reason is not None:
        del calls["naive"]
        row["naive_skipped"] = naive_reason
    warm = {k: v for k, v in _calls(_small(x)).items() if k in calls}
    if case == TARGET_CASE:
        repeats = max(repeats, TARGET_REPEATS)
    times = timing.interleaved(calls, repeats=repeats, warmup=1, warmup_fns=warm)
    row["seconds"] = {k: timing.Summary.of(v).to_dict() for k, v in times.items()}
    row["ratio_to_lm_head"] = {
        k: timing.ratio(v, times["lm_head"]).to_dict() for k, v in times.items() if k != "lm_head"
    }
    lm_rate = case.lm_head_flops / timing.Summary.of(times["lm_head"]).median
    row["lm_head_gflops"] = lm_rate / 1e9
    floor = case.stream_flops / case.lm_head_flops
    row["floor_ratio"] = row["ratio_to_lm_head"]["stream"]["of_medians"] / floor
    two_floor = case.two_matmul_flops / case.lm_head_flops
    row["two_matmul_floor_ratio"] = row["ratio_to_lm_head"]["two_matmul"]["of_medians"] / two_floor
    row["stream_over_two_matmul"] = timing.ratio(times["stream"], times["two_matmul"]).to_dict()
    if profile_exp:
        row["time_share"] = exp_share(calls["stream"], device)
    del x, calls
    if measure_memory:
        kw = {"case": asdict(case), "device": str(device), "dtype": str(dtype).split(".")[-1]}
        # naive right after stream, as before the two-matmul kernel was added: at tiny
        # sizes (below the 1 MiB mmap threshold) the heap reuses what a previous call freed
        names = ["stream"] + ([] if naive_reason is not None else ["naive"]) + ["two_matmul"]
        row["peak_extra_bytes"] = memory.peak_extra_bytes(
            "benchmarks.signals:memory_workload", kw, names, device=device
        )
    return row


def run(
    cases: Sequence[SignalCase],
    *,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
    measure_memory: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the sweep; ``rows`` in case order, plus the targets evaluated on them."""
    limits = Limits.for_device(device)
    rows = []
    for case in cases:
        log(f"signals: {case.label}")
        rows.append(
            run_case(
                case,
                device=device,
                dtype=dtype,
                limits=limits,
                repeats=repeats,
                measure_memory=measure_memory,
                profile_exp=case.hidden <= 64,
            )
        )
    return {"rows": rows, "targets": targets(rows)}


def targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's two targets on this benchmark, where the sweep holds the cases."""
    out: list[dict[str, Any]] = []
    for row in rows:
        case = SignalCase(**row["case"])
        if case == TARGET_CASE and "floor_ratio" in row:
            out.append(
                {
                    "target": f"policy_stats within {FLOOR_TARGET}x of its FLOP floor at "
                    f"{case.label}",
                    "measured": f"{row['floor_ratio']:.2f}x floor "
                    f"({row['ratio_to_lm_head']['stream']['of_medians']:.2f}x LM head)",
                    "holds": row["floor_ratio"] <= FLOOR_TARGET,
                }
            )
            speedup = row["stream_over_two_matmul"]["of_medians"]
            to_lm = {k: v["of_medians"] for k, v in row["ratio_to_lm_head"].items()}
            out.append(
                {
                    "target": f"two-matmul W0 >= {TWO_MATMUL_SPEEDUP_TARGET}x faster than "
                    f"policy_stats, same W0 within {WORK_RTOL:g} relative, at {case.label}",
                    "measured": f"{speedup:.2f}x ({to_lm['two_matmul']:.2f}x vs "
                    f"{to_lm['stream']:.2f}x LM head); "
                    f"W0 rel. diff {row['work_rel_err']:.1e}",
                    "holds": speedup >= TWO_MATMUL_SPEEDUP_TARGET
                    and row["work_rel_err"] <= WORK_RTOL,
                }
            )
        peak = row.get("peak_extra_bytes") or {}
        if (
            case.vocab == 32768
            and case.seq == 1024
            and peak.get("stream") is not None
            and peak.get("naive")
        ):
            frac = peak["stream"] / peak["naive"]
            out.append(
                {
                    "target": f"peak extra memory <= 1/8 of naive at {case.label}",
                    "measured": f"{frac:.3f} ({peak['stream'] / 2**20:.0f} MiB vs "
                    f"{peak['naive'] / 2**20:.0f} MiB)",
                    "holds": frac <= MEMORY_TARGET,
                }
            )
    return out


#: (chunk_size, tile_elements) settings compared by ``run_tiles``; the first is the default.
TILE_SETTINGS: tuple[tuple[int, int], ...] = (
    (DEFAULT_CHUNK_SIZE, DEFAULT_TILE_ELEMENTS),
    (2048, 2 << 20),
    (2048, 4 << 20),
    (4096, 1 << 20),
    (4096, 4 << 20),
    (8192, 4 << 20),
    (8192, 8 << 20),
    (16384, 4 << 20),
)
TILE_CASES: tuple[SignalCase, ...] = (TARGET_CASE, SignalCase(4, 1024, 32768, 64, 64))


def _tile_calls(
    x: dict[str, torch.Tensor], settings: Sequence[tuple[int, int]]
) -> dict[str, Callable[[], object]]:
    h2 = x["hidden"].reshape(-1, x["hidden"].shape[-1])
    calls: dict[str, Callable[[], object]] = {"lm_head": lambda: h2 @ x["weight"].T}
    for chunk, tile in settings:
        calls[f"{chunk}/{tile >> 20}Mi"] = functools.partial(
            policy_stats,
            x["hidden"],
            x["weight"],
            x["ids"],
            x["emb"],
            chunk_size=chunk,
            tile_elements=tile,
        )
    return calls


def run_tiles(
    cases: Sequence[SignalCase],
    *,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
    settings: Sequence[tuple[int, int]] = TILE_SETTINGS,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """``policy_stats`` at several (chunk_size, tile_elements), interleaved with the LM head:
    the measurement behind the defaults."""
    rows = []
    for case in cases:
        log(f"tiles: {case.label}")
        calls = _tile_calls(make_inputs(case, device=device, dtype=dtype), settings)
        times = timing.interleaved(calls, repeats=repeats, warmup=1)
        rows.append(
            {
                "case": asdict(case),
                "label": case.label,
                "seconds": {k: timing.Summary.of(v).to_dict() for k, v in times.items()},
                "ratio_to_lm_head": {
                    k: timing.ratio(v, times["lm_head"]).to_dict()
                    for k, v in times.items()
                    if k != "lm_head"
                },
            }
        )
    return {"rows": rows}


def run_compile(
    cases: Sequence[SignalCase],
    *,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """``policy_stats`` eager against ``torch.compile(policy_stats)`` (inductor, static
    shapes), interleaved with the LM head: whether compiling the kernel pays. Reports the
    first compiled call (the compilation) apart, and the largest difference of ``m1``."""
    rows = []
    for case in cases:
        log(f"compile: {case.label}")
        x = make_inputs(case, device=device, dtype=dtype)
        args = (x["hidden"], x["weight"], x["ids"], x["emb"])
        compiled = torch.compile(policy_stats, dynamic=False)
        first = timing.time_once(functools.partial(compiled, *args))
        diff = float((compiled(*args).m1 - policy_stats(*args).m1).abs().max())
        h2 = x["hidden"].reshape(-1, x["hidden"].shape[-1])
        calls: dict[str, Callable[[], object]] = {
            "lm_head": functools.partial(torch.matmul, h2, x["weight"].T),
            "eager": functools.partial(policy_stats, *args),
            "compiled": functools.partial(compiled, *args),
        }
        times = timing.interleaved(calls, repeats=repeats, warmup=1)
        rows.append(
            {
                "case": asdict(case),
                "label": case.label,
                "first_compiled_call_s": first,
                "max_abs_diff_m1": diff,
                "seconds": {k: timing.Summary.of(v).to_dict() for k, v in times.items()},
                "compiled_over_eager": timing.ratio(times["compiled"], times["eager"]).to_dict(),
            }
        )
    return {"rows": rows}
