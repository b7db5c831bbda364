"""Tracking backends write what the driver logs: JSONL lines and TensorBoard event files."""

import json
from pathlib import Path

from dagrl.config import load_job_config
from dagrl_worker.tracking import Tracker


def test_jsonl_and_tensorboard_record_every_step(tmp_path: Path) -> None:
    config = load_job_config(data={"trainer": {"logger": ["console", "jsonl", "tensorboard"]}})
    tracker = Tracker(config, tmp_path)
    tracker.log({"critic/score/mean": 0.25, "actor/pg_loss": -0.1}, step=1)
    tracker.log({"critic/score/mean": 0.5, "val/arith/accuracy": 0.3}, step=2)
    tracker.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert lines[1]["critic/score/mean"] == 0.5
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scores = [e.value for e in events.Scalars("critic/score/mean")]
    assert scores == [0.25, 0.5]
