"""The restart policy: a rank's death restarts the job up to `trainer.max_restarts` times, a
rank's own error fails it at once, and an error that echoes another rank's death counts as
that death."""

from __future__ import annotations

from ray.exceptions import RayActorError, RayTaskError, UnserializableException

from dagrl_worker.driver.restart_policy import RestartPolicy, is_worker_death


def raised_on_a_rank(cause: BaseException) -> RayTaskError:
    return RayTaskError("run_step", f"Traceback ...\n{type(cause).__name__}: {cause}", cause,
                        proctitle="ray::DAGWorkerActor", pid=1, ip="127.0.0.1")


def never_asked() -> bool:
    raise AssertionError("a death needs no question about the other ranks")


def test_deaths_restart_until_max_restarts_then_fail_naming_the_count() -> None:
    policy = RestartPolicy(max_restarts=2)
    assert not policy.waits_for_nodes  # the first attempt fails at once if it cannot place
    assert policy.failure(RayActorError(), never_asked) is None
    assert policy.restarts == 1 and policy.waits_for_nodes
    assert policy.failure(RayActorError(), never_asked) is None
    reason = policy.failure(RayActorError(), never_asked)
    assert reason is not None and reason.startswith("a worker died 3 times; last: ")
    assert policy.restarts == 3


def test_no_restarts_allowed_fails_at_the_first_death() -> None:
    policy = RestartPolicy(max_restarts=0)
    reason = policy.failure(RayActorError(), never_asked)
    assert reason is not None and reason.startswith("a worker died 1 times")


def test_a_task_that_failed_because_its_actor_died_is_a_death() -> None:
    death = raised_on_a_rank(RayActorError())
    assert is_worker_death(death)
    policy = RestartPolicy(max_restarts=1)
    assert policy.failure(death, never_asked) is None
    assert policy.restarts == 1


def test_a_ranks_own_error_fails_at_once_when_every_rank_is_alive() -> None:
    error = raised_on_a_rank(ValueError("loss is nan at step 3"))
    assert not is_worker_death(error)
    policy = RestartPolicy(max_restarts=5)
    reason = policy.failure(error, lambda: False)
    assert reason is not None and reason.startswith("a worker raised: ")
    assert "loss is nan at step 3" in reason
    assert policy.restarts == 0 and not policy.waits_for_nodes


def test_an_error_that_echoes_a_lost_rank_is_that_death() -> None:
    """gloo's "connection closed by peer" on one rank when another rank's node goes."""
    asked: list[bool] = []
    policy = RestartPolicy(max_restarts=1)
    echo = raised_on_a_rank(RuntimeError("Connection closed by peer"))
    assert policy.failure(echo, lambda: asked.append(True) or True) is None
    assert asked == [True] and policy.restarts == 1


def test_an_error_ray_could_not_unpickle_is_still_a_ranks_failure() -> None:
    """Ray's `UnserializableException` (not a RayTaskError) once crashed the driver's thread:
    it is asked about like any task error, and its original text is the reason."""
    lost = UnserializableException("Traceback ...\nRedisUnavailableError: Redis at r is gone")
    policy = RestartPolicy(max_restarts=1)
    assert policy.failure(lost, lambda: True) is None and policy.restarts == 1
    reason = RestartPolicy(max_restarts=1).failure(lost, lambda: False)
    assert reason is not None and "Redis at r is gone" in reason
