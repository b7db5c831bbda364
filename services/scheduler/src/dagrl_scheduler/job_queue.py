"""The scheduler's job queue: which submitted jobs may start now, and the others' positions.

A job holds its plan's ranks (`world_size` slots) from its start until its driver exits. A
submitted job starts when its slots fit beside those of the jobs running: within the slots of
the cluster it was planned for, or the scheduler's `slots` setting when one is given
(`DAGRL_SCHEDULER_SLOTS`). Otherwise it waits, PENDING, in the queue: higher `priority` first,
in submission order among equals. The queue is strict: a job never starts ahead of one waiting
before it, so a large job is not starved by a stream of small ones. A job that could never fit
(more ranks than the slots) is refused at submit (`too_large_problem`).

Plain logic under one lock, no I/O: the dispatcher (`dagrl_scheduler.dispatcher`) records the
states and positions in the job store.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiting:
    job_id: str
    slots: int  # ranks of its plan
    capacity: int  # slots it may share with the running jobs
    priority: int
    order: int  # submission order

    def sort_key(self) -> tuple[int, int]:
        return -self.priority, self.order


def too_large_problem(slots: int, capacity: int, setting: str) -> str | None:
    """Why a job of `slots` ranks can never start within `capacity` (None: it can)."""
    if slots <= capacity:
        return None
    return (f"the job's plan needs {slots} ranks but this scheduler runs jobs on {capacity} "
            f"slots ({setting}), so it could never start; lower trainer.nnodes x "
            "trainer.n_ranks_per_node (or the cluster you submit with), or give the scheduler "
            "more slots")


class JobQueue:
    """Running jobs' slots and the waiting jobs, in start order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._waiting: list[Waiting] = []
        self._orders = itertools.count()

    @property
    def used_slots(self) -> int:
        with self._lock:
            return sum(self._running.values())

    def add(self, job_id: str, slots: int, capacity: int, priority: int = 0) -> bool:
        """Queue a submitted job; `take_startable` decides when it starts. A job already
        waiting or running is left as it is (a recovery retried after a failure queues its
        jobs again); whether it was queued."""
        with self._lock:
            if self._knows(job_id):
                return False
            self._waiting.append(Waiting(job_id, slots, capacity, priority, next(self._orders)))
            self._waiting.sort(key=Waiting.sort_key)
            return True

    def knows(self, job_id: str) -> bool:
        """Whether the job is waiting or holds slots."""
        with self._lock:
            return self._knows(job_id)

    def hold(self, job_id: str, slots: int) -> None:
        """Count a job that runs already (a driver a restarted scheduler re-adopted)."""
        with self._lock:
            self._running[job_id] = slots

    def release(self, job_id: str) -> None:
        """The job's driver exited: its slots are free. Idempotent."""
        with self._lock:
            self._running.pop(job_id, None)

    def remove(self, job_id: str) -> bool:
        """Take a waiting job out of the queue (cancelled); whether it was waiting."""
        with self._lock:
            kept = [w for w in self._waiting if w.job_id != job_id]
            removed = len(kept) != len(self._waiting)
            self._waiting = kept
            return removed

    def take_startable(self) -> list[str]:
        """The jobs at the head of the queue that fit now, in order, counted as running."""
        started = []
        with self._lock:
            used = sum(self._running.values())
            while self._waiting and used + self._waiting[0].slots <= self._waiting[0].capacity:
                head = self._waiting.pop(0)
                self._running[head.job_id] = head.slots
                used += head.slots
                started.append(head.job_id)
        return started

    def waiting(self) -> list[tuple[int, Waiting]]:
        """(1-based position, job) of each waiting job, in start order."""
        with self._lock:
            return list(enumerate(self._waiting, start=1))

    def _knows(self, job_id: str) -> bool:
        return job_id in self._running or any(w.job_id == job_id for w in self._waiting)

    def drain(self) -> list[str]:
        """Empty the queue (the scheduler stops); the ids of the jobs that were waiting."""
        with self._lock:
            ids = [w.job_id for w in self._waiting]
            self._waiting = []
            return ids
