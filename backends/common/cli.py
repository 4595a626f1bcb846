"""One error contract for every command line of the project.

``run_cli(prog, main, argv)`` runs ``main(argv)`` and turns an *expected* failure into one
message on stderr, ``<prog>: error: <what is wrong and what to do>``, and exit status 2,
without a traceback. Expected failures: ``CreditError`` (bad input), ``CommandError`` (a
command line or machine that cannot do what was asked, e.g. a missing GPU), a missing or
unreadable file (``OSError``: ``FileNotFoundError``, ``PermissionError``, ...), a missing
package (``ImportError``, ``ModuleNotFoundError``), and the types a command adds (its
config error). Anything else is a bug and raises with its traceback. ``--debug`` anywhere
on the command line shows the traceback of an expected failure too. Third-party log lines
that mean nothing to the user (``SILENCED``) are dropped at their loggers.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from credit_core.errors import CreditError

DEBUG_FLAG = "--debug"


class CommandError(Exception):
    """An expected failure of a command; the message names the thing and what to do."""


#: What every command reports as a message (a command adds its own config error).
EXPECTED: tuple[type[Exception], ...] = (CreditError, CommandError, OSError, ImportError)


#: Third-party log lines that mean nothing to the user of a command: logger name -> the
#: starts of the messages dropped. DeepSpeed (imported by accelerate whenever a model is
#: saved or unwrapped) warns on every CPU-only process that it found no accelerator.
SILENCED: dict[str, tuple[str, ...]] = {
    "DeepSpeed": ("Setting accelerator to CPU",),
}


class _DropMessages(logging.Filter):
    """Drops records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def silence_third_party_noise() -> None:
    """Drop the ``SILENCED`` lines at their loggers (idempotent; every other record of those
    loggers, and every other logger, is untouched). A logger keeps its filters when the
    library configures it later, so this works before the library is imported."""
    for name, prefixes in SILENCED.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(prefixes))


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    """List ``--debug`` in a parser's help (``run_cli`` takes it off the command line)."""
    parser.add_argument(
        DEBUG_FLAG,
        action="store_true",
        help="on an expected error (bad config, missing file or package), show the "
        "traceback instead of the one-line message",
    )


def run_cli(
    prog: str,
    main: Callable[[list[str]], int],
    argv: Sequence[str] | None = None,
    *,
    expected: tuple[type[Exception], ...] = (),
) -> int:
    """``main(args)``'s exit status, or 2 after printing an expected failure (see the module
    docstring). ``args`` is ``argv`` (default ``sys.argv[1:]``) without ``--debug``; with
    ``--debug`` an expected failure propagates with its traceback."""
    silence_third_party_noise()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in args
    args = [a for a in args if a != DEBUG_FLAG]
    try:
        return main(args)
    except (*EXPECTED, *expected) as exc:
        if debug:
            raise
        print(f"{prog}: error: {describe(exc)}", file=sys.stderr)
        print(f"{prog}: (run with {DEBUG_FLAG} to see the traceback)", file=sys.stderr)
        return 2


def describe(exc: BaseException) -> str:
    """What went wrong and what to do, for an expected failure ``exc``."""
    if isinstance(exc, ModuleNotFoundError):
        return (
            f"the Python module {exc.name!r} is not installed ({exc}); install the package "
            "that provides it into this environment, or choose options that do not need it"
        )
    if isinstance(exc, ImportError):
        return (
            f"cannot import {exc.name or 'a module'}: {exc}; the installed packages do not "
            "fit together (see the README's setup details)"
        )
    if isinstance(exc, FileNotFoundError):
        return f"no such file or directory: {_path(exc)}; check the path"
    if isinstance(exc, PermissionError):
        return f"permission denied: {_path(exc)}; make it accessible or choose another path"
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {_path(exc)}"
    return str(exc)


def _path(exc: OSError) -> str:
    if exc.filename is None:
        return str(exc)
    return repr(str(exc.filename))
