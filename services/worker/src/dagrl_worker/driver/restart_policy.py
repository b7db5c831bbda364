"""When a failed attempt of a job is started again: the restart policy.

A rank's death (its process or its node gone) restarts the job from its last committed
checkpoint, up to `trainer.max_restarts` times; then the job fails. A rank's own error (an
exception in the step) fails the job at once: running it again would raise it again. A task
error may be the echo of another rank's death (gloo's "connection closed by peer" when a node
goes), so before calling it an error the policy asks whether a rank is gone
(`WorkerGroup.a_rank_is_gone`); so is any other Ray error a step ends with (an exception
Ray could not unpickle arrives as `UnserializableException`). After a death the next attempt
waits for the cluster to hold the plan again (a lost node rejoined, or another took its
place), up to `trainer.node_wait_timeout_s` (`WorkerGroup.start_when_placeable`).

Pure logic (no Ray calls): what to do with a failure, given the exception and that question.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ray.exceptions import RayActorError, RayError, RayTaskError

from dagrl_worker.driver.failure_reasons import failure_reason

log = logging.getLogger("dagrl.driver")


def is_worker_death(exc: BaseException) -> bool:
    """A rank's process or node is gone: Ray says so, or the task failed because of it."""
    return isinstance(exc, RayActorError) or (
        isinstance(exc, RayTaskError) and isinstance(getattr(exc, "cause", None), RayActorError))


class RestartPolicy:
    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self.restarts = 0  # attempts started again so far

    @property
    def waits_for_nodes(self) -> bool:
        """Whether the next attempt waits for the cluster to hold the plan (after a death)
        rather than failing at once when it does not."""
        return self.restarts > 0

    def failure(self, exc: RayError,
                a_rank_is_gone: Callable[[], bool]) -> str | None:
        """None to start the job again (the restart counted), else why the job fails.
        `a_rank_is_gone` is asked only of a task error that is not itself a death."""
        if not is_worker_death(exc) and not a_rank_is_gone():
            return f"a worker raised: {failure_reason(exc)}"
        self.restarts += 1
        log.warning("a worker died (%s); restart %d of %d from the last checkpoint",
                    failure_reason(exc), self.restarts, self.max_restarts)
        if self.restarts > self.max_restarts:
            return f"a worker died {self.restarts} times; last: {failure_reason(exc)}"
        return None
