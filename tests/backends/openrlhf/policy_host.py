"""Live OpenRLHF model actors, in-process: ``PolicyHost`` holds a real
``openrlhf.models.Actor`` and OpenRLHF's own ``PolicyModelActor.forward`` and
``execute_batch`` (the functions of its Ray class), and counts the forwards of the Hugging
Face model inside the ``Actor``; ``RewardHost`` holds OpenRLHF's own ``RewardModel`` (loaded
by ``get_llm_for_sequence_regression``) with ``RewardModelActor.forward`` and
``execute_batch``, and counts its forwards and backward passes. Both ``forward`` methods ask
``torch.cuda.current_device()``: a test using them points that at the CPU."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from adapters.tiny import tiny_causal_lm


def policy_actor_class() -> Any:
    """The Python class behind OpenRLHF's ``@ray.remote`` ``PolicyModelActor``."""
    from openrlhf.trainer.ray.ppo_actor import PolicyModelActor

    return PolicyModelActor.__ray_metadata__.modified_class


class PolicyHost:
    """A policy actor instance as ``__ray_call__`` sees it, with OpenRLHF's own methods."""

    forward = policy_actor_class().forward
    execute_batch = policy_actor_class().execute_batch

    def __init__(self, vocab: int, seed: int, temperature: float, packing: bool = False) -> None:
        """``packing``: the ``Actor`` packs its micro-batches (``--ds.packing_samples``). As
        when OpenRLHF's ``Actor`` loads a model, its config's ``use_cache`` is off (with a
        cache, transformers ignores the restarting position ids that separate packed
        samples)."""
        from openrlhf.models import Actor

        self.actor = Actor(tiny_causal_lm("qwen2", vocab, seed=seed), temperature=temperature)
        self.actor.packing_samples = packing
        self.actor.model.config.use_cache = False
        self.strategy = SimpleNamespace(ring_attn_group=None, is_rank_0=lambda: False)
        self.forwards = 0
        self.actor.model.register_forward_pre_hook(self._count)

    def _count(self, *_: Any) -> None:
        self.forwards += 1

    def run(self, method: str, batches: list[Any]) -> list[Any]:
        """What ``RayActorGroup.async_run_method_batch`` makes one rank do."""
        data = {
            "sequences": [b.sequences for b in batches],
            "action_mask": [b.action_mask for b in batches],
            "attention_mask": [b.attention_mask for b in batches],
        }
        results: list[Any] = self.execute_batch(method, data, 0, len(batches))
        return results


def reward_actor_class() -> Any:
    """The Python class behind OpenRLHF's ``@ray.remote`` ``RewardModelActor``."""
    from openrlhf.trainer.ray.launcher import RewardModelActor

    return RewardModelActor.__ray_metadata__.modified_class


class RewardHost:
    """A reward-model actor instance as ``__ray_call__`` sees it, with OpenRLHF's own
    methods, around ``model`` (an OpenRLHF ``RewardModel``, eval mode). ``forwards`` counts
    the forwards of its transformer, ``backwards`` the backward passes through its value
    head."""

    forward = reward_actor_class().forward
    execute_batch = reward_actor_class().execute_batch

    def __init__(self, model: Any) -> None:
        model.eval()  # a DeepSpeed engine's eval() returns None
        self.model = model
        self.strategy = SimpleNamespace(ring_attn_group=None, is_rank_0=lambda: False)
        self.forwards = self.backwards = 0
        getattr(model, model.base_model_prefix).register_forward_pre_hook(self._count_forward)
        head = getattr(model, model.value_head_prefix)
        head.register_full_backward_pre_hook(self._count_backward)

    def _count_forward(self, *_: Any) -> None:
        self.forwards += 1

    def _count_backward(self, *_: Any) -> None:
        self.backwards += 1

    def run(self, batches: list[Any]) -> list[Any]:
        """The rewards of ``batches``, as ``make_experience`` dispatches the reward model."""
        data = {
            "sequences": [b.sequences for b in batches],
            "attention_mask": [b.attention_mask for b in batches],
            "pad_sequence": [True] * len(batches),
        }
        results: list[Any] = self.execute_batch("forward", data, 0, len(batches))
        return results


class LocalHandle:
    """A Ray actor handle of an in-process host: ``handle.__ray_call__.remote(f, *args)``
    runs ``f(host, *args)`` at once; ``.options(num_returns=n)`` (n > 1) returns the n
    values as a list, as Ray returns n references."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.__ray_call__ = SimpleNamespace(remote=self._call, options=self._options)

    def _call(self, f: Any, *args: Any) -> Any:
        return f(self.host, *args)

    def _options(self, num_returns: int = 1) -> Any:
        if num_returns == 1:
            return SimpleNamespace(remote=self._call)
        return SimpleNamespace(remote=lambda f, *args: list(self._call(f, *args)))


class LocalGroup:
    """OpenRLHF's ``RayActorGroup`` over one in-process host: every call runs at once and
    returns what the actor would (a test makes ``ray.get`` the identity);
    ``_actor_handlers`` holds its one handle."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self._actor_handlers = [LocalHandle(host)]

    def async_run_method(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        if method_name == "__ray_call__":
            function, *rest = args
            return [function(self.host, *rest, **kwargs)]
        return [getattr(self.host, method_name)(*args, **kwargs)]

    def async_run_method_batch(self, method_name: str, **batch: Any) -> list[list[Any]]:
        size = len(next(iter(batch.values())))
        return [self.host.execute_batch(method_name, batch, 0, size)]


class StoredRef:
    """A Ray object reference as its owner sees it: the value serialized in the object store
    (``pickle``); only ``stored_get`` turns it back into objects in this process."""

    def __init__(self, value: Any) -> None:
        self.data = pickle.dumps(value)


def stored_get(on_fetch: Callable[[Any], None]) -> Callable[[Any], Any]:
    """``ray.get`` for ``StoredRef``s (and lists of them): each fetched value is deserialized
    and passed to ``on_fetch``; anything else is returned as it is (a ``LocalGroup``'s)."""

    def get(refs: Any) -> Any:
        if isinstance(refs, list):
            return [get(ref) for ref in refs]
        if not isinstance(refs, StoredRef):
            return refs
        value = pickle.loads(refs.data)
        on_fetch(value)
        return value

    return get


class StoredHandle(LocalHandle):
    """A ``LocalHandle`` whose calls with ``.options(num_returns=n)`` return ``StoredRef``s."""

    def _options(self, num_returns: int = 1) -> Any:
        if num_returns == 1:
            return SimpleNamespace(remote=lambda f, *args: StoredRef(self._call(f, *args)))
        return SimpleNamespace(remote=lambda f, *args: [StoredRef(v) for v in self._call(f, *args)])


class StoredGroup(LocalGroup):
    """A ``LocalGroup`` whose batched calls return, as Ray's do, references to values in an
    object store (``StoredRef``): ``async_run_method_batch`` one per actor (the list of its
    results), per-item ``__ray_call__`` one per item."""

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self._actor_handlers = [StoredHandle(host)]

    def async_run_method_batch(self, method_name: str, **batch: Any) -> list[Any]:
        results = super().async_run_method_batch(method_name, **batch)
        return [StoredRef(result) for result in results]
