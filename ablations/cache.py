"""``SpecModel``: the base of the parameter models whose dump is part of a cache key
(``adapters.folder_cache.cached_dir``) or a run's fingerprint: a field at None is left out of
its dump, so an optional knob added with default None keeps every key and fingerprint made
before it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer


class SpecModel(BaseModel):
    """A parameter model whose dump (``model_dump``, also of it nested in another) leaves out
    every field whose value is None (module docstring)."""

    @model_serializer(mode="wrap")
    def _without_unset_knobs(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        return {key: value for key, value in data.items() if value is not None}
