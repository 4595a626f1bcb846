"""adapters: Hugging Face policies and reward models -> the signals credit_core needs.

Public API::

    # policy side (adapters.policy, adapters.logprobs)
    response_logprobs_and_stats, response_logprobs_and_work, response_logprobs_and_entropy,
    token_logprobs,
    final_hidden_states, lm_head_of, position_ids_from_mask
    # reward side (adapters.direction, adapters.reward_models, adapters.scorers)
    RewardOutput, DirectionModel, EmbeddingDirectionModel, SeqClassificationRM,
    EncoderSimilarityRM, ModuleRM, TextScorer, Scorer, CallableScorer, ModelScorer,
    PRMScorer, RewardSignals, import_object
    # vocabulary bridge (adapters.vocab_bridge)
    VocabBridge
    # configuration (adapters.config) and the packaged MiniLM (adapters.minilm)
    RewardModelConfig, ScorerConfig, RewardSignalsConfig, build_direction_model,
    build_scorer, build_reward_signals, minilm_model_dir, load_minilm
    # tiny offline presets (adapters.tiny)
    tiny_causal_lm, tiny_seq_classifier, tiny_encoder, train_bpe_tokenizer, TINY_CORPUS, SIZES

Importing ``adapters`` does not import ``transformers``; the functions that need it
import it when called.
"""

from credit_core.layout import check_layout

check_layout()

from adapters.config import (
    RewardModelConfig,
    RewardSignalsConfig,
    ScorerConfig,
    build_direction_model,
    build_reward_signals,
    build_scorer,
)
from adapters.direction import DirectionModel, EmbeddingDirectionModel, RewardOutput
from adapters.logprobs import token_logprobs
from adapters.minilm import load_minilm, minilm_model_dir
from adapters.policy import (
    final_hidden_states,
    lm_head_of,
    position_ids_from_mask,
    response_logprobs_and_entropy,
    response_logprobs_and_stats,
    response_logprobs_and_work,
)
from adapters.reward_models import EncoderSimilarityRM, ModuleRM, SeqClassificationRM
from adapters.scorers import (
    CallableScorer,
    ModelScorer,
    PRMScorer,
    RewardSignals,
    Scorer,
    TextScorer,
    import_object,
)
from adapters.tiny import (
    SIZES,
    TINY_CORPUS,
    tiny_causal_lm,
    tiny_encoder,
    tiny_seq_classifier,
    train_bpe_tokenizer,
)
from adapters.vocab_bridge import VocabBridge

__all__ = [
    "SIZES",
    "TINY_CORPUS",
    "CallableScorer",
    "DirectionModel",
    "EmbeddingDirectionModel",
    "EncoderSimilarityRM",
    "ModelScorer",
    "ModuleRM",
    "PRMScorer",
    "RewardModelConfig",
    "RewardOutput",
    "RewardSignals",
    "RewardSignalsConfig",
    "Scorer",
    "ScorerConfig",
    "SeqClassificationRM",
    "TextScorer",
    "VocabBridge",
    "build_direction_model",
    "build_reward_signals",
    "build_scorer",
    "final_hidden_states",
    "import_object",
    "lm_head_of",
    "load_minilm",
    "minilm_model_dir",
    "position_ids_from_mask",
    "response_logprobs_and_entropy",
    "response_logprobs_and_stats",
    "response_logprobs_and_work",
    "tiny_causal_lm",
    "tiny_encoder",
    "tiny_seq_classifier",
    "token_logprobs",
    "train_bpe_tokenizer",
]
