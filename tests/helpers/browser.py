"""Headless Chromium for the page tests (not a test module): the DOM a page shows, and its
screenshot, from a file:// URL."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

#: Flags for a headless run as root in a container: no GPU, no sandbox, no first-run UI.
FLAGS = ["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars"]


def chromium() -> str:
    """The Chromium executable; skips the test when none is installed."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(
            "chromium is not installed: the browser tests need Debian's chromium package "
            "(`make install` installs it where apt-get runs as root)"
        )
    return found


def _run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(
        [chromium(), *FLAGS, *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def dump_dom(page: Path, fragment: str = "") -> str:
    """The DOM of ``page`` after its scripts ran, as HTML (``#fragment`` appended)."""
    return _run(["--dump-dom", page.resolve().as_uri() + fragment], page.parent)


def screenshot(page: Path, png: Path, fragment: str = "", size: str = "1200,700") -> Path:
    """A PNG screenshot of ``page`` in a window of ``size`` (width,height) pixels."""
    url = page.resolve().as_uri() + fragment
    _run([f"--screenshot={png}", f"--window-size={size}", url], png.parent)
    return png


@dataclass
class Token:
    text: str
    title: str
    style: str
    weight: str


@dataclass
class Shown:
    """What a dumped credit-view page shows: the body's data attributes, per run column
    the token rows as (label, tokens) and its agreement line, and how many elements sit
    inside token texts."""

    body: dict[str, str] = field(default_factory=dict)
    runs: dict[str, list[tuple[str, list[Token]]]] = field(default_factory=dict)
    tags_in_tokens: int = 0
    agreements: list[str] = field(default_factory=list)  # each run's agreement line


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.shown = Shown()
        self._run: str | None = None
        self._in: str | None = None  # the element whose text is being read
        self._token: Token | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        cls = a.get("class", "")
        if self._in == "tok":
            self.shown.tags_in_tokens += 1
        if tag == "body":
            self.shown.body = {k: v for k, v in a.items() if k.startswith("data-")}
        elif tag == "h3":
            self._in, self._text = "h3", ""
        elif cls == "label":
            self._in, self._text = "label", ""
        elif cls == "agreement":
            self._in, self._text = "agreement", ""
        elif cls == "tok":
            self._in, self._text = "tok", ""
            self._token = Token("", a.get("title", ""), a.get("style", ""), a.get("data-w", ""))

    def handle_data(self, data: str) -> None:
        if self._in:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if self._in == "h3" and tag == "h3":
            self._run = self._text
            self.shown.runs[self._run] = []
        elif self._in == "label" and tag == "span":
            assert self._run is not None
            self.shown.runs[self._run].append((self._text, []))
        elif self._in == "agreement" and tag == "p":
            self.shown.agreements.append(self._text)
        elif self._in == "tok" and tag == "span":
            assert self._run is not None and self._token is not None
            self._token.text = self._text
            self.shown.runs[self._run][-1][1].append(self._token)
        else:
            return
        self._in = None


def read_page(dom: str) -> Shown:
    """What the dumped DOM ``dom`` of a credit-view page shows."""
    reader = _Reader()
    reader.feed(dom)
    return reader.shown
