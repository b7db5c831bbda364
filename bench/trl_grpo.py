"""TRL's GRPOTrainer on the SmolLM2 GRPO job the training-speed benchmarks time: the baseline
of issue #33 ("a SmolLM2 GRPO step 2x TRL's in bf16 and 1.5x in fp32"), measured here instead
of read from the issue's table.

The job is `examples/grpo_smollm2_vllm.yaml`'s as a TRL user writes it: the same checkpoint
and training prompts (`_smollm2_job.prepare_assets`), 16 prompts x 4 samples a step (one
optimizer step), responses up to 32 tokens, temperature 1, lr 5e-6, KL coefficient (`beta`)
0.001, the same reward (1 when the response's final number is the sum), on the CPU with 2
threads; bf16 with `--bf16` (TRL's mixed precision through accelerate's autocast). TRL generates
with transformers' `generate` (its vLLM server mode needs a separate GPU process).

TRL runs in a virtual environment of its own (`outputs/trl-venv`, made on the first run with
the pins below and this project's torch and transformers), so nothing of TRL's enters dagrl's
environment; this script makes it, then runs itself inside it. Each step's time is taken by
a trainer callback around the step; `trl_step_seconds_<dtype>` is the median over the steps
after the first (the first warms up, as `step_profile.py` skips it).

The script checks what it measures: every step generated completions longer than 4 tokens
on average and the policy's parameters changed.

    .venv/bin/python bench/trl_grpo.py [--steps 5] [--bf16]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import venv
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "outputs" / "smollm2"  # _smollm2_job's (not importable in TRL's venv: dagrl)
TRL_VENV = ROOT / "outputs" / "trl-venv"
# TRL as issue #33 measured it, on this project's torch and transformers
PINS = ("trl==1.16.0", "accelerate==1.15.0", "datasets==5.2.0")
SAME_AS_DAGRL = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pyarrow")
THREADS = 2
PROMPTS, SAMPLES, RESPONSE = 16, 4, 32


def dagrl_pins() -> list[str]:
    """This environment's versions of the packages both sides use."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in SAME_AS_DAGRL]


def ensure_trl_venv() -> Path:
    python = TRL_VENV / "bin" / "python"
    marker = TRL_VENV / "dagrl-pins.txt"
    wanted = "\n".join([*PINS, *dagrl_pins()])
    if python.is_file() and marker.is_file() and marker.read_text() == wanted:
        return python
    print(f"making {TRL_VENV} ({', '.join(PINS)}) ...", flush=True)
    venv.create(TRL_VENV, with_pip=True, clear=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *wanted.split("\n")], check=True)
    marker.write_text(wanted)
    return python


def final_number_reward(completions: list, ground_truth: list[str], **_: object) -> list[float]:
    """1.0 when the completion's last number is the sum (dagrl's `score_numeric` on these
    questions)."""
    rewards = []
    for completion, truth in zip(completions, ground_truth, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        numbers = re.findall(r"-?\d+(?:\.\d+)?", text)
        rewards.append(1.0 if numbers and float(numbers[-1]) == float(truth) else 0.0)
    return rewards


def run_inside(steps: int, bf16: bool) -> None:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(THREADS)
    data = load_dataset("parquet", data_files=str(ASSETS / "data" / "train.parquet"),
                        split="train").select_columns(["prompt", "ground_truth"])
    tokenizer = AutoTokenizer.from_pretrained(ASSETS / "model")
    model = AutoModelForCausalLM.from_pretrained(ASSETS / "model", dtype=torch.float32)
    before = model.model.layers[0].mlp.down_proj.weight.detach().clone()

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.started = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.seconds.append(time.perf_counter() - self.started)
            print(f"step {len(self.seconds)}: {self.seconds[-1]:.2f} s", flush=True)

    timer = StepTimer()
    config = GRPOConfig(
        output_dir=str(ROOT / "outputs" / "bench_trl_grpo"), max_steps=steps,
        per_device_train_batch_size=PROMPTS * SAMPLES, gradient_accumulation_steps=1,
        num_generations=SAMPLES, max_completion_length=RESPONSE, temperature=1.0,
        learning_rate=5e-6, beta=0.001, weight_decay=0.0, bf16=bf16, use_cpu=True,
        logging_steps=1, save_strategy="no", report_to=[], seed=0,
        dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=final_number_reward, args=config,
                          train_dataset=data, processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    lengths = [row["completions/mean_length"] for row in trainer.state.log_history
               if "completions/mean_length" in row]
    if len(timer.seconds) != steps or not lengths or min(lengths) <= 4:
        sys.exit(f"steps timed {len(timer.seconds)} of {steps}, completion lengths {lengths}: "
                 "not the job this script measures")
    if torch.equal(before, model.model.layers[0].mlp.down_proj.weight.detach()):
        sys.exit("the policy's parameters did not change: nothing trained")
    name = "bf16" if bf16 else "fp32"
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    print(f"TRL {name}: steps {', '.join(f'{s:.2f}' for s in timer.seconds)} s; mean "
          f"completion lengths {', '.join(f'{n:.1f}' for n in lengths)}; rewards "
          f"{', '.join(f'{r:.3f}' for r in rewards)}")
    print(f"RESULT trl_step_seconds_{name} {statistics.median(timer.seconds[1:]):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--bf16", action="store_true", help="TRL's bf16 mixed precision")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be 2 or more: the first step is not timed")
    if args.inside:
        run_inside(args.steps, args.bf16)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _smollm2_job import prepare_assets

    prepare_assets()
    python = ensure_trl_venv()
    command = [str(python), __file__, "--inside", "--steps", str(args.steps)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(THREADS)}
    sys.exit(subprocess.run(command + (["--bf16"] if args.bf16 else []), env=env).returncode)


if __name__ == "__main__":
    main()
