"""datc_mid's signal phase against datc's plus one reward-model forward, from a results.csv.

    python scripts/signal_phase.py RESULTS_CSV --rm-is-reward SETTING [SETTING ...]

Per (setting, family): the mean seconds per step (steps after the first, as the report's
s/step) of the signal phase and of its reward-model part (``time_signals_reward``) for
``uniform``, ``datc`` and ``datc_mid``; and, in the settings named by ``--rm-is-reward``
(those whose reward is the direction model's own, so that uniform's reward part is one
forward of that model), the bound 1.15 x (datc's signal phase + uniform's reward part) and
datc_mid's ratio to datc's signal phase + that forward. Prints a markdown table; exit
status 2 on bad input. n/a: a setting not named by ``--rm-is-reward`` (its reward is
another scorer, so uniform runs no forward of the direction model to measure).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Sequence

from ablations.results import read_csv

STRATEGIES = ("uniform", "datc", "datc_mid")
TOLERANCE = 1.15


def phase_means(
    rows: Sequence[dict[str, object]],
) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(setting, family, strategy) -> mean (signals, reward part) over timed steps > 1."""
    sums: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r.get("strategy") not in STRATEGIES or "time_signals_reward" not in r:
            continue
        if int(str(r["step"])) <= 1:
            continue
        key = (str(r["setting"]), str(r["family"]), str(r["strategy"]))
        sums[key].append((float(str(r["time_signals"])), float(str(r["time_signals_reward"]))))
    return {
        k: (math.fsum(a for a, _ in v) / len(v), math.fsum(b for _, b in v) / len(v))
        for k, v in sums.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_csv")
    parser.add_argument("--rm-is-reward", nargs="*", default=[], metavar="SETTING")
    args = parser.parse_args()
    try:
        rows = read_csv(args.results_csv)
    except (OSError, ValueError, KeyError) as exc:
        print(f"signal_phase: error: {args.results_csv}: {exc}", file=sys.stderr)
        return 2
    means = phase_means(rows)
    if not means:
        print(
            f"signal_phase: error: {args.results_csv}: no timed rows of {list(STRATEGIES)} "
            "with a time_signals_reward column",
            file=sys.stderr,
        )
        return 2
    print(
        "| setting | family | uniform: signals [RM] | datc: signals [RM] | "
        f"datc_mid: signals [RM] | {TOLERANCE} x (datc + 1 RM forward) | "
        "datc_mid / (datc + 1 RM forward) |"
    )
    print("|---|---|---|---|---|---|---|")
    pairs = sorted({(s, f) for s, f, _ in means}, key=lambda k: (rows_order(rows, k), k))
    for setting, family in pairs:
        cells = []
        for name in STRATEGIES:
            m = means.get((setting, family, name))
            cells.append("-" if m is None else f"{m[0]:.4f} [{m[1]:.4f}]")
        bound = ratio = "n/a"
        datc, uni = means.get((setting, family, "datc")), means.get((setting, family, "uniform"))
        mid = means.get((setting, family, "datc_mid"))
        if setting in args.rm_is_reward and datc and uni and mid:
            base = datc[0] + uni[1]
            bound = f"{TOLERANCE * base:.4f}"
            ratio = f"{mid[0] / base:.2f}"
        elif mid is None:
            bound = ratio = "-"
        print(f"| {setting} | {family} | " + " | ".join([*cells, bound, ratio]) + " |")
    return 0


def rows_order(rows: Sequence[dict[str, object]], key: tuple[str, str]) -> int:
    """The position of ``key``'s first row in the file (the config's setting order)."""
    for i, r in enumerate(rows):
        if (r.get("setting"), r.get("family")) == key:
            return i
    return len(rows)


if __name__ == "__main__":
    sys.exit(main())
