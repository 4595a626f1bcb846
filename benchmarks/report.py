"""Render benchmark results: one JSON file, one Markdown report, one PNG plot.

The JSON holds everything measured (``results.json``); the Markdown (``results.md``) is the
table published in ``docs/performance.md``; the plot shows ``policy_stats``' and the
two-matmul W0's time and peak memory against the vocabulary size next to the LM head and the
naive version.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_MiB = 2**20


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")


def _ms(row: dict[str, Any], name: str) -> str:
    s = row.get("seconds", {}).get(name)
    return f"{s['median'] * 1e3:.1f}" if s else "-"


def _ratio(r: dict[str, float] | None) -> str:
    if not r:
        return "-"
    return (
        f"{r['of_medians']:.2f} (paired {r['paired_median']:.2f} "
        f"[{r['paired_q25']:.2f}, {r['paired_q75']:.2f}])"
    )


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / _MiB:.0f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def signals_table(section: dict[str, Any]) -> list[str]:
    header = [
        "B x T",
        "V",
        "H = d",
        "LM head ms",
        "policy_stats ms",
        "x LM head (paired median [IQR])",
        "x FLOP floor",
        "two-matmul W0 ms",
        "x LM head (paired median [IQR])",
        "x FLOP floor",
        "policy_stats / two-matmul (paired median [IQR])",
        "W0 rel. diff",
        "naive ms",
        "peak MiB stream / two-matmul / naive",
        "share exp / matmul",
    ]
    rows = []
    for row in section["rows"]:
        c = row["case"]
        dims = [f"{c['batch']}x{c['seq']}", str(c["vocab"]), str(c["hidden"])]
        if "skipped" in row:
            rows.append([*dims, *["-"] * 10, f"skipped: {row['skipped']}", "-"])
            continue
        peak = row.get("peak_extra_bytes", {})
        streamed = f"{_mib(peak.get('stream'))} / {_mib(peak.get('two_matmul'))}"
        mem = f"{streamed} / {_mib(peak.get('naive'))}"
        if "naive_skipped" in row:
            mem = f"{streamed} / ({row['naive_skipped']})"
        share = row.get("time_share")
        rows.append(
            [
                *dims,
                _ms(row, "lm_head"),
                _ms(row, "stream"),
                _ratio(row["ratio_to_lm_head"].get("stream")),
                f"{row['floor_ratio']:.2f}",
                _ms(row, "two_matmul"),
                _ratio(row["ratio_to_lm_head"].get("two_matmul")),
                f"{row['two_matmul_floor_ratio']:.2f}",
                _ratio(row.get("stream_over_two_matmul")),
                f"{row['work_rel_err']:.1e}",
                _ms(row, "naive"),
                mem,
                f"{share['exp']:.0%} / {share['matmul']:.0%}" if share else "-",
            ]
        )
    return _table(header, rows)


def reward_table(section: dict[str, Any]) -> list[str]:
    header = [
        "reward model",
        "B x R",
        "forward ms",
        "forward + input grad ms",
        "ratio (paired median [IQR])",
    ]
    rows = [
        [
            row["model"],
            f"{row['batch']}x{row['response_len']}",
            _ms(row, "forward"),
            _ms(row, "forward_grad"),
            _ratio(row["ratio"]),
        ]
        for row in section["rows"]
    ]
    return _table(header, rows)


def step_table(section: dict[str, Any]) -> list[str]:
    header = [
        "config",
        "strategy",
        "step s (median)",
        "ratio to uniform (paired median [IQR])",
        "signal s / step",
        "peak MiB",
    ]
    rows = []
    for cfg in section["configs"]:
        for name, row in cfg["strategies"].items():
            ratio = cfg["ratio_to_uniform"].get(name)
            peak = row.get("peak_memory_bytes")
            rows.append(
                [
                    cfg["name"],
                    name,
                    f"{row['seconds']['median']:.3f}",
                    _ratio(ratio) if name != "uniform" else "1",
                    f"{row['signal_seconds']['median']:.4f}",
                    _mib(peak),
                ]
            )
    return _table(header, rows)


def compile_table(section: dict[str, Any]) -> list[str]:
    header = [
        "shape",
        "LM head ms",
        "eager ms",
        "compiled ms",
        "compiled / eager (paired median [IQR])",
        "first compiled call s",
        "max |m1 diff|",
    ]
    rows = [
        [
            row["label"],
            _ms(row, "lm_head"),
            _ms(row, "eager"),
            _ms(row, "compiled"),
            _ratio(row["compiled_over_eager"]),
            f"{row['first_compiled_call_s']:.1f}",
            f"{row['max_abs_diff_m1']:.1e}",
        ]
        for row in section["rows"]
    ]
    return _table(header, rows)


def tiles_table(section: dict[str, Any]) -> list[str]:
    settings = [k for k in section["rows"][0]["ratio_to_lm_head"]] if section["rows"] else []
    header = ["shape", "LM head ms", *[f"{s} ms (x LM head)" for s in settings]]
    rows = []
    for row in section["rows"]:
        cells = [row["label"], _ms(row, "lm_head")]
        for s in settings:
            ratio = row["ratio_to_lm_head"][s]
            best = row["seconds"][s]["min"] * 1e3
            cells.append(f"{_ms(row, s)} ({ratio['of_medians']:.2f}); min {best:.0f}")
        rows.append(cells)
    return _table(header, rows)


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        "# Benchmark results",
        "",
        f"Command: `{results['command']}`  ",
        f"Device: {env['device']} ({env['threads']} threads), torch {env['torch']}, "
        f"dtype {env['dtype']}  ",
        f"1-min load average at start / end: {env['load_start']} / {env['load_end']}; "
        f"total wall time {results['wall_seconds']:.0f} s",
        "",
        "## Targets",
        "",
    ]
    tgt = results.get("targets", [])
    lines += _table(
        ["target", "measured", "holds"],
        [[t["target"], t["measured"], "yes" if t["holds"] else "**no**"] for t in tgt],
    )
    if "signals" in results:
        lines += [
            "",
            "## 1. Signals: `policy_stats` and the two-matmul W0 vs the LM-head matmul",
            "",
        ]
        lines += signals_table(results["signals"])
    if "tiles" in results:
        lines += ["", "## Tile sizes: `policy_stats` at (chunk_size / tile_elements)", ""]
        lines += tiles_table(results["tiles"])
    if "compile" in results:
        lines += ["", "## `policy_stats` eager vs `torch.compile`", ""]
        lines += compile_table(results["compile"])
    if "reward" in results:
        lines += ["", "## 2. Reward gradient: RM forward vs forward + input gradient", ""]
        lines += reward_table(results["reward"])
    if "step" in results:
        step = results["step"]
        lines += ["", "## 3. Full GRPO step of the torch backend", ""]
        lines += [
            f"{step['pairs']} paired steps per strategy after 1 warm-up round, alternating, "
            f"{step.get('threads', '?')} torch thread(s); signal s = time inside "
            "`policy_stats` and the RM's `score(with_grad=True)` (instrumented).",
            "",
        ]
        lines += step_table(step)
    return "\n".join(lines) + "\n"


def plot_vocab(section: dict[str, Any], path: Path) -> bool:
    """Time and peak memory against V, one line per method and width, at the B x T of the
    sweep that has the most vocabulary sizes. Returns False (and writes nothing) when no
    B x T has two."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in section["rows"] if "seconds" in r]
    shapes: dict[tuple[int, int], set[int]] = {}
    for r in timed:
        shapes.setdefault((r["case"]["batch"], r["case"]["seq"]), set()).add(r["case"]["vocab"])
    if not shapes or max(len(v) for v in shapes.values()) < 2:
        return False
    batch, seq = max(shapes, key=lambda k: len(shapes[k]))
    rows = [r for r in timed if (r["case"]["batch"], r["case"]["seq"]) == (batch, seq)]
    widths = sorted({r["case"]["hidden"] for r in rows})
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"lm_head": "C0", "stream": "C1", "two_matmul": "C3", "naive": "C2"}
    lines = {"lm_head": ":", "stream": "-", "two_matmul": "-.", "naive": "--"}
    names = {
        "lm_head": "LM head matmul",
        "stream": "policy_stats (streamed)",
        "two_matmul": "two-matmul W0 (streamed)",
        "naive": "naive",
    }
    markers = "os^vD"
    for i, width in enumerate(widths):
        sel = sorted(
            (r for r in rows if r["case"]["hidden"] == width), key=lambda r: r["case"]["vocab"]
        )
        for impl in colors:
            style = {"color": colors[impl], "linestyle": lines[impl], "marker": markers[i % 5]}
            label = f"{names[impl]}, H=d={width}"
            timed_impl = [r for r in sel if impl in r["seconds"]]
            if timed_impl:
                ax_t.plot(
                    [r["case"]["vocab"] for r in timed_impl],
                    [r["seconds"][impl]["median"] * 1e3 for r in timed_impl],
                    label=label,
                    **style,
                )
            measured = [r for r in sel if r.get("peak_extra_bytes", {}).get(impl) is not None]
            if measured and impl != "lm_head":
                ax_m.plot(
                    [r["case"]["vocab"] for r in measured],
                    [r["peak_extra_bytes"][impl] / _MiB for r in measured],
                    label=label,
                    **style,
                )
    for ax, ylabel in ((ax_t, "time per call (ms)"), (ax_m, "peak extra memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("vocabulary size V")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"policy_stats and two-matmul W0 at B x T = {batch} x {seq}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
