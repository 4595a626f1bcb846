"""The strategy registry: a pluggy plugin manager over the ``credit_core_strategies`` hook.

Built-ins register through the same hook as third parties. Entry points in the group
``credit_core.strategies`` are loaded once, on the first lookup. Every failure (a plugin
that cannot be imported, a duplicate name, a class that breaks the strategy contract) is a
``CreditError`` naming the plugin.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from importlib import metadata
from typing import Any

import pluggy
from pydantic import BaseModel, ValidationError

from credit_core import builtin_strategies, hookspecs
from credit_core.batch import SIGNALS
from credit_core.errors import CreditError, validation_messages
from credit_core.strategy import CreditStrategy

_NAME_RE = re.compile(r"^[a-z][a-z0-9_\-.]*$")
_BUILTIN_PLUGIN = "credit_core.builtin"


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.strategies: dict[str, tuple[type[CreditStrategy], str]] = {}
        self.entry_points_loaded = False
        self.entry_point_error: CreditError | None = None
        self._add(builtin_strategies, _BUILTIN_PLUGIN)

    def _collect(self, plugin: object, plugin_name: str) -> dict[str, type[CreditStrategy]]:
        found: dict[str, type[CreditStrategy]] = {}
        impls = [
            impl
            for impl in self.pm.hook.credit_core_strategies.get_hookimpls()
            if impl.plugin is plugin
        ]
        if not impls:
            raise CreditError(
                f"plugin {plugin_name!r}: no @hookimpl 'credit_core_strategies' found; "
                "decorate a function with credit_core.hookimpl"
            )
        for impl in impls:
            try:
                result = impl.function()
                classes = list(result) if isinstance(result, Iterable) else None
            except Exception as exc:
                raise CreditError(
                    f"plugin {plugin_name!r}: credit_core_strategies() raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if classes is None:
                raise CreditError(
                    f"plugin {plugin_name!r}: credit_core_strategies() must return an iterable "
                    f"of strategy classes, got {type(result).__name__}"
                )
            for obj in classes:
                cls = _checked_strategy(obj, plugin_name)
                if cls.name in found:
                    raise CreditError(
                        f"plugin {plugin_name!r}: strategy name {cls.name!r} returned twice"
                    )
                found[cls.name] = cls
        return found

    def _add(self, plugin: object, plugin_name: str) -> None:
        with self.lock:
            if self.pm.has_plugin(plugin_name) or self.pm.is_registered(plugin):
                raise CreditError(f"plugin {plugin_name!r} is already registered")
            try:
                self.pm.register(plugin, name=plugin_name)
            except Exception as exc:
                raise CreditError(f"plugin {plugin_name!r} cannot be registered: {exc}") from exc
            try:
                found = self._collect(plugin, plugin_name)
                for name in found:
                    if name in self.strategies:
                        owner = self.strategies[name][1]
                        raise CreditError(
                            f"plugin {plugin_name!r}: strategy name {name!r} is already "
                            f"registered by plugin {owner!r}"
                        )
            except CreditError:
                self.pm.unregister(plugin)
                raise
            for name, cls in found.items():
                self.strategies[name] = (cls, plugin_name)

    def remove(self, plugin_name: str) -> None:
        with self.lock:
            if plugin_name == _BUILTIN_PLUGIN or not self.pm.has_plugin(plugin_name):
                raise CreditError(f"plugin {plugin_name!r}: not a registered third-party plugin")
            self.pm.unregister(name=plugin_name)
            self.strategies = {k: v for k, v in self.strategies.items() if v[1] != plugin_name}

    def load_entry_points(self) -> None:
        """Load the entry points once; if that failed, raise the same error on every call.

        A broken plugin must not be reported once and then silently missing (with the entry
        points after it never loaded) on the next lookup.
        """
        with self.lock:
            if not self.entry_points_loaded:
                self.entry_points_loaded = True
                try:
                    self._load_entry_points()
                except CreditError as exc:
                    self.entry_point_error = exc
            if self.entry_point_error is not None:
                raise CreditError(str(self.entry_point_error)) from self.entry_point_error

    def _load_entry_points(self) -> None:
        for ep in metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist is not None else "unknown distribution"
            label = f"entry point {ep.name!r} = {ep.value!r} (group "
            label += f"{hookspecs.ENTRY_POINT_GROUP!r}, distribution {dist!r})"
            try:
                plugin = ep.load()
            except Exception as exc:
                raise CreditError(
                    f"plugin {label} failed to import: {type(exc).__name__}: {exc}"
                ) from exc
            try:
                self._add(plugin, f"entrypoint:{ep.name}")
            except CreditError as exc:
                raise CreditError(f"plugin {label}: {exc}") from exc

    def lookup(self, name: str) -> type[CreditStrategy]:
        self.load_entry_points()
        entry = self.strategies.get(name)
        if entry is None:
            raise CreditError(
                f"unknown credit strategy {name!r}; "
                f"registered strategies: {sorted(self.strategies)}"
            )
        return entry[0]


def _checked_strategy(cls: object, plugin_name: str) -> type[CreditStrategy]:
    """Return ``cls`` if it satisfies the strategy contract, else raise ``CreditError``."""
    where = f"plugin {plugin_name!r}: strategy {cls!r}"
    if not (isinstance(cls, type) and issubclass(cls, CreditStrategy)):
        raise CreditError(f"{where} is not a subclass of credit_core.CreditStrategy")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise CreditError(
            f"{where}: class attribute 'name' must be a lowercase identifier string "
            f"(pattern {_NAME_RE.pattern}), got {name!r}"
        )
    requires = getattr(cls, "requires", None)
    if not isinstance(requires, frozenset) or not requires <= SIGNALS:
        raise CreditError(
            f"{where}: class attribute 'requires' must be a frozenset within {sorted(SIGNALS)}, "
            f"got {requires!r}"
        )
    params = getattr(cls, "Params", None)
    if not (isinstance(params, type) and issubclass(params, BaseModel)):
        raise CreditError(f"{where}: class attribute 'Params' must be a pydantic BaseModel class")
    if getattr(cls, "__abstractmethods__", None):
        missing = sorted(cls.__abstractmethods__)
        raise CreditError(f"{where}: abstract methods not implemented: {missing}")
    return cls


_REGISTRY: _Registry | None = None
_REGISTRY_LOCK = threading.Lock()


def _registry() -> _Registry:
    global _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is None:
            _REGISTRY = _Registry()
        return _REGISTRY


def register_plugin(plugin: object, name: str | None = None) -> str:
    """Register an in-process plugin (a module or object with a ``@hookimpl``).

    Returns the plugin's registered name (``name``, or the module/object name). Raises
    ``CreditError`` on a duplicate plugin or strategy name or a broken strategy class.
    """
    reg = _registry()
    reg.load_entry_points()
    plugin_name = name or getattr(plugin, "__name__", None) or f"plugin-{id(plugin)}"
    reg._add(plugin, plugin_name)
    return plugin_name


def unregister_plugin(name: str) -> None:
    """Remove a plugin registered with ``register_plugin`` and its strategies."""
    _registry().remove(name)


def list_strategies() -> list[str]:
    """Sorted names of all registered strategies (built-ins, entry points, in-process)."""
    reg = _registry()
    reg.load_entry_points()
    return sorted(reg.strategies)


def strategy_class(name: str) -> type[CreditStrategy]:
    """The registered class for ``name``; ``CreditError`` listing the names if unknown."""
    return _registry().lookup(name)


def plugin_of(name: str) -> str:
    """Name of the plugin that registered strategy ``name``."""
    reg = _registry()
    reg.lookup(name)
    return reg.strategies[name][1]


def validate_params(name: str, params: dict[str, Any]) -> BaseModel:
    """Validate ``params`` against strategy ``name``'s Params model.

    Raises ``CreditError`` naming each bad field, what it allows, and the value given.
    """
    cls = strategy_class(name)
    try:
        return cls.Params.model_validate(params)
    except ValidationError as exc:
        raise CreditError(_format_param_errors(name, cls.Params, exc)) from exc


def _format_param_errors(name: str, model: type[BaseModel], exc: ValidationError) -> str:
    lines = []
    for problem in validation_messages(exc, model):
        field = problem.field or "<params>"
        if problem.kind == "unknown":
            allowed = list(problem.allowed)
            lines.append(f"unknown parameter {field!r}; allowed parameters: {allowed}")
        else:
            lines.append(f"parameter {field!r}: {problem.message}")
    return f"strategy {name!r}: " + "; ".join(lines)
