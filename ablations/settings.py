"""The built-in settings: task data, pretrained policies and frozen reward models.

Each setting turns its parameters into ``SettingAssets`` for one model family: a pretrained
policy folder (``policy.path`` of the trainer), JSONL prompt files, and the trainer's
``reward`` section. Everything is built in-process, offline, and cached under the cache
folder (``cache.cached_dir``), keyed by everything that determines it; reruns reuse it.

1. ``target_tokens``: the target-token task (``word_tasks.target_task``) on a word-level
   vocabulary; the reward is a tiny BERT trained in-process on the exact score, and it both
   sets the advantage and supplies the direction. The exact score on held-out prompts is
   reported beside the RM's reward (``extra_eval``): the RM could be exploited, the rule not.
2. ``minilm_shared``: continue the first words of a standard-library docstring sentence;
   the reward is the cosine similarity of the response to ``target_text`` under the
   pretrained all-MiniLM-L6-v2 encoder; the policy uses MiniLM's own WordPiece vocabulary
   (the fast path: same vocabulary).
3. ``minilm_bridge``: the same, with a policy that has its own byte-level BPE tokenizer:
   the direction goes through the vocabulary bridge.
4. ``verifiable``: sorting four digits; an exact checker sets the advantage (1 for the
   exact answer, else 0) and is the held-out metric (exact-match accuracy); a tiny BERT
   trained in-process on the fraction of correct positions supplies only the direction.
5. ``positional_sparse``: 24-word responses of which 3 positions are scored by the frozen
   ``positional`` reward model (``sparse_tasks``); exact reward and direction.
6. ``keyword_sparse``: 24-word responses scored on a target word at 3 positions; reward and
   direction from a tiny BERT trained in-process on that score (a learned direction), the
   exact score reported beside it.
7. ``outcome_chain``: a 64-step Fibonacci-mod-10 scratchpad and a final answer (66 response
   words, ``chain_task``); the reward is the exact binary outcome, and the direction model is
   a tiny BERT trained in-process on that binary label only (no partial credit).
8. ``preference``: 24-word responses; the reward is a Bradley-Terry reward model trained
   in-process on noisy preference pairs labelled by a hidden two-span rule that does not
   add up over tokens (``preference_task``); the hidden rule is the held-out metric, so
   over-optimisation of the learned RM shows.
9. ``length_sweep``: one sparse task at any response length (``response_len``; 24, 96 and
   192 in configs/ablate/length.yaml): the exact reward is the product of the target-word
   counts of two spans of decisive positions, which does not decompose over prefixes
   (``length_task``); the direction model is a tiny BERT trained in-process on that rule.
   The title is formatted with the params (``{response_len}``), so named settings of this
   kind (``kind:`` in the config) read apart in the report.
10. ``real_lm``: SmolLM2-135M-Instruct (a GGUF file, ``real_lm``) on short sums asked
   through its chat template; the exact checker sets the advantage and is the held-out
   metric; the direction model is an outcome RM trained on the step-0 policy's own labelled
   samples; only the top ``trainable_blocks`` blocks and the head train, for every strategy
   (``SettingAssets.prepare_policy``). The family must be ``llama`` (SmolLM2's).

Settings 8, 9 and 10 also record the step-0 policy's sampling entropy and their direction
model's fit on its samples (``info["policy_samples"]``, ``policy_samples.sample_fit``);
setting 9 takes the fidelity knob ``rm_proxy`` and the peaked pretraining ``chain_noise``
(docs/design.md, "Direction-model fidelity and a peaked policy").

Settings 1, 4, 5 and 6 also give the exact per-token decomposition of their score
(``SettingAssets.token_rule``) for the credit probes; settings 7 and 8, whose scores are not
sums over tokens, give a per-token credit rule instead (the chain's step correctness, the
hidden rule with one token swapped), and so does setting 9 (its rule with one token
swapped); the MiniLM settings have none.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from ablations import (
    chain_task,
    length_task,
    preference_task,
    real_lm,
    sparse_tasks,
    word_tasks,
)
from ablations.cache import SpecModel
from ablations.corpus import docstring_sentences
from ablations.policy_samples import TextScorer, sample_fit
from ablations.pretrain import PretrainConfig, pretrain_policy
from ablations.rm_train import RMTrainConfig, train_preference_model, train_reward_model
from adapters.folder_cache import cached_dir
from adapters.gguf import gguf_folder

TRAIN_FILE, EVAL_FILE = "train.jsonl", "eval.jsonl"

#: A scorer for an extra held-out metric: (prompts, responses) -> scores.
ExtraScorer = Callable[[list[str], list[str]], list[float]]


@dataclass(frozen=True)
class SettingAssets:
    """What one run of a setting needs.

    - ``policy_dir``: the pretrained policy (HF folder with its tokenizer);
    - ``data``: the trainer's ``data`` section (JSONL files of the setting);
    - ``reward``: the trainer's ``reward`` section (``adapters.config.RewardSignalsConfig``);
    - ``train``: the setting's defaults for the trainer (e.g. ``rollout.max_new_tokens``),
      applied before the ablation config's own per-setting overrides;
    - ``extra_eval``: name -> exact scorer evaluated on held-out prompts after training;
    - ``info``: facts for the report (pretraining loss, reward-model fit, sizes).
    - ``token_rule``: the exact per-token decomposition of the setting's score (the
      probes' exact token credit), or None where the score has none (MiniLM similarity).
    - ``prepare_policy``: applied by the runner to the built policy model before training
      (e.g. freezing its lower stack), the same for every strategy; None: nothing.
    """

    policy_dir: Path
    data: dict[str, Any]
    reward: dict[str, Any]
    train: dict[str, Any] = field(default_factory=dict)
    extra_eval: dict[str, ExtraScorer] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    token_rule: sparse_tasks.TokenRule | None = None
    prepare_policy: Callable[[Any], None] | None = None


class _Params(SpecModel):
    """A setting's parameters; an optional knob at None stays out of its dump, so run
    fingerprints and cache keys made before the knob existed stay as they were."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetTokensParams(_Params):
    """Setting 1: task sizes, the pretrained skill level, pretraining and reward model."""

    num_train: int = Field(default=512, ge=1)
    num_held_out: int = Field(default=64, ge=1)
    num_pretrain: int = Field(default=4000, ge=1, description="pretraining sequences")
    target_rate: float = Field(
        default=0.25, ge=0.0, le=1.0, description="target-word rate of pretraining text"
    )
    seed: int = 0
    pretrain: PretrainConfig = PretrainConfig(steps=150)
    rm: RMTrainConfig = RMTrainConfig()


class VerifiableParams(_Params):
    """Setting 4: task sizes, pretraining and the direction reward model."""

    num_train: int = Field(default=512, ge=1)
    num_held_out: int = Field(default=64, ge=1)
    num_pretrain: int = Field(default=4000, ge=1)
    seed: int = 0
    pretrain: PretrainConfig = PretrainConfig(steps=150)
    rm: RMTrainConfig = RMTrainConfig()


class ChainParams(_Params):
    """Setting 7: held-out pairs, pretraining demos and their step-error rate, the RM."""

    num_held_out: int = Field(default=20, ge=1, le=99, description="of the 100 start pairs")
    num_pretrain: int = Field(default=4000, ge=1)
    error_rate: float = Field(
        default=0.015, ge=0.0, lt=1.0, description="step-error rate of the pretraining demos"
    )
    seed: int = 0
    pretrain: PretrainConfig = PretrainConfig(steps=800, max_len=80)
    rm: RMTrainConfig = RMTrainConfig()


class PreferenceParams(_Params):
    """Setting 8: task sizes, the pretrained rate of span words, the labeller's noise, the
    preference reward model (``rm.examples`` preference pairs)."""

    num_train: int = Field(default=512, ge=1)
    num_held_out: int = Field(default=64, ge=1)
    num_pretrain: int = Field(default=4000, ge=1)
    rate: float = Field(
        default=0.15, ge=0.0, le=0.5, description="rate of each span's words in pretraining"
    )
    temperature: float = Field(
        default=0.05, gt=0.0, description="labeller noise: P(a > b) = sigmoid(dh / temperature)"
    )
    seed: int = 0
    pretrain: PretrainConfig = PretrainConfig(steps=150)
    rm: RMTrainConfig = RMTrainConfig()


class PositionalSparseParams(_Params):
    """Setting 5: task sizes, scored positions, the positional RM, pretraining."""

    num_train: int = Field(default=512, ge=1)
    num_held_out: int = Field(default=64, ge=1)
    num_pretrain: int = Field(default=4000, ge=1)
    response_words: int = Field(default=sparse_tasks.SPARSE_WORDS, ge=2, le=28)
    positions: tuple[int, ...] = sparse_tasks.SCORED_POSITIONS
    embed_dim: int = Field(default=16, ge=1, description="positional RM embedding width")
    rm_seed: int = Field(default=0, description="seed of the positional RM's random weights")
    seed: int = 0
    pretrain: PretrainConfig = PretrainConfig(steps=150)


class KeywordSparseParams(_Params):
    """Setting 6: task sizes, scored positions, the target-word rate, pretraining, RM."""

    num_train: int = Field(default=512, ge=1)
    num_held_out: int = Field(default=64, ge=1)
    num_pretrain: int = Field(default=4000, ge=1)
    response_words: int = Field(default=sparse_tasks.SPARSE_WORDS, ge=2, le=28)
    positions: tuple[int, ...] = sparse_tasks.SCORED_POSITIONS
    target_rate: float = Field(default=0.25, ge=0.0, le=1.0)
    seed: int = 0
    pretrain: PretrainConfig = PretrainConfig(steps=150)
    rm: RMTrainConfig = RMTrainConfig()


class LengthSweepParams(_Params):
    """Setting 9: the response length, task sizes, the pretrained target-word rate,
    pretraining (``max_len`` must hold a prompt, the response and EOS) and the direction RM
    (its fidelity: ``rm_proxy``, the weight w of the additive proxy in its training score
    (``length_task.span_rm_examples``; held-out fit against the rule itself), and
    ``rm.examples``, ``rm.steps``, ``rm.label_noise``, ``rm.label_threshold``).
    ``chain_noise`` (None: off) pretrains on the successor-chain texts of
    ``length_task.chain_words``: the peaked regime."""

    response_len: int = Field(
        default=24, ge=length_task.MIN_LENGTH, le=448, description="response words"
    )
    num_train: int = Field(default=512, ge=1)
    num_held_out: int = Field(default=64, ge=1)
    num_pretrain: int = Field(default=4000, ge=1)
    target_rate: float = Field(default=0.25, ge=0.0, le=1.0)
    chain_noise: float | None = Field(
        default=None, gt=0.0, le=1.0, description="peaked pretraining texts: the chain's noise"
    )
    rm_proxy: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="weight of the additive proxy in the direction RM's training score",
    )
    seed: int = 0
    pretrain: PretrainConfig = PretrainConfig(steps=150, max_len=256)
    rm: RMTrainConfig = RMTrainConfig()

    @model_validator(mode="after")
    def _fits(self) -> LengthSweepParams:
        need = word_tasks.PROMPT_WORDS + 1 + self.response_len + 1
        if self.pretrain.max_len < need:
            raise ValueError(
                f"pretrain.max_len: {self.pretrain.max_len} cuts the pretraining texts short; "
                f"a prompt, {self.response_len} response words and EOS need {need}"
            )
        return self


class MiniLMParams(_Params):
    """Settings 2 and 3: the target description, prompts from the corpus, pretraining."""

    target_text: str = "Open the file, read its lines and write them to another file."
    prompt_words: int = Field(
        default=3, ge=1, description="words of a sentence given as the prompt"
    )
    held_out_fraction: float = Field(default=0.1, gt=0.0, lt=1.0)
    bpe_vocab_size: int = Field(default=1024, ge=300, description="minilm_bridge: policy BPE size")
    seed: int = 0
    pretrain: PretrainConfig = PretrainConfig(steps=80, batch_size=16, max_len=24, lr=5e-3)


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _texts_hash(texts: list[str]) -> str:
    return hashlib.blake2b("\n".join(texts).encode(), digest_size=8).hexdigest()


def _policy(
    cache: Path,
    setting: str,
    family: str,
    tokenizer_spec: dict[str, Any],
    make_tokenizer: Callable[[], Any],
    texts: list[str],
    cfg: PretrainConfig,
) -> tuple[Path, dict[str, Any]]:
    spec = {
        "format": 2,  # tokenizer in a subfolder
        "setting": setting,
        "family": family,
        "tokenizer": tokenizer_spec,
        "texts": _texts_hash(texts),
        "n_texts": len(texts),
        "pretrain": cfg.model_dump(),
    }

    def build(folder: Path) -> None:
        losses = pretrain_policy(
            folder, family=family, tokenizer=make_tokenizer(), texts=texts, cfg=cfg
        )
        tail = losses[-max(1, len(losses) // 10) :] if losses else [float("nan")]
        (folder / "pretrain.json").write_text(
            json.dumps(
                {
                    "first_loss": losses[0] if losses else None,
                    "final_loss": sum(tail) / len(tail),
                    "steps": len(losses),
                }
            )
        )

    folder = cached_dir(cache, "policy", spec, build)
    return folder, json.loads((folder / "pretrain.json").read_text())


def _data_dir(cache: Path, setting: str, params: dict[str, Any], data: word_tasks.TaskData) -> Path:
    def build(folder: Path) -> None:
        _write_jsonl(folder / TRAIN_FILE, data.train)
        _write_jsonl(folder / EVAL_FILE, data.held_out)

    return cached_dir(cache, "data", {"setting": setting, **params}, build)


def _data_section(folder: Path) -> dict[str, Any]:
    return {"train_file": str(folder / TRAIN_FILE), "eval_file": str(folder / EVAL_FILE)}


def _rm(
    cache: Path,
    setting: str,
    words: list[str],
    spec: dict[str, Any],
    cfg: RMTrainConfig,
    examples: Callable[[int, int], list[tuple[str, str, float]]],
    test_examples: Callable[[int, int], list[tuple[str, str, float]]] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """The cached RM trained on ``examples(n, seed)`` and tested on ``test_examples``
    (default: ``examples``; given where the training score is not the task's own)."""
    held_out = test_examples or examples

    def train(folder: Path) -> dict[str, float]:
        return train_reward_model(
            folder,
            rm_tokenizer=word_tasks.word_tokenizer(words, pair_template=True),
            train_examples=examples(cfg.examples, cfg.seed + 1),
            test_examples=held_out(max(64, cfg.examples // 8), cfg.seed + 2),
            cfg=cfg,
        )

    return _cached_rm(cache, {"setting": setting, **spec, "rm": cfg.model_dump()}, train)


def _cached_rm(
    cache: Path, spec: dict[str, Any], train: Callable[[Path], dict[str, float]]
) -> tuple[Path, dict[str, Any]]:
    """The reward-model folder of ``spec`` (``train(folder)`` saves the model there and
    returns its fit, kept as ``fit.json``) and that fit."""

    def build(folder: Path) -> None:
        (folder / "fit.json").write_text(json.dumps(train(folder)))

    folder = cached_dir(cache, "rm", spec, build)
    return folder, json.loads((folder / "fit.json").read_text())


#: Samples per held-out prompt of the step-0 policy-sample fit (the configs' group size).
FIT_SAMPLES_PER_PROMPT = 8


def _sample_fit(
    cache: Path,
    policy_dir: Path,
    rm_dir: Path,
    reward: dict[str, Any],
    truth: TextScorer,
    prompts: list[str],
    max_new_tokens: int,
    seed: int,
) -> dict[str, float]:
    """The step-0 policy's sampling entropy and the direction RM's fit on its samples
    (``policy_samples.sample_fit`` on the held-out ``prompts``), cached per (policy, RM)."""
    spec = {
        "policy": policy_dir.name,
        "rm": rm_dir.name,
        "prompts": _texts_hash(prompts),
        "samples_per_prompt": FIT_SAMPLES_PER_PROMPT,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
    }

    def build(folder: Path) -> None:
        fit = sample_fit(
            policy_dir,
            reward,
            truth,
            prompts,
            samples_per_prompt=FIT_SAMPLES_PER_PROMPT,
            max_new_tokens=max_new_tokens,
            seed=seed,
        )
        (folder / "fit.json").write_text(json.dumps(fit.to_dict()))

    folder = cached_dir(cache, "sample_fit", spec, build)
    loaded: dict[str, float] = json.loads((folder / "fit.json").read_text())
    return loaded


@dataclass(frozen=True)
class _WordTaskAssets:
    rm_dir: Path
    policy_dir: Path
    data: dict[str, Any]
    info: dict[str, Any]


def _word_task(
    setting: str,
    p: TargetTokensParams
    | VerifiableParams
    | KeywordSparseParams
    | ChainParams
    | LengthSweepParams,
    family: str,
    cache: Path,
    data: word_tasks.TaskData,
    words: list[str],
    rm_examples: Callable[[list[str], int, int], list[tuple[str, str, float]]],
    rm_test_examples: Callable[[list[str], int, int], list[tuple[str, str, float]]] | None = None,
) -> _WordTaskAssets:
    """The cached reward model, pretrained policy and data of a task over a word vocabulary
    (``rm_examples(train_prompts, n, seed)`` makes the RM's training examples,
    ``rm_test_examples`` its held-out ones: default the same)."""
    task_spec = p.model_dump(exclude={"pretrain", "rm"})
    train_prompts = [r["prompt"] for r in data.train]
    held_out = rm_test_examples or rm_examples
    rm_dir, fit = _rm(
        cache,
        setting,
        words,
        p.model_dump(exclude={"pretrain", "rm", "chain_noise"}),  # the RM's data ignores it
        p.rm,
        lambda n, seed: rm_examples(train_prompts, n, seed),
        lambda n, seed: held_out(train_prompts, n, seed),
    )
    policy_dir, pre = _policy(
        cache,
        setting,
        family,
        {"words": words},
        lambda: word_tasks.word_tokenizer(words),
        data.pretrain_texts,
        p.pretrain,
    )
    return _WordTaskAssets(
        rm_dir=rm_dir,
        policy_dir=policy_dir,
        data=_data_section(_data_dir(cache, setting, task_spec, data)),
        info={"pretrain": pre, "rm_fit": fit, "vocab_size": len(words) + len(word_tasks.SPECIALS)},
    )


def build_target_tokens(p: TargetTokensParams, family: str, cache: Path) -> SettingAssets:
    data = word_tasks.target_task(
        num_train=p.num_train,
        num_held_out=p.num_held_out,
        num_pretrain=p.num_pretrain,
        target_rate=p.target_rate,
        seed=p.seed,
    )
    a = _word_task(
        "target_tokens",
        p,
        family,
        cache,
        data,
        word_tasks.target_words(),
        word_tasks.target_rm_examples,
    )
    return SettingAssets(
        policy_dir=a.policy_dir,
        data=a.data,
        reward={"direction_model": {"kind": "seq_classification", "path": str(a.rm_dir)}},
        train={"rollout": {"max_new_tokens": word_tasks.RESPONSE_WORDS}},
        extra_eval={"task_score": word_tasks.target_scorer},
        info=a.info,
        token_rule=sparse_tasks.target_rule(),
    )


def build_verifiable(p: VerifiableParams, family: str, cache: Path) -> SettingAssets:
    data = word_tasks.sort_task(
        num_train=p.num_train,
        num_held_out=p.num_held_out,
        num_pretrain=p.num_pretrain,
        seed=p.seed,
    )
    a = _word_task(
        "verifiable", p, family, cache, data, word_tasks.sort_words(), word_tasks.sort_rm_examples
    )
    return SettingAssets(
        policy_dir=a.policy_dir,
        data=a.data,
        reward={
            "direction_model": {"kind": "seq_classification", "path": str(a.rm_dir)},
            "reward": {"kind": "callable", "function": "ablations.word_tasks:sort_checker"},
        },
        train={"rollout": {"max_new_tokens": word_tasks.SORT_DIGITS + 1}},
        info=a.info,
        token_rule=sparse_tasks.SortTokenRule(sparse_tasks.word_ids(word_tasks.sort_words())),
    )


def build_outcome_chain(p: ChainParams, family: str, cache: Path) -> SettingAssets:
    data = chain_task.chain_task(
        num_held_out=p.num_held_out,
        num_pretrain=p.num_pretrain,
        error_rate=p.error_rate,
        seed=p.seed,
    )
    words = chain_task.chain_words()
    a = _word_task("outcome_chain", p, family, cache, data, words, chain_task.chain_rm_examples)
    return SettingAssets(
        policy_dir=a.policy_dir,
        data=a.data,
        reward={
            "direction_model": {"kind": "seq_classification", "path": str(a.rm_dir)},
            "reward": {"kind": "callable", "function": "ablations.chain_task:chain_checker"},
        },
        train={
            "rollout": {"max_new_tokens": chain_task.CHAIN_STEPS + 3},
            # the final answer follows the first "=": the span OAR-G reads (data.answer_span)
            "data": {"answer_span": {"after": "="}},
        },
        info={**a.info, "chain steps": chain_task.CHAIN_STEPS},
        token_rule=chain_task.ChainStepRule(sparse_tasks.word_ids(words)),
    )


def _preference_rm(
    cache: Path, p: PreferenceParams, words: list[str], train_prompts: list[str]
) -> tuple[Path, dict[str, Any]]:
    def pairs(n: int, seed: int) -> list[preference_task.PreferencePair]:
        return preference_task.preference_pairs(train_prompts, n, seed, p.temperature)

    def train(folder: Path) -> dict[str, float]:
        test = pairs(max(64, p.rm.examples // 8), p.rm.seed + 2)
        fit, scores = train_preference_model(
            folder,
            rm_tokenizer=word_tasks.word_tokenizer(words, pair_template=True),
            train_pairs=[
                (q.prompt, q.chosen, q.rejected) for q in pairs(p.rm.examples, p.rm.seed + 1)
            ],
            test_pairs=[(q.prompt, q.chosen, q.rejected) for q in test],
            cfg=p.rm,
        )
        return {**fit, "test_rule_accuracy": preference_task.rule_agreement(test, scores)}

    # what the RM depends on: the training prompts (sizes, seed), the labeller, its training
    spec = {
        "setting": "preference",
        **p.model_dump(include={"num_train", "num_held_out", "seed", "temperature", "rm"}),
    }
    return _cached_rm(cache, spec, train)


def build_preference(p: PreferenceParams, family: str, cache: Path) -> SettingAssets:
    data = preference_task.preference_task(
        num_train=p.num_train,
        num_held_out=p.num_held_out,
        num_pretrain=p.num_pretrain,
        rate=p.rate,
        seed=p.seed,
    )
    words = word_tasks.target_words()
    rm_dir, fit = _preference_rm(cache, p, words, [r["prompt"] for r in data.train])
    policy_dir, pre = _policy(
        cache,
        "preference",
        family,
        {"words": words},
        lambda: word_tasks.word_tokenizer(words),
        data.pretrain_texts,
        p.pretrain,
    )
    task_spec = p.model_dump(exclude={"pretrain", "rm", "temperature"})
    reward = {"direction_model": {"kind": "seq_classification", "path": str(rm_dir)}}
    samples = _sample_fit(
        cache,
        policy_dir,
        rm_dir,
        reward,
        preference_task.hidden_scorer,
        [r["prompt"] for r in data.held_out],
        preference_task.RESPONSE_WORDS,
        p.pretrain.seed,
    )
    return SettingAssets(
        policy_dir=policy_dir,
        data=_data_section(_data_dir(cache, "preference", task_spec, data)),
        reward=reward,
        train={"rollout": {"max_new_tokens": preference_task.RESPONSE_WORDS}},
        extra_eval={"hidden_score": preference_task.hidden_scorer},
        info={
            "pretrain": pre,
            "preference_fit": fit,
            "policy_samples": samples,
            "vocab_size": len(words) + len(word_tasks.SPECIALS),
        },
        token_rule=preference_task.PreferenceSwapRule(sparse_tasks.word_ids(words)),
    )


def build_positional_sparse(p: PositionalSparseParams, family: str, cache: Path) -> SettingAssets:
    data = sparse_tasks.sparse_task(
        num_train=p.num_train,
        num_held_out=p.num_held_out,
        num_pretrain=p.num_pretrain,
        target_rate=0.0,
        seed=p.seed,
        response_words=p.response_words,
    )
    words = word_tasks.target_words()
    task_spec = p.model_dump(exclude={"pretrain", "embed_dim", "rm_seed", "positions"})
    policy_dir, pre = _policy(
        cache,
        "positional_sparse",
        family,
        {"words": words},
        lambda: word_tasks.word_tokenizer(words),
        data.pretrain_texts,
        p.pretrain,
    )
    vocab = len(word_tasks.SPECIALS) + len(words)
    rm_kwargs = {
        "vocab_size": vocab,
        "positions": list(p.positions),
        "embed_dim": p.embed_dim,
        "seed": p.rm_seed,
    }
    rm, _ = sparse_tasks.positional_reward_model(**rm_kwargs)  # type: ignore[arg-type]
    return SettingAssets(
        policy_dir=policy_dir,
        data=_data_section(_data_dir(cache, "positional_sparse", task_spec, data)),
        reward={
            "direction_model": {
                "kind": "module",
                "factory": "ablations.sparse_tasks:positional_reward_model",
                "factory_kwargs": rm_kwargs,
                "include_prompt": False,
            }
        },
        train={"rollout": {"max_new_tokens": p.response_words}},
        info={"pretrain": pre, "vocab_size": vocab, "scored positions": list(p.positions)},
        token_rule=sparse_tasks.positional_rule(rm),
    )


def build_keyword_sparse(p: KeywordSparseParams, family: str, cache: Path) -> SettingAssets:
    data = sparse_tasks.sparse_task(
        num_train=p.num_train,
        num_held_out=p.num_held_out,
        num_pretrain=p.num_pretrain,
        target_rate=p.target_rate,
        seed=p.seed,
        response_words=p.response_words,
    )

    def examples(prompts: list[str], n: int, seed: int) -> list[tuple[str, str, float]]:
        return sparse_tasks.keyword_rm_examples(prompts, n, seed, p.positions, p.response_words)

    a = _word_task("keyword_sparse", p, family, cache, data, word_tasks.target_words(), examples)

    def scorer(prompts: list[str], responses: list[str]) -> list[float]:
        return [sparse_tasks.keyword_score(r, p.positions) for r in responses]

    return SettingAssets(
        policy_dir=a.policy_dir,
        data=a.data,
        reward={"direction_model": {"kind": "seq_classification", "path": str(a.rm_dir)}},
        train={"rollout": {"max_new_tokens": p.response_words}},
        extra_eval={"task_score": scorer},
        info={**a.info, "scored positions": list(p.positions)},
        token_rule=sparse_tasks.keyword_rule(p.positions),
    )


def build_length_sweep(p: LengthSweepParams, family: str, cache: Path) -> SettingAssets:
    data = length_task.length_task(
        num_train=p.num_train,
        num_held_out=p.num_held_out,
        num_pretrain=p.num_pretrain,
        target_rate=p.target_rate,
        response_len=p.response_len,
        seed=p.seed,
        chain_noise=p.chain_noise,
    )

    def examples(prompts: list[str], n: int, seed: int) -> list[tuple[str, str, float]]:
        return length_task.span_rm_examples(prompts, n, seed, p.response_len, p.rm_proxy or 0.0)

    def clean(prompts: list[str], n: int, seed: int) -> list[tuple[str, str, float]]:
        return length_task.span_rm_examples(prompts, n, seed, p.response_len)

    def truth(prompts: list[str], responses: list[str]) -> list[float]:
        return length_task.span_checker(prompts, responses, p.response_len)

    words = word_tasks.target_words()
    a = _word_task("length_sweep", p, family, cache, data, words, examples, clean)
    reward = {
        "direction_model": {"kind": "seq_classification", "path": str(a.rm_dir)},
        "reward": {
            "kind": "callable",
            "function": "ablations.length_task:span_checker",
            "kwargs": {"response_len": p.response_len},
        },
    }
    samples = _sample_fit(
        cache,
        a.policy_dir,
        a.rm_dir,
        reward,
        truth,
        [r["prompt"] for r in data.held_out],
        p.response_len,
        p.pretrain.seed,
    )
    return SettingAssets(
        policy_dir=a.policy_dir,
        data=a.data,
        reward=reward,
        train={"rollout": {"max_new_tokens": p.response_len}},
        info={
            **a.info,
            "decisive positions": list(length_task.decisive_positions(p.response_len)),
            "policy_samples": samples,
        },
        token_rule=length_task.SpanSwapRule(sparse_tasks.word_ids(words), p.response_len),
    )


def build_real_lm(p: real_lm.RealLMParams, family: str, cache: Path) -> SettingAssets:
    if family != "llama":
        raise ValueError(
            f"families: setting kind 'real_lm' trains SmolLM2, a llama model; got family "
            f"{family!r} (set families: [llama])"
        )
    policy_dir = gguf_folder(p.gguf)
    train, held = real_lm.task_prompts(p)
    rm_dir, fit = real_lm.cached_outcome_rm(
        cache, policy_dir, [r["prompt"] for r in train], p.response_len, p.rm
    )
    reward = {
        "direction_model": {
            "kind": "module",
            "factory": "ablations.real_lm:outcome_rm",
            "factory_kwargs": {"path": str(rm_dir)},
            "include_prompt": True,
        },
        "reward": {"kind": "callable", "function": "backends.common.arithmetic:exact_answer"},
    }
    held_prompts = [r["prompt"] for r in held]
    fit_seed = p.rm.seed + 101  # fresh samples: not the RM's training draws
    fit_spec = {
        "real_lm": 1,
        "policy": policy_dir.name,
        "rm": rm_dir.name,
        "prompts": _texts_hash(held_prompts),
        "samples_per_prompt": p.fit_samples_per_prompt,
        "max_new_tokens": p.response_len,
        "seed": fit_seed,
    }

    def build_fit(folder: Path) -> None:
        fresh = sample_fit(
            policy_dir,
            reward,
            real_lm.truth,
            held_prompts,
            samples_per_prompt=p.fit_samples_per_prompt,
            max_new_tokens=p.response_len,
            seed=fit_seed,
            chat_template=True,
        )
        (folder / "fit.json").write_text(json.dumps(fresh.to_dict()))

    samples = json.loads(
        (cached_dir(cache, "sample_fit", fit_spec, build_fit) / "fit.json").read_text()
    )
    data_dir = _data_dir(
        cache, "real_lm", {"task": p.task.model_dump()}, word_tasks.TaskData(train, held, [])
    )
    return SettingAssets(
        policy_dir=policy_dir,
        data={**_data_section(data_dir), "chat_template": True},
        reward=reward,
        train={"rollout": {"max_new_tokens": p.response_len}},
        info={
            "rm_fit": fit,
            "policy_samples": samples,
            "trainable_blocks": p.trainable_blocks,
            "gguf": p.gguf,
        },
        prepare_policy=real_lm.FreezeLowerStack(p.trainable_blocks),
    )


def minilm_policy_tokenizer() -> Any:
    """MiniLM's WordPiece tokenizer without its ``[CLS] ... [SEP]`` template (a policy must
    not see an end-of-sequence token after its prompt); ``[SEP]`` is the policy's EOS."""
    from tokenizers import processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from adapters.minilm import minilm_model_dir

    rm_tok = AutoTokenizer.from_pretrained(minilm_model_dir(), local_files_only=True)
    backend = rm_tok.backend_tokenizer
    backend.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1")
    fast: Any = PreTrainedTokenizerFast
    return fast(
        tokenizer_object=backend,
        eos_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=512,
    )


def _minilm_data(p: MiniLMParams) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    sentences = list(docstring_sentences())
    order = sorted(
        range(len(sentences)),
        key=lambda i: hashlib.blake2b(f"{p.seed}:{sentences[i]}".encode()).hexdigest(),
    )
    n_held = max(1, int(len(sentences) * p.held_out_fraction))
    held = [sentences[i] for i in order[:n_held]]
    train = [sentences[i] for i in order[n_held:]]

    def prompts(sents: list[str], exclude: set[str]) -> list[str]:
        out = {" ".join(s.split()[: p.prompt_words]) for s in sents}
        return sorted(out - exclude)

    train_prompts = prompts(train, set())
    held_prompts = prompts(held, set(train_prompts))
    return ([{"prompt": t} for t in train_prompts], [{"prompt": t} for t in held_prompts], train)


def _build_minilm(p: MiniLMParams, family: str, cache: Path, *, bridged: bool) -> SettingAssets:
    name = "minilm_bridge" if bridged else "minilm_shared"
    train, held, texts = _minilm_data(p)
    data_spec = p.model_dump(include={"prompt_words", "held_out_fraction", "seed"})
    data_spec["texts"] = _texts_hash(texts)
    make_tok: Callable[[], Any]
    if bridged:
        from adapters.tiny import train_bpe_tokenizer

        def make_tok() -> Any:
            return train_bpe_tokenizer(texts, vocab_size=p.bpe_vocab_size)

        tok_spec: dict[str, Any] = {"bpe": p.bpe_vocab_size, "texts": _texts_hash(texts)}
    else:
        make_tok = minilm_policy_tokenizer
        tok_spec = {"minilm_wordpiece": True}
    policy_dir, pre = _policy(cache, name, family, tok_spec, make_tok, texts, p.pretrain)
    data = word_tasks.TaskData(train, held, [])
    return SettingAssets(
        policy_dir=policy_dir,
        data=_data_section(_data_dir(cache, "minilm", data_spec, data)),
        reward={"direction_model": {"kind": "encoder_similarity", "target_text": p.target_text}},
        train={"rollout": {"max_new_tokens": 12}},
        info={"pretrain": pre, "target_text": p.target_text, "corpus_sentences": len(texts)},
    )


def build_minilm_shared(p: MiniLMParams, family: str, cache: Path) -> SettingAssets:
    return _build_minilm(p, family, cache, bridged=False)


def build_minilm_bridge(p: MiniLMParams, family: str, cache: Path) -> SettingAssets:
    return _build_minilm(p, family, cache, bridged=True)


#: The held-out metrics every setting records (results.csv columns): the trainer's reward
#: of sampled responses and, with ``train.eval.greedy``, of greedy ones.
REWARD_METRICS = {
    "eval_reward_sampled": "reward (sampled)",
    "eval_reward_greedy": "reward (greedy)",
}


@dataclass(frozen=True)
class SettingKind:
    """A built-in setting: its parameter model, builder, default primary held-out metric
    (``primary``, described by ``metric``), title, and the names of its exact held-out
    scorers (``extra``: the keys of its assets' ``extra_eval``)."""

    params: type[SpecModel]
    build: Callable[[Any, str, Path], SettingAssets]
    primary: str
    title: str
    metric: str
    extra: tuple[str, ...] = ()

    def metrics(self) -> dict[str, str]:
        """The held-out metrics the setting records: results.csv column -> what it
        measures (the trainer's rewards, and ``extra_<name>_{sampled,greedy}`` of every
        exact scorer)."""
        out = dict(REWARD_METRICS)
        for name in self.extra:
            out[f"extra_{name}_sampled"] = f"{name.replace('_', ' ')} (sampled)"
            out[f"extra_{name}_greedy"] = f"{name.replace('_', ' ')} (greedy)"
        out[self.primary] = self.metric
        return out


#: The spacing of the model seeds of ``seeded`` (larger than any offset a build adds to
#: its seed, so that two run seeds never share a random stream).
MODEL_SEED_STRIDE = 1000


def seeded(params: Any, seed: int) -> Any:
    """``params`` with the run's ``seed`` also setting the policy pretraining and the
    reward-model training: ``pretrain.seed`` and ``rm.seed`` (where the setting has them)
    become their configured value + ``MODEL_SEED_STRIDE * seed`` (seed 0: the configured
    models). The task data, the frozen positional RM and MiniLM are not seeded by it."""
    update = {
        key: getattr(params, key).model_copy(
            update={"seed": getattr(params, key).seed + MODEL_SEED_STRIDE * seed}
        )
        for key in ("pretrain", "rm")
        if hasattr(params, key)
    }
    return params.model_copy(update=update)


#: The built-in settings, in report order. ``primary`` names the held-out metric that the
#: verdict is about (a column of results.csv), ``metric`` what it measures.
SETTINGS: dict[str, SettingKind] = {
    "target_tokens": SettingKind(
        TargetTokensParams,
        build_target_tokens,
        "extra_task_score_sampled",
        "1. target tokens, in-process RM",
        "task score (exact rule)",
        ("task_score",),
    ),
    "minilm_shared": SettingKind(
        MiniLMParams,
        build_minilm_shared,
        "eval_reward_sampled",
        "2. MiniLM similarity, shared tokenizer",
        "cosine similarity",
    ),
    "minilm_bridge": SettingKind(
        MiniLMParams,
        build_minilm_bridge,
        "eval_reward_sampled",
        "3. MiniLM similarity, own tokenizer (vocabulary bridge)",
        "cosine similarity",
    ),
    "verifiable": SettingKind(
        VerifiableParams,
        build_verifiable,
        "eval_reward_sampled",
        "4. sorting, exact checker + direction RM",
        "exact-match accuracy",
    ),
    "positional_sparse": SettingKind(
        PositionalSparseParams,
        build_positional_sparse,
        "eval_reward_sampled",
        "5. sparse: 3 of 24 positions scored by an exact positional RM",
        "positional reward (exact)",
    ),
    "keyword_sparse": SettingKind(
        KeywordSparseParams,
        build_keyword_sparse,
        "extra_task_score_sampled",
        "6. sparse: target words at 3 of 24 positions, in-process RM",
        "keyword score (exact rule)",
        ("task_score",),
    ),
    "outcome_chain": SettingKind(
        ChainParams,
        build_outcome_chain,
        "eval_reward_sampled",
        "7. outcome reward, 66-token scratchpad: binary checker + binary-label direction RM",
        "exact-answer accuracy",
    ),
    "preference": SettingKind(
        PreferenceParams,
        build_preference,
        "extra_hidden_score_sampled",
        "8. learned preference RM (Bradley-Terry, noisy labels of a hidden two-span rule)",
        "hidden-rule score",
        ("hidden_score",),
    ),
    "length_sweep": SettingKind(
        LengthSweepParams,
        build_length_sweep,
        "eval_reward_sampled",
        "9. length sweep, {response_len} words: product of two span counts at 4 decisive positions",
        "span product (exact rule)",
    ),
    "real_lm": SettingKind(
        real_lm.RealLMParams,
        build_real_lm,
        "eval_reward_sampled",
        "10. SmolLM2-135M-Instruct, sums through its chat template: exact checker + outcome RM "
        "on its own samples",
        "exact-answer accuracy",
    ),
}
