"""``CreditGRPOTrainer``: TRL's ``GRPOTrainer`` with token advantages from ``credit_core``.

TRL computes the response advantages A (B,) in ``_generate_and_score_completions`` and its
loss multiplies the importance ratio by ``inputs["advantages"]``, accepting a (B, T) tensor.
This subclass replaces A by the token advantages of ``credit_core.assign_credit`` (0 at
padding, row mean A over the valid tokens), computing only the signals the strategy reads.
The reward gradient is always known before the policy statistics are reduced, so a
strategy with ``work_requires`` (the DATC family) gets DATC's unsigned work W0 streamed in
two matmuls per vocabulary tile instead of ``PolicyStats`` (``signals_to_compute``):

- ``reward_grad`` (B, T, d): the direction model's input-embedding gradient, taken at
  generation time with grad enabled (TRL's reward functions return scalars and run model
  rewards under ``torch.inference_mode()``).
- ``policy_stats`` or ``unsigned_work``: from the final hidden states of a policy forward
  TRL already takes, at the parameters that sampled the batch, with no extra forward:

  * where TRL takes an old-log-prob forward (``num_iterations > 1``, gradient accumulation
    across generations, vLLM importance correction), from that forward's hidden states,
    reduced at generation time once the reward gradient is known;
  * otherwise (the default on-policy setup) from the loss forward of each micro-batch, whose
    parameters are still those that sampled it: the statistics are taken without grad
    from its detached hidden states, and the token advantages are formed before TRL's loss
    reads them (``_get_per_token_logps_and_entropies`` runs before that read).

Strategies that need no policy statistics (``uniform``, ``saliency``) get their token
advantages at generation time. The credit diagnostics go to TRL's metrics as ``credit/...``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

import torch
from transformers import PreTrainedModel
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.trainer.grpo_trainer import GRPOTrainer

from adapters.config import build_direction_model
from adapters.direction import DirectionModel
from adapters.grad_path import path_direction
from adapters.reward_models import SeqClassificationRM
from backends.trl.capture import HiddenCapture, lm_head
from backends.trl.config import CreditGRPOConfig
from backends.trl.credit_samples import REWARDS_KEY, TrlSampleRecorder, compared_strategies
from backends.trl.version import check_trl_version
from credit_core import (
    CreditDiagnostics,
    CreditError,
    CreditSignals,
    CreditStrategy,
    assign_credit,
    get_strategy,
    policy_stats,
    unsigned_work,
)

#: Key of the inputs dict that carries the reward gradient (B, T, d) from generation to the
#: loss step (TRL shuffles and splits every tensor of that dict along dim 0).
REWARD_GRAD_KEY = "credit_reward_grad"

#: File of a checkpoint folder that holds the strategy's mutable state (when it has one).
STRATEGY_STATE_FILE = "credit_strategy.pt"

#: Where the token advantages are formed: at generation time, or in each loss step.
CreditPhase = Literal["generation", "loss"]

#: Takes the detached final hidden states (B, T, H) of a policy forward at the positions
#: that predict the completion tokens, and those tokens (B, T).
HiddenConsumer = Callable[[torch.Tensor, torch.Tensor], None]


class CreditGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose loss gets (B, T) token advantages from ``args.credit``.

    Takes ``GRPOTrainer``'s arguments, ``args`` a ``CreditGRPOConfig``, plus
    ``direction_model`` (an ``adapters.direction.DirectionModel`` in the policy's vocabulary).
    When the strategy reads a signal and none is given, it is built from ``args.direction``,
    else from the first reward model among ``reward_funcs`` (so ``credit: datc`` alone is
    enough for a TRL run with a reward model).
    ``credit_phase`` says where the token advantages are formed (see the module docstring).
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: CreditGRPOConfig | None = None,
        *trainer_args: Any,
        direction_model: DirectionModel | None = None,
        **trainer_kwargs: Any,
    ) -> None:
        check_trl_version()
        if not isinstance(args, CreditGRPOConfig):
            raise TypeError(
                f"args: expected a backends.trl.CreditGRPOConfig, got {type(args).__name__}"
            )
        super().__init__(model, reward_funcs, args, *trainer_args, **trainer_kwargs)
        self.credit_args: CreditGRPOConfig = args
        self.policy: torch.nn.Module = self.model  # type: ignore[assignment]
        self.strategy: CreditStrategy = get_strategy(args.credit_config)
        # the reward gradient is taken at generation time, before any statistics are reduced
        self.reads = type(self.strategy).signals_to_compute(reward_grad_first=True)
        self.needs_reward_grad = bool(self.reads & {"reward_grad", "unsigned_work"})
        self.needs_policy_stats = bool(self.reads & {"policy_stats", "unsigned_work"})
        self.direction: DirectionModel | None = None
        if self.needs_reward_grad or self.needs_policy_stats:
            self.direction = direction_model or self._build_direction(args)
        if self.strategy.reward_grad_points:  # datc_mid, datc_ig: m1 at TRL's temperature
            points = self.strategy.reward_grad_points
            self.direction = path_direction(self.direction, self.policy, points, self.temperature)
        self.credit_phase: CreditPhase = (
            "loss" if self.needs_policy_stats and not self.takes_old_logp_forward else "generation"
        )
        self._capture = HiddenCapture(self.policy) if self.needs_policy_stats else None
        self._on_hidden: HiddenConsumer | None = None
        self._old_hidden: tuple[torch.Tensor, torch.Tensor] | None = None
        self.samples = self._build_recorder(args)
        self._local_rewards: torch.Tensor | None = None

    # ------------------------------------------------------------------------------ setup

    @property
    def takes_old_logp_forward(self) -> bool:
        """Whether TRL runs an old-policy log-prob forward at generation time (its own rule in
        ``_generate_and_score_completions``): the loss forward's parameters then differ from
        the sampling ones, or vLLM sampled the batch."""
        steps = self.credit_args.steps_per_generation
        assert steps is not None  # GRPOConfig.__post_init__ sets it
        generate_every = steps * self.num_iterations
        return bool(
            self.args.gradient_accumulation_steps % generate_every != 0
            or (self.use_vllm and self.vllm_importance_sampling_correction)
        )

    def _build_recorder(self, args: CreditGRPOConfig) -> TrlSampleRecorder | None:
        """The credit-samples recorder of ``args`` (None when ``credit_samples_steps`` is 0)."""
        interval = args.credit_samples_steps
        if interval is None:
            interval = int(args.logging_steps)
        if interval == 0:
            return None
        own = args.credit_config.label
        compare = compared_strategies(self.strategy, own, args.credit_samples_configs)
        return TrlSampleRecorder(
            interval=interval,
            count=args.credit_samples_count,
            own=own,
            compare=compare,
            tokenizer=self._tokenizer,
            output_dir=str(args.output_dir),
            enabled=self.accelerator.is_main_process,
            tensorboard=self._tensorboard_writer,
        )

    def _tensorboard_writer(self) -> Any:
        """TRL's TensorBoard writer (``report_to`` with tensorboard, once training began), or
        None."""
        from transformers.integrations.integration_utils import TensorBoardCallback

        for callback in self.callback_handler.callbacks:
            if isinstance(callback, TensorBoardCallback):
                return callback.tb_writer
        return None

    def _build_direction(self, args: CreditGRPOConfig) -> DirectionModel:
        """``args.direction`` built for this policy; without it, the first reward model among
        TRL's ``reward_funcs`` (a one-label sequence classifier, weights shared)."""
        with lm_head(self.policy) as (weight, _):
            vocab = int(weight.shape[0])
        cfg = args.direction_config
        if cfg is not None:
            return build_direction_model(
                cfg, self._tokenizer, device=self.accelerator.device, policy_vocab_size=vocab
            )
        for func, rm_tokenizer in zip(
            self.reward_funcs, self.reward_processing_classes, strict=True
        ):
            model = getattr(func, "module", func)  # a DeepSpeed engine holds it as .module
            if isinstance(model, PreTrainedModel):
                return SeqClassificationRM(
                    model, rm_tokenizer, self._tokenizer, policy_vocab_size=vocab
                )
        raise CreditError(
            f"direction: strategy {self.strategy.name!r} reads "
            f"{sorted(self.strategy.requires)}, which needs a differentiable reward model: "
            "set direction (e.g. {kind: seq_classification, path: ...}), give TRL a reward "
            "model in reward_funcs, or pass direction_model= to CreditGRPOTrainer"
        )

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """TRL's checkpoint, plus the strategy's mutable state (``datc_shuffled``'s random
        stream) in ``STRATEGY_STATE_FILE`` when it has any."""
        super()._save_checkpoint(model, trial)  # type: ignore[no-untyped-call]
        state = self.strategy.state_dict()
        if state and self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            path = os.path.join(self._get_output_dir(trial=trial), folder, STRATEGY_STATE_FILE)
            torch.save(state, path)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """TRL's resume, plus the strategy's state saved by ``_save_checkpoint``."""
        super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[no-untyped-call]
        path = None if checkpoint is None else os.path.join(checkpoint, STRATEGY_STATE_FILE)
        if path is not None and os.path.exists(path):
            self.strategy.load_state_dict(torch.load(path, weights_only=True))

    # -------------------------------------------------------------------------- signals

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """TRL's forward; when a consumer waits for them (``_on_hidden``), the policy's final
        hidden states of this forward are recorded and handed over (detached) with the
        completion tokens ``input_ids[:, -logits_to_keep:]``."""
        consumer, self._on_hidden = self._on_hidden, None
        if consumer is None:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        assert self._capture is not None  # set whenever statistics are needed
        with self._capture.recording() as chunks:
            result = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        # hidden state j predicts token j + 1: completion tokens are predicted by -T-1 .. -2
        hidden = torch.cat(chunks)[:, -logits_to_keep - 1 : -1]
        consumer(hidden.detach(), input_ids[:, -logits_to_keep:])
        return result

    def credit_signals(
        self,
        reward_grad: torch.Tensor | None,
        hidden: torch.Tensor | None = None,
        token_ids: torch.Tensor | None = None,
    ) -> CreditSignals:
        """The signals the strategy reads (``self.reads``): ``reward_grad`` (B, T, d), and,
        from the policy's final hidden states (B, T, H) at the positions that predict
        ``token_ids`` (B, T), DATC's W0 (streamed with ``reward_grad``) or ``PolicyStats``;
        no grad, TRL's temperature."""
        grad = reward_grad if "reward_grad" in self.reads else None
        if hidden is None or token_ids is None:
            return CreditSignals(reward_grad=grad)
        assert self.direction is not None
        h = hidden.float() if self.credit_args.cast_lm_head_to_fp32 else hidden
        kw: dict[str, Any] = {
            "temperature": self.temperature,
            "chunk_size": self.credit_args.credit_stats_chunk_size,
        }
        E = self.direction.reward_embedding
        with torch.no_grad(), lm_head(self.policy) as (weight, bias):
            if "unsigned_work" in self.reads:
                assert reward_grad is not None
                w0 = unsigned_work(h, weight, token_ids, E, reward_grad, lm_head_bias=bias, **kw)
                return CreditSignals(unsigned_work=w0)
            stats = policy_stats(h, weight, token_ids, E, lm_head_bias=bias, **kw)
        return CreditSignals(reward_grad=grad, policy_stats=stats)

    def reward_grad(self, batch: dict[str, Any]) -> torch.Tensor:
        """dR / d(RM input embedding) (B, T, d) at the completion tokens of ``batch`` (TRL's
        generation output), scored in chunks of TRL's per-device batch size."""
        assert self.direction is not None
        size = (
            self.args.per_device_train_batch_size
            if self.policy.training
            else self.args.per_device_eval_batch_size
        )
        parts = []
        with torch.enable_grad():
            for start in range(0, batch["completion_ids"].shape[0], size):
                rows = slice(start, start + size)
                out = self.direction.score(
                    batch["prompt_ids"][rows],
                    batch["prompt_mask"][rows],
                    batch["completion_ids"][rows],
                    batch["completion_mask"][rows],
                    with_grad=True,
                )
                assert out.reward_grad is not None
                parts.append(out.reward_grad.detach())
        return torch.cat(parts)

    # --------------------------------------------------------------------------- credit

    def _calculate_rewards(self, inputs: Any, prompts: Any, *args: Any) -> torch.Tensor:
        """TRL's rewards of every reward function (all processes' rows); keeps this process's
        rows' weighted sum (TRL's reward) for the credit samples."""
        per_func: torch.Tensor = super()._calculate_rewards(inputs, prompts, *args)
        if self.samples is not None:
            weights = self.reward_weights.to(per_func.device).unsqueeze(0)
            start = self.accelerator.process_index * len(prompts)
            self._local_rewards = (per_func * weights).nansum(dim=1)[start : start + len(prompts)]
        return per_func

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        """TRL's generation batch with ``advantages`` (B, T) where credit is formed at
        generation time; in the loss phase, with the reward gradient (if needed) attached;
        with the rows' rewards attached when credit samples are recorded."""
        old_forward = self.needs_policy_stats and self.credit_phase == "generation"
        if old_forward:
            self._on_hidden = self._keep_old_hidden
        try:
            output: dict[str, Any] = super()._generate_and_score_completions(inputs)
        finally:
            pending, self._on_hidden = self._on_hidden, None
        if self._local_rewards is not None:
            output[REWARDS_KEY], self._local_rewards = self._local_rewards, None
        if old_forward and (pending is not None or "old_per_token_logps" not in output):
            raise RuntimeError(
                "CreditGRPOTrainer: TRL took no old-log-prob forward where TRL 1.16 takes one; "
                "the policy statistics are missing (is the installed TRL the supported one?)"
            )
        reward_grad = self.reward_grad(output) if self.needs_reward_grad else None
        if self.credit_phase == "loss":
            if reward_grad is not None:
                output[REWARD_GRAD_KEY] = reward_grad
            return output
        old, self._old_hidden = self._old_hidden, None
        signals = self.credit_signals(reward_grad, *(old or (None, None)))
        output["advantages"] = self.token_advantages(output, signals)
        return output

    def _keep_old_hidden(self, hidden: torch.Tensor, token_ids: torch.Tensor) -> None:
        self._old_hidden = (hidden, token_ids)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """TRL's loss; in the loss phase the token advantages are formed from this step's
        loss forward (between the forward and TRL's read of ``advantages``)."""
        if self.credit_phase != "loss":
            return super()._compute_loss(model, inputs)  # type: ignore[no-any-return,no-untyped-call]
        batch = dict(inputs)  # the buffered generation batch keeps its (B,) advantages
        reward_grad = batch.pop(REWARD_GRAD_KEY, None)

        def form_credit(hidden: torch.Tensor, token_ids: torch.Tensor) -> None:
            signals = self.credit_signals(reward_grad, hidden, token_ids)
            batch["advantages"] = self.token_advantages(batch, signals)

        self._on_hidden = form_credit
        try:
            loss: torch.Tensor = super()._compute_loss(model, batch)  # type: ignore[no-untyped-call]
        finally:
            pending, self._on_hidden = self._on_hidden, None
        if pending is not None:
            raise RuntimeError("CreditGRPOTrainer: TRL's loss took no policy forward")
        return loss

    def token_advantages(self, batch: dict[str, Any], signals: CreditSignals) -> torch.Tensor:
        """Token advantages (B, T) float32 of ``batch`` (``advantages`` (B,),
        ``completion_ids``/``completion_mask`` (B, T), optional ``tool_mask``) and the
        strategy's ``signals`` by ``assign_credit``: 0 where TRL's loss mask is 0, row mean
        A over the valid tokens.

        Rows without a valid token (truncated completions TRL masks out) get 0. Logs the
        diagnostics into TRL's metrics.
        """
        advantages = batch["advantages"]
        mask = batch["completion_mask"].bool()
        if "tool_mask" in batch:
            mask = mask & batch["tool_mask"].bool()
        token_ids = batch["completion_ids"].long()
        rows = mask.any(dim=1)
        token_adv = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        diagnostics: CreditDiagnostics | None = None
        if bool(rows.any()):
            every = bool(rows.all())
            result = assign_credit(
                self.strategy,
                advantages if every else advantages[rows],
                mask if every else mask[rows],
                token_ids if every else token_ids[rows],
                signals if every else signals.select(rows),
            )
            token_adv[rows] = result.token_advantages
            diagnostics = result.diagnostics
        self._log_credit(diagnostics)
        step = self.state.global_step + 1
        if (
            self.samples is not None
            and self.policy.training
            and REWARDS_KEY in batch
            and bool(rows.any())
            and self.samples.due(step, self.state.max_steps)
        ):
            shuffled = self.credit_phase == "loss"  # TRL shuffled the rows: one group
            group = mask.shape[0] if shuffled else int(self.num_generations or 1)
            self.samples.record(step, batch, token_adv, signals, mask, group)
        return token_adv

    def _log_credit(self, diagnostics: CreditDiagnostics | None) -> None:
        """Append the diagnostics, reduced over processes, to ``self._metrics[mode]``:
        max of ``weight_max``, min of ``weight_min``, mean of the fractions, sum of the
        fallbacks (a process without valid rows contributes nothing)."""
        names = ("weight_max", "weight_min", "weight_entropy", "frac_upweighted")
        nan = float("nan")
        local = (
            [nan] * 6
            if diagnostics is None
            else [
                *(float(getattr(diagnostics, n)) for n in names),
                float(diagnostics.nonfinite_fallbacks),
                float(diagnostics.uniform_fallbacks),
            ]
        )
        device = self.accelerator.device
        values = self.accelerator.gather(torch.tensor([local], device=device)).reshape(-1, 6)
        valid = values[~values[:, 0].isnan()]
        if valid.shape[0] == 0:
            return
        mode = "train" if self.policy.training else "eval"
        reduced = CreditDiagnostics(
            weight_max=float(valid[:, 0].max()),
            weight_min=float(valid[:, 1].min()),
            weight_entropy=float(valid[:, 2].mean()),
            frac_upweighted=float(valid[:, 3].mean()),
            nonfinite_fallbacks=int(valid[:, 4].sum()),
            uniform_fallbacks=int(valid[:, 5].sum()),
        )
        for key, value in reduced.to_dict(prefix="credit/").items():
            self._metrics[mode][key].append(value)
