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

Every write is one optimistic transaction (WATCH the record, write only the changed fields,
append the event): a driver reporting progress and a scheduler cancelling the job at the same
moment cannot undo each other's change. Each event carries the state, step, total_steps,
failure reason, metrics (the last step's summary the driver reported) and time (`unix_ms`, the
record's `updated_unix_ms`) as of that event, so a watcher replays the history exactly
(`read_job_events`). Entries written before metrics and time were stored read as no metrics
and the time of their stream entry id.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import redis

from dagrl.errors import FailedPreconditionError, NotFoundError
from dagrl.urls import redact_urls

JOBS_INDEX_KEY = "dagrl:jobs"
# In a driver's environment: the PID of the scheduler whose jobs end with it (`dagrl run`'s);
# the driver cancels its job once that process is gone, however it went.
DRIVER_OWNER_PID_ENV = "DAGRL_DRIVER_OWNER_PID"


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
    driver_pid: int = 0  # the driver process, on driver_host; 0 before launch
    driver_host: str = ""
    driver_log: str = ""  # path of the driver's log file on driver_host
    # W3C trace context of the SubmitJob call: the driver's spans continue that trace
    trace_context: Mapping[str, str] = field(default_factory=dict)
    # while RUNNING: why the job is not stepping (waiting for a lost node); "" when it is;
    # while PENDING in the scheduler's queue: what it waits for
    waiting_reason: str = ""
    queue_position: int = 0  # while queued: 1 = the next job to start; 0: not queued
    priority: int = 0  # queue order: higher first (SubmitJobRequest.priority)

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
            "driver_pid": str(self.driver_pid).encode(),
            "driver_host": self.driver_host.encode(), "driver_log": self.driver_log.encode(),
            "trace_context": json.dumps(dict(self.trace_context)).encode(),
            "waiting_reason": self.waiting_reason.encode(),
            "queue_position": str(self.queue_position).encode(),
            "priority": str(self.priority).encode(),
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
            driver_pid=int(text.get("driver_pid", b"0")),
            driver_host=text.get("driver_host", b"").decode(),
            driver_log=text.get("driver_log", b"").decode(),
            trace_context=json.loads(text.get("trace_context", b"{}")),
            waiting_reason=text.get("waiting_reason", b"").decode(),
            queue_position=int(text.get("queue_position", b"0")),
            priority=int(text.get("priority", b"0")),
        )


@dataclass(frozen=True)
class JobEvent:
    """One entry of a job's event stream: the record's state, progress and time at that moment.

    `metrics` are the last step's as of the event ({} before the first step, and for entries
    written before metrics were stored); `unix_ms` is when it was written."""

    event_id: str
    state: JobState
    step: int
    total_steps: int
    failure_reason: str
    metrics: Mapping[str, float] = field(default_factory=dict)
    unix_ms: int = 0

    @classmethod
    def from_entry(cls, event_id: str, fields: Mapping[bytes, bytes]) -> JobEvent:
        def text(name: str, default: str = "") -> str:
            raw = fields.get(name.encode())
            return raw.decode() if raw is not None else default

        # the entry id is "<redis server's unix ms>-<sequence>": older entries' only time
        return cls(event_id, JobState(text("state")), int(text("step", "0")),
                   int(text("total_steps", "0")), text("reason"),
                   metrics=json.loads(text("metrics", "{}")),
                   unix_ms=int(text("unix_ms", event_id.split("-", 1)[0])))


def _event_fields(record: JobRecord) -> dict[str, str | int]:
    return {"state": record.state.value, "step": record.step, "total_steps": record.total_steps,
            "reason": record.failure_reason, "metrics": json.dumps(dict(record.metrics)),
            "unix_ms": record.updated_unix_ms}


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
        pipe.xadd(job_events_key(record.job_id), _event_fields(record))
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

        def check(current: JobRecord) -> dict[str, Any] | None:
            if state == current.state:
                return None
            if state not in _NEXT_STATES.get(current.state, set()):
                raise JobStateError(
                    f"job {job_id} cannot go from {current.state.value} to {state.value}"
                )
            # shown by `dagrl status` without a token: no URL's password or query string
            return {"state": state, "failure_reason": redact_urls(reason)}

        return self._transact(job_id, check)

    def set_plan(self, job_id: str, plan: bytes, total_steps: int) -> JobRecord:
        return self._update(job_id, {"plan": plan, "total_steps": total_steps})

    def set_driver(self, job_id: str, pid: int, host: str, log_path: str) -> JobRecord:
        """Record where the job's driver process runs and logs (the scheduler, at launch)."""
        return self._update(job_id, {"driver_pid": pid, "driver_host": host,
                                     "driver_log": log_path})

    def report_progress(self, job_id: str, step: int, total_steps: int,
                        metrics: Mapping[str, float]) -> JobRecord:
        update = {"step": step, "total_steps": total_steps,
                  "metrics": {k: float(v) for k, v in metrics.items()}}
        return self._update(job_id, update)

    def set_waiting(self, job_id: str, reason: str) -> JobRecord:
        """Why the running job is not stepping now; "" once it is again."""
        return self._update(job_id, {"waiting_reason": reason})

    def set_queued(self, job_id: str, position: int, reason: str) -> JobRecord:
        """The job's place in the scheduler's queue (0: it left the queue) and what it waits
        for; unchanged fields are not rewritten."""
        def changes(current: JobRecord) -> dict[str, Any] | None:
            if (current.queue_position, current.waiting_reason) == (position, reason):
                return None
            return {"queue_position": position, "waiting_reason": reason}

        return self._transact(job_id, changes)

    def request_cancel(self, job_id: str) -> JobRecord:
        return self._update(job_id, {"cancel_requested": True})

    def is_cancel_requested(self, job_id: str) -> bool:
        return self._redis.hget(job_key(job_id), "cancel_requested") == b"1"

    def read_job_events(self, job_id: str, after: str = "0",
                        block_ms: int = 1000) -> list[JobEvent]:
        """Events after stream id `after` (waiting up to block_ms), each as it was recorded."""
        answer = self._redis.xread({job_events_key(job_id): after}, block=block_ms)
        if not answer:
            return []
        entries = answer[0][1]
        return [JobEvent.from_entry(entry_id.decode(), fields) for entry_id, fields in entries]

    def _update(self, job_id: str, changes: dict[str, Any]) -> JobRecord:
        return self._transact(job_id, lambda _current: changes)

    def _transact(self, job_id: str,
                  decide: Callable[[JobRecord], dict[str, Any] | None]) -> JobRecord:
        """Read the record, let `decide` return the changes (None: none), write them atomically.

        Only the changed fields are written, under WATCH: when another writer changes the record
        in between, the transaction is retried on the fresh record.
        """
        key = job_key(job_id)
        with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    data = pipe.hgetall(key)
                    if not data:
                        raise JobNotFoundError(
                            f"no job {job_id!r}; `dagrl status` lists the known jobs")
                    current = JobRecord.from_hash(data)
                    changes = decide(current)
                    if changes is None:
                        pipe.reset()
                        return current
                    record = replace(current, updated_unix_ms=_now_ms(), **changes)
                    fields = record.to_hash()
                    written = {name: fields[name] for name in (*changes, "updated_unix_ms")}
                    pipe.multi()
                    pipe.hset(key, mapping=written)
                    pipe.xadd(job_events_key(job_id), _event_fields(record),
                              maxlen=10000)
                    pipe.execute()
                    return record
                except redis.WatchError:
                    continue
