"""The credit-view page in a real browser: headless Chromium loads it from a file:// URL; the
test reads what it shows (token colours, hover values, the step chosen) and its screenshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.samples.cli import main as view
from backends.samples.records import SAMPLES_FILE, read_samples
from backends.torch.__main__ import main as train_main
from tests.helpers.browser import chromium, dump_dom, read_page, screenshot
from tests.helpers.paths import REPO

WHITE, RED, BLUE = "rgb(255, 255, 255)", "rgb(178, 24, 43)", "rgb(33, 102, 172)"
GREY = "rgb(224, 224, 224)"


def _sample(tokens: list[str], a: float, datc: list[float]) -> dict[str, object]:
    return {
        "prompt": "say <i>hi</i>",
        "tokens": tokens,
        "reward": 0.5,
        "advantage": a,
        "token_advantages": {"datc": datc, "uniform": [a] * len(tokens)},
    }


def _write_run(folder: Path) -> Path:
    """Two recorded steps with known weights: at step 2, w = 0, 1, 2, 1.5 (scale 0..2)."""
    folder.mkdir(parents=True)
    steps = [
        {"step": 1, "strategy": "datc", "compare": ["uniform"],
         "samples": [_sample(["first", "step"], 1.0, [1.0, 1.0])]},
        {"step": 2, "strategy": "datc", "compare": ["uniform"],
         "samples": [_sample(["zero", "one", "</script><b>x</b>", "half"], 2.0,
                             [0.0, 2.0, 4.0, 3.0]),
                     _sample(["flat"], 0.0, [0.0])],
         "agreement": {"direction_is_reward": False, "agreement": 0.25, "groups": 2,
                       "skipped": 0}},
    ]  # fmt: skip
    (folder / SAMPLES_FILE).write_text("".join(json.dumps(s) + "\n" for s in steps))
    return folder


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chromium()
    run = _write_run(tmp_path_factory.mktemp("view") / "run")
    assert view([str(run)]) == 0
    return run / "credit_view.html"


def test_tokens_are_coloured_by_their_weight_with_exact_values_on_hover(page: Path) -> None:
    shown = read_page(dump_dom(page))
    assert shown.body["data-step"] == "2"  # the last step by default
    (label, tokens), (uniform_label, uniform), (_, flat), (_, flat_uniform) = shown.runs["datc"]
    assert (label, uniform_label) == ("datc", "uniform")  # compared strategies under the run's
    assert [t.text for t in tokens] == ["zero", "one", "</script><b>x</b>", "half"]
    assert shown.tags_in_tokens == 0  # token text is text, never markup
    colours = [t.style.removeprefix("background-color: ").split(";")[0] for t in tokens]
    assert colours == [BLUE, WHITE, RED, "rgb(217, 140, 149)"]  # w = 0, 1, 2, 1.5
    assert [t.title for t in tokens] == [
        "w = 0.000, A_t = +0.000, token 0",
        "w = 1.000, A_t = +2.000, token 1",
        "w = 2.000, A_t = +4.000, token 2",
        "w = 1.500, A_t = +3.000, token 3",
    ]
    assert all(WHITE in t.style for t in uniform)  # GRPO: every token its uniform share
    assert [t.title for t in flat] == ["w undefined (A = 0), A_t = +0.000, token 0"]
    assert GREY in flat[0].style and GREY in flat_uniform[0].style
    assert float(shown.body["data-render-ms"]) >= 0
    assert shown.agreements == ["direction model vs reward: rho = 0.250 over 2 groups"]


@pytest.mark.slow
def test_the_step_in_the_url_is_the_step_shown(page: Path) -> None:
    shown = read_page(dump_dom(page, "#step=1"))
    assert shown.body["data-step"] == "1"
    assert [t.text for t in shown.runs["datc"][0][1]] == ["first", "step"]
    assert read_page(dump_dom(page, "#step=1")).agreements == []  # step 1's record has none
    assert read_page(dump_dom(page, "#step=7")).body["data-step"] == "2"  # not recorded


@pytest.mark.slow
def test_a_trained_run_shows_datc_and_its_compared_strategies(tmp_path: Path) -> None:
    """`credit-train configs/torch/tiny_datc.yaml`, then `credit-view` on its run folder."""
    chromium()
    run = tmp_path / "tiny_datc"
    overrides = [f"output_dir={run}", "steps=4", "eval.interval=2", "logging.progress=false"]
    args = [str(REPO / "configs/torch/tiny_datc.yaml")]
    assert train_main([*args, *(x for o in overrides for x in ("--set", o))]) == 0
    assert view([str(run), "-o", str(tmp_path / "page.html")]) == 0
    record = read_samples(run / SAMPLES_FILE)[-1]
    shown = read_page(dump_dom(tmp_path / "page.html"))
    assert shown.body["data-step"] == "4" == str(record.step)
    assert record.labels == ["datc(beta=1.0, lam=0.5)", "uniform", "datc_mid"]
    rows = shown.runs[record.strategy]
    for (label, tokens), (sample, own) in zip(
        rows, [(s, label) for s in record.samples for label in record.labels], strict=True
    ):
        assert label == own and [t.text for t in tokens] == sample.tokens
        for token, w in zip(tokens, sample.weights(label), strict=True):
            shown_w = float(token.title.split(",")[0].removeprefix("w = "))
            assert shown_w == pytest.approx(w, rel=1e-3, abs=1e-4)
    png = screenshot(tmp_path / "page.html", tmp_path / "page.png")
    import matplotlib.pyplot as plt

    image = plt.imread(png)
    pixels = {tuple(round(c * 255) for c in p[:3]) for p in image.reshape(-1, image.shape[-1])}
    assert (255, 255, 255) in pixels and len(pixels) > 50  # the heat-map is drawn
