"""P2T's token reward: the gradient x input attribution of the reward model's score
(docs/design.md, "Gradient x input attribution (P2T)").

Replacing token t's RM input embedding e_t by a null embedding e_null changes the reward by

    R(x) - R(x with e_t := e_null) = (e_t - e_null) . g_t + O(||e_t - e_null||^2),

g_t = dR / de_t, the reward gradient every DATC-family strategy already reads
(``CreditBatch.reward_grad``): the first-order term is the token reward r_t, one dot product
per token from that gradient, with no further reward-model pass. e_t is the sampled token's
row of the direction model's embedding table in the policy vocabulary (the bridged table
E' for an RM with another tokenizer), e_null one of ``NULL_EMBEDDINGS``:

- ``pad``: the RM's embedding of the id it pads its inputs with (its tokenizer's pad token,
  else its eos token; the default, see ``DEFAULT_NULL``);
- ``unk``: the RM tokenizer's unknown token (an RM whose tokenizer has none cannot use it);
- ``zero``: the zero vector (plain gradient x input).
"""

from __future__ import annotations

from typing import Literal, cast, get_args

import torch

from credit_core.errors import CreditError
from credit_core.tensor_checks import check_tensor

NullEmbedding = Literal["pad", "unk", "zero"]
NULL_EMBEDDINGS: tuple[str, ...] = get_args(NullEmbedding)
#: The default null: the paper replaces a token by a *semantically null token*; the RM's pad
#: token is the token it is fed where there is no content, and every direction model has one
#: (``unk`` is missing from most byte-level BPE tokenizers; ``zero`` is no token's embedding).
DEFAULT_NULL: NullEmbedding = "pad"


def reward_attribution(
    reward_grad: torch.Tensor,
    token_ids: torch.Tensor,
    mask: torch.Tensor,
    reward_embedding: torch.Tensor,
    null_embedding: torch.Tensor,
) -> torch.Tensor:
    """r_t = (E[y_t] - e_null) . g_t (B, T), exactly 0 where ``mask`` is False.

    - reward_grad (B, T, d) floating: g_t at the policy's response positions.
    - token_ids (B, T) integer: the sampled tokens y_t, in [0, V) where ``mask`` is True
      (padding may hold any id).
    - mask (B, T) bool: the valid response tokens.
    - reward_embedding (V, d) floating: E, the RM's embedding table in the policy vocabulary.
    - null_embedding (d,) floating: e_null.

    Computed as E[y_t] . g_t - e_null . g_t in float32 (float64 if an input is float64): one
    (B, T, d) gather of E, never a (B, T, V) tensor. Non-finite gradients give non-finite
    r_t (the strategy decides). Everything on ``reward_grad``'s device; ``CreditError``
    naming the tensor otherwise, or for a bad shape or an id out of range.
    """
    g = check_tensor("reward_grad", reward_grad, (None, None, None), floating=True)
    B, T, d = g.shape
    dev = g.device
    m = check_tensor("mask", mask, (B, T), dtype=torch.bool, device=dev)
    ids = check_tensor("token_ids", token_ids, (B, T), device=dev)
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise CreditError(f"token_ids: expected an integer dtype, got {ids.dtype}")
    E = check_tensor("reward_embedding", reward_embedding, (None, d), floating=True, device=dev)
    null = check_tensor("null_embedding", null_embedding, (d,), floating=True, device=dev)
    V = E.shape[0]
    real = ids[m]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= V):
        raise CreditError(
            f"token_ids: expected values in [0, {V}) (the embedding table's rows) at valid "
            f"tokens, got [{int(real.min())}, {int(real.max())}]"
        )
    acc = torch.promote_types(torch.promote_types(g.dtype, E.dtype), torch.float32)
    acc = torch.promote_types(acc, null.dtype)
    ga = g.to(acc)
    e = E[torch.where(m, ids, 0).long()].to(acc)
    r = torch.einsum("btd,btd->bt", e, ga) - ga @ null.to(acc)
    return torch.where(m, r, 0.0)


def check_null(kind: object) -> NullEmbedding:
    """``kind``, checked to name a null embedding (``NULL_EMBEDDINGS``)."""
    if kind not in NULL_EMBEDDINGS:
        raise CreditError(f"null: expected one of {list(NULL_EMBEDDINGS)}, got {kind!r}")
    return cast(NullEmbedding, kind)
