"""How big and how fast the credit-view page of a long run is: a synthetic 1,000-step
credit-samples file (4 responses x 16 tokens, the run's strategy and 2 compared ones, as
``credit_samples: {interval: 1, count: 4, compare: [a, b]}`` would record), its page, and
the page's load in headless Chromium (wall time of ``--dump-dom``, browser start included,
and the milliseconds from navigation start to the first step drawn, as the page reports).

    .venv/bin/python scripts/credit_view_scale.py [--steps 1000] [--out /tmp/credit_view_scale]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

from backends.samples.cli import main as view
from backends.samples.records import SAMPLES_FILE

WORDS = ["the", " cat", " sat", " on", " a", " mat", ",", " and", " then", " it", " ran", "."]


def write_run(folder: Path, steps: int, rng: random.Random) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    labels = ["datc", "uniform", "datc_mid"]
    with open(folder / SAMPLES_FILE, "w") as fh:
        for step in range(1, steps + 1):
            samples = []
            for _ in range(4):
                a = round(rng.uniform(-2, 2), 6)
                tokens = [rng.choice(WORDS) for _ in range(16)]
                adv = {label: [round(a * rng.uniform(0, 2), 6) for _ in tokens] for label in labels}
                samples.append({"prompt": "write a sentence", "tokens": tokens, "reward": 0.5,
                                "advantage": a, "token_advantages": adv})  # fmt: skip
            record = {
                "step": step,
                "strategy": labels[0],
                "compare": labels[1:],
                "samples": samples,
            }
            fh.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("/tmp/credit_view_scale"))
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    write_run(args.out, args.steps, random.Random(0))
    start = time.perf_counter()
    view([str(args.out)])
    build = time.perf_counter() - start
    page = args.out / "credit_view.html"
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    print(f"samples file {(args.out / SAMPLES_FILE).stat().st_size / 1e6:.2f} MB")
    print(f"page {page.stat().st_size / 1e6:.2f} MB, written in {build:.2f} s")
    if browser is None:
        print("no chromium: load time not measured")
        return
    flags = ["--headless", "--disable-gpu", "--no-sandbox", "--dump-dom", page.as_uri()]
    for _ in range(3):
        start = time.perf_counter()
        dom = subprocess.run([browser, *flags], capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - start
        ms = re.search(r'data-render-ms="([\d.]+)"', dom)
        shown = ms.group(1) if ms else "?"
        print(f"chromium --dump-dom {wall:.2f} s wall; step drawn {shown} ms after navigation")


if __name__ == "__main__":
    main()
