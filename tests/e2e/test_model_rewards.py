"""Rewards from models, through the real driver, Ray, gloo and the databuffer on 2 ranks.

- The demo's tiny trained reward model ranks the policy's own samples, and GRPO whose only
  reward is that RM (`examples/grpo_arith_rm.yaml`, `reward.sources: {rm: 1.0}`) climbs the
  RM's score; validation is scored by the rule. The issue's target, +10 points of rule-scored
  accuracy, needs the demo's RM (600 steps) and the example's 100 GRPO steps (measured
  51.5 % -> 63 %, see the example's header), too long for this tier, so the short run here
  only reports it.
- A judge-scored run (the policy's own base as the judge) completes with finite scores and the
  judge's metrics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dagrl.jobs import JobState
from dagrl.local import LocalRedis
from dagrl.models.reward_model import FOLDER
from tests.shared_assets import RM_FIGURES

from .conftest import EXAMPLES
from .test_training import run_job, series

pytestmark = pytest.mark.e2e
RM_STEPS = 12
JUDGE_STEPS = 2
JUDGE_WORKFLOW = """\
dag_id: grpo_judge
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
  - {node_id: judge, node_type: MODEL_INFERENCE, node_role: REWARD, dependencies: [rollout],
     config: {judge_template: "Is {response} the sum {prompt}? Score 0 or 1.",
              judge_max_new_tokens: 4, micro_batch_size: 64}}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [judge]}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward]}
  - {node_id: old_log_prob, node_type: MODEL_TRAIN, node_role: ACTOR, only_forward_compute: true,
     dependencies: [advantage]}
  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [old_log_prob]}
"""


@pytest.fixture(scope="session")
def rm_figures(assets: Path) -> dict[str, float]:
    """The demo's tiny reward model, trained beside the test assets' policy (a third of the
    demo's steps and a quarter of its sampled prompts: `tests/shared_assets.py` builds it with
    the assets); its held-out figures, as `prepare_reward_model` measured them."""
    figures: dict[str, float] = json.loads((assets / RM_FIGURES).read_text())
    return figures


@pytest.fixture(scope="session")
def rm_assets(assets: Path, rm_figures: dict[str, float]) -> Path:
    return assets


def test_the_reward_model_ranks_the_policys_own_samples(rm_figures: dict[str, float]) -> None:
    """A right sample of the policy outscores a wrong one of the same prompt > 85 % of the time
    (91.5 % measured; the old recipe's RM: 84 %). Best-of-8 by the RM beating the policy's
    greedy accuracy (74.5 % vs 51.5 %) takes the demo's 600 steps; with the 200 of the shared
    assets (tests/shared_assets.py) it does not (61 % vs 62.5 % on 64 prompts)."""
    assert rm_figures["rm_heldout_accuracy"] > 0.8, rm_figures
    assert rm_figures["rm_heldout_pairwise_accuracy"] > 0.85, rm_figures


def rm_workflow(assets: Path, tmp_path: Path) -> Path:
    """The example's workflow with its reward model read from the test assets."""
    text = (EXAMPLES / "grpo_arith_rm_workflow.yaml").read_text()
    path = tmp_path / "workflow.yaml"
    path.write_text(text.replace(f"outputs/arith/{FOLDER}", str(assets / FOLDER)))
    return path


def test_grpo_on_the_reward_model_alone_climbs_its_score_and_validates_by_the_rule(
        ray_session: None, rm_assets: Path, redis_server: LocalRedis, tmp_path: Path) -> None:
    """The RM is the only training reward and the policy climbs it. Validation accuracy is the
    rule's and is only reported here: +10 points takes the example's 100 steps (module
    docstring)."""
    _driver, outcome = run_job(
        rm_assets, redis_server, tmp_path, example="grpo_arith_rm",
        workflow={"source": str(rm_workflow(rm_assets, tmp_path))},
        trainer={"total_training_steps": RM_STEPS, "val_before_train": True,
                 "test_freq": RM_STEPS, "save_freq": -1})
    assert outcome.state == JobState.SUCCEEDED, outcome.reason
    rm_means = series(outcome, "reward_model/score/mean")
    assert len(rm_means) == RM_STEPS and all(math.isfinite(x) for x in rm_means)
    assert sum(rm_means[-3:]) / 3 > sum(rm_means[:3]) / 3, rm_means
    combined = series(outcome, "reward/rm/mean")  # the only source, weight 1
    assert len(combined) == RM_STEPS
    assert all(abs(a - b) < 1e-5 for a, b in zip(combined, rm_means, strict=True))
    accuracy = series(outcome, "val/arith/accuracy")  # scored by the rule, not the RM
    assert len(accuracy) == 2 and all(0.0 <= a <= 1.0 for a in accuracy)


def test_a_judge_scored_run_completes_with_finite_scores(
        ray_session: None, assets: Path, redis_server: LocalRedis, tmp_path: Path) -> None:
    flow = tmp_path / "judge.yaml"
    flow.write_text(JUDGE_WORKFLOW)
    _driver, outcome = run_job(
        assets, redis_server, tmp_path, workflow={"source": str(flow)},
        reward={"sources": {"judge": 1.0}},
        trainer={"total_training_steps": JUDGE_STEPS, "val_before_train": False,
                 "test_freq": -1, "save_freq": -1})
    assert outcome.state == JobState.SUCCEEDED, outcome.reason
    for name in ("critic/score/mean", "judge/score/mean", "judge/verdict_length/mean"):
        values = series(outcome, name)
        assert len(values) == JUDGE_STEPS and all(math.isfinite(v) for v in values), name
    ratios = series(outcome, "judge/unparseable_ratio")
    assert len(ratios) == JUDGE_STEPS and all(0.0 <= r <= 1.0 for r in ratios)
    assert len(series(outcome, "judge/unparseable")) == JUDGE_STEPS
