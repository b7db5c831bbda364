"""RL algorithms for LLM post-training, in pure torch: advantages, losses, KL.

Owns the math every trainer shares: advantage estimators (GAE, GRPO, Dr.GRPO, RLOO,
REINFORCE++), policy losses (PPO with dual-clip and clip-higher, GSPO), the value loss, loss
aggregation, entropy and log-probs from logits, KL estimators and controllers. No I/O, no
models, no distributed code: functions take tensors and return tensors. Shapes: B samples,
T response tokens, V vocab; `response_mask` [B, T] is 1 on tokens the policy produced.

Configs choose by name through three tables: `ADVANTAGE_ESTIMATORS` (`compute_advantage`),
`POLICY_LOSSES` (`get_policy_loss_fn`) and `KL_ESTIMATORS` (`kl_penalty`); an unknown name
raises `AlgorithmError` listing the valid ones.
"""

from dagrl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    GroupIds,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from dagrl.algorithms.errors import AlgorithmError
from dagrl.algorithms.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    kl_penalty,
)
from dagrl.algorithms.losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    PolicyLossConfig,
    PolicyLossStats,
    agg_denominator,
    agg_loss,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_value_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    log_probs_from_logits,
)
from dagrl.algorithms.masked import (
    SumAcross,
    explained_variance,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from dagrl.algorithms.rollout_correction import (
    ISWeights,
    Mismatch,
    rollout_mismatch,
    truncated_is_weights,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AlgorithmError",
    "FixedKLController",
    "GroupIds",
    "ISWeights",
    "KLController",
    "Mismatch",
    "PolicyLossConfig",
    "PolicyLossStats",
    "SumAcross",
    "agg_denominator",
    "agg_loss",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_gspo",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "explained_variance",
    "get_policy_loss_fn",
    "kl_penalty",
    "log_probs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "rollout_mismatch",
    "truncated_is_weights",
]
