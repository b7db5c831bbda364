"""The job record in Redis: the contract between the scheduler and a job's driver.

The scheduler creates a job, plans it and launches its driver; the driver reads the spec
and plan from here, reports step progress and its final state here, and watches for a
cancel request. Every key pattern of the job store lives in this module.

Keys (`{id}` is the job id):
    dagrl:jobs                  sorted set of job ids by creation time (ms)
    dagrl:job:{id}              hash: the JobRecord fields
    dagrl:job:{id}:events       stream: one entry per state change or progress report

State machine: PENDING -> PLANNING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED, plus
FAILED or CANCELLED from any non-final state. A final state never changes again.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import redis

from dagrl.errors import FailedPreconditionError, NotFoundError

JOBS_INDEX_KEY = "dagrl:jobs"


def job_key(job_id: str) -> str:
    return f"dagrl:job:{job_id}"


def job_events_key(job_id: str) -> str:
    return f"dagrl:job:{job_id}:events"


class JobNotFoundError(NotFoundError):
    """No job with this id is stored."""


class JobStateError(FailedPreconditionError):
    """A state change that the job state machine does not allow."""


class JobState(StrEnum):
    PENDING = "PENDING"
    PLANNING = "PLANNING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_final(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


_NEXT_STATES = {
    JobState.PENDING: {JobState.PLANNING, JobState.FAILED, JobState.CANCELLED},
    JobState.PLANNING: {JobState.RUNNING, JobState.FAILED, JobState.CANCELLED},
    JobState.RUNNING: {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED},
}


@dataclass(frozen=True)
class JobRecord:
    """Everything stored about one job. `plan` is a serialized `dagrl.scheduler.v1.Plan`."""

    job_id: str
    name: str = ""
    state: JobState = JobState.PENDING
    failure_reason: str = ""
    config_yaml: str = ""
    workflow_yaml: str = ""
    overrides: tuple[str, ...] = ()
    plan: bytes = b""
    step: int = 0
    total_steps: int = 0
    metrics: Mapping[str, float] = field(default_factory=dict)
    cancel_requested: bool = False
    created_unix_ms: int = 0
    updated_unix_ms: int = 0

    def to_hash(self) -> dict[str, bytes]:
        return {
            "job_id": self.job_id.encode(), "name": self.name.encode(),
            "state": self.state.value.encode(), "failure_reason": self.failure_reason.encode(),
            "config_yaml": self.config_yaml.encode(),
            "workflow_yaml": self.workflow_yaml.encode(),
            "overrides": json.dumps(list(self.overrides)).encode(), "plan": self.plan,
            "step": str(self.step).encode(), "total_steps": str(self.total_steps).encode(),
            "metrics": json.dumps(dict(self.metrics)).encode(),
            "cancel_requested": b"1" if self.cancel_requested else b"0",
            "created_unix_ms": str(self.created_unix_ms).encode(),
            "updated_unix_ms": str(self.updated_unix_ms).encode(),
        }

    @classmethod
    def from_hash(cls, data: Mapping[bytes, bytes]) -> JobRecord:
        text = {k.decode(): v for k, v in data.items()}
        return cls(
            job_id=text["job_id"].decode(), name=text["name"].decode(),
            state=JobState(text["state"].decode()),
            failure_reason=text["failure_reason"].decode(),
            config_yaml=text["config_yaml"].decode(),
            workflow_yaml=text["workflow_yaml"].decode(),
            overrides=tuple(json.loads(text["overrides"])), plan=text["plan"],
            step=int(text["step"]), total_steps=int(text["total_steps"]),
            metrics=json.loads(text["metrics"]),
            cancel_requested=text["cancel_requested"] == b"1",
            created_unix_ms=int(text["created_unix_ms"]),
            updated_unix_ms=int(text["updated_unix_ms"]),
        )


def new_job_id() -> str:
    return f"job-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _now_ms() -> int:
    return int(time.time() * 1000)


class JobStore:
    """Read and write job records; every write also appends an event to the job's stream."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis: Any = client  # redis-py's return types are unions of sync/async

    def create(self, record: JobRecord) -> JobRecord:
        now = _now_ms()
        record = replace(record, created_unix_ms=now, updated_unix_ms=now)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(job_key(record.job_id), mapping=record.to_hash())
        pipe.zadd(JOBS_INDEX_KEY, {record.job_id: now})
        pipe.xadd(job_events_key(record.job_id), {"state": record.state.value, "step": 0})
        pipe.execute()
        return record

    def get(self, job_id: str) -> JobRecord:
        data = self._redis.hgetall(job_key(job_id))
        if not data:
            raise JobNotFoundError(f"no job {job_id!r}; `dagrl status` lists the known jobs")
        return JobRecord.from_hash(data)

    def list_jobs(self, limit: int = 0) -> list[JobRecord]:
        """Jobs, newest first; `limit` 0 means all."""
        ids = self._redis.zrevrange(JOBS_INDEX_KEY, 0, (limit - 1) if limit > 0 else -1)
        records = []
        for raw_id in ids:
            try:
                records.append(self.get(raw_id.decode()))
            except JobNotFoundError:
                continue
        return records

    def set_state(self, job_id: str, state: JobState, reason: str = "") -> JobRecord:
        """Move the job to `state`; JobStateError when the state machine forbids it."""
        current = self.get(job_id)
        if state == current.state:
            return current
        if state not in _NEXT_STATES.get(current.state, set()):
            raise JobStateError(
                f"job {job_id} cannot go from {current.state.value} to {state.value}"
            )
        return self._update(current, {"state": state, "failure_reason": reason})

    def set_plan(self, job_id: str, plan: bytes, total_steps: int) -> JobRecord:
        return self._update(self.get(job_id), {"plan": plan, "total_steps": total_steps})

    def report_progress(self, job_id: str, step: int, total_steps: int,
                        metrics: Mapping[str, float]) -> JobRecord:
        update = {"step": step, "total_steps": total_steps,
                  "metrics": {k: float(v) for k, v in metrics.items()}}
        return self._update(self.get(job_id), update)

    def request_cancel(self, job_id: str) -> JobRecord:
        return self._update(self.get(job_id), {"cancel_requested": True})

    def is_cancel_requested(self, job_id: str) -> bool:
        return self._redis.hget(job_key(job_id), "cancel_requested") == b"1"

    def read_events(self, job_id: str, after: str = "0",
                    block_ms: int = 1000) -> list[tuple[str, JobRecord]]:
        """Events after stream id `after` (waiting up to block_ms), each with the record now."""
        answer = self._redis.xread({job_events_key(job_id): after}, block=block_ms)
        if not answer:
            return []
        record = self.get(job_id)
        return [(entry_id.decode(), record) for entry_id, _fields in answer[0][1]]

    def _update(self, current: JobRecord, changes: dict[str, Any]) -> JobRecord:
        record = replace(current, updated_unix_ms=_now_ms(), **changes)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(job_key(record.job_id), mapping=record.to_hash())
        pipe.xadd(job_events_key(record.job_id),
                  {"state": record.state.value, "step": record.step}, maxlen=10000)
        pipe.execute()
        return record
