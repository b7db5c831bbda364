"""The scheduler's job queue: strict order by priority then submission, within the slots."""

from __future__ import annotations

from dagrl_scheduler.job_queue import JobQueue, too_large_problem


def positions(queue: JobQueue) -> list[tuple[int, str]]:
    return [(position, waiting.job_id) for position, waiting in queue.waiting()]


def test_jobs_start_while_they_fit_and_wait_in_order_otherwise() -> None:
    queue = JobQueue()
    for job in ("a", "b", "c"):
        queue.add(job, slots=2, capacity=4)
    assert queue.take_startable() == ["a", "b"]
    assert positions(queue) == [(1, "c")]
    assert queue.take_startable() == []
    queue.release("a")
    assert queue.take_startable() == ["c"]
    assert queue.used_slots == 4


def test_priority_goes_first_and_the_head_is_never_overtaken() -> None:
    queue = JobQueue()
    queue.hold("running", 3)
    queue.add("big", slots=4, capacity=4)
    queue.add("small", slots=1, capacity=4)
    queue.add("urgent", slots=2, capacity=4, priority=5)
    assert positions(queue) == [(1, "urgent"), (2, "big"), (3, "small")]
    assert queue.take_startable() == []  # "small" would fit, but "urgent" waits before it
    queue.release("running")
    assert queue.take_startable() == ["urgent"]
    assert positions(queue) == [(1, "big"), (2, "small")]
    assert queue.remove("big") and not queue.remove("big")
    assert queue.take_startable() == ["small"]
    assert queue.drain() == []


def test_a_job_larger_than_the_slots_is_named() -> None:
    assert too_large_problem(2, 2, "DAGRL_SCHEDULER_SLOTS") is None
    problem = too_large_problem(8, 2, "DAGRL_SCHEDULER_SLOTS")
    assert problem is not None
    assert "needs 8 ranks" in problem and "2 slots (DAGRL_SCHEDULER_SLOTS)" in problem
    assert "trainer.nnodes x trainer.n_ranks_per_node" in problem


def test_a_job_queued_again_keeps_one_place_and_a_running_one_is_not_queued() -> None:
    """A recovery retried after a failure re-queues the jobs it queued the first time: each
    keeps its one place, and a job that started meanwhile is not queued behind itself."""
    queue = JobQueue()
    queue.hold("running", 2)
    assert queue.add("a", slots=2, capacity=2) and queue.add("b", slots=2, capacity=2)
    assert not queue.add("a", slots=2, capacity=2, priority=9)
    assert not queue.add("running", slots=2, capacity=2)
    assert positions(queue) == [(1, "a"), (2, "b")]
    queue.release("running")
    assert queue.take_startable() == ["a"]
    assert not queue.add("a", slots=2, capacity=2)
    assert positions(queue) == [(1, "b")] and queue.knows("a") and not queue.knows("c")
