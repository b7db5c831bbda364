"""DATA_LOAD, CUSTOM (`executable_ref` to a file) and BARRIER_SYNC nodes run in a step."""

from pathlib import Path

import yaml

from dagrl.data import make_dataset
from dagrl.workflow import parse_workflow
from dagrl_worker.rank.dag_worker import DAGWorker
from dagrl_worker.shared.plan_view import colocated_plan
from dagrl_worker.shared.spec import WorkerSpec

CUSTOM = '''
from dagrl_worker.shared.metrics import Reduce


def tag(batch, ctx):
    ctx.sink.add("custom/rows_seen", len(batch), Reduce.SUM)
    return batch.with_fields(columns={"tagged": [True] * len(batch)})


def check_tag(batch, ctx):
    ctx.sink.add("custom/tagged_rows", sum(batch.columns["tagged"]), Reduce.SUM)
    return batch
'''


def test_custom_data_load_and_barrier_nodes(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "hooks.py").write_text(CUSTOM)
    workflow = f"""
dag_id: custom
nodes:
  - {{node_id: load, node_type: DATA_LOAD}}
  - {{node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT, dependencies: [load]}}
  - {{node_id: tag, node_type: CUSTOM, executable_ref: "{tmp_path}/hooks.py:tag",
     dependencies: [rollout]}}
  - {{node_id: sync, node_type: BARRIER_SYNC, dependencies: [tag]}}
  - {{node_id: check, node_type: COMPUTE, executable_ref: "{tmp_path}/hooks.py:check_tag",
     dependencies: [sync]}}
  - {{node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [check]}}
  - {{node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward],
     config: {{adv_estimator: grpo}}}}
  - {{node_id: old_log_prob, node_type: MODEL_TRAIN, node_role: ACTOR,
     only_forward_compute: true, dependencies: [advantage]}}
  - {{node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR,
     dependencies: [old_log_prob]}}
"""
    graph = parse_workflow(workflow, source="custom.yaml")
    make_dataset("arith", 16, 4, tmp_path / "data", seed=0)
    config = {
        "data": {"train_files": [str(tmp_path / "data" / "train.parquet")],
                 "train_batch_size": 4, "max_prompt_length": 32, "max_response_length": 4},
        "actor_rollout_ref": {"model": {"path": str(tiny_checkpoint)},
                              "actor": {"ppo_mini_batch_size": 2,
                                        "ppo_micro_batch_size_per_rank": 4,
                                        "use_kl_loss": False},
                              "rollout": {"n": 2}},
        "trainer": {"total_training_steps": 1, "resume_mode": "disable"},
    }
    spec = WorkerSpec("custom", yaml.safe_dump(config), yaml.safe_dump(graph.to_dict()), (),
                      colocated_plan(graph, 1).SerializeToString(), None,
                      str(tmp_path / "ckpt"))
    worker = DAGWorker(spec, rank=0)
    worker.init_graph()
    summary = worker.run_step(1)
    assert summary["custom/rows_seen"][1] == 8  # 4 prompts x 2 samples reached the hook
    assert summary["custom/tagged_rows"][1] == 8  # its column travelled past the barrier
    assert "actor/pg_loss" in summary
