"""OpenRLHF integration: token credit assignment inside OpenRLHF's Ray PPO/GRPO pipeline.

- ``credit-openrlhf`` / ``python -m backends.openrlhf`` (``launcher.main``): OpenRLHF's
  ``train_ppo_ray`` with ``--credit NAME`` and friends; everything else passes through.
- ``settings`` (the credit settings of a run), ``compat`` (which OpenRLHF settings a
  strategy works with, checked before ``ray.init``), ``injection`` (how the maker gets into
  the trainer actor, which ``train_ppo_ray`` creates before it loads the models).
- ``experience_maker.TokenCreditExperienceMaker``: OpenRLHF's experience maker whose
  advantages are split over tokens by a ``credit_core`` strategy; ``credit`` (the backend's
  credit on the one seam ``backends.common.credit.CreditRun``: the step's token advantages,
  their shift of the token rewards under ``gae``, the direction model's agreement with the
  reward), ``dispatch`` (one result object per micro-batch, fetched when credited),
  ``step_batch`` (the step's micro-batches as one batch, with rewards and groups).
- ``actor_side``: what runs inside the policy / reward-model actors (policy statistics,
  reward gradients), with ``forward_capture``, ``layout`` and ``packing`` for OpenRLHF's
  own forward and batch layout.

Importing this package does not import OpenRLHF (which needs vllm/flash_attn); the modules
``experience_maker`` and ``injection`` do. Supported OpenRLHF: see ``version``.
"""

from backends.openrlhf.settings import OpenRLHFCreditConfig
from backends.openrlhf.version import SUPPORTED_SERIES, check_openrlhf_version

__all__ = ["SUPPORTED_SERIES", "OpenRLHFCreditConfig", "check_openrlhf_version"]
