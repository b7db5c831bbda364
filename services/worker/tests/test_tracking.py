"""Tracking backends write what the driver logs: JSONL lines and TensorBoard event files."""

import json
from pathlib import Path

import pytest

from dagrl import metrics_file, telemetry
from dagrl.config import load_job_config
from dagrl.step_phases import phases_in_order
from dagrl.workflow import load_workflow
from dagrl_worker.driver.tracking import Tracker


def test_jsonl_and_tensorboard_record_every_step(tmp_path: Path) -> None:
    config = load_job_config(data={"trainer": {"logger": ["console", "jsonl", "tensorboard"]}})
    tracker = Tracker(config, tmp_path, "job-7")
    tracker.log({"critic/score/mean": 0.25, "actor/pg_loss": -0.1}, step=1)
    tracker.log({"critic/score/mean": 0.5, "val/arith/accuracy": 0.3}, step=2)
    tracker.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert [(line["job_id"], line["attempt"]) for line in lines] == [("job-7", 0)] * 2
    assert lines[1]["critic/score/mean"] == 0.5
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scores = [e.value for e in events.Scalars("critic/score/mean")]
    assert scores == [0.25, 0.5]


def test_restarted_steps_are_tagged_with_the_attempt_and_the_last_attempt_wins(
        tmp_path: Path) -> None:
    config = load_job_config(data={"trainer": {"logger": ["jsonl"]}})
    tracker = Tracker(config, tmp_path, "job-7")
    tracker.begin_attempt(0)
    for step in (1, 2, 3):  # a worker dies after step 3; the checkpoint is at step 2
        tracker.log({"critic/score/mean": 0.1 * step}, step=step)
    tracker.log({"val/arith/accuracy": 0.2}, step=2)
    tracker.begin_attempt(1)
    tracker.log({"critic/score/mean": 0.9}, step=3)
    tracker.close()
    path = tmp_path / metrics_file.FILE_NAME
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    step3 = [(r["attempt"], r["critic/score/mean"]) for r in rows if r["step"] == 3]
    assert step3 == [(0, 0.1 * 3), (1, 0.9)]  # two rows, told apart by the attempt
    steps = metrics_file.read_steps(path)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert steps[1]["val/arith/accuracy"] == 0.2  # same writer's rows for a step merge
    assert (steps[2]["attempt"], steps[2]["critic/score/mean"]) == (1, 0.9)


def test_a_later_job_resuming_the_run_replaces_its_steps(tmp_path: Path) -> None:
    path = tmp_path / metrics_file.FILE_NAME
    path.write_text(metrics_file.encode_row("job-a", 0, 4, {"critic/score/mean": 0.1})
                    + '{"step": 5, "critic/sc'  # a write cut short by a crash
                    + "\n" + metrics_file.encode_row("job-b", 0, 4, {"perf/step_seconds": 2.0}))
    steps = metrics_file.read_steps(path)
    assert steps == [{"job_id": "job-b", "attempt": 0, "step": 4, "perf/step_seconds": 2.0}]


def test_the_console_lists_the_step_nodes_in_workflow_order_with_phase_and_time(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = load_job_config(data={"trainer": {"logger": ["console"]}})
    tracker = Tracker(config, tmp_path, "job-7", phases_in_order(load_workflow("ppo")))
    timings = {"rollout": 2.5, "reward": 0.01, "old_log_prob": 0.4, "ref_log_prob": 0.3,
               "values": 0.2, "advantage": 0.02, "actor_train": 3.0}  # critic_train: not run
    tracker.log({"critic/score/mean": 0.25,
                 **{telemetry.node_timing_key(n): s for n, s in timings.items()}}, step=3)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("step 3: critic/score/mean=0.25")
    assert lines[1] == (
        "step 3 nodes: rollout (rollout) 2.50s > reward (reward) 0.01s > "
        "old_log_prob (log_probs) 0.40s > ref_log_prob (log_probs) 0.30s > "
        "values (values) 0.20s > advantage (advantage) 0.02s > actor_train (update) 3.00s")
