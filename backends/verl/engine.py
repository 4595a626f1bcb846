"""``CreditFSDPEngine``: verl's FSDP language-model engine, computing the direction model's
per-token signals (DATC's W0, P2T's attribution, ABC's attention, RED's prefix rewards) in
the forward that already computes the old log-probs.

verl's trainer asks the actor engine for the old-policy log-probs once per batch
(``compute_log_prob``, no grad); ``FSDPEngineWithLMHead.prepare_model_outputs`` receives
that forward's raw Hugging Face output, logits included. When the micro-batch carries the
trainer's work request (``WORK_REQUEST_KEY``, a JSON string: the direction model's settings,
the tile size, the path points, the ``signals`` asked for, within ``ENGINE_SIGNALS``, and
for ``reward_attribution`` its ``null``),
this subclass adds one more per-token output per signal (``SIGNAL_FIELDS``), each a nested
tensor laid out like verl's ``log_probs`` (row i: its prompt + response tokens, the value at
j about the token at j + 1, 0 at every position that predicts no response token), so
verl's own ``response_from_nested`` cuts it to the response. The frozen direction model is
built in the engine's process from the request, once, and kept.

- ``unsigned_work`` (W0): ``credit_core.unsigned_work_from_logits`` of that forward's logits
  at verl's temperature, with the direction model's reward gradient g scored on the same
  prompt and response tokens. A path-gradient strategy (``datc_mid``, ``datc_ig``: the
  request's ``points`` >= 1) takes g on the path to the policy's expected embeddings m1
  instead: ``PolicyStats`` of the same logits first (m1 among them), then
  ``adapters.grad_path.path_reward_grad`` from m1, then W0 from the statistics and g
  (``credit_core.token_work``).
- ``reward_attribution`` (P2T): r_t = (E'[y_t] - e_null) . g_t
  (``DirectionModel.attribution``, the request's ``null``) from the reward gradient g of the
  same prompt and response tokens, the one W0 reads (one direction-model forward + backward,
  no further reward pass); it reads the token ids only.
- ``reward_attention`` (ABC) and ``prefix_rewards`` (RED): the direction model's own
  ``score(..., with_attention / with_prefix_rewards)`` (``adapters.direction.score_rollout``,
  no gradient) of the same prompt and response tokens; they read the token ids only.

With ``scores`` in the request (the trainer measures the direction model against verl's
reward, issue 46) the engine also ships the direction model's own score of each response
(``SCORES_FIELD``: in the same layout, the score at the position that predicts the
response's last token, 0 elsewhere), from the pass that gives the signal: the reward of
the gradient pass at the sampled tokens (``unsigned_work``, ``reward_attribution``) or of
the scoring pass (``reward_attention``, ``prefix_rewards``). A path-gradient request
(``points`` >= 1) takes no gradient at the sampled tokens: its scores cost one no-grad
direction-model forward more (as the native trainer's ``PathGradientDirection`` does).

No extra policy forward; without a request the engine is verl's own: no extra work, no
extra key.

The subclass is registered for ``actor_rollout_ref.actor.strategy`` fsdp/fsdp2 on NVIDIA
GPUs (``register_engine``), where a vendor-specific entry takes precedence over verl's
built-in engine.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from tensordict import TensorDict
from torch.distributed.tensor import DTensor
from verl.utils import tensordict_utils as tu
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

from adapters.config import RewardModelConfig, build_direction_model
from adapters.direction import DirectionModel, score_rollout
from adapters.grad_path import path_alphas, path_model, path_reward_grad
from backends.verl.config import ENGINE_SIGNALS, SCORES_FIELD, SIGNAL_FIELDS
from credit_core import (
    CreditError,
    PolicyStats,
    policy_stats_from_logits,
    token_work,
    unsigned_work_from_logits,
)

#: Non-tensor key of the old-log-prob micro-batch that asks for the direction model's
#: signals (``backends.verl.config.work_request``).
WORK_REQUEST_KEY = "credit_work_request"

#: The model-output key (and TransferQueue field) of W0.
WORK_FIELD = SIGNAL_FIELDS["unsigned_work"]

#: The name of the direction model's scores among the engine's outputs (``SCORES_FIELD``).
SCORES = "direction_scores"
#: Each output of ``credit_signals`` and its model-output key (and TransferQueue field).
OUTPUT_FIELDS: dict[str, str] = {**SIGNAL_FIELDS, SCORES: SCORES_FIELD}


def response_lengths(micro_batch: TensorDict) -> torch.Tensor:
    """Response tokens per row (B,): the lengths of a nested ``response_mask`` (verl's V1
    trainer), or the valid tokens of a padded one (single-turn: a prefix of the row)."""
    mask: Any = micro_batch["response_mask"]  # nested or padded
    lengths: torch.Tensor = mask.offsets().diff() if mask.is_nested else mask.sum(dim=-1)
    return lengths


def response_logits(
    output: Any, micro_batch: TensorDict, resp_lens: torch.Tensor
) -> list[torch.Tensor]:
    """Per row i, the forward's raw logits (r_i, V) at the positions that predict its r_i
    response tokens, as views of the output (no copy), from either of verl's layouts:
    packed (``use_remove_padding``: (1, N, V), row i's tokens at ``input_ids.offsets()[i]``
    .. ``[i + 1]``) or padded ((B, S, V), row i's tokens first)."""
    input_ids: Any = micro_batch["input_ids"]  # nested (B, j)
    offsets = input_ids.offsets().tolist()
    logits: torch.Tensor = output.logits
    if isinstance(logits, DTensor):
        logits = logits.full_tensor()
    logits = logits.detach()
    packed = tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True)
    spans = []
    for i, r in enumerate(resp_lens.tolist()):
        n = offsets[i + 1] - offsets[i]
        row = logits[0, offsets[i] : offsets[i + 1]] if packed else logits[i, :n]
        spans.append(row[n - r - 1 : n - 1])
    return spans


def sampling_temperature(micro_batch: TensorDict) -> float:
    """verl's temperature of the micro-batch as one float (a per-sample tensor must be one
    value: W0 reads the distribution sampled from)."""
    temperature = micro_batch["temperature"]
    if isinstance(temperature, torch.Tensor):
        values = torch.unique(temperature)
        if values.numel() != 1:
            raise CreditError(
                "actor_rollout_ref.rollout.temperature: the credit backend needs one sampling "
                f"temperature per batch, got {values.tolist()}"
            )
        return float(values.item())
    return float(temperature)


def split_rows(
    values: torch.Tensor, offsets: torch.Tensor, resp_lens: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed tokens -> (prompt_ids, prompt_mask) left-padded (B, P) and (response_ids,
    response_mask) right-padded (B, R): row i is ``values[offsets[i]:offsets[i+1]]``, its
    last ``resp_lens[i]`` tokens the response."""
    rows = offsets.diff().tolist()
    resp = resp_lens.tolist()
    B = len(rows)
    P = max(n - r for n, r in zip(rows, resp, strict=True))
    R = max(resp)
    prompt_ids = torch.full((B, P), pad_id, dtype=values.dtype, device=values.device)
    prompt_mask = torch.zeros((B, P), dtype=torch.long, device=values.device)
    response_ids = torch.full((B, R), pad_id, dtype=values.dtype, device=values.device)
    response_mask = torch.zeros((B, R), dtype=torch.long, device=values.device)
    for i, (start, n, r) in enumerate(zip(offsets[:-1].tolist(), rows, resp, strict=True)):
        p = n - r
        prompt_ids[i, P - p :] = values[start : start + p]
        prompt_mask[i, P - p :] = 1
        response_ids[i, :r] = values[start + p : start + n]
        response_mask[i, :r] = 1
    return prompt_ids, prompt_mask, response_ids, response_mask


def attribution_null(direction: DirectionModel, asked: dict[str, Any]) -> str:
    """The request's ``null`` (the null embedding of ``reward_attribution``), checked to be
    one ``direction`` has: ``CreditError`` naming ``algorithm.credit`` and the null
    otherwise (e.g. ``unk`` for a reward model whose tokenizer has no unknown token)."""
    null = str(asked.get("null"))
    try:
        direction.null_embedding(null)
    except CreditError as err:
        raise CreditError(f"algorithm.credit: reward_attribution: {err}") from err
    return null


class CreditFSDPEngine(FSDPEngineWithLMHead):  # type: ignore[misc]
    """verl's FSDP LM engine plus the direction model's per-token signals in the
    old-log-prob forward when asked (module doc)."""

    _credit_direction: tuple[str, DirectionModel] | None = None

    def prepare_model_outputs(
        self,
        output: Any,
        output_args: dict[str, Any],
        micro_batch: TensorDict,
        logits_processor_func: Any,
    ) -> dict[str, Any]:
        model_output: dict[str, Any] = super().prepare_model_outputs(
            output, output_args, micro_batch, logits_processor_func
        )
        request = tu.get_non_tensor_data(data=micro_batch, key=WORK_REQUEST_KEY, default=None)
        if request is not None:
            offsets = micro_batch["input_ids"].offsets()
            # verl calls this inside its forward's autocast (bf16 under its default mixed
            # precision): the signals are computed in float32 outside it
            device = micro_batch["input_ids"].device.type
            with torch.autocast(device_type=device, enabled=False):
                signals = self.credit_signals(output, micro_batch, str(request))
            for signal, values in signals.items():
                field = OUTPUT_FIELDS[signal]
                model_output[field] = torch.nested.nested_tensor_from_jagged(values, offsets)
        return model_output

    def direction_model(
        self, settings: dict[str, Any], vocab: int, device: torch.device
    ) -> DirectionModel:
        """The frozen direction model of ``settings`` on ``device`` (the logits' device, which
        is not the parameters' one under parameter offload), built once per process and
        kept resident."""
        key = json.dumps(settings, sort_keys=True)
        if self._credit_direction is None or self._credit_direction[0] != key:
            tokenizer = self.model_config.tokenizer
            if tokenizer is None:
                raise CreditError(
                    "actor_rollout_ref.model: the credit backend needs the policy's tokenizer "
                    "to build the direction model (load_tokenizer is off)"
                )
            cfg = RewardModelConfig.model_validate(settings)
            model = build_direction_model(cfg, tokenizer, device=device, policy_vocab_size=vocab)
            self._credit_direction = (key, model)
        return self._credit_direction[1]

    def credit_signals(
        self, output: Any, micro_batch: TensorDict, request: str
    ) -> dict[str, torch.Tensor]:
        """Each signal of the request's ``signals`` (within ``ENGINE_SIGNALS``) as (N,)
        float32 at the micro-batch's N packed positions: at the position that predicts
        response token t, the signal's value at t; 0 elsewhere. With the request's
        ``scores``, also ``SCORES``: the direction model's score of each response at the
        position that predicts its last token, 0 elsewhere. ``CreditError`` for a signal
        the engine does not compute. Called with autocast disabled (``prepare_model_outputs``):
        the direction model's passes, the attribution and the reductions over the logits run
        in their own dtypes (float32 accumulation), whatever verl's mixed precision."""
        asked = json.loads(request)
        signals = list(asked["signals"])
        unknown = sorted(set(signals) - ENGINE_SIGNALS)
        if unknown:
            raise CreditError(
                f"{WORK_REQUEST_KEY}: the engine computes {sorted(ENGINE_SIGNALS)}, not {unknown}"
            )
        input_ids = micro_batch["input_ids"]
        values, offsets = input_ids.values(), input_ids.offsets()
        resp_lens = response_lengths(micro_batch).to(offsets.device)
        outputs = [*signals, SCORES] if asked.get("scores") else signals
        found = {
            s: torch.zeros(int(offsets[-1]), dtype=torch.float32, device=values.device)
            for s in outputs
        }
        if int(resp_lens.max()) == 0:
            return found
        pad_id = self.model_config.tokenizer.pad_token_id or 0
        rollout = split_rows(values, offsets, resp_lens, int(pad_id))
        lengths = resp_lens.tolist()
        ends = offsets[1:].tolist()
        per_row: dict[str, torch.Tensor] = {}
        gradient = [s for s in ("unsigned_work", "reward_attribution") if s in found]
        if gradient:
            per_row.update(self.gradient_signals(output, micro_batch, asked, rollout, gradient))
        scored = [s for s in ("reward_attention", "prefix_rewards") if s in found]
        if scored:
            vocab = int(self.model_config.hf_config.vocab_size)
            direction = self.direction_model(asked["direction"], vocab, values.device)
            out = score_rollout(
                direction,
                *rollout,
                with_grad=False,
                with_attention="reward_attention" in found,
                with_prefix_rewards="prefix_rewards" in found,
            )
            if out.attention is not None:
                per_row["reward_attention"] = out.attention
            if out.prefix_rewards is not None:
                per_row["prefix_rewards"] = out.prefix_rewards
            if SCORES in found and SCORES not in per_row:
                per_row[SCORES] = out.rewards
        for signal, rows in per_row.items():
            target = found[signal]
            if signal == SCORES:  # one value per response, at the position predicting its last
                for i, r in enumerate(lengths):
                    if r:
                        target[ends[i] - 2] = rows[i].float().to(target.device)
                continue
            for i, r in enumerate(lengths):
                # the position predicting response token t of row i: ends[i] - r - 1 + t
                if r:
                    target[ends[i] - r - 1 : ends[i] - 1] = rows[i, :r].float().to(target.device)
        return found

    def gradient_signals(
        self,
        output: Any,
        micro_batch: TensorDict,
        asked: dict[str, Any],
        rollout: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        signals: list[str],
    ) -> dict[str, torch.Tensor]:
        """The ``signals`` of the reward gradient g (``unsigned_work``, ``reward_attribution``)
        for the ``rollout`` (prompt ids/mask, response ids/mask: ``split_rows``) of the
        micro-batch, each (B, R) float32, response-aligned (0 at padding), from one g (one
        direction-model forward + backward, or the path's ``points``); with the request's
        ``scores``, ``SCORES`` (B,): the direction model's reward at the sampled tokens (that
        pass's, or for ``points`` >= 1 one no-grad forward more).

        - W0: of the forward's logits, read one row's response span at a time, as views (no
          copy). ``CreditError`` under Ulysses sequence parallelism (verl's
          ``use_ulysses_sp``): the logits are then sequence-local, the row offsets global.
        - r_t = (E'[y_t] - e_null) . g_t (``DirectionModel.attribution``) with the request's
          ``null``; it reads g at the sampled tokens, so a request with ``points`` >= 1 gets
          a ``CreditError``, and so does a null the direction model lacks (naming it)."""
        points = int(asked.get("points", 0))
        response_ids, response_mask = rollout[2], rollout[3]
        found: dict[str, torch.Tensor] = {}
        if "reward_attribution" in signals and points:
            raise CreditError(
                f"{WORK_REQUEST_KEY}: reward_attribution reads the reward gradient at the "
                f"sampled tokens, not on the path (points: {points})"
            )
        if "unsigned_work" in signals:
            found["unsigned_work"], g, scores, direction = self.unsigned_work(
                output, micro_batch, asked, rollout
            )
        else:
            device = response_ids.device
            vocab = int(self.model_config.hf_config.vocab_size)
            direction = self.direction_model(asked["direction"], vocab, device)
            null = attribution_null(direction, asked)  # refused before the reward pass
            with torch.enable_grad():
                g, scores = self.reward_grad(direction, rollout, [], 0)
        if asked.get("scores"):
            if scores is None:  # the path's gradient gives no reward at the sampled tokens
                with torch.no_grad():
                    scores = direction.score(*rollout, with_grad=False).rewards
            found[SCORES] = scores.detach().float()
        if "reward_attribution" in signals:
            null = attribution_null(direction, asked)
            with torch.no_grad():
                found["reward_attribution"] = direction.attribution(
                    g, response_ids, response_mask, null
                ).float()
        return found

    def unsigned_work(
        self,
        output: Any,
        micro_batch: TensorDict,
        asked: dict[str, Any],
        rollout: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, DirectionModel]:
        """W0 (B, R) float32, response-aligned (0 at padding), of the forward's logits and
        g for the ``rollout`` of the micro-batch (``gradient_signals``), with that g
        (B, R, d) (on the path for ``points`` >= 1), the rewards (B,) of its pass (None on
        the path) and the direction model."""
        if getattr(self, "use_ulysses_sp", False):
            # the forward's logits are this rank's slice of the padded packed sequence, while
            # the rows' offsets are global: slicing them would give another token's W0
            raise CreditError(
                "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size: "
                f"{self.ulysses_sequence_parallel_size}; under Ulysses sequence parallelism "
                "each rank holds a slice of every sequence's logits, and W0 is reduced from "
                "whole sequences: set it to 1"
            )
        response_ids, response_mask = rollout[2], rollout[3]
        lengths = response_mask.sum(dim=1).tolist()
        spans = response_logits(output, micro_batch, response_mask.sum(dim=1))
        V, device = int(spans[0].shape[-1]), spans[0].device
        direction = self.direction_model(asked["direction"], V, device)
        points = int(asked.get("points", 0))
        kw: dict[str, Any] = {
            "temperature": sampling_temperature(micro_batch),
            "chunk_size": int(asked["chunk_size"]),
        }
        E = direction.reward_embedding
        work = torch.zeros(response_ids.shape, dtype=torch.float32, device=device)
        stats: list[PolicyStats | None] = [None] * len(spans)
        if points:  # the path starts at m1 of this forward: the statistics come first
            with torch.no_grad():
                for i, (span, r) in enumerate(zip(spans, lengths, strict=True)):
                    if r:
                        ids = response_ids[i, :r].unsqueeze(0).to(device)
                        stats[i] = policy_stats_from_logits(span.unsqueeze(0), ids, E, **kw)
        with torch.enable_grad():
            g, scores = self.reward_grad(direction, rollout, stats, points)
        with torch.no_grad():
            for i, (span, r) in enumerate(zip(spans, lengths, strict=True)):
                if r == 0:
                    continue
                g_i = g[i, :r].unsqueeze(0).to(device)
                found = stats[i]
                if found is not None:
                    w = token_work(found, g_i, None)
                else:
                    ids = response_ids[i, :r].unsqueeze(0).to(device)
                    w = unsigned_work_from_logits(span.unsqueeze(0), ids, E, g_i, **kw)
                work[i, :r] = w.squeeze(0).float()
        return work, g, scores, direction

    @staticmethod
    def reward_grad(
        direction: DirectionModel,
        rollout: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        stats: list[PolicyStats | None],
        points: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """g (B, R, d) of the rollout (prompt ids/mask, response ids/mask), detached: at
        the sampled tokens (``points`` 0, one scoring pass, whose rewards (B,) come with
        it), or averaged over ``points`` positions of the path to m1 (each row's ``stats``;
        ``path_reward_grad``; no rewards: None), 0 at padding."""
        response_ids = rollout[2]
        if not points:
            scored = direction.score(*rollout, with_grad=True)
            if scored.reward_grad is None:
                raise CreditError(
                    f"algorithm.direction: {type(direction).__name__}.score(with_grad=True) "
                    "returned no reward_grad"
                )
            return scored.reward_grad.detach(), scored.rewards.detach()
        model = path_model(direction)
        B, R = response_ids.shape
        m1 = torch.zeros(B, R, model.reward_embedding.shape[1], device=response_ids.device)
        for i, found in enumerate(stats):
            if found is not None:
                m1[i, : found.m1.shape[1]] = found.m1[0].to(m1)
        return path_reward_grad(model, *rollout, m1, path_alphas(points)).detach(), None


def register_engine() -> None:
    """Register ``CreditFSDPEngine`` for verl's fsdp/fsdp2 language-model engine on NVIDIA
    GPUs (verl looks the (device, vendor) key up before its built-in device key)."""
    EngineRegistry.register(
        model_type="language_model", backend=["fsdp", "fsdp2"], device="cuda", vendor="nvidia"
    )(CreditFSDPEngine)
