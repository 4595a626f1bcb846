"""The benchmark runner (``python -m benchmarks``): its quick mode runs end to end, and the
pieces it trusts (timing statistics, interleaving, peak-memory measurement, the naive
reference, shape gating) do what the report says they do."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from benchmarks import cli, memory, signals, timing
from credit_core import policy_stats, token_work


def test_ratio_of_medians_and_paired_quartiles() -> None:
    a = [2.0, 4.0, 6.0, 100.0]
    b = [1.0, 2.0, 3.0, 4.0]
    r = timing.ratio(a, b)
    assert r.of_medians == pytest.approx(5.0 / 2.5)
    assert r.paired_median == pytest.approx(2.0)  # per-round ratios: 2, 2, 2, 25
    assert r.paired_q25 == pytest.approx(2.0)
    assert r.paired_q75 == pytest.approx(2.0 + 0.25 * 23.0)
    s = timing.Summary.of([3.0, 1.0, 2.0])
    assert (s.median, s.min, s.n) == (2.0, 1.0, 3)
    with pytest.raises(ValueError, match="equally long"):
        timing.ratio([1.0], [1.0, 2.0])


def test_interleaved_rotates_the_order_after_warmup() -> None:
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = timing.interleaved(fns, repeats=3, warmup=1)
    assert calls == list("abc" + "abc" + "bca" + "cab")
    assert all(len(t) == 3 and all(x >= 0 for x in t) for t in times.values())


@pytest.mark.skipif(not memory.rss_peak_supported(), reason="needs /proc/self/clear_refs")
def test_peak_rss_measurement_sees_a_known_allocation() -> None:
    peaks = memory.peak_extra_bytes(
        "benchmarks.memory:calibration_workload",
        {"mib": 64},
        ["alloc", "none"],
        device=torch.device("cpu"),
    )
    mib = 2**20
    assert peaks["alloc"] is not None and peaks["none"] is not None
    assert 64 * mib <= peaks["alloc"] < 72 * mib
    assert peaks["none"] < 2 * mib


def test_naive_reference_equals_policy_stats() -> None:
    case = signals.SignalCase(2, 5, 300, 16, 8)
    x = signals.make_inputs(case, device=torch.device("cpu"), dtype=torch.float32)
    naive = signals.naive_policy_stats(x["hidden"], x["weight"], x["ids"], x["emb"])
    stream = policy_stats(x["hidden"], x["weight"], x["ids"], x["emb"], chunk_size=64)
    for field in ("p_sampled", "p_sq", "m1", "m2", "sampled_emb"):
        torch.testing.assert_close(getattr(stream, field), getattr(naive, field))


def test_two_matmul_work_equals_the_current_path_and_costs_one_product_less() -> None:
    case = signals.SignalCase(2, 5, 300, 16, 8)
    x = signals.make_inputs(case, device=torch.device("cpu"), dtype=torch.float32)
    assert signals._work_agreement(x) < 1e-5
    assert x["grad"].dtype == torch.float32 and x["grad"].shape == (2, 5, 8)
    calls = signals._calls(x)
    stats = policy_stats(x["hidden"], x["weight"], x["ids"], x["emb"])
    w0 = calls["two_matmul"]()
    assert isinstance(w0, torch.Tensor)
    torch.testing.assert_close(w0, token_work(stats, x["grad"], None))
    target = signals.TARGET_CASE
    assert target.two_matmul_flops / target.lm_head_flops == pytest.approx(2.0)


def test_cpu_gating_keeps_the_target_case_and_skips_only_with_a_reason() -> None:
    limits = signals.Limits(1.0e12, 1.6e9, 12 * 2**30)
    assert limits.skip_reason(signals.TARGET_CASE) is None
    assert limits.naive_skip_reason(signals.TARGET_CASE) is None
    skipped = [c for c in signals.FULL_CASES if limits.skip_reason(c) is not None]
    assert skipped and all("GPU" in str(limits.skip_reason(c)) for c in skipped)
    assert signals.SignalCase(8, 2048, 151936, 896, 896) in skipped
    flops = signals.TARGET_CASE.stream_flops / signals.TARGET_CASE.lm_head_flops
    assert flops == pytest.approx(3.0)  # the FLOP floor is 3x the LM head at H = d
    cpu = signals.Limits.for_device(torch.device("cpu"))  # the limits a CPU run uses
    assert cpu.skip_reason(signals.TARGET_CASE) is None
    assert cpu.naive_skip_reason(signals.TARGET_CASE) is None


def test_cli_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--repeats", "0"])
    with pytest.raises(SystemExit):
        cli.parse_args(["nonsense"])
    assert cli.parse_args([]).benchmarks == list(cli.BENCHMARKS)


@pytest.mark.slow
def test_quick_mode_runs_every_benchmark_and_writes_the_report(tmp_path: Path) -> None:
    assert cli.main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    markdown = (tmp_path / "results.md").read_text()
    assert (tmp_path / "vocab.png").stat().st_size > 0

    rows = results["signals"]["rows"]
    assert len(rows) == len(signals.QUICK_CASES)
    for row in rows:
        assert row["max_rel_err_vs_naive"] < 1e-4
        assert math.isfinite(row["floor_ratio"]) and row["floor_ratio"] > 0
        assert set(row["seconds"]) == {"lm_head", "stream", "two_matmul", "naive"}
        assert row["work_rel_err"] < 1e-5
        assert row["stream_over_two_matmul"]["of_medians"] > 0
        assert math.isfinite(row["two_matmul_floor_ratio"]) and row["two_matmul_floor_ratio"] > 0
        assert 0.0 <= row["time_share"]["exp"] < 1.0
        if memory.rss_peak_supported():
            case = row["case"]
            logits_bytes = 4 * case["batch"] * case["seq"] * case["vocab"]
            # below the measurement's 1 MiB mmap threshold the heap may reuse what the call
            # before freed: the naive logits are then not new resident memory
            if logits_bytes > 2**20:
                assert row["peak_extra_bytes"]["naive"] >= logits_bytes
            assert row["peak_extra_bytes"]["two_matmul"] is not None

    reward = {r["model"]: r for r in results["reward"]["rows"]}
    assert set(reward) == {"minilm", "tiny_causal"}
    assert all(r["ratio"]["of_medians"] > 0 for r in reward.values())

    (step,) = results["step"]["configs"]
    assert set(step["strategies"]) == {"uniform", "datc", "saliency", "oar_g"}
    assert "oar_g" in step["ratio_to_uniform"]
    assert step["strategies"]["uniform"]["signal_calls"] == 0
    assert step["strategies"]["datc"]["signal_calls"] > 0
    assert step["strategies"]["saliency"]["trainer_counters"]["policy_stats_rows"] == 0
    assert step["strategies"]["saliency"]["trainer_counters"]["reward_grad_rows"] > 0
    zero = [t for t in results["targets"] if t["target"].startswith("uniform spends")]
    assert zero and all(t["holds"] for t in zero)

    for heading in ("## Targets", "## 1. Signals", "## 2. Reward", "## 3. Full GRPO step"):
        assert heading in markdown
    assert results["command"].startswith("python -m benchmarks --quick")


@pytest.mark.slow
def test_compile_benchmark_times_both_and_checks_they_agree(tmp_path: Path) -> None:
    assert cli.main(["compile", "--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    (row,) = results["compile"]["rows"]
    assert row["max_abs_diff_m1"] < 1e-5
    assert set(row["seconds"]) == {"lm_head", "eager", "compiled"}
    assert row["first_compiled_call_s"] > 0 and row["compiled_over_eager"]["of_medians"] > 0
    assert "## `policy_stats` eager vs `torch.compile`" in (tmp_path / "results.md").read_text()
