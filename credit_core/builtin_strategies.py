"""The built-in strategies of docs/design.md ("Strategies"), registered through the public hook."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from pydantic import BaseModel, Field

# Imported for their ``builtin`` registrations.
from credit_core import (  # noqa: F401
    answer_reweighting,
    baseline_strategies,
    implicit_rewards,
    key_tokens,
    p2t,
    process_supervision,
)
from credit_core.allocation import CreditDiagnostics
from credit_core.batch import CreditBatch, PolicyStats
from credit_core.hookspecs import hookimpl
from credit_core.strategy import (
    CreditStrategy,
    ScoreParams,
    ScoreStrategy,
    SeededStream,
    builtin,
    builtin_classes,
)
from credit_core.work import token_work

DATC_SIGNALS = frozenset({"reward_grad", "policy_stats"})
DATC_WORK_SIGNALS = frozenset({"unsigned_work"})


def _work(batch: CreditBatch, signed: bool) -> torch.Tensor:
    """W (B, T) = sign(A) W0 (``signed``) or W0, from ``batch.unsigned_work`` if present,
    else from ``policy_stats`` and ``reward_grad`` (``token_work``); float32 or wider."""
    w0 = batch.unsigned_work
    if w0 is None:
        stats: PolicyStats | None = batch.policy_stats
        grad = batch.reward_grad
        assert stats is not None and grad is not None  # guaranteed by batch.require
        w0 = token_work(stats, grad, None)
    w0 = w0.to(torch.promote_types(w0.dtype, torch.float32))
    if not signed:
        return w0
    return w0 * torch.sign(batch.advantages).to(w0.dtype).unsqueeze(1)


@builtin
class DATCStrategy(ScoreStrategy):
    """DATC: s_t = W_t, the work of the GRPO update direction against the reward gradient."""

    name = "datc"
    requires = DATC_SIGNALS
    work_requires = DATC_WORK_SIGNALS

    def scores(self, batch: CreditBatch) -> torch.Tensor:
        return _work(batch, signed=True)


@builtin
class DATCMidpointStrategy(DATCStrategy):
    """DATC with the reward gradient taken at the midpoint between the sampled embeddings
    and the policy's expected embeddings (docs/design.md, "Curvature-robust direction");
    the allocation is DATC's."""

    name = "datc_mid"

    @property
    def reward_grad_points(self) -> int:
        return 1


class PathParams(ScoreParams):
    """``ScoreParams`` plus the number of points of the integrated gradient."""

    points: int = Field(4, ge=2, le=64, description="points of the path (midpoint rule)")


@builtin
class DATCIntegratedStrategy(DATCStrategy):
    """DATC with the reward gradient averaged over ``points`` points of the path from the
    sampled embeddings to the policy's expected embeddings (the midpoint rule of the
    integrated gradient; docs/design.md, "Curvature-robust direction")."""

    name = "datc_ig"
    Params: ClassVar[type[BaseModel]] = PathParams
    params: PathParams

    @property
    def reward_grad_points(self) -> int:
        return self.params.points


@builtin
class DATCUnsignedStrategy(ScoreStrategy):
    """Ablation: s_t = |W_t|, magnitude without direction."""

    name = "datc_unsigned"
    requires = DATC_SIGNALS
    work_requires = DATC_WORK_SIGNALS

    def scores(self, batch: CreditBatch) -> torch.Tensor:
        return _work(batch, signed=True).abs()


@builtin
class DATCNoSignStrategy(ScoreStrategy):
    """Ablation: s_t = W_t without the sign(A) factor."""

    name = "datc_nosign"
    requires = DATC_SIGNALS
    work_requires = DATC_WORK_SIGNALS

    def scores(self, batch: CreditBatch) -> torch.Tensor:
        return _work(batch, signed=False)


@builtin
class DATCInverseStrategy(ScoreStrategy):
    """Negative control: s_t = -W_t."""

    name = "datc_inverse"
    requires = DATC_SIGNALS
    work_requires = DATC_WORK_SIGNALS

    def scores(self, batch: CreditBatch) -> torch.Tensor:
        return -_work(batch, signed=True)


@builtin
class SaliencyStrategy(ScoreStrategy):
    """RM-gradient saliency: s_t = ||g_t||, no policy direction."""

    name = "saliency"
    requires = frozenset({"reward_grad"})

    def scores(self, batch: CreditBatch) -> torch.Tensor:
        grad = batch.reward_grad
        assert grad is not None  # guaranteed by batch.require
        norm: torch.Tensor = torch.linalg.vector_norm(
            grad.to(torch.promote_types(grad.dtype, torch.float32)), dim=-1
        )
        return norm


class ShuffledParams(ScoreParams):
    """``ScoreParams`` plus the seed of the permutation stream."""

    seed: int = Field(0, ge=0, description="seed of the permutation generator")


def permute_within_rows(
    values: torch.Tensor, mask: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Randomly permute ``values`` (B, T) among the True positions of each row of ``mask``.

    Padded positions keep their value. One random key per position, drawn on the CPU from
    ``generator`` so the permutation does not depend on the device.
    """
    B, T = mask.shape
    keys = torch.rand(B, T, generator=generator, dtype=torch.float64).to(mask.device)
    positions = torch.arange(T, device=mask.device, dtype=torch.float64).expand(B, T)
    # Valid positions first (in random order / in position order), padding after.
    source = torch.argsort(torch.where(mask, keys, 2.0 + positions), dim=1)
    target = torch.argsort(torch.where(mask, positions, T + positions), dim=1)
    return torch.empty_like(values).scatter_(1, target, values.gather(1, source))


@builtin
class DATCShuffledStrategy(SeededStream, DATCStrategy):
    """Control: DATC's weights permuted among each response's valid tokens (seeded).

    Same weight distribution per response, no alignment with the tokens. The generator is
    seeded once at construction and advances with every call.
    """

    name = "datc_shuffled"
    Params: ClassVar[type[BaseModel]] = ShuffledParams
    params: ShuffledParams

    def weights(self, batch: CreditBatch) -> tuple[torch.Tensor, CreditDiagnostics]:
        w, diag = super().weights(batch)
        return permute_within_rows(w, batch.mask, self.generator), diag


#: Every built-in strategy: the classes decorated with ``builtin`` here and in the modules
#: this one imports (the baselines, KTAE, P2T, PRIME, OAR-G, process supervision), in
#: registration order.
BUILTIN_STRATEGIES: tuple[type[CreditStrategy], ...] = builtin_classes()


@hookimpl
def credit_core_strategies() -> Iterable[type[CreditStrategy]]:
    """The built-in strategies."""
    return BUILTIN_STRATEGIES
