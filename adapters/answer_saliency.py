"""OAR-G's signal: the input-gradient saliency of a causal LM's own answer distribution
(``credit_core.answer_reweighting``; docs/design.md, "Answer-gradient reweighting (OAR-G)").

For a batch in ``adapters.policy``'s layout ([prompt | response], response right-padded) and
each response's answer span, with a = the positions that predict the answer tokens:

    p0      = softmax(mean_{j in a} z_j)            the clean answer distribution (no grad)
    p_noisy = the same with e_t + eps_t at the reasoning tokens, eps_t ~ N(0, sigma^2 I)
    J       = sum_rows KL(p0 || p_noisy)
    s_t     = |dJ/de_t . e_t|                         at the reasoning tokens, 0 elsewhere

z_j the logits (the model's own, temperature 1) and e_t the output of the model's
input-embedding module; dJ/de_t is the gradient at the perturbed point (e_t + eps_t enters the
model, e_t is the leaf). Rows are independent, so one gradient of the summed J gives every
row's own. The mean of the logits over a is the LM head of the mean final hidden state (the
head is affine), so only (B, V) logits are formed, never (B, L, V).

Cost: one no-grad forward (p0) and one forward + backward to the input embeddings, the
model's weights frozen for the call (no weight gradient is formed and no activation kept for
one; ``adapters.input_grad.frozen``).
"""

from __future__ import annotations

import torch

from adapters.input_grad import frozen
from adapters.policy import final_hidden_states, lm_head_of, predictor_positions, unwrap_model
from credit_core import CreditError
from credit_core.answer_reweighting import reasoning_mask
from credit_core.tensor_checks import check_tensor


def _answer_logits(
    hidden: torch.Tensor,
    where: torch.Tensor,
    share: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """(B, V) float32: the LM head at the ``share``-weighted (B, R) mean of ``hidden`` (B, L,
    H) over the predictor positions ``where`` (B, R)."""
    B, R = where.shape
    h = hidden.gather(1, where.unsqueeze(2).expand(B, R, hidden.shape[2])).float()
    mean = (share.unsqueeze(2) * h).sum(dim=1)
    return torch.nn.functional.linear(mean, weight.float(), None if bias is None else bias.float())


def answer_saliency(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    answer_mask: torch.Tensor,
    *,
    noise_std: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """s (B, R) float32 of the module docstring, >= 0 at the reasoning tokens
    (``credit_core.answer_reweighting.reasoning_mask``) and 0 elsewhere (also on a row
    without an answer token).

    ``model``: a transformers causal LM (or a wrapper holding it as ``.module``), called on
    ``input_ids``/``attention_mask`` (B, P + R); ``answer_mask`` (B, R) bool: the answer
    tokens among the response tokens; the noise eps (B, L, H) is drawn from ``generator``
    (on its device) with std ``noise_std`` > 0. ``CreditError`` for a mask of another
    shape, answer tokens at padding, or a model whose input embeddings are not computed
    exactly once per forward.
    """
    ids = check_tensor("input_ids", input_ids, (None, None))
    B, L = ids.shape
    mask = check_tensor("attention_mask", attention_mask, (B, L), device=ids.device)
    R = response_len
    answer = check_tensor("answer_mask", answer_mask, (B, R), dtype=torch.bool, device=ids.device)
    if not noise_std > 0:
        raise CreditError(f"noise_std: expected a value > 0, got {noise_std!r}")
    real = mask[:, L - R :] != 0
    if bool((answer & ~real).any()):
        raise CreditError("answer_mask: expected answer tokens among the real response tokens")
    reasoning = reasoning_mask(real, answer)
    if not bool(reasoning.any()):  # no row has both reasoning and an answer: nothing to take
        return torch.zeros(B, R, dtype=torch.float32, device=ids.device)
    where = predictor_positions(mask, R)
    share = answer.float() / answer.sum(dim=1, keepdim=True).clamp_min(1).float()
    weight, bias = lm_head_of(model)
    inner = unwrap_model(model)
    embeddings = inner.get_input_embeddings()  # type: ignore[operator]
    with torch.no_grad():
        hidden = final_hidden_states(model, ids, mask)
        logp0 = torch.log_softmax(_answer_logits(hidden, where, share, weight, bias), dim=-1)
        del hidden
    noisy = torch.cat([torch.zeros_like(mask, dtype=torch.bool)[:, : L - R], reasoning], dim=1)
    leaves: list[torch.Tensor] = []

    def perturbed(_module: torch.nn.Module, _args: object, out: torch.Tensor) -> torch.Tensor:
        leaf = out.detach().requires_grad_(True)
        leaves.append(leaf)
        eps = torch.randn(out.shape, generator=generator, device=generator.device)
        eps = (eps.to(out.device) * noise_std * noisy.unsqueeze(2)).to(out.dtype)
        return leaf + eps

    handle = embeddings.register_forward_hook(perturbed)
    try:
        with torch.enable_grad(), frozen(inner):
            hidden = final_hidden_states(model, ids, mask)
            if len(leaves) != 1:
                raise CreditError(
                    f"model: expected its input embeddings computed once per forward, got "
                    f"{len(leaves)} calls of {type(embeddings).__name__}"
                )
            logits = _answer_logits(hidden, where, share, weight, bias)
            logp = torch.log_softmax(logits, dim=-1)
            J = (logp0.exp() * (logp0 - logp)).sum()
            (grad,) = torch.autograd.grad(J, leaves[0])
    finally:
        handle.remove()
    s = (grad.float() * leaves[0].detach().float()).sum(dim=-1).abs()[:, L - R :]
    return torch.where(reasoning, s, 0.0)
