"""Experiment tracking: where the driver writes each step's merged metrics.

Backends by `trainer.logger`: `console` (per step a line of headline figures and a line of
the step's nodes in workflow order, each with its step phase and its seconds, the slowest
rank's: `dagrl.step_phases`), `jsonl` (one JSON object per
step in `<run_dir>/metrics.jsonl`, tagged with the job id and the attempt; its format and
the rule for a step written twice by a restart live in `dagrl.metrics_file`),
`tensorboard`, `wandb`, `mlflow` — the last three only when their package is installed
(a clear error names the missing package).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from dagrl import metrics_file, telemetry
from dagrl.config import JobConfig

_HEADLINE = (telemetry.KEY_SCORE_MEAN, telemetry.KEY_ACTOR_PG_LOSS, telemetry.KEY_ACTOR_ENTROPY,
             telemetry.KEY_RESPONSE_LENGTH_MEAN, telemetry.KEY_THROUGHPUT,
             telemetry.KEY_TIME_PER_STEP)


class Backend(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class ConsoleBackend:
    def __init__(self, node_phases: Sequence[tuple[str, str]] = ()) -> None:
        """`node_phases`: the workflow's (node id, step phase) in topological order."""
        self.node_phases = tuple(node_phases)

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = [f"{k}={metrics[k]:.4g}" for k in _HEADLINE if k in metrics]
        shown += [f"{k}={v:.4g}" for k, v in sorted(metrics.items())
                  if k.startswith(telemetry.KEY_VAL_PREFIX)]
        lines = [f"step {step}: " + " ".join(shown)]
        sequence = self.node_sequence(metrics)
        if sequence:
            lines.append(f"step {step} nodes: {sequence}")
        print("\n".join(lines), file=sys.stderr, flush=True)

    def node_sequence(self, metrics: dict[str, float]) -> str:
        """`gen (rollout) 2.10s > reward (reward) 0.05s > ...`: the nodes that ran this step."""
        timed = [(node_id, phase, metrics[telemetry.node_timing_key(node_id)])
                 for node_id, phase in self.node_phases
                 if telemetry.node_timing_key(node_id) in metrics]
        return " > ".join(f"{node_id} ({phase}) {seconds:.2f}s"
                          for node_id, phase, seconds in timed)

    def close(self) -> None:
        pass


class JsonlBackend:
    def __init__(self, run_dir: Path, job_id: str) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / metrics_file.FILE_NAME
        self.job_id = job_id
        self.attempt = 0
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._file.write(metrics_file.encode_row(self.job_id, self.attempt, step, metrics))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardBackend:
    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError("trainer.logger has tensorboard but the tensorboard package is "
                              "not installed: pip install tensorboard") from exc
        self._writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        self._writer.close()


class WandbBackend:
    def __init__(self, config: JobConfig) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError("trainer.logger has wandb but wandb is not installed") from exc
        self._run: Any = wandb.init(project=config.trainer.project_name,
                                    name=config.trainer.experiment_name)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowBackend:
    def __init__(self, config: JobConfig) -> None:
        try:
            import mlflow
        except ImportError as exc:
            raise ImportError("trainer.logger has mlflow but mlflow is not installed") from exc
        self._mlflow: Any = mlflow
        mlflow.set_experiment(config.trainer.project_name)
        mlflow.start_run(run_name=config.trainer.experiment_name)

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k.replace("@", "_at_"): v for k, v in metrics.items()}
        self._mlflow.log_metrics(clean, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


class Tracker:
    """Fans each step's metrics out to the configured backends."""

    def __init__(self, config: JobConfig, run_dir: Path, job_id: str,
                 node_phases: Sequence[tuple[str, str]] = ()) -> None:
        """`node_phases`: the workflow's (node id, step phase), for the console's node line."""
        self.backends: list[Backend] = []
        for name in config.trainer.logger:
            if name == "console":
                self.backends.append(ConsoleBackend(node_phases))
            elif name == "jsonl":
                self.backends.append(JsonlBackend(run_dir, job_id))
            elif name == "tensorboard":
                self.backends.append(TensorBoardBackend(run_dir))
            elif name == "wandb":
                self.backends.append(WandbBackend(config))
            elif name == "mlflow":
                self.backends.append(MlflowBackend(config))

    def begin_attempt(self, attempt: int) -> None:
        """Tag the JSONL rows written from now on with `attempt` (the driver's restarts)."""
        for backend in self.backends:
            if isinstance(backend, JsonlBackend):
                backend.attempt = attempt

    def log(self, metrics: dict[str, float], step: int) -> None:
        for backend in self.backends:
            backend.log(metrics, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
