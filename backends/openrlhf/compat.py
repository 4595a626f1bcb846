"""Which OpenRLHF settings a credit strategy works with, and where its signals come from.

``resolve_credit(args, cfg)`` reads OpenRLHF's parsed arguments (the hierarchical namespace
of ``train_ppo_ray``: ``args.algo.advantage.estimator`` ...) and returns a
``ResolvedCredit``, or raises ``CreditError`` listing every setting that does not fit.

``uniform`` (stock OpenRLHF) fits every setting. Other strategies split a *response-level*
advantage over tokens, so they need one: every estimator but ``gae``, ``reinforce`` only
with gamma 1, and no KL penalty inside the reward (use ``--algo.kl.use_loss`` or
``--algo.kl.init_coef 0``); or they run under OpenRLHF's critic (``gae``), as a shift of its
token rewards (``backends.openrlhf.credit``; any KL penalty in the reward stays), which
needs a ``critic_reward_form`` and >= 2 samples per prompt. A strategy that reads the
step's rewards and groups (``reads_groups``: ``ktae``, the paper forms) gets them under
either, each prompt's ``--rollout.n_samples_per_prompt`` (>= 2) samples a group; one that
reads the reward function's token rewards (``process``) needs a reward function
(``--reward.remote_url`` or ``--train.agent_func_path``), whose ``extra_logs`` carry them. Signals
reduced from the policy's logits (policy statistics, DATC's W0, the token entropy) are read
per sample from the logits of OpenRLHF's forward, packed (``--ds.packing_samples``,
``--train.dynamic_batch_enable``) or not; a truncated rollout (``--rollout.top_p`` < 1,
``SAMPLING_OFF``) is rejected for strategies whose signals reduce the distribution sampled
from (the plan's sampling check), and so are ring attention (which splits those logits over
ranks) and DeepSpeed tensor parallelism for strategies that read them; vision-language
inputs are rejected for every strategy but ``uniform``.

What the actors compute (``ResolvedCredit.requires``) is the run's ``CreditPlan`` on
``BACKEND`` (the strategy built once per process): with the direction model on the policy
actors its gradient is known before the policy's log-prob forward (``work_first``), so a
strategy with ``work_requires`` gets W0 ("unsigned_work") instead of ``PolicyStats`` +
``reward_grad``; a path strategy
(``reward_grad_points`` >= 1: ``datc_mid``, ``datc_ig``) takes its gradient on the path to the
policy's expected embeddings m1, which that forward gives, so it reads ``PolicyStats`` +
``reward_grad`` at either placement (m1 from OpenRLHF's own log-prob forward, no extra policy
forward). With the direction model being OpenRLHF's reward model on its actors and the
gradient taken at the sampled tokens, ``ResolvedCredit.one_pass`` says the reward and its
input gradient come from one pass (``one_pass_problem``). Every signal of
``credit_core.SIGNALS`` has a source here: ``LOGITS_SIGNALS`` from the policy's logits
(``EMBEDDING_SIGNALS`` with the direction model's embedding table), ``SCORING_SIGNALS`` from
one scoring call of the direction model; a strategy reading one of
``credit_core.DIRECTION_SIGNALS`` needs a direction model.

What a settings check cannot see is the direction model itself, which is built on the
actors hosting it: ``check_direction_capabilities`` refuses a strategy whose signal the
built model cannot give (``abc`` without attention), when the experience maker is installed,
before the first step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from backends.common.config_values import parse_direction
from backends.openrlhf.settings import OpenRLHFCreditConfig
from credit_core import DIRECTION_SIGNALS, SIGNALS, CreditError
from credit_core.batch import TRAINED_MODEL_SIGNALS
from credit_core.plan import Backend, CreditPlan, signals_read

#: Signals reduced from the policy's logits inside its log-prob forward (policy actors).
LOGITS_SIGNALS = frozenset({"policy_stats", "unsigned_work", "token_entropy"})
#: Signals reduced with the direction model's embedding table E (which the policy actors need).
EMBEDDING_SIGNALS = frozenset({"policy_stats", "unsigned_work"})
#: Signals of one scoring call of the direction model (on the actors hosting it); P2T's
#: attribution is a (B, A) reduction of that call's gradient, formed where it is taken.
SCORING_SIGNALS = frozenset(
    {"reward_grad", "reward_attention", "prefix_rewards", "reward_attribution"}
)
#: The scoring signals taken from the direction model's reward gradient (one backward).
GRADIENT_SIGNALS = frozenset({"reward_grad", "reward_attribution"})
#: The (B, A, d) signals: a strategy reading one is handed one micro-batch at a time.
WIDE_SIGNALS = frozenset({"reward_grad", "policy_stats"})

#: What the OpenRLHF backend provides: the signals of the policy's logits and of one scoring
#: call of the direction model (P2T's attribution included), the step's rewards and groups
#: (the token-credit maker holds the whole step) and the token rewards the reward function
#: gives in its ``extra_logs`` (``backends.openrlhf.given_rewards``); not a second trained
#: model's log-probs or the policy's own answer-span gradient; no answer span reaches its
#: credit step.
#: Whether the reward gradient comes first depends on the placement (``resolve_credit``).
BACKEND = Backend(
    "OpenRLHF",
    "--credit",
    SIGNALS - TRAINED_MODEL_SIGNALS - {"answer_saliency"},
    frozenset({"gather", "path_gradient", "groups", "token_rewards"}),
    work_first=False,
    path_work=False,
    hint="use the native or TRL backend (docs/backends.md)",
)

#: OpenRLHF's critic estimator: credit enters as a shift of its token rewards
#: (docs/design.md, "Credit under a critic").
CRITIC_ESTIMATORS = ("gae",)

#: The rollout's sampling settings that truncate the distribution, and their "off" values: a
#: strategy reducing the distribution sampled from needs the full softmax at the temperature
#: (``CreditPlan.sampling_problem``). OpenRLHF 0.11.2's parser has ``--rollout.top_p`` only
#: (its samples generator passes vLLM top_k -1); ``--rollout.top_k`` is read where present.
SAMPLING_OFF: dict[str, tuple[object, ...]] = {"top_p": (1.0, None), "top_k": (-1, 0, None)}

#: OpenRLHF estimators whose token advantages are one value per response.
RESPONSE_LEVEL_ESTIMATORS = (
    "group_norm",
    "dr_grpo",
    "rloo",
    "reinforce_baseline",
    "reinforce",
    "flash_reinforce",
)


@dataclass(frozen=True)
class ResolvedCredit:
    """Credit settings bound to one OpenRLHF run.

    - ``config``: the validated settings.
    - ``plan``: the run's ``CreditPlan`` for this placement (its strategy, its signals).
    - ``placement``: "reward" or "policy" (the actors hosting the direction model), None when
      the strategy needs no signal.
    - ``direction``: the direction model's ``RewardModelConfig`` fields, None when unused.
    - ``duplicate_factor``: ring-attention size x tensor-parallel size (actors per micro-batch).
    - ``colocate``: OpenRLHF empties the CUDA cache after each forward (``--train.colocate_all``).
    - ``one_pass``: the reward gradient comes from OpenRLHF's own reward forward on the
      reward-model actors (one forward + one backward give the reward and dR/dx; no direction
      model is built), see ``one_pass_problem``.
    - ``direction_is_reward``: the direction model is OpenRLHF's reward model (no
      ``--credit.direction.*``, one ``--reward.model_name_or_path``): its agreement with the
      reward is 1 by construction (up to OpenRLHF's length penalties), nothing to measure
      (``backends.common.credit.CreditRun``).
    """

    config: OpenRLHFCreditConfig
    plan: CreditPlan
    placement: Literal["reward", "policy"] | None
    direction: dict[str, Any] | None
    duplicate_factor: int
    colocate: bool
    one_pass: bool = False
    direction_is_reward: bool = False

    @property
    def requires(self) -> frozenset[str]:
        """The signals the actors compute (``plan.signals``)."""
        return self.plan.signals


def one_pass_problem(
    args: Any,
    cfg: OpenRLHFCreditConfig,
    plan: frozenset[str],
    placement: Literal["reward", "policy"] | None,
    reward_grad_points: int,
) -> str | None:
    """Why the reward and its input gradient cannot come from one pass of OpenRLHF's reward
    model for this run (then the direction model takes its own forward and backward beside
    OpenRLHF's reward forward), or None when they can: the direction model IS OpenRLHF's
    reward model (no ``--credit.direction.*``: it defaults to ``--reward.model_name_or_path``),
    it runs on the reward-model actors (placement ``reward``), the strategy reads the
    gradient at the sampled tokens (``reward_grad_points`` 0: the ``datc`` family,
    ``saliency``, or P2T's attribution of it) and no other signal of the direction model,
    and each micro-batch is whole on its actor (not ring attention, which splits the RM's
    packed input over the ring and takes its backward through ring-flash-attention's
    collective kernels, not written or tested here). Packed samples are fine (the RM packs
    the padded micro-batch itself), and so is ZeRO-3 (DeepSpeed's module hooks gather the
    partitioned weights in the forward and in the input-gradient backward;
    ``actor_side.reward_and_input_grad``)."""
    if placement != "reward":
        return "the direction model runs on the policy actors, OpenRLHF's reward model on its own"
    if not plan & GRADIENT_SIGNALS:
        return "the strategy reads no reward gradient"
    if cfg.direction is not None:
        return "--credit.direction.* gives another direction model than OpenRLHF's reward model"
    if reward_grad_points:
        return "the path gradient is taken away from the sampled tokens (its own passes)"
    others = sorted(plan & SCORING_SIGNALS - GRADIENT_SIGNALS)
    if others:
        return f"the strategy also reads {others} from the direction model"
    if int(_get(args, "ds.ring_attn_size", 1)) > 1:
        return "ring attention splits the reward model's input over ranks"
    return None


def _get(args: Any, dotted: str, default: Any = None) -> Any:
    node = args
    for part in dotted.split("."):
        node = getattr(node, part, None)
        if node is None:
            return default
    return node


def resolve_credit(args: Any, cfg: OpenRLHFCreditConfig) -> ResolvedCredit:
    """Check ``cfg`` against OpenRLHF's arguments ``args`` and bind it to this run.

    Raises ``CreditError`` with one line per incompatible setting, naming the OpenRLHF flag.
    """
    # the strategy is built once; the placement below decides whether g comes first
    estimator = _get(args, "algo.advantage.estimator")
    critic = estimator in CRITIC_ESTIMATORS
    plan = CreditPlan.build(cfg.credit, BACKEND)
    strategy = plan.strategy
    requires = strategy.requires
    name = strategy.name
    duplicate_factor = int(_get(args, "ds.ring_attn_size", 1)) * int(
        _get(args, "ds.tensor_parallel_size", 1)
    )
    colocate = bool(_get(args, "train.colocate_all", False))
    if name == "uniform":
        return ResolvedCredit(cfg, plan, None, None, duplicate_factor, colocate)

    problems: list[str] = []
    problem = plan.estimator_problem(
        "--algo.advantage.estimator",
        estimator,
        RESPONSE_LEVEL_ESTIMATORS,
        critic=CRITIC_ESTIMATORS,
    )
    if problem is not None:
        problems.append(str(problem))
    sampling = {f"--rollout.{key}": _get(args, f"rollout.{key}") for key in SAMPLING_OFF}
    problem = plan.sampling_problem(sampling, SAMPLING_OFF)
    if problem is not None:
        problems.append(str(problem))
    samples = int(_get(args, "rollout.n_samples_per_prompt", 1))
    if critic and samples < 2:
        problems.append(
            f"--rollout.n_samples_per_prompt: {samples}; under a critic strategy {name!r} is "
            "run on GRPO's group advantages of each prompt's samples and needs >= 2 "
            "(docs/design.md, 'Credit under a critic')"
        )
    elif plan.reads_groups and samples < 2:
        problems.append(
            f"--rollout.n_samples_per_prompt: {samples}; strategy {name!r} reads the response "
            "rewards within each prompt's group of samples and needs >= 2"
        )
    if estimator == "reinforce" and float(_get(args, "algo.advantage.gamma", 1.0)) != 1.0:
        problems.append(
            "--algo.advantage.gamma: 'reinforce' with gamma != 1 gives per-token advantages; "
            f"strategy {name!r} needs gamma 1"
        )
    kl_in_reward = not _get(args, "algo.kl.use_loss", False) and (
        float(_get(args, "algo.kl.init_coef", 0.0)) > 0.0
    )
    if kl_in_reward and not critic:  # under a critic the shift adds to the KL-shaped rewards
        problems.append(
            "--algo.kl.init_coef > 0 without --algo.kl.use_loss puts a per-token KL penalty "
            f"into the reward, so advantages differ within a response; strategy {name!r} needs "
            "--algo.kl.use_loss (GRPO style) or --algo.kl.init_coef 0"
        )
    wide = sorted(requires & WIDE_SIGNALS)
    whole_step = {
        "selects tokens across the step's batch (CreditStrategy.gathers)": strategy.gathers,
        "reads the step's rewards and groups (CreditStrategy.reads_groups)": (
            strategy.reads_groups
        ),
        "reads the reward function's token rewards (CreditStrategy.reads_token_rewards)": (
            strategy.reads_token_rewards
        ),
    }
    why = next((reason for reason, on in whole_step.items() if on), None)
    if why is not None and wide:
        problems.append(
            f"strategy {name!r} {why} and reads the (B, A, d) signals {wide}; this backend "
            "gives a strategy the whole step as one batch only when its signals are per "
            "token, and one micro-batch at a time otherwise (the step's (B, A, d) tensors are "
            "never copied into one)"
        )
    if int(_get(args, "data.max_images_per_prompt", 0) or 0) > 0:
        problems.append(
            "--data.max_images_per_prompt > 0: vision-language inputs are not supported"
        )
    from_logits = sorted(signals_read(type(strategy)) & LOGITS_SIGNALS)
    if from_logits:
        if int(_get(args, "ds.ring_attn_size", 1)) > 1:
            problems.append(
                f"--ds.ring_attn_size > 1: ring attention is not supported (the signals "
                f"{from_logits} are reduced from the policy's logits, of which each rank of a "
                "ring holds a slice of the packed row; gathering the per-token results over "
                "the ring, as OpenRLHF's gather_and_pad_tensor gathers log-probs, is not "
                "written yet)"
            )
        if int(_get(args, "ds.tensor_parallel_size", 1)) > 1:
            problems.append(
                "--ds.tensor_parallel_size > 1: tensor parallelism is not supported (the "
                f"signals {from_logits} are reduced from the policy's logits; DeepSpeed "
                "AutoTP's lm_head gathers its output, but a check that each rank's logits "
                "span the whole vocabulary and a test under AutoTP are not written yet)"
            )

    placement: Literal["reward", "policy"] | None = None
    direction = cfg.direction
    from_direction = sorted(requires & DIRECTION_SIGNALS)
    if from_direction:  # policy statistics need the direction model's embedding table too
        remote = bool(_get(args, "reward.remote_url") or _get(args, "train.agent_func_path"))
        rm_path = _get(args, "reward.model_name_or_path")
        has_rm_actors = not remote and bool(rm_path)
        if cfg.placement == "auto":
            placement = "reward" if has_rm_actors else "policy"
        elif cfg.placement == "reward" and not has_rm_actors:
            problems.append(
                "--credit.placement reward: OpenRLHF creates reward-model actors only with "
                "--reward.model_name_or_path and without --reward.remote_url or "
                "--train.agent_func_path; use placement 'policy' or 'auto'"
            )
        else:
            placement = cfg.placement
        if direction is None:
            if rm_path and not remote:
                direction = {"kind": "seq_classification", "path": str(rm_path).split(",")[0]}
            else:
                problems.append(
                    f"strategy {name!r} needs a differentiable reward model (the direction "
                    f"model) for its signals {from_direction}: give --credit.direction.kind/"
                    "--credit.direction.path (or a 'direction' section in --credit.config), or "
                    "a local --reward.model_name_or_path"
                )
    if plan.reads_token_rewards and not (
        _get(args, "reward.remote_url") or _get(args, "train.agent_func_path")
    ):
        problems.append(
            f"strategy {name!r} reads the token rewards of the reward function: give "
            "--reward.remote_url (a reward server, or a .py file with reward_func) or "
            "--train.agent_func_path whose extra_logs carry 'token_rewards' or 'step_rewards' "
            "(docs/openrlhf.md, 'Token rewards from the reward function')"
        )
    if problems:
        raise CreditError(
            f"credit strategy {name!r} does not fit these OpenRLHF settings:\n  - "
            + "\n  - ".join(problems)
        )
    is_reward = False
    if direction is not None and cfg.direction is None:
        found = parse_direction(direction, "--reward.model_name_or_path")
        assert found is not None
        direction = found.model_dump(exclude_unset=True)
        is_reward = "," not in str(_get(args, "reward.model_name_or_path"))
    # W0 streams from g known before the policy's forward (placement policy); a path
    # strategy's g needs the policy's m1 from that forward first (the plan's rule)
    plan = CreditPlan.build(strategy, BACKEND, work_first=placement == "policy")
    points = plan.reward_grad_points
    one_pass = one_pass_problem(args, cfg, plan.signals, placement, points) is None
    return ResolvedCredit(
        cfg, plan, placement, direction, duplicate_factor, colocate, one_pass, is_reward
    )


def check_direction_capabilities(
    credit: ResolvedCredit, *, gives_attention: bool = True, path_problem: str | None = None
) -> None:
    """Refuse ``credit`` if the direction model built for it cannot give a signal it needs.

    ``gives_attention``: ``DirectionModel.gives_attention`` of the model built on every actor
    hosting it (all of them True). ``path_problem``: why that model cannot give the path
    gradient of a strategy with ``reward_grad_points`` >= 1 (``adapters.grad_path.path_problem``),
    None if it can. Raises the plan's ``direction_problem`` (naming the strategy, the
    missing signal, the direction model's settings and what would serve it); run when the
    experience maker is installed, before the first step (the model does not exist earlier).
    """
    problem = credit.plan.direction_problem(
        "--credit.direction",
        f"the direction model {credit.direction}",
        gives_attention=gives_attention,
        path_problem=path_problem,
    )
    if problem is not None:
        raise CreditError(str(problem))
