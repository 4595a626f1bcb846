"""OpenRLHF integration: token credit assignment inside OpenRLHF's Ray PPO/GRPO pipeline.

- ``credit-openrlhf`` / ``python -m backends.openrlhf`` (``launcher.main``): OpenRLHF's
  ``train_ppo_ray`` with ``--credit NAME`` and friends; everything else passes through.
- ``experience_maker.TokenCreditExperienceMaker``: OpenRLHF's experience maker whose
  advantages are split over tokens by a ``credit_core`` strategy.
- ``actor_side``: what runs inside the policy / reward-model actors (policy statistics,
  reward gradients), ``injection``: how the maker gets into the trainer actor.

Importing this package does not import OpenRLHF (which needs vllm/flash_attn); the modules
``experience_maker`` and ``injection`` do. Supported OpenRLHF: see ``version``.
"""

from backends.openrlhf.settings import OpenRLHFCreditConfig
from backends.openrlhf.version import SUPPORTED_SERIES, check_openrlhf_version

__all__ = ["SUPPORTED_SERIES", "OpenRLHFCreditConfig", "check_openrlhf_version"]
