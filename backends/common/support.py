"""Which strategy each backend serves, computed from the backends' own plans.

Every backend declares what it provides (its ``BACKEND``, a ``credit_core.plan.Backend``) and
refuses at start-up, through ``CreditPlan.build``, a strategy that reads anything else. This
module asks the same question of every registered strategy (and the paper forms of the
baselines that have one) against every backend, so the README's strategies x backends table
is the plans' answer, not a copy of it (tests/test_readme.py compares the two).

Settings-dependent refusals (truncated sampling, an estimator, sequence parallelism) are not
in the table: each backend's page lists them.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass

from credit_core import CreditConfig, CreditError, list_strategies
from credit_core.plan import Backend, CreditPlan

#: (column title, module holding its ``BACKEND``, the page that says why it refuses).
BACKENDS: tuple[tuple[str, str, str], ...] = (
    ("native", "backends.torch.config", "docs/backends.md#strategies-with-a-trainable-model"),
    ("TRL", "backends.trl.config", "docs/trl.md#what-is-supported"),
    (
        "OpenRLHF",
        "backends.openrlhf.compat",
        "docs/openrlhf.md#which-openrlhf-settings-work-with-which-strategy",
    ),
    ("verl", "backends.verl.config", "docs/verl.md#where-each-signal-comes-from"),
)

#: Strategies with a second, published form (``mode: paper``), listed as their own rows.
PAPER_FORMS: tuple[str, ...] = ("abc", "p2t", "red")

#: How a cell names what a backend lacks.
_SHORT = {
    "groups": "the step's groups",
    "answer_span": "an answer span",
    "trained_model": "a second trained model",
    "gather": "a cross-process gather",
    "path_gradient": "the path gradient",
    "token_rewards": "the reward function's token rewards",
}


@dataclass(frozen=True)
class Cell:
    """One strategy on one backend: ``served``, or what it ``lacks`` and where ``why`` is
    explained."""

    served: bool
    lacks: tuple[str, ...] = ()
    why: str = ""

    def markdown(self) -> str:
        if self.served:
            return "yes"
        return f"no: [{', '.join(_SHORT.get(m, f'`{m}`') for m in self.lacks)}]({self.why})"


@dataclass(frozen=True)
class Row:
    """A strategy (``label``: its name, or ``<name> paper``) and its cell per backend."""

    label: str
    cells: tuple[Cell, ...]


def _backends() -> list[tuple[str, Backend, str]]:
    return [
        (title, importlib.import_module(module).BACKEND, why) for title, module, why in BACKENDS
    ]


def _configs(names: Sequence[str]) -> list[tuple[str, CreditConfig]]:
    out = []
    for name in names:
        out.append((name, CreditConfig(name=name)))
        if name in PAPER_FORMS:
            out.append((f"{name} paper", CreditConfig(name=name, mode="paper")))
    return out


def support_rows(names: Sequence[str] | None = None) -> list[Row]:
    """One ``Row`` per strategy of ``names`` (default: every registered one), in order."""
    backends = _backends()
    rows = []
    for label, config in _configs(sorted(list_strategies()) if names is None else names):
        cells = []
        for _, backend, why in backends:
            try:
                CreditPlan.build(config, backend)
            except CreditError:
                plan = CreditPlan.unchecked(config, backend)
                cells.append(Cell(False, tuple(plan.missing(backend)), why))
            else:
                cells.append(Cell(True))
        rows.append(Row(label, tuple(cells)))
    return rows


def support_markdown(rows: Sequence[Row]) -> str:
    """The table as Markdown: a header of the backends, then one line per distinct set of
    cells, naming every strategy that has it (in the order of ``rows``)."""
    titles = [title for title, _, _ in BACKENDS]
    grouped: dict[tuple[Cell, ...], list[str]] = {}
    for row in rows:
        grouped.setdefault(row.cells, []).append(f"`{row.label}`")
    lines = ["| strategy | " + " | ".join(titles) + " |", "|---|" + "---|" * len(titles)]
    for cells, labels in grouped.items():
        lines.append(f"| {', '.join(labels)} | {' | '.join(c.markdown() for c in cells)} |")
    return "\n".join(lines)
