"""An advantage node on several ranks computes the whole batch's statistics, as verl does on
its one driver: the whitening of GAE and REINFORCE++-baseline advantages, the KL the adaptive
controller adapts to, the critic's explained variance.

Three spawned gloo ranks join their groups through `RankGroups.setup` under two plans of the
PPO workflow: every node on all three ranks (the advantage node's group is the plan's model
group, reused), and the advantage node on ranks 1 and 2 only (a group of their own, which rank
0 creates too: `new_group` is collective). Each rank of the advantage node runs
`AdvantageExecutor` on its share of one batch with `GraphRunner`'s context (`statistics_for`);
the test process runs it on the whole batch alone. The shares' advantages are the whole
batch's rows, and every rank's controller holds the whole batch's coefficient.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.integration.spawned_ranks import run_ranks

pytestmark = pytest.mark.integration

ROWS, WIDTH, GROUP = 12, 5, 2  # samples, response tokens, samples per prompt
ESTIMATORS = ("gae", "reinforce_plus_plus_baseline")
ADAPTIVE_KL = {"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.01, "horizon": 10}


def whole_batch() -> Any:
    """Scores, values and log-probs of 12 samples (6 prompts x 2), of 1 to 5 response tokens."""
    from dagrl.batch import Batch

    generator = torch.Generator().manual_seed(7)
    lengths = torch.randint(1, WIDTH + 1, (ROWS,), generator=generator)
    mask = (torch.arange(WIDTH) < lengths.unsqueeze(1)).long()  # [B, R]
    scores = torch.zeros(ROWS, WIDTH)
    scores[torch.arange(ROWS), lengths - 1] = torch.rand(ROWS, generator=generator) * 3
    old = -torch.rand(ROWS, WIDTH, generator=generator)
    return Batch(
        tensors={"response_mask": mask, "token_level_scores": scores,
                 "values": torch.randn(ROWS, WIDTH, generator=generator),
                 "old_log_probs": old,
                 "ref_log_probs": old - 0.3 * torch.rand(ROWS, WIDTH, generator=generator)},
        columns={"uid": [f"u{i}" for i in range(ROWS)],
                 "group_id": [f"g{i // GROUP}" for i in range(ROWS)]})


def advantage_pass(estimator: str, batch: Any, dp: Any, rank: int = 0) -> dict[str, Any]:
    """`AdvantageExecutor` on `batch` with the node's ranks `dp` (adaptive KL in the reward):
    the advantages, the controller's coefficient after the step, the explained variance."""
    from dagrl.config import load_job_config
    from dagrl.job_rules import read_options
    from dagrl_worker.rank.executors.base import StepContext
    from dagrl_worker.rank.executors.compute import AdvantageExecutor, AdvantageSettings
    from dagrl_worker.rank.rank_parts import kl_controller
    from dagrl_worker.shared.metrics import MetricSink

    config = load_job_config(data={
        "algorithm": {"adv_estimator": estimator, "use_kl_in_reward": True,
                      "kl_ctrl": ADAPTIVE_KL},
        "actor_rollout_ref": {"rollout": {"n": GROUP}}, "workflow": {"source": "ppo"}})
    ctx = StepContext(step=1, rank=rank, config=config, sink=MetricSink(),
                      kl_controller=kl_controller(config), dp=dp)
    executor = AdvantageExecutor("advantage", estimator, AdvantageSettings.of(config.algorithm),
                                 read_options(config))
    out = executor.run(batch, ctx)
    return {"advantages": out.tensors["advantages"], "kl_coef": ctx.kl_controller.value,
            "explained_var": ctx.sink.value("critic/vf_explained_var")}


def split_plan(world: int, advantage_ranks: list[int]) -> Any:
    """Every PPO node on all `world` ranks but the advantage node, on `advantage_ranks`."""
    from dagrl.workflow import load_workflow
    from dagrl_worker.shared.plan_view import colocated_plan

    plan = colocated_plan(load_workflow("ppo"), world)
    for layout in plan.layouts:
        if layout.node_id == "advantage":
            layout.dp_size = len(advantage_ranks)
            del layout.ranks[:]
            layout.ranks.extend(advantage_ranks)
    return plan


def _rank(rank: int, port: int, results: dict) -> None:
    from dagrl.config import RolloutConfig
    from dagrl.workflow import load_workflow
    from dagrl_worker.rank.device import rank_device
    from dagrl_worker.rank.rank_groups import RankGroups
    from dagrl_worker.shared.plan_view import PlanView

    torch.set_num_threads(1)
    graph, batch = load_workflow("ppo"), whole_batch()
    outcome: dict[str, Any] = {}
    for name, advantage_ranks in (("colocated", [0, 1, 2]), ("split", [1, 2])):
        groups = RankGroups(graph, PlanView(split_plan(3, advantage_ranks)), rank,
                            rank_device("cpu"))
        groups.setup(f"tcp://127.0.0.1:{port}", RolloutConfig())  # joins the world once
        dp = groups.statistics_for("advantage")
        outcome[name, "reused"] = groups.statistics.get("advantage") is groups.groups["agent0"]
        if rank not in advantage_ranks:
            outcome[name, "dp"] = (dp.group is None, dp.size)
            continue
        share = ROWS // len(advantage_ranks)
        rows = list(range(dp.rank * share, (dp.rank + 1) * share))
        outcome[name, "dp"] = (dp.rank, dp.size)
        outcome[name, "rows"] = rows
        for estimator in ESTIMATORS:
            outcome[name, estimator] = advantage_pass(estimator, batch.select(rows), dp, rank)
        if name == "split":  # one share empty (a streamed step's late wave, say)
            rows = list(range(ROWS)) if dp.rank else []
            outcome["lopsided", "rows"] = rows
            outcome["lopsided", "gae"] = advantage_pass("gae", batch.select(rows), dp, rank)
    results[rank] = outcome


def test_an_advantage_node_on_several_ranks_whitens_and_adapts_over_the_whole_batch() -> None:
    from dagrl_worker.rank.training.parallel import DataParallel

    alone = {e: advantage_pass(e, whole_batch(), DataParallel()) for e in ESTIMATORS}
    results = run_ranks(_rank, 3)
    assert results[0]["colocated", "reused"] and not results[0]["split", "reused"]
    assert results[0]["split", "dp"] == (True, 1)  # not one of the split node's ranks
    for name, ranks in (("colocated", [0, 1, 2]), ("split", [1, 2])):
        assert [results[r][name, "dp"] for r in ranks] == [(i, len(ranks))
                                                            for i in range(len(ranks))]
        for estimator in ESTIMATORS:
            whole = alone[estimator]
            for rank in ranks:
                mine = results[rank][name, estimator]
                rows = results[rank][name, "rows"]
                assert torch.allclose(mine["advantages"], whole["advantages"][rows],
                                      atol=1e-5), (name, estimator, rank)
                assert mine["kl_coef"] == pytest.approx(whole["kl_coef"], rel=1e-9)
                assert mine["explained_var"] == pytest.approx(whole["explained_var"],
                                                              abs=1e-5)
    whole = alone["gae"]
    for rank in (1, 2):  # rank 1 held nothing: its coefficient is the whole batch's, not NaN
        mine = results[rank]["lopsided", "gae"]
        rows = results[rank]["lopsided", "rows"]
        assert torch.allclose(mine["advantages"], whole["advantages"][rows], atol=1e-5)
        assert mine["kl_coef"] == pytest.approx(whole["kl_coef"], rel=1e-9)
    # the coefficient moved: the batch's KL is far above the target
    assert alone["gae"]["kl_coef"] > ADAPTIVE_KL["kl_coef"]
