"""`make demo`: build the tiny model and data, run GRPO on 2 ranks, report before/after.

1. `dagrl.models.demo.prepare_assets("outputs/arith")`: char tokenizer + tiny Qwen2 model,
   synthetic addition data, a short supervised warm start (skipped when already built);
2. `dagrl run examples/grpo_arith.yaml`: the embedded default — Redis, the scheduler, the
   metrics service and Ray as local processes, 2 ranks through gloo and the databuffer;
3. reads the run's metrics (JSONL) and prints validation accuracy before and after RL,
   ending with RESULT lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from dagrl import metrics_file
from dagrl.models.demo import DemoRecipe, prepare_assets

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "grpo_arith.yaml"
ASSETS = ROOT / "outputs" / "arith"
ACCURACY = "val/arith/accuracy"


def metrics_path() -> Path:
    trainer = yaml.safe_load(EXAMPLE.read_text())["trainer"]
    return (ROOT / trainer["default_local_dir"] / trainer["project_name"]
            / trainer["experiment_name"] / metrics_file.RUN_SUBDIR / metrics_file.FILE_NAME)


def main() -> int:
    started = time.perf_counter()
    print("demo: building the tiny model and data (outputs/arith) ...", flush=True)
    for key, value in prepare_assets(ASSETS, DemoRecipe()).items():
        print(f"  {key}: {value:.4g}")
    log = metrics_path()
    log.unlink(missing_ok=True)
    command = [str(Path(sys.executable).parent / "dagrl"), "run", str(EXAMPLE),
               "trainer.resume_mode=disable"]
    print("demo:", " ".join(command[1:]), flush=True)
    code = subprocess.call(command, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if code != 0:
        print(f"demo: the GRPO run failed (exit code {code}); see outputs/logs/", file=sys.stderr)
        return code
    validations = [r for r in metrics_file.read_steps(log) if ACCURACY in r]
    before, after = validations[0][ACCURACY], validations[-1][ACCURACY]
    seconds = time.perf_counter() - started
    print(f"demo: validation accuracy {before:.1%} before RL, {after:.1%} after "
          f"({(after - before) * 100:+.1f} points) in {seconds:.0f} s")
    print(f"RESULT val_accuracy_before {before:.4f}")
    print(f"RESULT val_accuracy_after {after:.4f}")
    print(f"RESULT demo_seconds {seconds:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
