"""The names a job config may choose algorithms by: one list per table of `dagrl.algorithms`.

Each tuple lists the keys of one lookup table of `dagrl.algorithms` (`ADVANTAGE_ESTIMATORS`,
`POLICY_LOSSES`, `KL_ESTIMATORS`, `KL_CONTROLLERS`, the modes `agg_loss` implements, the
rollout-correction levels) or of the worker (the learning-rate schedules, DAPO's filter
metrics); the module holding the table checks at import that its table has exactly these keys
(`require_table_names`), and `dagrl.config` builds its accepted values from them. So a mode
the code implements can be set from a config, and a config value the code lacks is refused
when the job is checked, not mid-step. Outside that package and torch-free: the config (and the
scheduler's job check) reads them without importing torch.

The advantage estimators' entries also say what each one needs (`EstimatorNeeds`): the job
check (`dagrl.config.job`, `dagrl.batch.schema.reads`), its hints (`dagrl.job_rules`), the
estimators themselves (`advantages.compute_advantage`) and the config reference read it here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# `losses.agg_loss`: how a [B, T] loss matrix becomes one number
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an advantage estimator reads beyond the rewards and the response mask."""

    groups: bool  # compares the samples of one prompt: group ids, and rollout.n >= 2
    values: bool  # the critic's values: a forward-only CRITIC node upstream of the ADVANTAGE node


# `advantages.ADVANTAGE_ESTIMATORS`, each with what it needs
ESTIMATOR_NEEDS: Mapping[str, EstimatorNeeds] = {
    "gae": EstimatorNeeds(groups=False, values=True),
    "grpo": EstimatorNeeds(groups=True, values=False),
    "drgrpo": EstimatorNeeds(groups=True, values=False),
    "rloo": EstimatorNeeds(groups=True, values=False),
    "reinforce_plus_plus": EstimatorNeeds(groups=False, values=False),
    "reinforce_plus_plus_baseline": EstimatorNeeds(groups=True, values=False),
}
ADVANTAGE_ESTIMATOR_NAMES = tuple(ESTIMATOR_NEEDS)
# `losses.POLICY_LOSSES`
POLICY_LOSS_NAMES = ("ppo", "gspo")
# `kl.KL_ESTIMATORS` (verl's names and k1/k2/k3)
KL_ESTIMATOR_NAMES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# `rollout_correction.truncated_is_weights`' levels
CORRECTION_LEVELS = ("token", "sequence")
# `kl.KL_CONTROLLERS`: how the in-reward KL coefficient evolves
KL_CONTROLLER_NAMES = ("fixed", "adaptive")
# the worker's `training.optim.LR_SCHEDULES`: the learning rate after warmup
LR_SCHEDULE_NAMES = ("constant", "cosine")
# the worker's `executors.compute.FILTER_METRICS`: what a DAPO group's samples must differ in
FILTER_METRIC_NAMES = ("score", "acc", "seq_reward")


def require_table_names(table: Iterable[str], names: tuple[str, ...], what: str) -> None:
    """Raise at import when a lookup table's keys and its declared `names` differ."""
    keys = tuple(table)
    if sorted(keys) != sorted(names):
        raise RuntimeError(f"the {what} table implements {sorted(keys)} but "
                           f"dagrl.algorithm_names declares {sorted(names)}: make them agree")


def estimator_needs_text() -> str:
    """The estimators' needs in words, for `algorithm.adv_estimator`'s doc (the config
    reference and `dagrl config --options` print it)."""
    groups = [name for name, needs in ESTIMATOR_NEEDS.items() if needs.groups]
    values = [name for name, needs in ESTIMATOR_NEEDS.items() if needs.values]
    neither = [name for name, needs in ESTIMATOR_NEEDS.items()
               if not needs.groups and not needs.values]
    return ("needs the samples of one prompt (actor_rollout_ref.rollout.n >= 2): "
            f"{', '.join(groups)}; needs a critic's values (a forward-only CRITIC node before "
            f"the ADVANTAGE node): {', '.join(values)}; needs neither: {', '.join(neither)}")
