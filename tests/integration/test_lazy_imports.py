"""What a process loads before it needs it: every rank process of every job imports the rank
side, and every `dagrl` command the CLI, so an optional stack imported there costs each of
them its import time (peft ~0.3 s, aiohttp ~0.2 s, transformers ~3 s). They load only where a
job uses them: peft with `model.lora_rank`, aiohttp with a remote reward or an agent program,
vLLM with `rollout.name: vllm`, transformers and torch once the CLI reads a tokenizer or runs a
job; `dagrl run` checks the prompts of a job whose tokenizer is a generic fast one (the
demo's) without torch. A job's driver (one process per job, `python -m dagrl_worker`) and
the small actors it starts beside the ranks (the weight board, the per-machine Redis) never
load torch or transformers (~5 s of each job's start on two cores here): only the ranks do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dagrl.models.tokenizer import build_char_tokenizer

pytestmark = pytest.mark.integration  # a fresh interpreter: sys.modules as a new process has it

PROBE = """
import json, sys
import dagrl.cli.main
cli = sorted(m for m in ("torch", "transformers") if m in sys.modules)
import dagrl_worker.driver.job_driver, dagrl_worker.driver.machine_buffers
import dagrl_worker.rank.async_training.weight_board
driver = sorted(m for m in ("torch", "transformers") if m in sys.modules)
from dagrl.tokenizing import load_tokenizer
load_tokenizer(sys.argv[1])  # what `dagrl run` checks the prompts with
preflight = sorted(m for m in ("torch",) if m in sys.modules)
import dagrl_worker.rank.dag_worker
rank = sorted(m for m in ("peft", "aiohttp", "vllm") if m in sys.modules)
print(json.dumps({"cli": cli, "preflight": preflight, "driver": driver, "rank": rank,
                  "rank_loads_torch": "torch" in sys.modules}))
"""


def test_the_cli_the_driver_and_the_rank_side_load_no_optional_stack_at_import(
        tmp_path: Path) -> None:
    build_char_tokenizer(tmp_path / "tokenizer")  # the demo's: a generic fast tokenizer
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "tokenizer")],
                          capture_output=True, text=True, timeout=120, check=True)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {"cli": [], "preflight": [], "driver": [], "rank": [],
                      "rank_loads_torch": True}, loaded
