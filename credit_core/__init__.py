"""credit_core: framework-agnostic token-level credit assignment for GRPO-style RL.

Public API::

    from credit_core import (
        CreditBatch, PolicyStats, policy_stats, policy_stats_from_logits,
        CreditSignals, assign_credit,
        unsigned_work, unsigned_work_from_logits, streamed_unsigned_work,
        streamed_work_and_logprobs, choose_work_path, token_entropy,
        streamed_logprobs_and_entropy,
        get_strategy, list_strategies, register_plugin, hookimpl,
        CreditConfig, group_advantages, CreditError,
        TokenRewards, parse_reward_outputs,
    )
"""

from credit_core.advantages import ESTIMATORS, group_advantages
from credit_core.allocation import CreditDiagnostics, allocate_weights
from credit_core.batch import DIRECTION_SIGNALS, SIGNALS, CreditBatch, PolicyStats
from credit_core.config import CreditConfig
from credit_core.credit_step import CreditSignals, assign_credit
from credit_core.errors import CreditError
from credit_core.factory import get_strategy
from credit_core.given_rewards import TokenRewards, parse_reward_outputs
from credit_core.hookspecs import ENTRY_POINT_GROUP, hookimpl
from credit_core.policy_stats import policy_stats, policy_stats_from_logits
from credit_core.registry import (
    list_strategies,
    plugin_of,
    register_plugin,
    strategy_class,
    unregister_plugin,
)
from credit_core.strategy import (
    CreditResult,
    CreditStrategy,
    NoParams,
    ScoreParams,
    ScoreStrategy,
)
from credit_core.streamed_work import (
    streamed_unsigned_work,
    streamed_unsigned_work_from_logits,
    streamed_work_and_logprobs,
)
from credit_core.token_entropy import streamed_logprobs_and_entropy, token_entropy
from credit_core.work import token_work
from credit_core.work_path import (
    TWO_MATMUL_MIN_EMBED_DIM,
    choose_work_path,
    unsigned_work,
    unsigned_work_from_logits,
)

__all__ = [
    "DIRECTION_SIGNALS",
    "ENTRY_POINT_GROUP",
    "ESTIMATORS",
    "SIGNALS",
    "TWO_MATMUL_MIN_EMBED_DIM",
    "CreditBatch",
    "CreditConfig",
    "CreditDiagnostics",
    "CreditError",
    "CreditResult",
    "CreditSignals",
    "CreditStrategy",
    "NoParams",
    "PolicyStats",
    "ScoreParams",
    "ScoreStrategy",
    "TokenRewards",
    "allocate_weights",
    "assign_credit",
    "choose_work_path",
    "get_strategy",
    "group_advantages",
    "hookimpl",
    "list_strategies",
    "parse_reward_outputs",
    "plugin_of",
    "policy_stats",
    "policy_stats_from_logits",
    "register_plugin",
    "strategy_class",
    "streamed_logprobs_and_entropy",
    "streamed_unsigned_work",
    "streamed_unsigned_work_from_logits",
    "streamed_work_and_logprobs",
    "token_entropy",
    "token_work",
    "unregister_plugin",
    "unsigned_work",
    "unsigned_work_from_logits",
]
