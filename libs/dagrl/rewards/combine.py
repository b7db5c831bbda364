"""Reward sources and how a REWARD node combines them into one score per sample.

A source is one way of scoring a response: `rule` (the data_source's rule, math-verify, or the
job's `reward_fn`), `remote` (a user's HTTP service, `dagrl.rewards.remote`), `rm` (a reward
model node upstream) and `judge` (an LLM judge node upstream). The upstream model nodes put their
per-sample scores in the tensors `UPSTREAM_SCORES` names; the COMPUTE REWARD node scores the rest
itself and combines all of them here (the source names a job may use are
`dagrl.config.reward.REWARD_SOURCES`): a weighted sum, `sum_s weight_s * score_s` (weights are
not normalised, so `{rule: 1.0, rm: 0.5}` adds half the RM's score to the rule's).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dagrl.batch import schema as fields
from dagrl.errors import RewardError

# Sources scored by a node upstream: source -> (the Batch tensor it fills, who fills it)
UPSTREAM_SCORES: Mapping[str, tuple[str, str]] = {
    "rm": (fields.RM_SCORES, "a MODEL_INFERENCE node with node_role REWARD (a reward model)"),
    "judge": (fields.JUDGE_SCORES, "a MODEL_INFERENCE node with node_role REWARD and a "
              "judge_template (an LLM judge)"),
}


def upstream_scores(source: str, tensors: Mapping[str, torch.Tensor], rows: int,
                    node_id: str) -> torch.Tensor:
    """The `[B]` scores an upstream node wrote for `source`; RewardError naming the tensor and
    the node that should have written it when it is missing or malformed."""
    name, producer = UPSTREAM_SCORES[source]
    if name not in tensors:
        raise RewardError(
            f"reward node {node_id!r}: reward.sources names {source!r}, but its input has no "
            f"{name!r} tensor; {producer} must run upstream of it (list that node in its "
            f"dependencies), or remove {source!r} from reward.sources")
    scores = tensors[name]
    if tuple(scores.shape) != (rows,):
        raise RewardError(f"reward node {node_id!r}: {name!r} has shape {tuple(scores.shape)}; "
                          f"expected one score per sample, ({rows},)")
    if not bool(torch.isfinite(scores).all()):
        raise RewardError(f"reward node {node_id!r}: {name!r} holds non-finite scores "
                          f"({scores[~torch.isfinite(scores)][:3].tolist()}...)")
    return scores.to(torch.float32)


def combine_scores(scores: Mapping[str, torch.Tensor],
                   weights: Mapping[str, float]) -> torch.Tensor:
    """`sum_s weights[s] * scores[s]` over the sources in `weights`. # [B] float32"""
    missing = sorted(set(weights) - set(scores))
    if missing:
        raise RewardError(f"no scores for reward source(s) {missing}; have {sorted(scores)}")
    terms = [float(weight) * scores[source].to(torch.float32)
             for source, weight in weights.items()]
    return torch.stack(terms).sum(dim=0)
