"""The embedded scheduler of `dagrl run` serves only its own CLI (issue #27, item 2).

Another local process can find its loopback port; without the random token `dagrl run` handed
to it, every SchedulerService call — a submission (which would run that process's reward code
as the user of `dagrl run`), PlanJob and the reads — ends UNAUTHENTICATED.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dagrl.cli.client import SchedulerClient, SchedulerEndpoint, build_job_spec, embedded_scheduler
from dagrl.errors import UnauthenticatedError
from dagrl.local.redis_server import LocalRedis
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2

pytestmark = pytest.mark.integration

JOB = ("trainer: {nnodes: 1, n_ranks_per_node: 1, total_training_steps: 1}\n"
       "actor_rollout_ref: {model: {path: /models/policy}}\n"
       "workflow: {source: grpo}\n")


@pytest.fixture(scope="module")
def embedded(redis_server: LocalRedis,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchedulerEndpoint]:
    url = redis_server.url.rsplit("/", 1)[0] + "/9"
    with embedded_scheduler(url, str(tmp_path_factory.mktemp("logs"))) as scheduler:
        yield scheduler


def test_a_stranger_without_the_token_can_neither_submit_nor_read(
        embedded: SchedulerEndpoint, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    spec = build_job_spec(str(tmp_path / "job.yaml"), [])
    cluster = scheduler_pb2.ClusterSpec()
    assert embedded.token and len(embedded.token) >= 32
    for token in (None, "guessed-token"):
        with SchedulerClient(embedded.address, token) as stranger:
            calls = {"SubmitJob": lambda: stranger.submit(spec, cluster),
                     "PlanJob": lambda: stranger.plan(spec, cluster),
                     "ListJobs": lambda: stranger.list_jobs(),
                     "GetJob": lambda: stranger.get("job-x"),
                     "CancelJob": lambda: stranger.cancel("job-x"),
                     "WatchJob": lambda: next(stranger.watch("job-x"))}
            for name, call in calls.items():
                with pytest.raises(UnauthenticatedError, match=f"{name} carries .*private "
                                   "scheduler .*`dagrl run`"):
                    call()
    with embedded.client() as owner:
        assert owner.plan(spec, cluster).world_size == 1
        assert owner.list_jobs() == []  # nothing was submitted by the stranger
