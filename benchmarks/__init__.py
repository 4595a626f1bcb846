"""Benchmarks: what token credit assignment costs over plain GRPO, measured side by side.

Run ``python -m benchmarks --help``. Three benchmarks (``benchmarks.signals``,
``benchmarks.reward_grad``, ``benchmarks.step``) write one JSON file and one Markdown
report (``benchmarks.report``); ``--quick`` runs every one at a small size in seconds.
"""

from credit_core.layout import check_layout

check_layout()
