"""The benchmarks' jobs: an example config on the demo's assets, run to the end through the
real job driver (Ray actors, gloo, the databuffer). Imported by the bench scripts that time
whole jobs (`e2e_step.py`, `tracing_overhead.py`, `multi_agent.py`); not a benchmark itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
import yaml

from dagrl.models.demo import DemoRecipe, prepare_assets
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_worker.driver.job_driver import Driver, JobOutcome
from dagrl_worker.shared.spec import WorkerSpec

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "outputs" / "arith"  # `make demo`'s


def start() -> None:
    """Build (or reuse) the demo assets and start a private local Ray."""
    prepare_assets(ASSETS, DemoRecipe())
    ray.init(address="local", num_cpus=4, log_to_driver=False, include_dashboard=False)


def bench_config(example: str, steps: int, ranks: int) -> dict[str, Any]:
    """`examples/<example>.yaml` on the demo assets for `steps` steps on `ranks` ranks: no
    validation, checkpoints, resume or loggers, so only training steps are timed."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    config["data"]["train_files"] = [str(ASSETS / "data" / "train.parquet")]
    config["data"]["val_files"] = []
    config["actor_rollout_ref"]["model"]["path"] = str(ASSETS / "model")
    config["trainer"].update({"total_training_steps": steps, "n_ranks_per_node": ranks,
                              "val_before_train": False, "test_freq": -1, "save_freq": -1,
                              "resume_mode": "disable", "logger": []})
    return config


def run_to_end(name: str, config: dict[str, Any], plan: scheduler_pb2.Plan, redis_url: str,
               folder: Path) -> JobOutcome:
    """Run the job; exit the benchmark if it stops before its last step."""
    spec = WorkerSpec(name, yaml.safe_dump(config), "", (), plan.SerializeToString(), redis_url,
                      str(folder / name))
    outcome = Driver(spec).run()
    steps = config["trainer"]["total_training_steps"]
    if outcome.last_step != steps:
        raise SystemExit(f"job {name} stopped at step {outcome.last_step} of {steps}: "
                         f"{outcome.state} {outcome.reason}")
    return outcome
