"""Getting the token-credit experience maker into OpenRLHF's trainer actor.

OpenRLHF has no plugin point, its trainer is a ``@ray.remote`` class (it cannot be
subclassed from outside), and a monkeypatch made in the driver does not reach Ray worker
processes. The mechanism chosen here needs nothing in the workers but an importable
``backends`` package (installed, or the driver's working directory, which Ray puts on every
local worker's ``sys.path``):

1. In the driver, ``driver_hooks`` swaps two names that ``train_ppo_ray`` looks up at call
   time: ``openrlhf.trainer.ppo_trainer.PPOTrainer`` (and ``ppo_trainer_async
   .PPOTrainerAsync``) become ``TrainerWithCredit`` proxies, and
   ``openrlhf.utils.config.hierarchize`` gets a wrapper that checks the credit settings
   against OpenRLHF's parsed arguments before ``ray.init`` (so a bad combination fails
   before any actor, vLLM engine or GPU is touched).
2. ``TrainerWithCredit.remote(...)`` creates the real trainer actor, then runs
   ``install_in_trainer`` *inside that live actor* with ``handle.__ray_call__`` and waits
   for it, before ``train_ppo_ray`` makes its next call on the handle (Ray runs one caller's
   calls on an actor in order). ``install_in_trainer`` replaces the actor's
   ``experience_maker`` by a ``TokenCreditExperienceMaker`` sharing all of its parts, and
   that maker binds ``credit_<role>_signals`` onto the policy / reward-model actors the same way.
   ``train_ppo_ray`` creates the trainer *before* it loads the models into those actors, so
   the install reads no actor's model: what does (the reward model's embedding table, P2T's
   null row) waits for the first step (``TokenCreditExperienceMaker.prepare_actors``).
   For ``PPOTrainerAsync`` (which creates its training actor itself) the install hops one
   level down to its ``trainer_actor``.

Why not the alternatives: a Ray ``runtime_env`` ``worker_process_setup_hook`` only applies if
this driver's ``ray.init`` creates the job (OpenRLHF skips its own ``ray.init`` when Ray is up,
and ``ray job submit`` sets the runtime env elsewhere), runs in every worker (vLLM engines
included) and fails late, inside a worker; a ``sitecustomize``/``.pth`` file changes every
Python process of the environment. ``__ray_call__`` touches exactly one live object, in a
known order, and reports errors to the driver at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ray

from backends.openrlhf.compat import resolve_credit
from backends.openrlhf.settings import OpenRLHFCreditConfig
from backends.openrlhf.version import check_openrlhf_version
from credit_core import CreditError


def install_in_trainer(trainer: Any, cfg: OpenRLHFCreditConfig) -> str:
    """Run inside OpenRLHF's trainer actor: swap in the token-credit experience maker.

    Checks the OpenRLHF version of this worker, resolves ``cfg`` against the trainer's final
    arguments (``trainer.strategy.args``), replaces ``trainer.experience_maker``. Returns a
    description "<strategy> in <Class>@<pid>" of where it was installed.
    """
    check_openrlhf_version()
    if hasattr(trainer, "experience_maker"):
        from backends.openrlhf.experience_maker import TokenCreditExperienceMaker

        stock = trainer.experience_maker
        credit = resolve_credit(stock.strategy.args, cfg)
        trainer.experience_maker = TokenCreditExperienceMaker.replacing(stock, credit)
        return f"{cfg.credit.name} in {type(trainer).__name__}@{os.getpid()}"
    inner = getattr(trainer, "trainer_actor", None)
    if inner is not None:
        return str(ray.get(inner.__ray_call__.remote(install_in_trainer, cfg)))
    raise CreditError(
        f"cannot install token credit: the OpenRLHF trainer actor {type(trainer).__name__} has "
        "neither 'experience_maker' nor 'trainer_actor' (unsupported OpenRLHF version?)"
    )


def credit_error_of(exc: BaseException) -> CreditError | None:
    """The ``CreditError`` a Ray task failed with, found through nested task errors (an
    install refusal raised in a model actor reaches the driver through the trainer actor), or
    None when the failure is another error."""
    cause: BaseException | None = exc
    while isinstance(cause, ray.exceptions.RayTaskError):
        cause = cause.cause
    return cause if isinstance(cause, CreditError) else None


class TrainerWithCredit:
    """Stands in for OpenRLHF's trainer actor class; ``.remote`` installs token credit.

    ``remote(*args, **kwargs)`` creates the actor exactly as the wrapped class would, runs
    ``install_in_trainer`` in it and returns the handle; ``options(...)`` keeps the proxy.
    ``on_install`` receives the installation description (default: print to stdout). An
    install refused with a ``CreditError`` (in the trainer actor or in a model actor) is
    raised here as that ``CreditError`` alone, its message without Ray's remote traceback
    (chained to the Ray error, which ``--debug`` shows).
    """

    def __init__(
        self,
        actor_class: Any,
        cfg: OpenRLHFCreditConfig,
        on_install: Callable[[str], None] | None = None,
    ) -> None:
        self._actor_class = actor_class
        self._cfg = cfg
        self._on_install = on_install or (lambda where: print(f"token credit: installed {where}"))

    def options(self, **kwargs: Any) -> TrainerWithCredit:
        return TrainerWithCredit(self._actor_class.options(**kwargs), self._cfg, self._on_install)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        handle = self._actor_class.remote(*args, **kwargs)
        try:
            where = ray.get(handle.__ray_call__.remote(install_in_trainer, self._cfg))
        except ray.exceptions.RayTaskError as exc:
            refusal = credit_error_of(exc)
            if refusal is None:
                raise
            raise CreditError(str(refusal)) from exc
        self._on_install(str(where))
        return handle


@contextmanager
def driver_hooks(cfg: OpenRLHFCreditConfig) -> Iterator[None]:
    """Within the block, OpenRLHF's ``train_ppo_ray`` trains with token credit ``cfg``.

    Patches (and afterwards restores) ``hierarchize`` (early compatibility check) and the
    trainer actor classes (installation), see the module docstring.
    """
    import openrlhf.trainer.ppo_trainer as sync_trainer
    import openrlhf.trainer.ppo_trainer_async as async_trainer
    import openrlhf.utils.config as config_module

    saved = (
        config_module.hierarchize,
        sync_trainer.PPOTrainer,
        async_trainer.PPOTrainerAsync,
    )
    original_hierarchize = saved[0]

    def hierarchize_and_check(args: Any) -> Any:
        nested = original_hierarchize(args)
        resolve_credit(nested, cfg)
        return nested

    config_module.hierarchize = hierarchize_and_check
    sync_trainer.PPOTrainer = TrainerWithCredit(sync_trainer.PPOTrainer, cfg)
    async_trainer.PPOTrainerAsync = TrainerWithCredit(async_trainer.PPOTrainerAsync, cfg)
    try:
        yield
    finally:
        (
            config_module.hierarchize,
            sync_trainer.PPOTrainer,
            async_trainer.PPOTrainerAsync,
        ) = saved
