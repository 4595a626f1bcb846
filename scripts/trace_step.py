"""How far one training step travels: the project files and functions it enters.

    python scripts/trace_step.py [CONFIG] [--set key=value ...]

Builds a ``GRPORecipe`` from CONFIG (default ``configs/torch/tiny_datc.yaml``), runs one
untraced warm-up step, then traces one ``train_step()`` with ``sys.setprofile`` and prints
the number of project files and functions entered, how many times the step came back to a
file it had already left, and the files in order of first entry. Only the project's own
packages count (``credit_core``, ``adapters``, ``backends``, ``ablations``, ``benchmarks``),
and comprehensions count as part of their function.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("credit_core", "adapters", "backends", "ablations", "benchmarks")
#: Comprehension and lambda scopes are part of the function that holds them.
SCOPES = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(REPO / "configs/torch/tiny_datc.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    from backends.torch.trainer import GRPORecipe, resolve_config

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [*args.overrides, f"output_dir={tmp}/run", "logging.progress=false"]
        recipe = GRPORecipe(resolve_config(args.config, overrides))
        recipe.train_step()
        files: list[str] = []
        functions: set[tuple[str, str]] = set()
        returns = 0
        current: list[str | None] = [None]
        left: set[str] = set()

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            nonlocal returns
            if event != "call":
                return
            path = Path(frame.f_code.co_filename).resolve()
            try:
                rel = path.relative_to(REPO)
            except ValueError:
                return
            if rel.parts[0] not in PACKAGES or frame.f_code.co_name in SCOPES:
                return
            name = str(rel)
            functions.add((name, frame.f_code.co_qualname))
            if name != current[0]:
                if name in left:
                    returns += 1
                if current[0] is not None:
                    left.add(current[0])
                current[0] = name
                if name not in files:
                    files.append(name)

        sys.setprofile(profile)
        try:
            recipe.train_step()
        finally:
            sys.setprofile(None)
            recipe.logger.close()
            recipe.close()
    print(
        f"files: {len(files)}  functions: {len(functions)}  "
        f"re-entries of a file left before: {returns}"
    )
    for name in files:
        print(f"  {name}: {sorted(q for f, q in functions if f == name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
