"""OpenRLHF's batch layout, and the conversions to the adapters' [prompt | response] layout.

OpenRLHF 0.11 (``Experience``): ``sequences`` (B, T) token ids and ``attention_mask`` (B, T)
hold each sample's prompt and response (and, for agents, interleaved observations), right
padded; per-token tensors (log-probs, advantages, ``action_mask``) are (B, A) "action
coordinates": column j stands for token ``T - A + j`` of the sequence, whose log-prob comes
from the model output at position ``T - A + j - 1``. In 0.11, A = T - 1.

The adapters (``DirectionModel.score``) take a left-padded prompt (B, P) and a right-padded
response (B, R). Here the response of a sample runs from its first action token to its last
attended token (observation tokens of a multi-turn sample are part of it, the RM reads the
whole transcript); the prompt is everything attended before it. A sample without any action
token gets its last token as response, so no row is empty (its credit is never used).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from credit_core import CreditError


@dataclass(frozen=True)
class ResponseSplit:
    """One batch in the adapters' layout, plus where each response starts in ``sequences``.

    - ``prompt_ids``, ``prompt_mask`` (B, P) long: left-padded prompts (mask 1 on tokens).
    - ``response_ids``, ``response_mask`` (B, R) long: right-padded responses.
    - ``start`` (B,) long: index in ``sequences`` of each response's first token.
    - ``length`` (B,) long: number of response tokens (>= 1).
    - ``sequence_length``: T, the width of the OpenRLHF batch it was cut from.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    sequence_length: int


def check_layout(
    sequences: torch.Tensor, attention_mask: torch.Tensor, action_mask: torch.Tensor
) -> None:
    """Raise ``CreditError`` unless the three tensors form an OpenRLHF batch (see module doc)."""
    if sequences.dim() != 2:
        raise CreditError(f"sequences: expected shape (B, T), got {tuple(sequences.shape)}")
    B, T = sequences.shape
    if tuple(attention_mask.shape) != (B, T):
        raise CreditError(
            f"attention_mask: expected shape {(B, T)} (as sequences), got "
            f"{tuple(attention_mask.shape)}"
        )
    if action_mask.dim() != 2 or action_mask.shape[0] != B or not 0 < action_mask.shape[1] < T:
        raise CreditError(
            f"action_mask: expected shape (B={B}, A) with 0 < A < T={T}, got "
            f"{tuple(action_mask.shape)}"
        )
    if not bool(attention_mask.bool().any(dim=1).all()):
        raise CreditError("attention_mask: every sample needs at least one attended token")


def action_token_ids(sequences: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """(B, A) long: the token at each action coordinate, ``sequences[:, T - A:]``."""
    A = action_mask.shape[1]
    return sequences[:, sequences.shape[1] - A :].long()


def split_prompt_response(
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    action_mask: torch.Tensor,
    pad_token_id: int = 0,
) -> ResponseSplit:
    """Cut every sample of an OpenRLHF batch into (left-padded prompt, right-padded response).

    ``pad_token_id`` fills the padded slots (masked out, any valid id works).
    """
    check_layout(sequences, attention_mask, action_mask)
    B, T = sequences.shape
    offset = T - action_mask.shape[1]
    device = sequences.device
    acts = action_mask.bool()
    attended = attention_mask.bool()
    pos = torch.arange(T, device=device).expand(B, T)
    first_attended = torch.where(attended, pos, T).amin(dim=1)
    last_attended = torch.where(attended, pos, -1).amax(dim=1)
    first_action = offset + acts.long().argmax(dim=1)
    start = torch.where(acts.any(dim=1), first_action, last_attended)
    length = last_attended - start + 1
    if not bool((length >= 1).all()):
        rows = torch.nonzero(length < 1).flatten().tolist()
        raise CreditError(f"action_mask: samples {rows} have action tokens after their last token")
    prompt_len = start - first_attended
    P = max(int(prompt_len.max()), 1)
    R = int(length.max())

    k = torch.arange(P, device=device).expand(B, P)
    prompt_valid = k >= (P - prompt_len).unsqueeze(1)
    src = (start.unsqueeze(1) - P + k).clamp(0, T - 1)
    prompt_ids = torch.where(prompt_valid, sequences.gather(1, src), pad_token_id)

    k = torch.arange(R, device=device).expand(B, R)
    response_valid = k < length.unsqueeze(1)
    src = (start.unsqueeze(1) + k).clamp(0, T - 1)
    response_ids = torch.where(response_valid, sequences.gather(1, src), pad_token_id)
    return ResponseSplit(
        prompt_ids=prompt_ids.long(),
        prompt_mask=prompt_valid.long(),
        response_ids=response_ids.long(),
        response_mask=response_valid.long(),
        start=start,
        length=length,
        sequence_length=T,
    )


def response_to_action_coords(
    values: torch.Tensor, split: ResponseSplit, action_mask: torch.Tensor
) -> torch.Tensor:
    """Move per-response-token ``values`` (B, R, ...) to action coordinates (B, A, ...).

    Column j takes the value of the response token at sequence index ``T - A + j``; it is 0
    where ``action_mask`` is False (prompt, observation tokens, padding).
    """
    B, R = split.response_ids.shape
    if values.dim() < 2 or tuple(values.shape[:2]) != (B, R):
        raise CreditError(
            f"values: expected leading shape (B={B}, R={R}) (the response layout), got "
            f"{tuple(values.shape)}"
        )
    A = action_mask.shape[1]
    if tuple(action_mask.shape) != (B, A) or not 0 < A < split.sequence_length:
        raise CreditError(
            f"action_mask: expected shape (B={B}, A) with 0 < A < T={split.sequence_length}, "
            f"got {tuple(action_mask.shape)}"
        )
    acts = action_mask.bool().to(values.device)
    offset = split.sequence_length - A
    j = torch.arange(A, device=values.device).expand(B, A)
    k = offset + j - split.start.to(values.device).unsqueeze(1)
    valid = acts & (k >= 0) & (k < split.length.to(values.device).unsqueeze(1))
    index = k.clamp(0, R - 1)
    trailing = values.shape[2:]
    gathered = values.gather(1, index.view(B, A, *([1] * len(trailing))).expand(B, A, *trailing))
    return torch.where(valid.view(B, A, *([1] * len(trailing))), gathered, 0.0)


def action_to_response_coords(
    values: torch.Tensor, split: ResponseSplit, action_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Move action-coordinate ``values`` (B, A, ...) to the response layout (B, R, ...),
    the inverse of ``response_to_action_coords`` on the action tokens.

    Returns (moved, is_action): ``moved`` holds at response position k of row b the value of
    action column ``start_b + k - (T - A)``, and 0 where ``is_action`` (B, R) bool is False
    (observation tokens of a multi-turn sample, padding).
    """
    A = action_mask.shape[1]
    B, R = split.response_ids.shape
    if values.dim() < 2 or tuple(values.shape[:2]) != (B, A):
        raise CreditError(
            f"values: expected leading shape (B={B}, A={A}) (action coordinates), got "
            f"{tuple(values.shape)}"
        )
    device = values.device
    offset = split.sequence_length - A
    k = torch.arange(R, device=device).expand(B, R)
    j = split.start.to(device).unsqueeze(1) + k - offset
    inside = (j >= 0) & (j < A) & (k < split.length.to(device).unsqueeze(1))
    index = j.clamp(0, A - 1)
    is_action = inside & action_mask.bool().to(device).gather(1, index)
    trailing = values.shape[2:]
    shape = (B, R, *([1] * len(trailing)))
    gathered = values.gather(1, index.view(shape).expand(B, R, *trailing))
    return torch.where(is_action.view(shape), gathered, 0.0), is_action
