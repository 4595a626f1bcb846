"""``credit-view``'s page: one self-contained HTML file of a run's credit samples.

No network and no server: the CSS and the script are inline, the samples are embedded as
one JSON document (``<script type="application/json">``, read with ``JSON.parse``; every
``<`` is escaped, so no text of a sample can close the element) and put on the page with
``textContent`` only: nothing read from a run folder is ever executed or parsed as HTML.

The page shows one recorded step at a time (a selector; ``#step=N`` in the URL chooses
it): for each run, the step's agreement of its direction model with the reward where the
record has one (``StepAgreement.describe``), its responses with the prompt, the reward r
and the advantage A, and
one row of tokens per strategy (the run's own first, the compared ones under it). A token's
background is its weight w_t = A_t / A on a diverging scale centred at 1 (GRPO's uniform
share, white): ``lo`` -> blue rgb(33, 102, 172), 1 -> white, ``hi`` -> red rgb(178, 24,
43), linear in between and clamped outside; where A = 0 the weight is undefined (grey).
Its ``title`` (the hover text) gives w_t, A_t and the token's position. ``lo`` is the
smaller of 0 and the page's lowest weight, ``hi`` the larger of 2 and the 99th percentile
of its weights, so one scale holds for every step and run of the page.

After the first render the page writes the milliseconds since the navigation started
(loading, parsing the data, drawing the step) into ``document.body.dataset.renderMs`` and
the step shown into ``data-step``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass

from backends.samples.records import StepSamples


@dataclass(frozen=True)
class RunSamples:
    """The samples of one run: ``name`` (a column heading), ``group`` (runs of one group
    are shown side by side) and its records."""

    name: str
    group: str
    records: list[StepSamples]


def scale(runs: Sequence[RunSamples]) -> tuple[float, float]:
    """(lo, hi) of the colour scale (see the module docstring)."""
    weights = sorted(
        w
        for run in runs
        for record in run.records
        for sample in record.samples
        for label in record.labels
        for w in sample.weights(label)
        if w is not None
    )
    if not weights:
        return 0.0, 2.0
    p99 = weights[min(len(weights) - 1, int(0.99 * len(weights)))]
    return min(0.0, weights[0]), max(2.0, p99)


def page_data(runs: Sequence[RunSamples], title: str) -> dict[str, object]:
    """The JSON document the page embeds: compact keys, one entry per recorded step."""
    lo, hi = scale(runs)
    groups: dict[str, list[dict[str, object]]] = {}
    for run in runs:
        steps = {
            str(r.step): {
                "l": r.labels,
                "g": None if r.agreement is None else r.agreement.describe(),
                "n": [
                    {
                        "p": s.prompt,
                        "t": s.tokens,
                        "r": s.reward,
                        "a": s.advantage,
                        "x": [s.token_advantages[label] for label in r.labels],
                    }
                    for s in r.samples
                ],
            }
            for r in run.records
        }
        groups.setdefault(run.group, []).append({"name": run.name, "steps": steps})
    return {
        "title": title,
        "lo": lo,
        "hi": hi,
        "groups": [{"name": name, "runs": members} for name, members in groups.items()],
    }


def render_page(runs: Sequence[RunSamples], *, title: str) -> str:
    """The HTML page of ``runs`` (see the module docstring)."""
    data = json.dumps(page_data(runs, title), ensure_ascii=False, separators=(",", ":"))
    data = data.replace("<", "\\u003c")  # JSON-equivalent; nothing can end the element
    return (
        _TEMPLATE.replace("__TITLE__", html.escape(title))
        .replace("__STYLE__", _STYLE)
        .replace("__SCRIPT__", _SCRIPT)
        .replace("__DATA__", data)
    )


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>__TITLE__</title><style>__STYLE__</style></head>
<body>
<header><h1>__TITLE__</h1>
<label>step <select id="step"></select></label>
<button id="prev" type="button">&larr;</button><button id="next" type="button">&rarr;</button>
<span id="legend"></span>
<p class="note">Each token's colour is its weight w<sub>t</sub> = A<sub>t</sub> / A
(1 = GRPO's uniform share); hover a token for its exact values.</p></header>
<main id="view"></main>
<script type="application/json" id="data">__DATA__</script>
<script>__SCRIPT__</script>
</body></html>
"""

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{position:sticky;top:0;background:#fafafa;border-bottom:1px solid #ddd;padding:8px 16px}
h1{font-size:18px;margin:0 0 6px}h2{font-size:16px;margin:14px 0 6px}
h3{font-size:14px;margin:0 0 6px}main{padding:0 16px 24px}
.note{margin:4px 0 0;color:#555;font-size:12px}
.runs{display:flex;gap:16px;align-items:flex-start;overflow-x:auto}
.run{flex:1 1 0;min-width:320px;border:1px solid #ddd;border-radius:6px;padding:8px}
.sample{margin:0 0 10px;padding:0 0 8px;border-bottom:1px dashed #ddd}
.meta{font-size:12px;color:#444;margin:0 0 4px}
.row{display:flex;flex-wrap:wrap;align-items:center;gap:2px;margin:2px 0}
.label{font:12px monospace;min-width:14em;color:#333}
.tok{font:13px monospace;white-space:pre;padding:1px 3px;border-radius:3px;cursor:default}
.bar{display:inline-block;width:180px;height:12px;vertical-align:middle;margin:0 6px;
background:linear-gradient(to right,rgb(33,102,172),#fff,rgb(178,24,43))}
.empty{color:#888;font-style:italic}
.agreement{font-size:12px;color:#333;background:#f3f3f3;padding:2px 6px;margin:0 0 8px}
"""

_SCRIPT = r"""
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const BLUE = [33, 102, 172], RED = [178, 24, 43], UNDEFINED = "rgb(224, 224, 224)";
const steps = [...new Set(D.groups.flatMap(g => g.runs.flatMap(r => Object.keys(r.steps))))]
  .map(Number).sort((a, b) => a - b);
const select = document.getElementById("step");

function colour(w) {
  if (w === null) return UNDEFINED;
  const t = w >= 1 ? Math.min(1, (w - 1) / (D.hi - 1)) : Math.min(1, (1 - w) / (1 - D.lo));
  const end = w >= 1 ? RED : BLUE;
  const c = end.map(v => Math.round(255 + (v - 255) * t));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}
const fmt = x => (x >= 0 ? "+" : "") + x.toPrecision(4);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function sampleBlock(s, labels) {
  const box = el("div", "sample");
  box.appendChild(el("div", "meta", `prompt: ${s.p}`));
  box.appendChild(el("div", "meta", `r = ${s.r.toPrecision(4)}   A = ${fmt(s.a)}`));
  labels.forEach((label, i) => {
    const row = el("div", "row");
    row.appendChild(el("span", "label", label));
    s.t.forEach((tok, j) => {
      const at = s.x[i][j], w = s.a === 0 ? null : at / s.a;
      const span = el("span", "tok", tok);
      span.style.backgroundColor = colour(w);
      const far = w === null ? 0 : w >= 1 ? (w - 1) / (D.hi - 1) : (1 - w) / (1 - D.lo);
      if (far > 0.6) span.style.color = "#fff";
      span.title = (w === null ? "w undefined (A = 0)" : `w = ${w.toPrecision(4)}`) +
        `, A_t = ${fmt(at)}, token ${j}`;
      span.dataset.w = w === null ? "" : String(w);
      row.appendChild(span);
    });
    box.appendChild(row);
  });
  return box;
}

function render(step) {
  const view = document.getElementById("view");
  view.replaceChildren();
  for (const g of D.groups) {
    if (g.name) view.appendChild(el("h2", null, g.name));
    const runs = el("div", "runs");
    for (const r of g.runs) {
      const col = el("section", "run");
      col.appendChild(el("h3", null, r.name));
      const rec = r.steps[String(step)];
      if (!rec) col.appendChild(el("p", "empty", "no samples recorded at this step"));
      else {
        if (rec.g !== null) col.appendChild(el("p", "agreement", rec.g));
        rec.n.forEach(s => col.appendChild(sampleBlock(s, rec.l)));
      }
      runs.appendChild(col);
    }
    view.appendChild(runs);
  }
  select.value = String(step);
  document.body.dataset.step = String(step);
}

function fromHash() {
  const m = /step=(\d+)/.exec(location.hash);
  const n = m ? Number(m[1]) : NaN;
  return steps.includes(n) ? n : steps[steps.length - 1];
}

function show(step) {
  history.replaceState(null, "", `#step=${step}`);
  render(step);
}

for (const s of steps) select.appendChild(new Option(String(s), String(s)));
const legend = document.getElementById("legend");
legend.append(`w = ${D.lo.toPrecision(3)}`, el("span", "bar"), `${D.hi.toPrecision(3)} (white: 1)`);
if (steps.length) render(fromHash());
else document.getElementById("view").appendChild(el("p", "empty", "no recorded step"));
document.body.dataset.renderMs = performance.now().toFixed(1);  // since navigation start
select.addEventListener("change", () => show(Number(select.value)));
const move = d => { const i = steps.indexOf(Number(select.value)) + d;
  if (i >= 0 && i < steps.length) show(steps[i]); };
document.getElementById("prev").addEventListener("click", () => move(-1));
document.getElementById("next").addEventListener("click", () => move(1));
window.addEventListener("hashchange", () => render(fromHash()));
"""
