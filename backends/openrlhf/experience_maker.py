"""The token-credit experience maker: OpenRLHF's ``RemoteExperienceMaker`` plus credit.

``TokenCreditExperienceMaker.compute_advantages_and_returns`` first runs OpenRLHF's own
(shaped rewards, estimator, returns, advantages) on the step's rollout batch (every
micro-batch ``Experience`` of one ``make_experience_batch`` call), then:

1. reads each response's advantage A_i (the advantage of any action token: the
   estimators the strategy accepts give one value per response; checked);
2. gathers the signals the strategy requires from the actors that hold them (policy
   statistics, DATC's W0 or the token entropy from the policy actors, which took them from
   OpenRLHF's own log-prob forward in ``make_experience``; the reward gradient, P2T's
   attribution of it, attention or prefix rewards from the actors hosting the direction
   model), dispatched with OpenRLHF's
   ``RayActorGroup.async_run_method_batch`` over the same micro-batches as the log-prob
   forward (a path strategy with the direction model on the reward-model actors: the
   policy actors' first, each micro-batch's m1 then handed to the reward-model actors; on
   the one-pass path the reward actors hand over the gradient their reward forward took);
3. hands the step to the process's credit (``backends.openrlhf.credit.OpenRLHFCredit``, on
   the one seam ``CreditRun``), which writes the token advantages into
   ``experience.advantages`` (0 off the action tokens; ``returns`` are left alone) and,
   for a strategy that reads a direction model, measures its agreement with the reward
   once over the whole step;
4. logs the diagnostics and that agreement (``credit/direction_agreement``... or
   ``credit/direction_is_reward``) through ``experience.info`` as (B,) tensors, which
   OpenRLHF's policy actors average into the step status it sends to wandb / TensorBoard
   (``weight_max`` / ``weight_min`` and the agreement are the whole step's, the same in
   every micro-batch, so the average is the step's).

How the strategy sees the step (``OpenRLHFCredit``): as ONE batch for a strategy that
selects tokens across the step (``gathers``: ``entropy_top``, ``random_top``; the
driver-side maker holds every response, no ``gather`` is needed) or reads the response
rewards and their groups (``reads_groups``: ``ktae``, the paper forms of ``abc``, ``red``
and ``p2t``), with R_i the reward OpenRLHF's estimator normalized (``experience.rewards``
after its length penalties) and each prompt's ``--rollout.n_samples_per_prompt`` samples a
group (``Experience.index`` // n, so a group split over micro-batches is whole); one
micro-batch at a time otherwise. The actors compute a step's signals in one dispatch, and
the maker fetches them one micro-batch at a time as it credits it
(``dispatch.run_method_per_item``, ``StepSignals``): the trainer actor holds one
micro-batch's (B, A, d) signals (and the previous one's, until it is dropped) whatever the
step's size.

Everything happens inside this one call on whole micro-batches, before OpenRLHF splits or
rebalances them, so nothing relies on extra ``Experience`` attributes (those are dropped on
a split); the credit lives in the standard ``advantages`` and ``info`` fields.

A strategy that reads the reward function's token rewards (``process``) gets them from the
``extra_logs`` of each sample (``backends.openrlhf.given_rewards``): ``split_rollout_samples``
takes them out of each single sample's ``info`` before OpenRLHF concatenates the rollout
into micro-batches, and the credit reads them against the step's action masks.

With the ``uniform`` strategy nothing is gathered and the advantages are OpenRLHF's own,
untouched: training is stock OpenRLHF bit for bit (only ``credit/*`` constants are logged).

Under a critic (``--algo.advantage.estimator gae``, ``under_critic``) the advantages are
OpenRLHF's GAE: the maker adds the strategy's shift D (``OpenRLHFCredit.critic_credit``) to the
token rewards OpenRLHF hands its ``get_advantages_and_returns``, and leaves the rest to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import ray
import torch
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from backends.openrlhf.actor_side import (
    ActorCreditState,
    ActorSignals,
    Role,
    bind_credit_methods,
    direction_gives_attention,
    direction_path_problem,
    export_reward_embedding,
    import_reward_embedding,
    null_token_id,
    prepare_attribution,
    signals_method,
)
from backends.openrlhf.compat import (
    EMBEDDING_SIGNALS,
    LOGITS_SIGNALS,
    SCORING_SIGNALS,
    ResolvedCredit,
    check_direction_capabilities,
)
from backends.openrlhf.credit import OpenRLHFCredit, StepCredit
from backends.openrlhf.dispatch import run_method_per_item
from backends.openrlhf.given_rewards import take_reward_items
from credit_core import CreditError
from credit_core.allocation import UNIFORM_DIAGNOSTICS

#: Gathers the signals of a list of micro-batches: one ``ActorSignals`` per Experience, in
#: order (an iterator fetches them one micro-batch at a time).
SignalGatherer = Callable[[Sequence[Experience]], Iterable[ActorSignals]]


def log_diagnostics(experience: Experience, values: dict[str, float]) -> None:
    """Put batch-level ``values`` into ``experience.info`` as (B,) float32 tensors.

    OpenRLHF's ``info`` entries are per sample (its batch splitting requires length B); the
    policy actors average them, weighted by samples, into the logged step status.
    """
    B = experience.action_mask.shape[0]
    for key, value in values.items():
        experience.info[key] = torch.full((B,), float(value), dtype=torch.float32)


class StepSignals:
    """The signals of a step's ``count`` micro-batches, in order, taken from ``source`` one
    micro-batch at a time as they are iterated (once): a consumer that drops each before
    taking the next holds one micro-batch's (B, A, d) signals, whatever the step's size.
    ``seconds``: the time spent taking them; ``logged``: what the diagnostics read of each
    taken one (``ActorSignals.logged``). ``CreditError`` when ``source`` gives another
    number of them."""

    def __init__(self, source: Iterable[ActorSignals], count: int) -> None:
        self._source = source
        self.count = count
        self.seconds = 0.0
        self.logged: list[ActorSignals] = []

    def __iter__(self) -> Iterator[ActorSignals]:
        found = iter(self._source)
        for i in range(self.count):
            start = time.perf_counter()
            signals = next(found, None)
            self.seconds += time.perf_counter() - start
            if signals is None:
                raise CreditError(
                    f"credit signals: expected one per micro-batch ({self.count}), got {i}"
                )
            self.logged.append(signals.logged())
            yield signals
        if next(found, None) is not None:
            raise CreditError(
                f"credit signals: expected one per micro-batch ({self.count}), got more"
            )


class TokenCreditExperienceMaker(RemoteExperienceMaker):  # type: ignore[misc]
    """``RemoteExperienceMaker`` whose advantages are split over tokens by a credit strategy.

    Constructed like OpenRLHF's (same positional arguments) plus ``credit``; or from a live
    one with ``replacing``. ``gather_signals`` replaces the Ray dispatch (tests run the
    actor-side functions in-process with it); by default the policy (and reward-model)
    actors get ``credit_<role>_signals`` bound at construction, when the strategy needs
    signals.
    """

    def __init__(
        self,
        *args: Any,
        credit: ResolvedCredit,
        gather_signals: SignalGatherer | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.credit = credit
        #: the process's credit: its one ``CreditRun``, on the plan ``credit`` holds
        self.credit_run = OpenRLHFCredit(credit)
        self.credit_strategy = self.credit_run.strategy
        self._gather_signals: SignalGatherer = gather_signals or self._gather_from_actors
        #: under a critic, the step whose GAE OpenRLHF is computing, and its pending shifts
        self._critic_step: list[Experience] | None = None
        self._critic_shifts: list[tuple[Experience, torch.Tensor]] = []
        #: whether the actors are ready for the first step (``prepare_actors``)
        self._actors_ready = not credit.requires or gather_signals is not None
        if not self._actors_ready:
            self._bind_actor_methods()

    @classmethod
    def replacing(
        cls, stock: RemoteExperienceMaker, credit: ResolvedCredit
    ) -> TokenCreditExperienceMaker:
        """A token-credit maker sharing every part (actor groups, KL controller...) of ``stock``."""
        return cls(
            stock.actor_model_group,
            stock.critic_model_group,
            stock.reward_model_group,
            stock.initial_model_group,
            stock.kl_ctl,
            stock.strategy,
            stock.tokenizer,
            credit=credit,
        )

    @property
    def under_critic(self) -> bool:
        """PPO with a critic (``--algo.advantage.estimator gae``) and a strategy other than
        ``uniform``: the credit enters as a shift of the token rewards
        (``OpenRLHFCredit.critic_credit``), not as token advantages."""
        return self.advantage_estimator == "gae" and self.credit_strategy.name != "uniform"

    def split_rollout_samples(self, rollout_samples: list[Experience]) -> list[Experience]:
        """OpenRLHF's split of the rollout into micro-batches; for a strategy that reads the
        reward function's token rewards, each sample's ``extra_logs`` entries of them are
        first taken out of its ``info`` into one item that the concatenation keeps per row
        (``given_rewards.take_reward_items``)."""
        if self.credit_strategy.reads_token_rewards:
            take_reward_items(rollout_samples)
        batches: list[Experience] = super().split_rollout_samples(rollout_samples)
        return batches

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list[Experience]) -> list[Experience]:
        """OpenRLHF's advantages and returns, then the step's token credit in place
        (``OpenRLHFCredit.grpo_credit``, see the module docstring) and its logs; under a
        critic, OpenRLHF's with the credit's shift in its token rewards."""
        if not self.under_critic:
            experiences = super().compute_advantages_and_returns(experiences)
            if self.credit_strategy.name == "uniform":
                for experience in experiences:
                    log_diagnostics(experience, UNIFORM_DIAGNOSTICS.to_dict())
                return experiences
            signals = self._signals(experiences)
            n = int(self.strategy.args.rollout.n_samples_per_prompt)
            step = self.credit_run.grpo_credit(experiences, signals, n_samples_per_prompt=n)
            self._log(experiences, signals, step)
            return experiences
        self._critic_step = experiences
        try:
            shaped: list[Experience] = super().compute_advantages_and_returns(experiences)
            return shaped
        finally:
            self._critic_step = None
            self._critic_shifts = []

    @torch.no_grad()
    def get_advantages_and_returns(
        self,
        values: torch.Tensor,
        rewards: torch.Tensor,
        action_mask: torch.Tensor,
        gamma: float,
        lambd: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """OpenRLHF's GAE on ``rewards`` (B, A), its token rewards of one micro-batch (the
        outcome reward at the last action token plus its KL term), plus, under a critic, that
        micro-batch's shift D. OpenRLHF calls it once per micro-batch in order, after its
        length penalties: the first call computes the step's shifts (``critic_shifts``)."""
        if self._critic_step is not None:
            if not self._critic_shifts:
                self._critic_shifts = self.critic_shifts(self._critic_step)
            experience, shift = self._critic_shifts.pop(0)
            if experience.action_mask is not action_mask:
                raise CreditError(
                    "get_advantages_and_returns: expected OpenRLHF to compute the micro-batches' "
                    "GAE in the order of the step's experiences"
                )
            rewards = rewards + shift.to(device=rewards.device, dtype=rewards.dtype)
        advantages, returns = super().get_advantages_and_returns(
            values, rewards, action_mask, gamma, lambd
        )
        return advantages, returns

    def critic_shifts(self, experiences: list[Experience]) -> list[tuple[Experience, torch.Tensor]]:
        """Each micro-batch of the step with the shift D of its token rewards (gathering the
        strategy's signals as under GRPO, ``OpenRLHFCredit.critic_credit``), logging the
        credit's diagnostics and the step's agreement."""
        args = self.strategy.args
        signals = self._signals(experiences)
        step = self.credit_run.critic_credit(
            experiences,
            signals,
            n_samples_per_prompt=int(args.rollout.n_samples_per_prompt),
            clip_range=args.reward.clip_range,
        )
        self._log(experiences, signals, step)
        assert step.shifts is not None  # a critic step's
        return list(zip(experiences, step.shifts, strict=True))

    def _signals(self, experiences: list[Experience]) -> StepSignals:
        """The strategy's signals of every micro-batch, taken one at a time (none gathered
        when it reads none)."""
        if not self.credit.requires:
            return StepSignals([ActorSignals() for _ in experiences], len(experiences))
        return StepSignals(self._gather_signals(experiences), len(experiences))

    def _log(
        self, experiences: Sequence[Experience], signals: StepSignals, step: StepCredit
    ) -> None:
        """Each micro-batch's credit diagnostics and the step's agreement
        (``AgreementMetrics.to_dict``) into its ``info`` (``log_diagnostics``), once all of
        ``signals`` were taken."""
        diagnostics = step.diagnostics
        # OpenRLHF averages every info entry: the extremes are logged as the step's, the
        # same in each micro-batch, so that their average is the step's max and min; so are
        # the agreement's (one measure of the whole step)
        shared = {
            "credit/weight_max": max(d.weight_max for d in diagnostics),
            "credit/weight_min": min(d.weight_min for d in diagnostics),
            **({} if step.agreement is None else step.agreement.to_dict()),
        }
        for experience, signal, diag in zip(experiences, signals.logged, diagnostics, strict=True):
            values = {
                **diag.to_dict(),
                **shared,
                "credit/signal_time_s": signals.seconds,
                "credit/extra_policy_forwards": float(signal.extra_policy_forwards),
            }
            log_diagnostics(experience, values)
            if signal.direction_reward is not None:
                experience.info["credit/direction_reward"] = signal.direction_reward.float()

    def _bind_actor_methods(self) -> None:
        """At installation, before OpenRLHF has loaded any model into its actors (its
        ``train_ppo_ray`` creates the trainer first): bind the signal methods (and, on the
        policy actors, the forward wrapper that keeps the logits signals; on the reward-model
        actors of the one-pass path, the forward that gives OpenRLHF's reward and its input
        gradient at once); for a strategy reading the direction model's attention or taking
        the path gradient, build that model (a model of its own, not an actor's) on the
        actors hosting it and refuse it if it cannot serve
        (``compat.check_direction_capabilities``); for one reading P2T's attribution, refuse
        a null embedding the direction model (or, on the one-pass path, the policy
        tokenizer) lacks. What reads the actors' models waits for the first step
        (``prepare_actors``)."""
        credit = self.credit
        chunk = credit.config.stats_chunk_size
        points = self.credit_strategy.reward_grad_points
        null = self.credit_strategy.attribution_null
        on_policy = credit.placement == "policy"
        policy_state = ActorCreditState(
            computes=(credit.requires & LOGITS_SIGNALS)
            | (credit.requires & SCORING_SIGNALS if on_policy else frozenset()),
            direction=credit.direction if on_policy else None,
            tokenizer=self.tokenizer if on_policy else None,
            stats_chunk_size=chunk,
            path_points=points if on_policy else 0,
            attribution_null=null,
            score_samples=bool(points) and on_policy and not credit.direction_is_reward,
        )
        ray.get(
            self.actor_model_group.async_run_method(
                "__ray_call__", bind_credit_methods, "policy", policy_state
            )
        )
        if credit.placement == "reward":
            reward_state = ActorCreditState(
                computes=credit.requires & SCORING_SIGNALS,
                direction=None if credit.one_pass else credit.direction,
                tokenizer=self.tokenizer,
                stats_chunk_size=chunk,
                path_points=points,
                one_pass=credit.one_pass,
                attribution_null=null,
                score_samples=bool(points) and not credit.direction_is_reward,
            )
            ray.get(
                self.reward_model_group.async_run_method(
                    "__ray_call__", bind_credit_methods, "reward", reward_state
                )
            )
        group, role = self._direction_host()
        if "reward_attention" in credit.requires:
            answers = ray.get(
                group.async_run_method("__ray_call__", direction_gives_attention, role)
            )
            check_direction_capabilities(credit, gives_attention=all(answers))
        if points:
            problems = ray.get(group.async_run_method("__ray_call__", direction_path_problem, role))
            check_direction_capabilities(credit, path_problem=next(filter(None, problems), None))
        if "reward_attribution" in credit.requires:
            if credit.one_pass:  # the row is read from OpenRLHF's reward model at the first step
                try:
                    null_token_id(null, self.tokenizer)
                except CreditError as err:
                    raise self._attribution_refusal(str(err)) from err
            else:
                self._prepare_attribution()

    def _direction_host(self) -> tuple[Any, Role]:
        """The actor group hosting the reward gradient and its role."""
        if self.credit.placement == "reward":
            return self.reward_model_group, "reward"
        return self.actor_model_group, "policy"

    def _attribution_refusal(self, problem: str) -> CreditError:
        return CreditError(
            f"--credit: strategy {self.credit_strategy.name!r} reads reward_attribution: {problem}"
        )

    def _prepare_attribution(self) -> None:
        """Every actor hosting the gradient reads its null embedding now (on the one-pass path
        a row of OpenRLHF's reward model, gathered under ZeRO-3: a collective)."""
        group, role = self._direction_host()
        problems = ray.get(group.async_run_method("__ray_call__", prepare_attribution, role))
        problem = next(filter(None, problems), None)
        if problem is not None:
            raise self._attribution_refusal(problem)

    def prepare_actors(self) -> None:
        """Once, before the first step's forwards (OpenRLHF has loaded its models by then):
        the policy actors get the direction model's embedding table from the reward-model
        actors (when the statistics need it there), and the one-pass reward actors read
        P2T's null embedding from OpenRLHF's reward model."""
        if self._actors_ready:
            return
        credit = self.credit
        if credit.placement == "reward" and credit.requires & EMBEDDING_SIGNALS:
            self._share_reward_embedding()
        if credit.one_pass and "reward_attribution" in credit.requires:
            self._prepare_attribution()
        self._actors_ready = True

    @torch.no_grad()
    def make_experience(self, samples_list: list[Experience]) -> list[Experience]:
        """OpenRLHF's ``make_experience``, the actors prepared first (``prepare_actors``)."""
        self.prepare_actors()
        experiences: list[Experience] = super().make_experience(samples_list)
        return experiences

    def _gather_from_actors(self, experiences: Sequence[Experience]) -> Iterator[ActorSignals]:
        """Every micro-batch's signals from the actors holding them, merged, in order, one
        micro-batch at a time: each group computes the whole step at once, dispatched as
        OpenRLHF's ``async_run_method_batch`` dispatches it, with one result object per
        micro-batch (``dispatch.run_method_per_item``), fetched here only when its
        micro-batch's turn comes (so the step's (B, A, d) signals are never in this actor
        at once). A path strategy with the direction model on the reward-model actors
        dispatches the policy actors first and hands the reward-model actors each
        micro-batch's policy signals by reference (their ``PolicyStats.m1``, from OpenRLHF's
        own log-prob forward, starts the path gradient there)."""
        self.prepare_actors()
        credit = self.credit
        roles: list[tuple[Any, Role]] = []
        if credit.requires & LOGITS_SIGNALS or credit.placement == "policy":
            roles.append((self.actor_model_group, "policy"))
        if credit.placement == "reward" and credit.requires & SCORING_SIGNALS:
            roles.append((self.reward_model_group, "reward"))
        batch: dict[str, list[Any]] = {
            "sequences": [e.sequences for e in experiences],
            "action_mask": [e.action_mask for e in experiences],
            "attention_mask": [e.attention_mask for e in experiences],
        }
        hands_m1 = bool(self.credit_strategy.reward_grad_points) and len(roles) == 2
        pending: list[list[Any]] = []
        for group, role in roles:
            if hands_m1 and role == "reward":
                batch["policy_signals"] = pending[0]
            refs = run_method_per_item(
                group, signals_method(role), credit.duplicate_factor, **batch
            )
            if credit.colocate:  # models share GPUs: one at a time, like OpenRLHF's forwards
                ray.wait(refs, num_returns=len(refs), fetch_local=False)
                ray.get(group.async_run_method(method_name="empty_cache"))
            pending.append(refs)
        for i in range(len(experiences)):
            signals: ActorSignals = ray.get(pending[0][i])
            for refs in pending[1:]:
                signals = signals.merged(ray.get(refs[i]))
            yield signals

    def _share_reward_embedding(self) -> None:
        # One copy of the (V, d) table, from the first reward-model actor; every actor takes
        # part (under ZeRO-3 the table is gathered, a collective). RayActorGroup has no
        # public per-actor call in OpenRLHF 0.11.
        refs = [
            handle.__ray_call__.remote(export_reward_embedding, i == 0)
            for i, handle in enumerate(self.reward_model_group._actor_handlers)
        ]
        ray.get(
            self.actor_model_group.async_run_method(
                "__ray_call__", import_reward_embedding, refs[0]
            )
        )
        ray.get(refs[1:])
