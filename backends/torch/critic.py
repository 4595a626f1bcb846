"""PPO's critic for ``algorithm.estimator: gae``: a copy of the policy with a scalar head.

The critic is a separate model initialised from the policy's weights (as OpenRLHF's and
verl's critics start from the actor's checkpoint): a deep copy of the policy's decoder
(its transformer up to the final norm, without the LM head) and a linear value head
``hidden -> 1`` without bias, drawn from N(0, 1/(H + 1)^2) (OpenRLHF's value-head init), so
the first values are near 0. It is trained beside the policy with its own optimizer
(``GRPORecipe.update``). A separate model rather than a head on the policy's trunk: the
value loss then never moves the policy, as in OpenRLHF and verl.

``response_values`` reads V(s_t) at the position that predicts response token t, the
position of the policy's log-prob of t (``adapters.policy.predictor_positions``).
"""

from __future__ import annotations

import copy
from typing import cast

import torch
from transformers import PreTrainedModel

from adapters.policy import position_ids_from_mask, predictor_positions
from credit_core import CreditError
from credit_core.tensor_checks import check_tensor

#: The critic's entry in a checkpoint's ``TrainingState.extra``.
CHECKPOINT_KEY = "critic"


class CriticModule(torch.nn.Module):
    """The unit DDP/FSDP wrap: the decoder as ``.module`` (FSDP shards its layers, as the
    policy's) and the value head. ``forward(input_ids, attention_mask)`` gives the values
    (B, L) float32 at every position."""

    def __init__(self, decoder: torch.nn.Module, hidden_size: int, *, seed: int) -> None:
        super().__init__()
        self.module = decoder
        param = next(decoder.parameters())
        head = torch.nn.utils.skip_init(  # type: ignore[no-untyped-call]
            torch.nn.Linear, hidden_size, 1, bias=False, device=param.device, dtype=param.dtype
        )
        generator = torch.Generator(device="cpu").manual_seed(seed)
        init = torch.randn(1, hidden_size, generator=generator) / (hidden_size + 1)
        with torch.no_grad():
            head.weight.copy_(init)
        self.value_head = head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.module(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        )
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return cast(torch.Tensor, self.value_head(hidden)).squeeze(-1).float()


def build_critic(policy: PreTrainedModel, *, seed: int) -> CriticModule:
    """A critic initialised from ``policy`` (a Hugging Face causal LM): a copy of its
    decoder (``get_decoder()``), trainable, and a value head seeded by ``seed``."""
    decoder = policy.get_decoder()  # type: ignore[no-untyped-call]
    if decoder is policy or not isinstance(decoder, torch.nn.Module):
        raise CreditError(
            f"policy: {type(policy).__name__} has no separate decoder (get_decoder()) to copy "
            "for the critic of algorithm.estimator: gae"
        )
    hidden = int(policy.config.hidden_size)
    critic = CriticModule(copy.deepcopy(decoder).requires_grad_(True), hidden, seed=seed)
    return critic.eval()


def response_values(
    critic: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
) -> torch.Tensor:
    """V(s_t) (B, R) float32 of response token t = ``input_ids[:, P + t]`` (adapters'
    layout: [left-padded prompt | right-padded response], R = ``response_len``): the
    critic's value at the position predicting token t; exactly 0 at padding.
    Differentiable under the caller's grad mode."""
    ids = check_tensor("input_ids", input_ids, (None, None))
    B, L = ids.shape
    mask = check_tensor("attention_mask", attention_mask, (B, L), device=ids.device)
    if not 1 <= response_len < L:
        raise CreditError(
            f"response_len: expected an integer in [1, {L - 1}], got {response_len!r}"
        )
    values = critic(input_ids=ids, attention_mask=mask)
    gathered = values.gather(1, predictor_positions(mask, response_len))
    real = mask[:, L - response_len :] != 0
    return torch.where(real, gathered, torch.zeros((), dtype=gathered.dtype, device=ids.device))
