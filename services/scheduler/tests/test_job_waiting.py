"""A running job's `waiting_reason` (a lost node, `dagrl_worker.driver.job_driver`): stored,
carried by the scheduler's Job message and shown by `dagrl status`."""

from __future__ import annotations

from dagrl.cli.status_cmd import format_job
from dagrl.jobs import JobRecord, JobState
from dagrl_scheduler.service import job_to_proto


def stored(record: JobRecord) -> JobRecord:
    """What Redis gives back: bytes keys and values."""
    return JobRecord.from_hash({k.encode(): v for k, v in record.to_hash().items()})


def test_waiting_reason_round_trips_and_is_shown() -> None:
    record = JobRecord(job_id="job-1", state=JobState.RUNNING,
                       waiting_reason="a rank was lost; waiting until 12:00:00")
    assert stored(record).waiting_reason == record.waiting_reason
    assert stored(JobRecord(job_id="j")).waiting_reason == ""
    job = job_to_proto(record)
    assert job.waiting_reason == record.waiting_reason
    assert "waiting   a rank was lost; waiting until 12:00:00" in format_job(job)
    assert "waiting" not in format_job(job_to_proto(JobRecord(job_id="job-2")))
