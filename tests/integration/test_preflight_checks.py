"""`dagrl config` and `dagrl run`, as the real CLI, refuse what this machine's devices cannot run
and every bad data row before any service starts (issue #36, items 7 and 8).

Before: `trainer.device=cuda` without a GPU failed 16 s in with a Ray placement message that
never named the key; `model.dtype=float16` on CPU trained on nan; invalid UTF-8 in a prompt
column was an uncaught UnicodeDecodeError; an empty or null prompt was named only by a worker
~20 s in; a 10 MB prompt was refused 44 s in, 23 s of it tokenising. "Before any service
starts": `dagrl run` ends with 2 (a job that ran and failed ends with 1) and its log folder,
made once its Redis is up, does not exist afterwards. (No bound on seconds: on a loaded
2-core machine the CLI's own imports take 10-30 s.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagrl.models.tokenizer import build_char_tokenizer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/grpo_arith.yaml"
GOOD = {"prompt": [{"role": "user", "content": "1+1="}], "ground_truth": "2",
        "data_source": "arith"}


def dagrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dagrl.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1",
                               "CUDA_VISIBLE_DEVICES": ""})  # no GPU, whatever the machine


def run_refused(job: str, *overrides: str, tmp_path: Path) -> str:
    """`dagrl run` that must stop before its services: its stderr. The log folder is made
    once Redis is up (`run_cmd._start_services`); a job that ran and failed ends with 1."""
    logs = tmp_path / "logs"
    done = dagrl("run", job, *overrides, "--log-dir", str(logs), "--no-tracing")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert not logs.exists()  # nothing was started
    return done.stderr


def test_cuda_without_a_gpu_is_refused_naming_trainer_device(tmp_path: Path) -> None:
    named = "trainer.device is cuda, but this machine has no GPU"
    done = dagrl("config", EXAMPLE, "trainer.device=cuda")
    assert done.returncode == 2 and named in done.stderr and not done.stdout
    assert named in run_refused(EXAMPLE, "trainer.device=cuda", tmp_path=tmp_path)


CPU_REFUSED = {
    "actor_rollout_ref.model.dtype=float16": "actor_rollout_ref.model.dtype is float16, but "
                                             "the job's ranks run on CPU",
    "critic.model.dtype=float16": "critic.model.dtype is float16",
    "actor_rollout_ref.actor.fsdp_config.param_offload=true":
        "actor_rollout_ref.actor.fsdp_config.param_offload moves state",
    "actor_rollout_ref.model.attn_implementation=flash_attention_2":
        "attn_implementation is flash_attention_2, a GPU kernel",
}


def test_settings_a_cpu_cannot_run_are_each_named_by_config_and_run(tmp_path: Path) -> None:
    done = dagrl("config", EXAMPLE, *CPU_REFUSED)
    assert done.returncode == 2 and not done.stdout
    assert "4 configuration problem(s)" in done.stderr
    assert all(named in done.stderr for named in CPU_REFUSED.values()), done.stderr
    assert "use bfloat16" in done.stderr and "or float32" in done.stderr
    err = run_refused(EXAMPLE, *CPU_REFUSED, tmp_path=tmp_path)
    assert all(named in err for named in CPU_REFUSED.values()), err
    fine = dagrl("config", EXAMPLE, "actor_rollout_ref.model.dtype=bfloat16")
    assert fine.returncode == 0 and "dtype: bfloat16" in fine.stdout


def write_rows(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def job_file(tmp_path: Path, train: Path, **data: object) -> str:
    model = tmp_path / "model"
    if not model.exists():
        build_char_tokenizer(model)  # the policy's tokenizer: what the workers tokenise with
    extra = "".join(f", {key}: {value}" for key, value in data.items())
    job = tmp_path / "job.yaml"
    job.write_text(f"actor_rollout_ref: {{model: {{path: {model}}}, "
                   "actor: {ppo_mini_batch_size: 2}}\n"
                   f"data: {{train_files: [{train}], train_batch_size: 2{extra}}}\n")
    return str(job)


def test_invalid_utf8_is_named_by_row_and_column(tmp_path: Path) -> None:
    texts = pa.array([b"1+1=", b"\xff\xfe2+2=", b"3+3="], pa.binary())
    not_utf8 = pa.Array.from_buffers(pa.string(), len(texts), texts.buffers())  # unchecked
    train = tmp_path / "latin1.parquet"
    pq.write_table(pa.table({"prompt": not_utf8, "ground_truth": ["2", "4", "6"],
                             "data_source": ["arith"] * 3}), train)
    err = run_refused(job_file(tmp_path, train), tmp_path=tmp_path)
    assert f"row 1 of {train}, column 'prompt': its text is not valid UTF-8" in err


def test_every_bad_prompt_row_is_named_before_any_service_starts(tmp_path: Path) -> None:
    rows = [GOOD] * 5 + [{**GOOD, "prompt": []}] + [GOOD] * 2 + [{**GOOD, "prompt": None}]
    train = write_rows(tmp_path / "train.parquet", rows)
    err = run_refused(job_file(tmp_path, train), tmp_path=tmp_path)
    assert f"prompt at row 5 of {train} ('prompt') is []" in err
    assert f"prompt at row 8 of {train} ('prompt') is None" in err
    assert "2 configuration problem(s)" in err


def test_a_huge_prompt_is_refused_in_seconds(tmp_path: Path) -> None:
    huge = {**GOOD, "prompt": [{"role": "user", "content": "12+34=" * 1_700_000}]}  # 10 MB
    train = write_rows(tmp_path / "train.parquet", [GOOD, huge, GOOD])
    err = run_refused(job_file(tmp_path, train, max_prompt_length=32), tmp_path=tmp_path)
    assert f"prompt at row 1 of {train} is more than" in err
    assert "over max_prompt_length=32" in err


def test_prompts_right_truncation_drops_count_toward_a_full_batch(tmp_path: Path) -> None:
    long = {**GOOD, "prompt": [{"role": "user", "content": "9" * 100}]}
    train = write_rows(tmp_path / "train.parquet", [GOOD, long, long])
    err = run_refused(job_file(tmp_path, train, max_prompt_length=32, truncation="right"),
                      tmp_path=tmp_path)
    assert "hold 1 prompts (2 over data.max_prompt_length dropped by data.truncation=right)" in err
