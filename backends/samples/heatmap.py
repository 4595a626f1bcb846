"""The credit heat-map (matplotlib, Agg backend): one row per response, one cell per token
coloured by its weight w_t = A_t / A on a diverging scale centred at 1 (GRPO's uniform
share), with the token's text in the cell and a colour bar.

``credit_figure`` draws it (the ablation report saves it as PNG, the trainers log it to
TensorBoard); ``samples_figure`` draws one recorded step, each response's compared
strategies as rows under the run's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from backends.samples.records import StepSamples


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def credit_figure(*, title: str, examples: Sequence[Mapping[str, Any]]) -> Any:
    """The heat-map figure of ``examples`` (each: ``tokens`` list[str], ``weights``
    list[float | None] (None: undefined, drawn white), ``reward``, ``advantage``, optional
    ``prompt`` and ``label``, written before the row's reward). The caller closes it."""
    plt = pyplot()
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    width = max((len(e["tokens"]) for e in examples), default=1)
    grid = np.full((max(1, len(examples)), max(1, width)), np.nan)
    for i, e in enumerate(examples):
        grid[i, : len(e["weights"])] = [np.nan if w is None else w for w in e["weights"]]
    finite = grid[np.isfinite(grid)]
    lo = float(min(finite.min(), 0.999)) if finite.size else 0.0
    hi = float(max(finite.max(), 1.001)) if finite.size else 2.0
    fig, ax = plt.subplots(
        figsize=(min(22.0, 3.0 + 0.9 * width), 1.4 + 0.7 * len(examples)), layout="constrained"
    )
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="white")
    image = ax.imshow(
        np.ma.masked_invalid(grid), cmap=cmap, norm=TwoSlopeNorm(1.0, lo, hi), aspect="auto"
    )
    for i, e in enumerate(examples):
        for j, tok in enumerate(e["tokens"]):
            ax.text(j, i, short_token(tok), ha="center", va="center", fontsize=7)
    ax.set_yticks(
        range(len(examples)),
        [
            (f"{e['label']}  " if e.get("label") else "")
            + f"r={e['reward']:.2f} A={e['advantage']:+.2f}"
            for e in examples
        ],
        fontsize=8,
    )
    ax.set_xticks(range(width), [str(j) for j in range(width)], fontsize=7)
    ax.set_xlabel("response token")
    prompt = examples[0].get("prompt") if examples else None
    sub = f"; prompt: {prompt!r}" if prompt else ""
    ax.set_title(
        f"{title}\nweight w_t = A_t / A per token (1 = GRPO's uniform share){sub}", fontsize=9
    )
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01, label="w_t = A_t / A")
    return fig


def samples_figure(record: StepSamples, *, title: str) -> Any:
    """The heat-map of one recorded step: per response, a row for the run's strategy and one
    for each compared strategy (labelled when there are any)."""
    labelled = bool(record.compare)
    examples = [
        {
            "tokens": s.tokens,
            "weights": s.weights(label),
            "reward": s.reward,
            "advantage": s.advantage,
            "label": label if labelled else None,
        }
        for s in record.samples
        for label in record.labels
    ]
    return credit_figure(title=f"{title}, step {record.step}", examples=examples)


def short_token(token: str, limit: int = 9) -> str:
    """The token's text for a heat-map cell: non-printable characters as ``·``, cut to
    ``limit`` characters."""
    token = "".join(c if c.isprintable() else "·" for c in token)
    return token if len(token) <= limit else token[: limit - 1] + "…"
