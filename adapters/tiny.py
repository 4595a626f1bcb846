"""Tiny, offline models and tokenizers: the presets shared by tests, backends and ablations.

Nothing here downloads anything. Models are built from a config with random weights
(seeded); tokenizers are trained in-process.

- ``tiny_causal_lm(family, vocab_size, size="tiny", tie=True, seed=0, dtype=...)``: a
  ``transformers`` causal LM of family ``llama``, ``qwen2`` or ``gpt2``. ``SIZES`` names the
  shapes (``tiny``: hidden 64, 2 layers, 4 heads; ``small``: hidden 128, 4 layers, 4 heads);
  ``hidden``/``layers``/``heads`` override them. Dropout is 0 in every preset (RL fine-tuning
  runs the policy without dropout, so train and eval mode compute the same function).
- ``tiny_seq_classifier(family, vocab_size, ...)``: a one-label
  ``*ForSequenceClassification`` (``bert`` or ``llama``), a differentiable reward model.
- ``tiny_encoder(vocab_size, ...)``: a random ``BertModel`` (a sentence-encoder stand-in).
- ``train_bpe_tokenizer(texts, vocab_size)``: a byte-level BPE trained in-process, wrapped
  in ``PreTrainedTokenizerFast`` (with ``<|endoftext|>`` as eos/bos and ``<pad>`` as pad).
- ``TINY_CORPUS``: a few dozen short sentences (a little non-ASCII text on purpose, so a
  byte-level BPE has partial-byte tokens), enough to train a tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import torch

from credit_core import CreditError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

Family = Literal["llama", "qwen2", "gpt2"]
FAMILIES: tuple[str, ...] = get_args(Family)

#: Named shapes of the tiny presets: hidden size, layers, attention heads.
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4},
    "small": {"hidden": 128, "layers": 4, "heads": 4},
}

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<pad>"

TINY_CORPUS: tuple[str, ...] = (
    "The cat sat on the mat and looked at the moon.",
    "A quick brown fox jumps over the lazy dog.",
    "She is playing the piano while he is reading a book.",
    "Rewards are computed by a frozen model that scores each response.",
    "Good answers are helpful, honest and short.",
    "The weather today is sunny with a light breeze from the west.",
    "We trained a small policy with group relative policy optimization.",
    "Every token of a response gets the same advantage in plain GRPO.",
    "Direction-aware credit moves the advantage toward tokens that matter.",
    "I think this answer is wonderful, thank you very much!",
    "This response is terrible and unhelpful; please try again.",
    "Numbers like 3.14, 42 and 1000 appear in text, too.",
    "Café, naïve, résumé and jalapeño carry accents.",
    "Über große Straßen fahren schöne Autos.",
    "東京は日本の首都です。",
    "Emoji such as 🙂 and 🚀 take four bytes in UTF-8.",
    "The model said: 'hello, world' and then stopped.",
    "Playing, played, plays and player share a stem.",
    "It was the best of times, it was the worst of times.",
    "Language models predict the next token from the previous ones.",
    "A happy dog runs in the park with a red ball.",
    "The sad story ended with a quiet goodbye at the station.",
    "Please summarize the following paragraph in one sentence.",
    "It's a nice day, isn't it? Don't worry, we'll see what's next.",
    "Questions, answers and explanations make a good tutorial.",
)


def _size(size: str, hidden: int | None, layers: int | None, heads: int | None) -> dict[str, int]:
    if size not in SIZES:
        raise CreditError(f"size: expected one of {sorted(SIZES)}, got {size!r}")
    shape = dict(SIZES[size])
    for key, value in (("hidden", hidden), ("layers", layers), ("heads", heads)):
        if value is not None:
            shape[key] = value
    if shape["hidden"] % shape["heads"]:
        raise CreditError(
            f"hidden: expected a multiple of heads={shape['heads']}, got {shape['hidden']}"
        )
    return shape


def _build(auto_class: Any, config: Any, seed: int, dtype: torch.dtype) -> PreTrainedModel:
    """``auto_class.from_config(config)`` under ``seed``, cast to ``dtype``, in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto_class.from_config(config)
    return cast("PreTrainedModel", model.to(dtype).eval())


def tiny_causal_lm(
    family: str,
    vocab_size: int,
    *,
    size: str = "tiny",
    hidden: int | None = None,
    layers: int | None = None,
    heads: int | None = None,
    tie: bool = True,
    max_positions: int = 512,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    pad_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> PreTrainedModel:
    """A randomly initialized causal LM of ``family`` (``llama``, ``qwen2``, ``gpt2``).

    ``tie`` ties the LM head to the input embeddings. The model is returned in eval mode,
    cast to ``dtype``; the same arguments (and ``seed``) give the same weights.
    """
    from transformers import (
        AutoModelForCausalLM,
        GPT2Config,
        LlamaConfig,
        Qwen2Config,
    )

    shape = _size(size, hidden, layers, heads)
    h, n_layers, n_heads = shape["hidden"], shape["layers"], shape["heads"]
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "tie_word_embeddings": tie,
        "pad_token_id": pad_token_id,
        "eos_token_id": eos_token_id,
        "bos_token_id": eos_token_id,
    }
    config: Any
    if family == "llama":
        config = LlamaConfig(
            hidden_size=h,
            intermediate_size=2 * h,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=n_heads,
            max_position_embeddings=max_positions,
            **common,
        )
    elif family == "qwen2":
        config = Qwen2Config(
            hidden_size=h,
            intermediate_size=2 * h,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=max(1, n_heads // 2),
            max_position_embeddings=max_positions,
            **common,
        )
    elif family == "gpt2":
        config = GPT2Config(
            n_embd=h,
            n_layer=n_layers,
            n_head=n_heads,
            n_positions=max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    else:
        raise CreditError(f"family: expected one of {list(FAMILIES)}, got {family!r}")
    return _build(AutoModelForCausalLM, config, seed, dtype)


def _bert_config(vocab_size: int, hidden: int, layers: int, heads: int, **extra: Any) -> Any:
    """A BERT config of this width and depth, dropout off, 512 positions."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **extra,
    )


def tiny_seq_classifier(
    family: Literal["bert", "llama"],
    vocab_size: int,
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    pad_token_id: int = 0,
) -> PreTrainedModel:
    """A random one-label sequence classifier (a differentiable reward model), eval mode."""
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    config: Any
    single_label: dict[str, Any] = {"num_labels": 1}
    if family == "bert":
        config = _bert_config(
            vocab_size, hidden, layers, heads, pad_token_id=pad_token_id, **single_label
        )
    elif family == "llama":
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=512,
            pad_token_id=pad_token_id,
            **single_label,
        )
    else:
        raise CreditError(f"family: expected 'bert' or 'llama', got {family!r}")
    return _build(AutoModelForSequenceClassification, config, seed, dtype)


def tiny_encoder(
    vocab_size: int,
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> PreTrainedModel:
    """A random ``BertModel`` without dropout (a stand-in sentence encoder), eval mode."""
    from transformers import AutoModel

    return _build(AutoModel, _bert_config(vocab_size, hidden, layers, heads), seed, dtype)


def train_bpe_tokenizer(
    texts: Iterable[str] = TINY_CORPUS,
    vocab_size: int = 512,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 style, no prefix space) trained in-process on ``texts``.

    The 256 byte symbols are always in the vocabulary, so any text encodes; characters of
    several UTF-8 bytes that were not merged become partial-byte tokens. ``<|endoftext|>``
    (id 0) is bos/eos/unk, ``<pad>`` (id 1) is the pad token. Deterministic for given inputs.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(texts), trainer=trainer)
    fast: Any = PreTrainedTokenizerFast
    return cast(
        "PreTrainedTokenizerFast",
        fast(
            tokenizer_object=bpe,
            bos_token=EOS_TOKEN,
            eos_token=EOS_TOKEN,
            unk_token=EOS_TOKEN,
            pad_token=PAD_TOKEN,
        ),
    )
