"""What a strategy that reads a trained model asks its backend to host (PRIME's implicit PRM;
``CreditStrategy.implicit_prm``, docs/backends.md, "Strategies with a trainable model").

The strategy base class and the plan read this spec; the strategy that fills it
(``credit_core.implicit_rewards.PrimeStrategy``) imports it, and nothing here imports a
strategy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from credit_core.errors import CreditError


@dataclass(frozen=True)
class ImplicitPRMSpec:
    """What a backend needs to host PRIME's implicit PRM pi_phi: ``beta`` (of the loss and
    the rewards), pi_phi's AdamW learning rate ``lr`` (weight decay 0, constant schedule) and
    gradient-norm clip ``grad_clip``, and how outcome labels come from rewards
    (``threshold``: l = 1[R > threshold]; None: l = R, which must lie in [0, 1])."""

    beta: float
    lr: float
    grad_clip: float
    threshold: float | None

    def labels(self, rewards: torch.Tensor) -> torch.Tensor:
        """Outcome labels (B,) float32 in [0, 1] of the rewards (B,); ``CreditError`` naming
        the rewards when they are the labels and leave [0, 1]."""
        if self.threshold is not None:
            return (rewards > self.threshold).to(torch.float32)
        if not bool(((rewards >= 0) & (rewards <= 1)).all()):
            raise CreditError(
                "rewards: prime with threshold None takes the rewards as outcome labels and "
                f"needs them in [0, 1], got min {float(rewards.min())}, max "
                f"{float(rewards.max())}; set a threshold"
            )
        return rewards.to(torch.float32)
