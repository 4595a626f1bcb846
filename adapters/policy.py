"""Policy side: response log-probs and ``PolicyStats`` or W0 from a Hugging Face causal LM.

Layout (binding, see notes): ``input_ids``/``attention_mask`` are (B, P + R) =
[prompt | response]; the response is right-padded, the prompt is left-padded (right-padded
prompts also work: the first response token is predicted from the last *real* prompt token
and positions come from the attention mask). Response token j is ``input_ids[:, P + j]``.

The model runs once up to its final hidden states (``final_hidden_states``); the LM head is
then applied by streamed reductions over the vocabulary: ``adapters.logprobs.token_logprobs``
for the (differentiable) log-probs and ``credit_core.policy_stats`` for the stats
(``response_logprobs_and_stats``), or ``credit_core.unsigned_work`` for DATC's W0 when the
reward gradient is already known (``response_logprobs_and_work``). The (B, R, V) logits are
never materialized. The cost is two LM-head passes when stats or W0 are asked for (the
stats pass also does two (N x V) x (V x d) products, the two-matmul W0 pass one), plus one
recomputation pass in backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from adapters.logprobs import token_logprobs
from adapters.signature import accepts_keyword
from credit_core import (
    CreditError,
    PolicyStats,
    choose_work_path,
    policy_stats,
    streamed_logprobs_and_entropy,
    streamed_work_and_logprobs,
    token_entropy,
    unsigned_work,
)
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE, DEFAULT_TILE_ELEMENTS
from credit_core.streamed_work import work_dtype
from credit_core.tensor_checks import check_tensor

#: Config attributes of model families whose logits are not ``hidden @ W.T + b``.
_UNSUPPORTED_HEAD_ATTRS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside wrappers that hold it as ``.module`` (DDP, DeepSpeed)."""
    inner: Any = model
    while not hasattr(inner, "get_output_embeddings") and hasattr(inner, "module"):
        inner = inner.module
    if not hasattr(inner, "get_output_embeddings"):
        raise CreditError(
            f"model: expected a transformers causal LM (with get_output_embeddings), "
            f"got {type(model).__name__}"
        )
    found: torch.nn.Module = inner
    return found


def lm_head_of(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LM head's weight (V, H) and bias (V,) or None, as the model's own parameters.

    With tied embeddings the weight is the input-embedding parameter itself, so gradients
    flow into it. Raises CreditError for heads that are not ``hidden @ W.T + b`` (logit
    soft-capping, logit scaling).
    """
    inner = unwrap_model(model)
    config = getattr(inner, "config", None)
    for attr in _UNSUPPORTED_HEAD_ATTRS:
        value = getattr(config, attr, None)
        if value not in (None, 1.0) and not isinstance(value, bool):
            raise CreditError(
                f"model: config.{attr}={value!r} transforms the logits after the LM head; "
                "streamed log-probs and policy stats assume logits = hidden @ W.T + bias"
            )
    head = inner.get_output_embeddings()  # type: ignore[operator]
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise CreditError(
            f"model: expected an LM head with a (V, H) weight, got {type(head).__name__}"
        )
    bias = getattr(head, "bias", None)
    return weight, bias if isinstance(bias, torch.Tensor) else None


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, ... over the attended tokens (padding gets 1), as HF ``generate``."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 1)


def final_hidden_states(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Final (post-norm) hidden states (B, L, H): the inputs of the LM head.

    Position ids are computed from ``attention_mask``. A plain ``transformers`` model runs
    its decoder only (no LM head). A wrapper with ``.module`` (DDP, DeepSpeed engine) is
    called through its own ``forward`` so that its hooks run, with
    ``output_hidden_states=True`` and ``logits_to_keep=1`` (LM head on one position only).
    """
    position_ids = position_ids_from_mask(attention_mask)
    inputs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": False,
    }
    inner = unwrap_model(model)
    get_decoder = getattr(inner, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else inner
    if inner is model and decoder is not inner:
        out = decoder(**inputs)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    else:
        if accepts_keyword(inner.forward, "logits_to_keep", via_var_keyword=True):
            inputs["logits_to_keep"] = 1
        hidden = model(**inputs, output_hidden_states=True).hidden_states[-1]
    if not isinstance(hidden, torch.Tensor) or hidden.shape[:2] != input_ids.shape:
        got = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
        raise CreditError(
            f"final hidden states: expected shape {tuple(input_ids.shape)} + (H,), got {got}"
        )
    return hidden


def predictor_positions(attention_mask: torch.Tensor, response_len: int) -> torch.Tensor:
    """(B, R) long: the position whose output predicts response token j.

    j >= 1: position P + j - 1; j = 0: the last attended prompt position (P - 1 for a
    left-padded prompt). Raises CreditError for rows whose prompt has no attended token.
    """
    B, L = attention_mask.shape
    P = L - response_len
    prompt = attention_mask[:, :P] != 0
    empty = torch.nonzero(~prompt.any(dim=1)).flatten()
    if empty.numel() > 0:
        raise CreditError(
            f"attention_mask: prompt rows {empty.tolist()} have no attended token; "
            "the first response token needs a prompt token to be predicted from"
        )
    steps = torch.arange(1, P + 1, device=attention_mask.device)
    last_prompt = (prompt * steps).argmax(dim=1)
    pos = torch.arange(P - 1, L - 1, device=attention_mask.device).expand(B, response_len)
    return torch.cat([last_prompt.unsqueeze(1), pos[:, 1:]], dim=1)


@dataclass(frozen=True)
class ResponseHidden:
    """What one policy forward gives the response positions (adapters' layout).

    - ``hidden`` (B, R, H): final hidden states at the positions predicting response tokens.
    - ``tokens`` (B, R) int64: the response tokens, 0 at padding.
    - ``real`` (B, R) bool: True at response tokens, False at padding.
    - ``weight`` (V, H), ``bias`` (V,) or None: the model's LM head (its own parameters).
    """

    hidden: torch.Tensor
    tokens: torch.Tensor
    real: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None


def _check_reward_embedding(reward_embedding: torch.Tensor, vocab: int) -> None:
    check_tensor("reward_embedding", reward_embedding, (None, None), floating=True)
    if reward_embedding.shape[0] != vocab:
        raise CreditError(
            f"reward_embedding: expected {vocab} rows (one per LM-head output of the policy), "
            f"got shape {tuple(reward_embedding.shape)}"
        )


def response_hidden(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    reward_embedding: torch.Tensor | None = None,
) -> ResponseHidden:
    """Check the batch (and ``reward_embedding``'s rows against V), run the model once up to
    its final hidden states and gather the response positions (module docstring layout)."""
    ids = check_tensor("input_ids", input_ids, (None, None))
    B, L = ids.shape
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise CreditError(f"input_ids: expected an integer dtype, got {ids.dtype}")
    mask = check_tensor("attention_mask", attention_mask, (B, L), device=ids.device)
    if not isinstance(response_len, int) or not 1 <= response_len < L:
        raise CreditError(
            f"response_len: expected an integer in [1, {L - 1}] (input length {L} "
            f"minus at least one prompt position), got {response_len!r}"
        )
    weight, bias = lm_head_of(model)
    V = weight.shape[0]
    if reward_embedding is not None:
        _check_reward_embedding(reward_embedding, V)
    P = L - response_len
    real = mask[:, P:] != 0
    resp = torch.where(real, ids[:, P:], 0).long()
    bad = real & ((resp < 0) | (resp >= V))
    if bool(bad.any()):
        rows = torch.nonzero(bad.any(dim=1)).flatten().tolist()
        raise CreditError(
            f"input_ids: response tokens must be in [0, {V}) (the LM head's vocabulary); "
            f"rows {rows} are not"
        )
    where = predictor_positions(mask, response_len)
    hidden = final_hidden_states(model, ids, mask)
    H = hidden.shape[2]
    h = hidden.gather(1, where.unsqueeze(2).expand(B, response_len, H))
    return ResponseHidden(h, resp, real, weight, bias)


def _response_logprobs(
    x: ResponseHidden, temperature: float, chunk_size: int, tile_elements: int
) -> torch.Tensor:
    logp = token_logprobs(
        x.hidden,
        x.weight,
        x.tokens,
        bias=x.bias,
        temperature=temperature,
        chunk_size=chunk_size,
        tile_elements=tile_elements,
    )
    return torch.where(x.real, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))


def response_logprobs_and_stats(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    reward_embedding: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> tuple[torch.Tensor, PolicyStats | None]:
    """log p(response token) (B, R) and, if ``reward_embedding`` is given, ``PolicyStats``.

    - input_ids, attention_mask (B, P + R): [prompt | right-padded response]; R =
      ``response_len`` (1 <= R < P + R).
    - p = softmax((hidden @ W.T + b) / temperature), W, b = ``lm_head_of(model)``.
    - Log-probs: float32 (float64 for a float64 model), differentiable under the caller's
      grad mode (the trainer calls with grad for the loss, under no_grad for the old
      policy); exactly 0 where the response is padding (``attention_mask[:, P:] == 0``).
    - Stats: ``credit_core.PolicyStats`` (B, R[, d]) with d = reward_embedding.shape[1],
      never differentiable (computed from detached tensors); values at padded positions
      are finite but meaningless. ``reward_embedding`` (V, d) must have one row per LM-head
      output (V = lm_head weight rows); it is moved to the model's device.
    - Streamed over the vocabulary in ``chunk_size`` chunks; no (B, R, V) tensor.
    """
    x = response_hidden(model, input_ids, attention_mask, response_len, reward_embedding)
    logp = _response_logprobs(x, temperature, chunk_size, tile_elements)
    stats = None
    if reward_embedding is not None:
        with torch.no_grad():
            stats = policy_stats(
                x.hidden.detach(),
                x.weight.detach(),
                x.tokens,
                reward_embedding.detach().to(x.hidden.device),
                temperature=temperature,
                chunk_size=chunk_size,
                lm_head_bias=None if x.bias is None else x.bias.detach(),
                tile_elements=tile_elements,
            )
    return logp, stats


def response_logprobs_and_work(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    reward_embedding: torch.Tensor,
    reward_grad: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
    path: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(response token) (B, R) and DATC's unsigned work W0 (B, R), from ONE forward.

    For a caller that has the reward gradient before the old policy's log-probs (the torch
    trainer scores the rollout first): W0 replaces ``PolicyStats`` + ``reward_grad`` in the
    ``CreditBatch`` (``unsigned_work=``) of every strategy with ``work_requires``.

    - input_ids, attention_mask, response_len, temperature, chunk_size, tile_elements and
      the log-probs: as ``response_logprobs_and_stats``.
    - reward_embedding (V, d): E in the policy vocabulary; moved to the model's device.
    - reward_grad (B, R, d) floating: dR/d(RM input embedding) at the response positions,
      as ``DirectionModel.score(with_grad=True)`` returns it; moved to the model's device.
    - W0 = p_y (u_y - ubar) - (S - ubar q) (docs/design.md), float32 (float64 for float64
      E or g), never differentiable, exactly 0 at padding. ``path`` picks the kernel
      (``credit_core.choose_work_path``: "auto" by the width d, "two_matmul", "stats").
    - Cost: one model forward up to the final hidden states. Under ``no_grad`` (the old
      policy) with the two-matmul kernel, one streamed LM-head pass gives both the
      log-probs and W0; otherwise the differentiable log-probs take their own pass.
    """
    x = response_hidden(model, input_ids, attention_mask, response_len, reward_embedding)
    B, R = x.tokens.shape
    check_tensor("reward_grad", reward_grad, (B, R, reward_embedding.shape[1]), floating=True)
    device = x.hidden.device
    E = reward_embedding.detach().to(device)
    g = reward_grad.detach().to(device)
    kw: dict[str, Any] = {
        "temperature": temperature,
        "chunk_size": chunk_size,
        "lm_head_bias": None if x.bias is None else x.bias.detach(),
        "tile_elements": tile_elements,
    }
    fused = (
        not torch.is_grad_enabled()
        and choose_work_path(E.shape[1], path) == "two_matmul"
        and work_dtype(E, g) == torch.promote_types(x.hidden.dtype, torch.float32)
    )
    if fused:  # old-policy log-probs: one streamed LM-head pass gives both
        w0, logp = streamed_work_and_logprobs(x.hidden, x.weight, x.tokens, E, g, **kw)
    else:
        logp = _response_logprobs(x, temperature, chunk_size, tile_elements)
        with torch.no_grad():
            w0 = unsigned_work(
                x.hidden.detach(), x.weight.detach(), x.tokens, E, g, path=path, **kw
            )
    zero = torch.zeros((), dtype=w0.dtype, device=device)
    return torch.where(x.real, logp, zero.to(logp.dtype)), torch.where(x.real, w0, zero)


def response_logprobs_and_entropy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(response token) (B, R) and the policy's entropy H (B, R), from ONE forward.

    Arguments and log-probs as ``response_logprobs_and_stats``. H_t = -sum_v p_t[v]
    log p_t[v] at ``temperature``, float32 (float64 for a float64 model), never
    differentiable, exactly 0 at padding. Under ``no_grad`` (the old policy) one streamed
    LM-head pass gives both; with grad enabled the differentiable log-probs take their own.
    """
    x = response_hidden(model, input_ids, attention_mask, response_len)
    kw: dict[str, Any] = {
        "temperature": temperature,
        "lm_head_bias": None if x.bias is None else x.bias.detach(),
        "chunk_size": chunk_size,
        "tile_elements": tile_elements,
    }
    if torch.is_grad_enabled():
        logp = _response_logprobs(x, temperature, chunk_size, tile_elements)
        with torch.no_grad():
            entropy = token_entropy(x.hidden.detach(), x.weight.detach(), **kw)
    else:
        logp, entropy = streamed_logprobs_and_entropy(x.hidden, x.weight, x.tokens, **kw)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return torch.where(x.real, logp, zero), torch.where(x.real, entropy, zero.to(entropy.dtype))
