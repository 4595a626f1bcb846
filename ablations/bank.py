"""A bank of finished runs, committed beside a report, so that a plan larger than one machine's
session is trained over several sessions (or machines) and reported once.

A bank is a folder (the config's ``banked``) of gzipped JSON-lines files, one per deposit,
each line one run: ``{"run": [setting, family, strategy, seed], "result": {...}}`` with the
run's whole ``result.json`` (its fingerprint, history, info, examples). Deposits are never
rewritten: ``deposit`` writes a new file with the finished runs of the output folder that the
bank does not hold yet, so each session adds one file. ``withdraw`` writes the banked results
whose fingerprint is the current config's into the output folder where it has none: from then
on the runner treats them as its own (not trained again, in the report). A config may read
several banks: their deposits are one sequence, in time order. A banked result made with
another config is never used. Nothing read from a bank runs code (JSON only).

A banked run is paired with runs of later sessions only on the same build of its models: a
later session rebuilds the pretrained policy and reward model from the same spec, and on
another machine or code version float rounding can make them other models (seen: a reward
model's held-out correlation 0.55 in one session, 0.86 in the next). The runner compares each
run's recorded ``info`` (the build's own losses and fits) with its pair's and with the cache's
build, and trains again what differs (``runner.mixed_builds``, ``runner._other_build``); the
report refuses pairs of mixed builds.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ablations.results import RunKey, build_text, read_result, write_result

SUFFIX = ".jsonl.gz"


def banked_results(folders: Sequence[Path]) -> Iterator[tuple[RunKey, dict[str, Any]]]:
    """Every (run, result) in the files of the banks ``folders``, in deposit order across
    them (a file's name is its deposit's time stamp; a folder that does not exist holds
    none). ``ValueError`` naming the file and line of a bad entry."""
    files = [f for folder in folders if folder.is_dir() for f in folder.glob(f"*{SUFFIX}")]
    for file in sorted(files, key=lambda f: f.name):
        with gzip.open(file, "rt", encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                try:
                    entry = json.loads(line)
                    setting, family, strategy, seed = entry["run"]
                    result = entry["result"]
                    if not isinstance(result, dict) or "fingerprint" not in result:
                        raise ValueError("no result with a fingerprint")
                    run = RunKey(str(setting), str(family), str(strategy), int(seed))
                except (ValueError, KeyError, TypeError) as err:
                    raise ValueError(f"bank {file}, line {number}: {err}") from err
                yield run, result


def withdraw(folders: Sequence[Path], output: Path, fingerprints: Mapping[RunKey, str]) -> int:
    """Write into ``output`` each result in the banks ``folders`` of a planned run
    (``fingerprints``: run -> its current fingerprint) made with the current config, where
    ``output`` holds no current result of that run; the number written. Where the banks hold
    a run on several builds of its models (``build_text``), the latest deposit's is taken,
    whichever bank holds it."""
    latest: dict[RunKey, dict[str, Any]] = {}
    for run, result in banked_results(folders):
        if fingerprints.get(run) == result["fingerprint"]:
            latest[run] = result  # in deposit order: the last one stays
    written = 0
    for run, result in latest.items():
        dest = run.folder(output)
        if read_result(dest, result["fingerprint"]) is not None:
            continue
        dest.mkdir(parents=True, exist_ok=True)
        write_result(dest, result)
        written += 1
    return written


def deposit(
    folders: Sequence[Path],
    output: Path,
    plan: Sequence[RunKey],
    fingerprints: Mapping[RunKey, str],
) -> Path | None:
    """A new bank file in ``folders[0]`` with the current results in ``output`` of the
    planned runs that none of the banks ``folders`` holds with that fingerprint on that
    build of its models (``build_text``: a run trained again on a new build is added, the
    older build's stays); None when there is none to add."""
    held = {
        (run, result["fingerprint"], build_text(result.get("info", {})))
        for run, result in banked_results(folders)
    }
    entries = []
    for run in plan:
        result = read_result(run.folder(output), fingerprints[run])
        if result is None:
            continue
        if (run, fingerprints[run], build_text(result.get("info", {}))) not in held:
            entries.append(
                {"run": [run.setting, run.family, run.strategy, run.seed], "result": result}
            )
    if not entries:
        return None
    folder = folders[0]
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time_ns()  # to the nanosecond: two deposits of one second stay two files
    stamp = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now // 10**9))}.{now % 10**9:09d}"
    file = folder / f"{stamp}-{os.getpid()}{SUFFIX}"
    tmp = file.with_name(file.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as fh:
        for entry in entries:
            fh.write(json.dumps(entry, allow_nan=True) + "\n")
    os.replace(tmp, file)
    return file
