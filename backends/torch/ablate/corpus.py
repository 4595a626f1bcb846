"""An offline English corpus: sentences from docstrings of the Python standard library.

Deterministic for a given Python version: only the module's own docstring and those of the
classes and functions it defines are read (never attributes that other imports add), and
the sentences are sorted. The builders hash the sentences into their cache keys, so
another Python version simply builds its own artifacts.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from functools import lru_cache

#: Standard-library modules whose docstrings make the corpus (import failures are skipped).
MODULES: tuple[str, ...] = (
    "abc",
    "argparse",
    "array",
    "ast",
    "asyncio",
    "base64",
    "bisect",
    "bz2",
    "calendar",
    "cmath",
    "cmd",
    "codecs",
    "collections",
    "colorsys",
    "concurrent.futures",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "dis",
    "email.message",
    "enum",
    "filecmp",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "gc",
    "getopt",
    "gettext",
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "http.client",
    "http.server",
    "imaplib",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "mailbox",
    "math",
    "mimetypes",
    "mmap",
    "numbers",
    "operator",
    "optparse",
    "os",
    "os.path",
    "pathlib",
    "pickle",
    "pkgutil",
    "platform",
    "plistlib",
    "poplib",
    "pprint",
    "queue",
    "random",
    "re",
    "sched",
    "secrets",
    "selectors",
    "shlex",
    "shutil",
    "signal",
    "smtplib",
    "socket",
    "socketserver",
    "sqlite3",
    "ssl",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "tokenize",
    "traceback",
    "types",
    "typing",
    "unicodedata",
    "urllib.parse",
    "urllib.request",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "xml.dom.minidom",
    "zipfile",
    "zlib",
)

_SENTENCE = re.compile(r"[A-Z][A-Za-z ,;'\-]+[a-z]\.")
_SPLIT = re.compile(r"(?<=[.!?])\s+")


def _docstrings(module_name: str) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            module = importlib.import_module(module_name)
        except Exception:  # an optional module missing on this platform: skip it
            return []
        names = [n for n in sorted(vars(module)) if not n.startswith("_")]
        docs = [inspect.getdoc(module) or ""]
        for obj in (vars(module)[n] for n in names):
            # only what the module defines itself: what else is loaded must not matter
            own = getattr(obj, "__module__", None) == module.__name__
            if own and (inspect.isclass(obj) or inspect.isroutine(obj)):
                docs.append(inspect.getdoc(obj) or "")
    return [d for d in docs if d]


@lru_cache(maxsize=1)
def docstring_sentences(min_words: int = 5, max_words: int = 25) -> tuple[str, ...]:
    """Sorted, distinct plain-English sentences (letters, spaces, , ; ' - and a final period)
    of ``min_words`` to ``max_words`` words from the docstrings of ``MODULES``."""
    found: set[str] = set()
    for name in MODULES:
        for doc in _docstrings(name):
            for para in doc.split("\n\n"):
                for sentence in _SPLIT.split(" ".join(para.split())):
                    if _SENTENCE.fullmatch(sentence) and (
                        min_words <= len(sentence.split()) <= max_words
                    ):
                        found.add(sentence)
    return tuple(sorted(found))
