"""The verl tests run in .venv-verl (``make verl``) on verl's own code, on the CPU.

Where verl is installed, verl is pointed at the test-only CPU platform before anything
imports it: ``VERL_USE_EXTERNAL_MODULES`` makes ``import verl`` import
``tests.backends.verl.cpu_platform`` (which registers the platform) before the plugins of
the ``verl.plugins`` entry point (this project's ``backends.verl.plugin``), and
``VERL_PLATFORM=cpu`` selects it. Elsewhere each test module skips, saying why.
"""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("verl") is not None:
    os.environ.setdefault("VERL_PLATFORM", "cpu")
    os.environ["VERL_USE_EXTERNAL_MODULES"] = "tests.backends.verl.cpu_platform"
