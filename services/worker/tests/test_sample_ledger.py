"""The trained-sample ledger: for each step the rows of its last writer win."""

from __future__ import annotations

from pathlib import Path

from dagrl_worker.rank.async_training.sample_ledger import SampleLedger, read_trained


def test_a_restart_and_a_later_job_replace_the_steps_they_train_again(tmp_path: Path) -> None:
    first = [SampleLedger(tmp_path, rank, "job-a") for rank in (0, 1)]
    for step in (1, 2, 3):
        for rank, ledger in enumerate(first):
            ledger.record(0, step, "actor_train", [f"s{step}:{rank}/0"], [step - 1])
    restarted = [SampleLedger(tmp_path, rank, "job-a") for rank in (0, 1)]
    for rank, ledger in enumerate(restarted):  # attempt 1 trains step 3 again
        ledger.record(1, 3, "actor_train", [f"s3:{rank}/1"], [2])
    resumed = SampleLedger(tmp_path, 0, "job-b")  # a later job, attempt 0 again
    resumed.record(0, 2, "actor_train", ["s2:0/9"], [1])
    with (tmp_path / "trained_samples.rank1.jsonl").open("a") as out:
        out.write('{"cut sh')  # a write a crash cut short
    ledger = read_trained(tmp_path)
    assert [u for row in ledger[1] for u in row["uids"]] == ["s1:0/0", "s1:1/0"]
    assert [u for row in ledger[2] for u in row["uids"]] == ["s2:0/9"]
    assert [u for row in ledger[3] for u in row["uids"]] == ["s3:0/1", "s3:1/1"]
