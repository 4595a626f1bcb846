"""One reward-model pass for TRL's reward and DATC's reward gradient.

TRL scores a model reward function in ``_calculate_rewards``: the prompt + completion text,
re-tokenized by the reward model's tokenizer (right-padded, no special tokens added), one
forward under ``torch.inference_mode()``, reward = ``logits[:, 0]``. Where the direction
model is that same reward model (``CreditGRPOTrainer`` built it from TRL's reward
functions) and the strategy reads the reward gradient at the sampled tokens (the ``datc``
family), ``GradientRewardModel`` stands in TRL's list for the reward model: TRL calls it
exactly as it calls the model, and it runs the model on the same inputs with the input
embeddings as a leaf (``adapters.input_grad``): one backward of sum(logits[:, 0]) gives
dR/dx at every RM position. TRL gets the same logits (detached); the gradient is kept for
the credit (``take``). One RM forward and one backward, no second forward.

``completion_reward_grad`` moves that gradient (B, L, d) from the RM's positions to the
policy's completion tokens (B, T, d): a row's completion tokens, without the special
tokens TRL's decoding drops, are found as the last contiguous run of the same ids in the
RM's input (the tokenizers are the same); rows where they are not found (the text
re-tokenized otherwise across the prompt/completion boundary, a chat template around the
completion) are reported, and ``fill_unmatched`` takes their gradient from the direction
model's own pass. Under ZeRO-3 that pass is a collective (the reward model's partitioned
weights are all-gathered in its forward and backward) while the rows to fill differ between
processes: every process then scores as many rows as the process with the most
(``agree``), padded with copies of its first row whose gradient is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from adapters.direction import AgreeCount
from adapters.input_grad import forward_with_input_grad, unwrapped
from credit_core import CreditError


@dataclass(frozen=True)
class RewardPass:
    """One call of the reward model by TRL: its inputs ``input_ids`` / ``attention_mask``
    (B, L) and dR/dx ``grad`` (B, L, d) float32 at every position (0 at padding)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    grad: torch.Tensor


class GradientRewardModel(torch.nn.Module):
    """``model`` (TRL's reward model, or the DeepSpeed engine TRL's ``prepare_deepspeed``
    wrapped it in under any DeepSpeed config) that also keeps dR/d(input embeddings) of
    every call (``take``).

    ``forward(**inputs)`` returns ``model``'s output on the same inputs with its logits
    detached (bitwise the engine's), from one forward with grad and one backward of the
    module inside the engine (``forward_with_input_grad``: the engine's own forward would
    refuse the backward, or scale it for gradient accumulation; the weights get no
    gradient). Under ZeRO-3 the pass is a collective, as TRL's forward is (one per call on
    every process), and the weights are partitions again after it.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self._passes: list[RewardPass] = []

    @property
    def config(self) -> Any:
        """The reward model's config (a DeepSpeed engine holds the model as ``.module``)."""
        return unwrapped(self.model).config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> Any:
        out, grad = forward_with_input_grad(
            self.model,
            lambda module: module(input_ids=input_ids, attention_mask=attention_mask, **kwargs),
            lambda out: out.logits[:, 0],
        )
        mask = attention_mask.bool().unsqueeze(2)
        self._passes.append(
            RewardPass(input_ids, attention_mask, torch.where(mask, grad.detach().float(), 0.0))
        )
        out.logits = out.logits.detach()
        return out

    def take(self) -> RewardPass:
        """The one pass since the last ``take`` (``CreditError`` if there were none or
        several: TRL calls the model once per generation batch)."""
        passes, self._passes = self._passes, []
        if len(passes) != 1:
            raise CreditError(
                f"reward model: expected one scoring call since the last batch, got {len(passes)}"
            )
        return passes[0]

    def discard(self) -> None:
        """Forget the passes not taken (a batch abandoned by an exception)."""
        self._passes = []


def completion_reward_grad(
    rm: RewardPass,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    special_ids: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dR/dx at the completion tokens (B, T, d) float32 from the RM pass ``rm`` of the same
    B rows, and which rows were matched (B,) bool.

    A row's completion tokens that the RM read are its valid tokens (``completion_mask``)
    that are not in ``special_ids`` (TRL decodes with ``skip_special_tokens``); they get the
    gradient at the last contiguous run of the same ids among the row's attended RM
    positions, and every other token 0. An unmatched row is all 0 (the caller takes it from
    elsewhere). One vectorized window comparison per row, no loop over tokens.
    """
    B, T = completion_ids.shape
    if rm.input_ids.shape[0] != B:
        raise CreditError(
            f"reward model pass: {rm.input_ids.shape[0]} rows, the completions have {B}"
        )
    d = rm.grad.shape[2]
    out = torch.zeros(B, T, d, dtype=torch.float32, device=rm.grad.device)
    matched = torch.zeros(B, dtype=torch.bool)
    ids = completion_ids.to(rm.input_ids.device)
    read = completion_mask.bool().to(ids.device) & ~torch.isin(ids, special_ids.to(ids.device))
    for i in range(B):
        cols = read[i].nonzero().squeeze(1)
        wanted = ids[i, cols]
        attended = rm.attention_mask[i].bool().nonzero().squeeze(1)
        row = rm.input_ids[i, attended]
        n = int(wanted.numel())
        if n == 0:
            matched[i] = True
            continue
        if row.numel() < n:
            continue
        hits = (row.unfold(0, n, 1) == wanted).all(dim=1).nonzero()
        if hits.numel() == 0:
            continue
        start = int(hits[-1])
        out[i, cols.to(out.device)] = rm.grad[i, attended[start : start + n]]
        matched[i] = True
    return out, matched


#: The keys of TRL's generation batch that a scoring pass reads.
ROLLOUT_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")


def fill_unmatched(
    grad: torch.Tensor,
    matched: torch.Tensor,
    batch: Mapping[str, torch.Tensor],
    score: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    agree: AgreeCount | None = None,
) -> int:
    """Write the direction model's own gradient into ``grad`` (B, T, d) at the rows not
    ``matched`` (B,) bool by ``completion_reward_grad``; returns how many rows that was.

    ``score`` gives dR/dx (b, T, d) of the rows of ``batch`` it is handed (``ROLLOUT_KEYS``,
    b rows: the direction model's pass, with grad). Without ``agree`` it gets the unmatched
    rows only, and is not called when there are none. With ``agree`` (the direction model's
    forwards are collectives), every process hands it the largest number of unmatched rows
    of any process, its own followed by copies of its first row whose gradient is dropped;
    no process calls it when no process has a row to fill.
    """
    missing = (~matched).nonzero().squeeze(1)
    n = int(missing.numel())
    rows = n if agree is None else agree(n)
    if rows == 0:
        return 0
    if grad.shape[0] == 0:
        raise CreditError(
            "reward model pass: a process without rows cannot take part in the other "
            "processes' passes of a ZeRO-3 partitioned reward model"
        )
    index = torch.cat([missing, missing.new_zeros(rows - n)])
    again = score({key: batch[key][index.to(batch[key].device)] for key in ROLLOUT_KEYS})
    if n:
        grad[missing.to(grad.device)] = again[:n].to(grad.device, torch.float32)
    return n
