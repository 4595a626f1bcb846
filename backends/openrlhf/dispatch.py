"""OpenRLHF's ``RayActorGroup.async_run_method_batch`` with one result object per micro-batch.

``async_run_method_batch`` (OpenRLHF 0.11) gives each effective actor (the first of every
``duplicate_actors`` handles: a ring-attention / tensor-parallel group computes the same
chunk) a contiguous block of ceil(N / E) of the N micro-batches, and returns one object per
actor, the list of its block's results: fetching any micro-batch's result fetches its whole
block. ``run_method_per_item`` makes the same calls on the same actors (same blocks, same
order, so that the collectives line up and each actor finds the signals it kept from its
own ``forward`` of those micro-batches) through ``__ray_call__`` with one return per
micro-batch, so that a caller fetches micro-batch i alone (``ray.get(refs[i])``) and can drop
it before fetching the next. The duplicates' results are not returned (OpenRLHF drops them
too, ``RemoteExperienceMaker._flatten_results``).
"""

from __future__ import annotations

from typing import Any

from credit_core import CreditError


def blocks(total: int, effective: int) -> list[range]:
    """The micro-batches each of ``effective`` actors is given out of ``total``, as
    ``async_run_method_batch`` cuts them (empty ranges for actors past the last block).
    ``CreditError`` when there are fewer micro-batches than actors (OpenRLHF refuses it too)."""
    if effective < 1 or total < effective:
        raise CreditError(
            f"credit signals: {total} micro-batches cannot be spread over {effective} "
            "actors (OpenRLHF's async_run_method_batch needs at least one per actor)"
        )
    size = -(-total // effective)
    return [range(min(k * size, total), min((k + 1) * size, total)) for k in range(effective)]


def execute_items(actor_self: Any, method_name: str, data: dict[str, list[Any]], count: int) -> Any:
    """Run through ``__ray_call__`` with ``num_returns=count``: OpenRLHF's
    ``execute_batch(method_name, data, 0, count)`` on the actor, its results as ``count``
    return values (the result itself when ``count`` is 1, as Ray expects)."""
    results = actor_self.execute_batch(method_name, data, 0, count)
    return results[0] if count == 1 else tuple(results)


def run_method_per_item(
    group: Any, method_name: str, duplicate_factor: int, **batch: list[Any]
) -> list[Any]:
    """``group.async_run_method_batch(method_name, **batch)``'s calls, returning one object
    reference per micro-batch: ``refs[i]`` holds micro-batch i's result (module docstring).
    ``batch`` maps each keyword of ``method_name`` to its list of N values."""
    handles = group._actor_handlers  # RayActorGroup has no public per-actor call in 0.11
    total = len(next(iter(batch.values())))
    refs: list[Any] = []
    for k, block in enumerate(blocks(total, len(handles) // duplicate_factor)):
        if not block:
            continue
        data = {key: values[block.start : block.stop] for key, values in batch.items()}
        count = len(block)
        for j in range(duplicate_factor):
            call = handles[k * duplicate_factor + j].__ray_call__.options(num_returns=count)
            found = call.remote(execute_items, method_name, data, count)
            if j == 0:
                refs += [found] if count == 1 else list(found)
    return refs
