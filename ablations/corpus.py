"""An offline English corpus: sentences from docstrings of the Python standard library.

Deterministic for a given Python version, whatever else the process has imported or
patched: the docstrings are parsed from the modules' source files (the module's own and
those of its public top-level classes and functions), and the sentences are sorted. The
builders hash the sentences into their cache keys, so another Python version simply builds
its own artifacts.
"""

from __future__ import annotations

import ast
import re
import sysconfig
from functools import lru_cache
from pathlib import Path

#: Standard-library modules (written in Python) whose docstrings make the corpus.
MODULES: tuple[str, ...] = (
    "abc",
    "argparse",
    "ast",
    "asyncio",
    "base64",
    "bisect",
    "bz2",
    "calendar",
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
    "difflib",
    "dis",
    "email.message",
    "enum",
    "filecmp",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
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
    "json",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "mailbox",
    "mimetypes",
    "numbers",
    "operator",
    "optparse",
    "os",
    "posixpath",
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
    "smtplib",
    "socket",
    "socketserver",
    "sqlite3",
    "ssl",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "tokenize",
    "traceback",
    "types",
    "typing",
    "urllib.parse",
    "urllib.request",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "xml.dom.minidom",
    "zipfile",
)

_SENTENCE = re.compile(r"[A-Z][A-Za-z ,;'\-]+[a-z]\.")
_SPLIT = re.compile(r"(?<=[.!?])\s+")


def _docstrings(module_name: str) -> list[str]:
    """The docstrings of ``module_name``'s source file: the module's own and those of the
    public classes and functions defined at its top level, in file order. Parsed with ``ast``
    from the file, so that attributes which other imports replace in the live module (as
    libraries do with ``inspect.isgenerator``) cannot change the result."""
    base = Path(sysconfig.get_paths()["stdlib"], *module_name.split("."))
    source = next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)
    if source is None:  # written in C, or missing from this installation: skip it
        return []
    tree = ast.parse(source.read_text(encoding="utf-8"))
    nodes: list[ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef] = [tree]
    nodes += [
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
    ]
    return [doc for doc in (ast.get_docstring(node) for node in nodes) if doc]


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
