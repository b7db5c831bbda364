"""The names a job config may choose algorithms by: one list per table of `dagrl.algorithms`.

Each tuple lists the keys of one lookup table of `dagrl.algorithms` (`ADVANTAGE_ESTIMATORS`,
`POLICY_LOSSES`, `KL_ESTIMATORS`, `KL_CONTROLLERS`, the modes `agg_loss` implements, the
rollout-correction levels) or of the worker (the learning-rate schedules, DAPO's filter
metrics); the module holding the table checks at import that its table has exactly these keys
(`require_table_names`), and `dagrl.config` builds its accepted values from them. So a mode
the code implements can be set from a config, and a config value the code lacks is refused
when the job is checked, not mid-step. Outside that package and torch-free: the config (and the
scheduler's job check) reads them without importing torch.
"""

from __future__ import annotations

from collections.abc import Iterable

# `losses.agg_loss`: how a [B, T] loss matrix becomes one number
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
# `advantages.ADVANTAGE_ESTIMATORS`
ADVANTAGE_ESTIMATOR_NAMES = (
    "gae", "grpo", "drgrpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
)
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
