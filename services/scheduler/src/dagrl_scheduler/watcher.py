"""A job's history as a stream: what `WatchJob` sends, read from the job store's events.

Owns the watch loop: the job's events from its creation, each change of state or step once,
until a final state, the client going away, or the scheduler shutting down
(`SchedulerStoppingError`, UNAVAILABLE, which says whether the job goes on). Reads only: it
never changes a job, and the events are written by whoever changes one (`dagrl.jobs.JobStore`).
Converting to protos and holding a stream slot are the servicer's (`service`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from dagrl.errors import UnavailableError
from dagrl.jobs import JobEvent, JobRecord, JobStore

WATCH_BLOCK_MS = 500


class SchedulerStoppingError(UnavailableError):
    """The scheduler is shutting down: a watch cannot go on."""

    def __init__(self, job_id: str, stops_drivers: bool) -> None:
        if stops_drivers:
            then = ("it stops its jobs with it (it is the embedded scheduler of a `dagrl run`), "
                    "so the job ends CANCELLED; run it again to start over")
        else:
            then = (f"the job keeps running: `dagrl watch {job_id}` again once the scheduler "
                    "is back (a restarted scheduler re-adopts running jobs)")
        super().__init__(f"the scheduler is shutting down, so the watch of job {job_id} ends "
                         f"here; {then}")


class JobWatcher:
    """`store` is the scheduler's job store (connecting on first use); `closing` is set when
    the scheduler stops, and `stops_drivers` says whether its jobs stop with it."""

    def __init__(self, store: Callable[[], JobStore], closing: threading.Event,
                 stops_drivers: bool) -> None:
        self._store = store
        self._closing = closing
        self._stops_drivers = stops_drivers

    def watch(self, job_id: str,
              is_active: Callable[[], bool]) -> Iterator[tuple[JobEvent, JobRecord]]:
        """Each state change or step of the job from its creation, until its final state;
        SchedulerStoppingError when the scheduler shuts down first."""
        store = self._store()
        store.get(job_id)  # NOT_FOUND before the stream starts
        after, last = "0", None
        while is_active():
            events, record = self._next_events(store, job_id, after)
            if not events:
                if record.state.is_final and last is not None and last[0].is_final:
                    return
                continue
            for event in events:
                after = event.event_id
                if (event.state, event.step) == last:
                    continue
                last = (event.state, event.step)
                yield event, record
                if event.state.is_final:
                    return

    def _next_events(self, store: JobStore, job_id: str,
                     after: str) -> tuple[list[JobEvent], JobRecord]:
        """The job's events after `after` (waiting up to WATCH_BLOCK_MS) and its record."""
        stopping = SchedulerStoppingError(job_id, self._stops_drivers)
        if self._closing.is_set():
            raise stopping
        try:
            return (store.read_job_events(job_id, after, block_ms=WATCH_BLOCK_MS),
                    store.get(job_id))
        except Exception as exc:
            # close() closed the connection under the read: redis-py then fails in more than
            # one way (ConnectionError, ValueError, an AttributeError on its dropped buffer)
            if self._closing.is_set():
                raise stopping from exc
            raise
