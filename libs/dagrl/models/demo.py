"""The demo's assets: a tiny policy warm-started on synthetic arithmetic, and its dataset.

`prepare_assets(folder, recipe)` writes, under `folder`:
    model/              HF checkpoint (config, safetensors, tokenizer) after the warm start
    data/train.parquet  data/val.parquet   disjoint prompt sets
and skips the work when a previous call with the same recipe left them there. The same
code path serves `make demo` (folder `outputs/arith`, which the examples read), the e2e
tests (a smaller recipe) and users: `python -m dagrl.models.demo outputs/arith`.

The build runs in a child process with portable kernels (`PORTABLE_KERNELS`), so every
machine warm-starts the same policy bit for bit: with the kernels each CPU picks for itself
(AVX-512 on one, AVX2 and MKL's non-Intel path on another), 250 AdamW steps end at policies
whose greedy accuracy ranged from 23 % to 45 % for one seed, and the RL runs that start there
learn differently.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dagrl.data import ArithTask, make_dataset, read_parquet
from dagrl.errors import DagrlError
from dagrl.models.tiny import TinyModelSpec, build_tiny_model
from dagrl.models.tokenizer import build_char_tokenizer
from dagrl.models.warm_start import Prompt, supervised_warm_start

RECIPE_FILE = "recipe.json"
TOOL_USE = 0.5  # the tool example's share of calculator episodes in the warm start
# Kernels that compute the same bits on every x86 CPU: ATen's scalar (non-SIMD) kernels and
# MKL's conditional numerical reproducibility mode. Read once, when torch loads: hence the
# child process. They cost ~2.3x the warm start's time (8 s -> 19 s on the test recipe).
PORTABLE_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}


@dataclass(frozen=True)
class DemoRecipe:
    """What decides the demo's assets: the task, the model and its warm start.

    The RL run itself is configured by `examples/grpo_arith.yaml`.
    """

    digits: int = 2
    allow_carry: bool = False
    n_train: int = 2000
    n_val: int = 200
    hidden_size: int = 128
    num_layers: int = 2
    warm_steps: int = 250
    warm_lr: float = 1e-3  # 3e-3 stalled at ~0-6 % accuracy; 1e-3 reached 12-26 % greedy
    warm_batch_size: int = 32
    seed: int = 0
    # The fraction of warm-start examples taught as calculator calls (`CalculatorToolEnv`):
    # "12+34=" -> "<tool>12+34</tool>", then, after "<result>46</result>", -> "46". The rest
    # answer directly. 0: no tool use (the GRPO demo); the tool example uses TOOL_USE.
    tool_use: float = 0.0

    @classmethod
    def for_tests(cls, tool_use: float = 0.0) -> DemoRecipe:
        """The e2e tests' recipe: the demo's task, model and warm start, fewer val prompts."""
        return cls(n_val=64, tool_use=tool_use)


def prepare_assets(folder: str | Path, recipe: DemoRecipe) -> dict[str, float]:
    """Build (or reuse) the demo assets in `folder`; returns timings of what it did."""
    root = Path(folder)
    marker = root / RECIPE_FILE
    wanted = json.dumps(dataclasses.asdict(recipe), sort_keys=True)
    if marker.is_file() and marker.read_text() == wanted:
        return {"reused": 1.0}
    if any(os.environ.get(name) != value for name, value in PORTABLE_KERNELS.items()):
        return _prepare_with_portable_kernels(root, wanted)
    started = time.perf_counter()
    task = ArithTask(digits=recipe.digits, allow_carry=recipe.allow_carry)
    paths = make_dataset(task, recipe.n_train, recipe.n_val, root / "data", seed=recipe.seed)
    tokenizer = build_char_tokenizer()
    spec = TinyModelSpec(hidden_size=recipe.hidden_size, num_layers=recipe.num_layers,
                         intermediate_size=4 * recipe.hidden_size, seed=recipe.seed)
    model = build_tiny_model(spec, tokenizer, root / "model")
    examples = warm_start_examples(read_parquet(paths.train), recipe.tool_use, recipe.seed)
    with torch.random.fork_rng(devices=[]):
        losses = supervised_warm_start(model, tokenizer, examples, steps=recipe.warm_steps,
                                       lr=recipe.warm_lr, batch_size=recipe.warm_batch_size,
                                       seed=recipe.seed)
    model.save_pretrained(str(root / "model"))
    tokenizer.save_pretrained(str(root / "model"))
    marker.write_text(wanted)
    return {"warm_start_loss_first": losses[0], "warm_start_loss_last": losses[-1],
            "prepare_seconds": time.perf_counter() - started}


def _prepare_with_portable_kernels(root: Path, recipe_json: str) -> dict[str, float]:
    """`prepare_assets` in a child process whose torch loaded with `PORTABLE_KERNELS`."""
    child = subprocess.run(
        [sys.executable, "-m", "dagrl.models.demo", str(root), "--recipe", recipe_json],
        env={**os.environ, **PORTABLE_KERNELS}, capture_output=True, text=True, check=False)
    if child.returncode != 0:
        raise DagrlError(f"building the demo assets in {root} failed (exit {child.returncode}):"
                         f"\n{child.stderr[-4000:]}")
    return {key: float(value) for key, value in json.loads(child.stdout.splitlines()[-1]).items()}


def warm_start_examples(rows: Iterable[Mapping[str, Any]], tool_use: float,
                        seed: int) -> list[tuple[Prompt, str]]:
    """(prompt, answer) pairs for the warm start: each row answered directly, or, for a
    `tool_use` fraction of them (drawn with `seed`), as a calculator episode in two pairs: the
    question -> the tool call, and the conversation up to the tool's result -> the answer."""
    rng = random.Random(seed)
    examples: list[tuple[Prompt, str]] = []
    for row in rows:
        prompt, answer = row["prompt"], str(row["ground_truth"])
        if rng.random() >= tool_use:
            examples.append((prompt, answer))
            continue
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(
            prompt)
        call = f"<tool>{messages[-1]['content'].rstrip('=')}</tool>"
        examples.append((messages, call))
        examples.append(([*messages, {"role": "assistant", "content": call},
                          {"role": "user", "content": f"<result>{answer}</result>"}], answer))
    return examples


def main() -> None:
    parser = argparse.ArgumentParser(description="build the demo's model and data")
    parser.add_argument("folder", help="where to write model/ and data/ (examples read "
                                       "outputs/arith)")
    parser.add_argument("--small", action="store_true", help="the e2e tests' smaller recipe")
    parser.add_argument("--tool", action="store_true",
                        help=f"teach calculator calls on {TOOL_USE:.0%} of the warm start "
                             "(examples/calculator_tool.yaml reads outputs/arith_tool)")
    parser.add_argument("--recipe", metavar="JSON",
                        help="a whole DemoRecipe as JSON (replaces --small/--tool); prints the "
                             "timings as one JSON line")
    args = parser.parse_args()
    if args.recipe:
        recipe = DemoRecipe(**json.loads(args.recipe))
        print(json.dumps(prepare_assets(args.folder, recipe)))
        return
    tool_use = TOOL_USE if args.tool else 0.0
    recipe = DemoRecipe.for_tests(tool_use) if args.small else DemoRecipe(tool_use=tool_use)
    for key, value in prepare_assets(args.folder, recipe).items():
        print(f"{key}: {value:.4g}")


if __name__ == "__main__":
    main()
