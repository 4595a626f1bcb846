"""P2T: token rewards by gradient x input attribution of the reward model (Wu et al., CVPR
2026, "Unlocking Token Rewards via Training-Free Reward Attribution"; docs/design.md,
"Gradient x input attribution (P2T)").

The token reward r_t = (e_t - e_null) . dR/de_t is the first-order estimate of how much the
reward falls when token t is replaced by a null token (``credit_core.attribution``); it is
computed by the backend from the reward gradient it takes anyway (``reward_attribution``),
so P2T costs no reward-model pass beyond DATC's.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, Field

from credit_core.attribution import DEFAULT_NULL, NullEmbedding
from credit_core.baseline_strategies import TokenRewardParams, reward_form_for_critic
from credit_core.batch import CreditBatch
from credit_core.strategy import CreditResult, CreditStrategy, CriticRewardForm, builtin
from credit_core.tensor_checks import check_finite_at


class P2TParams(TokenRewardParams):
    """``TokenRewardParams`` (mode, allocation, paper route) plus ``null``: the null
    embedding e_null (``credit_core.attribution.NULL_EMBEDDINGS``; default ``pad``, the RM's
    pad-token embedding: the paper's null is a token, and the pad token, the one the RM is
    fed where there is no content, is the one every direction model has)."""

    null: NullEmbedding = Field(DEFAULT_NULL, description="null embedding: pad, unk or zero")


@builtin
class P2TStrategy(CreditStrategy):
    """P2T with r_t = ``batch.reward_attribution``, finite at valid tokens (``CreditError``
    naming the rows otherwise).

    - ``mean``, allocation ``aligned`` (this library's mean form): w_t = n (max(sign(A) r_t,
      0) + eps) / sum_k (max(sign(A) r_k, 0) + eps) over the response's n valid tokens,
      A_t = A w_t: w >= 0 and mean 1, so the sign and the per-response mean of A are kept; a
      response whose r_t all oppose sign(A) gets (near) uniform weights from the floor
      (counted in ``uniform_fallbacks``); A = 0 gives w = 1. The RED mean form applied to
      r_t (``aligned_result``).
    - ``mean``, allocation ``softmax_floor``: DATC's allocation of sign(A) r_t with beta,
      lam (``softmax_floor_result``): the matched-allocation control.
    - ``paper``: A_t = (G_t - mean_g G_0) / (std_g G_0 + 1e-6) with G_t = sum_{k >= t} r_k
      within each group (``group_return_advantages``; reads the groups), or with
      ``paper_route: step_norm`` ``group_step_advantages``. r_t is the direction model's
      attribution: no form reads the task's reward where a separate scorer sets it.
    """

    name = "p2t"
    requires = frozenset({"reward_attribution"})
    Params: ClassVar[type[BaseModel]] = P2TParams
    params: P2TParams

    @property
    def attribution_null(self) -> NullEmbedding:
        return self.params.null

    @property
    def reads_groups(self) -> bool:
        return self.params.mode == "paper"

    @classmethod
    def critic_form(cls, params: BaseModel) -> CriticRewardForm | None:
        return reward_form_for_critic(params)

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        batch.require(self.requires, self.name)
        r = batch.reward_attribution
        assert r is not None  # guaranteed by batch.require
        check_finite_at("CreditBatch.reward_attribution", r, batch.mask)
        return self.params.assign(batch, r, self.name)
