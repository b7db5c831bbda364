"""The job store's contract with drivers: atomic updates and replayable events."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import redis

from dagrl.jobs import (
    JobRecord,
    JobState,
    JobStateError,
    JobStore,
    job_events_key,
    job_key,
)
from dagrl.local.redis_server import LocalRedis

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(redis_server: LocalRedis) -> redis.Redis:
    """The session's redis-server, in a database of this module's own (flushed per test)."""
    return redis.Redis.from_url(redis_server.url.rsplit("/", 1)[0] + "/9")


@pytest.fixture
def store(client: redis.Redis) -> JobStore:
    client.flushdb()
    return JobStore(client)


def running(store: JobStore, job_id: str) -> None:
    store.create(JobRecord(job_id=job_id, name="t"))
    store.set_state(job_id, JobState.PLANNING)
    store.set_state(job_id, JobState.RUNNING)


def test_progress_reports_never_undo_a_concurrent_cancel(store: JobStore) -> None:
    running(store, "job-a")
    stop = threading.Event()

    def report() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            store.report_progress("job-a", step, 0, {"loss": 1.0})

    reporter = threading.Thread(target=report)
    reporter.start()
    try:
        store.set_state("job-a", JobState.CANCELLED, "cancelled by request")
        for _ in range(20):
            store.report_progress("job-a", 999, 0, {})
    finally:
        stop.set()
        reporter.join()
    record = store.get("job-a")
    assert (record.state, record.failure_reason) == (JobState.CANCELLED, "cancelled by request")
    with pytest.raises(JobStateError):
        store.set_state("job-a", JobState.SUCCEEDED)


def test_events_replay_each_state_and_step_as_recorded(store: JobStore) -> None:
    running(store, "job-b")
    store.report_progress("job-b", 1, 2, {})
    store.report_progress("job-b", 2, 2, {})
    store.set_state("job-b", JobState.FAILED, "loss is nan")
    events = store.read_job_events("job-b", block_ms=100)
    assert [(e.state, e.step) for e in events] == [
        (JobState.PENDING, 0), (JobState.PLANNING, 0), (JobState.RUNNING, 0),
        (JobState.RUNNING, 1), (JobState.RUNNING, 2), (JobState.FAILED, 2)]
    assert events[-1].failure_reason == "loss is nan" and events[-1].total_steps == 2
    assert store.read_job_events("job-b", after=events[-1].event_id, block_ms=10) == []


def test_each_event_keeps_the_metrics_and_time_of_its_own_moment(store: JobStore) -> None:
    running(store, "job-m")
    for step, loss in ((1, 0.9), (2, 0.5)):
        time.sleep(0.02)
        store.report_progress("job-m", step, 2, {"actor/pg_loss": loss})
    time.sleep(0.02)
    final = store.set_state("job-m", JobState.SUCCEEDED)
    events = store.read_job_events("job-m", block_ms=100)
    assert [(e.step, dict(e.metrics)) for e in events] == [
        (0, {}), (0, {}), (0, {}), (1, {"actor/pg_loss": 0.9}), (2, {"actor/pg_loss": 0.5}),
        (2, {"actor/pg_loss": 0.5})]
    times = [e.unix_ms for e in events]
    assert times == sorted(times) and times[-1] == final.updated_unix_ms
    # 20 ms apart from RUNNING at step 0 on; whole ms, so one less at worst
    assert all(later - earlier >= 19 for earlier, later in itertools.pairwise(times[2:]))


def test_events_stored_before_metrics_were_kept_read_without_metrics(
        store: JobStore, client: redis.Redis) -> None:
    """An entry of an older store (state, step, total_steps, reason only): no metrics rather
    than the job's final ones, and the time of its stream entry id."""
    running(store, "job-old")
    store.report_progress("job-old", 1, 1, {"loss": 0.1})
    key = job_events_key("job-old")
    client.delete(key)
    client.xadd(key, {"state": "RUNNING", "step": 2, "total_steps": 2, "reason": ""},
                id="1700000000123-0")
    [event] = store.read_job_events("job-old", block_ms=100)
    assert (event.step, dict(event.metrics), event.unix_ms) == (2, {}, 1700000000123)


def test_driver_location_is_kept_and_old_records_still_load(store: JobStore,
                                                           client: redis.Redis) -> None:
    running(store, "job-c")
    store.set_driver("job-c", 4242, "host-a", "/logs/job-c.log")
    record = store.get("job-c")
    assert (record.driver_pid, record.driver_host, record.driver_log) == (
        4242, "host-a", "/logs/job-c.log")
    client.hdel(job_key("job-c"), "driver_pid", "driver_host", "driver_log")
    assert store.get("job-c").driver_pid == 0


def test_a_failure_reason_is_stored_without_url_secrets(store: JobStore) -> None:
    """`dagrl status` shows the reason without a token: a URL's password and query string (an
    API key) never reach the store (issue 27, item 3)."""
    running(store, "job-secret")
    store.set_state("job-secret", JobState.FAILED,
                    "step 0: RewardError: http://u:pw@h:8000/score?key=K3Y answered HTTP 500")
    reason = store.get("job-secret").failure_reason
    assert reason == "step 0: RewardError: http://u:***@h:8000/score?*** answered HTTP 500"
