"""The job driver's command line: its arguments and `main`, the driver process.

`python -m dagrl_worker` (the scheduler's command, `__main__.py`) ends in `main`: the job's spec
read from the job store, Ray started or joined, the `Driver` run to the job's end, the final
state set in the store. `parse_args` needs nothing heavy, so that `python -m dagrl_worker
--help` and usage errors answer at once; `main` imports Ray (through the driver) only once the
arguments are good. The driver never loads torch or transformers: the ranks do, in their own
processes (`rank.actors`).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from dagrl.jobs import DRIVER_OWNER_PID_ENV, JobStore
from dagrl_worker.shared.spec import WorkerSpec

log = logging.getLogger("dagrl.driver")


def parse_args(argv: Sequence[str] | None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog,
                                     description="run one dagrl job (launched by the scheduler)")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--redis-url", required=True, help="job store (and databuffer) Redis")
    parser.add_argument("--ray-address", default=None, help="Ray cluster; default: start one")
    owner = os.environ.get(DRIVER_OWNER_PID_ENV)
    parser.add_argument("--owner-pid", type=int, default=int(owner) if owner else None,
                        help="cancel the job when this process (the scheduler that owns it) "
                             f"is gone, however it ended (default: ${DRIVER_OWNER_PID_ENV})")
    return parser.parse_args(argv)


def spec_from_store(store: JobStore, job_id: str, redis_url: str) -> WorkerSpec:
    """The job's spec from its record; its run folder resolved from the job's config."""
    record = store.get(job_id)
    spec = WorkerSpec(job_id=job_id, config_yaml=record.config_yaml,
                      workflow_yaml=record.workflow_yaml, overrides=record.overrides,
                      plan=record.plan, redis_url=redis_url, checkpoint_dir="")
    trainer = spec.job_config().trainer
    folder = Path(trainer.default_local_dir) / trainer.project_name / trainer.experiment_name
    return WorkerSpec(**{**spec.__dict__, "checkpoint_dir": str(folder.resolve())})


def main(argv: Sequence[str] | None = None, prog: str = "python -m dagrl_worker") -> int:
    """Run the job named on the command line; 0 when it succeeded."""
    args = parse_args(argv, prog=prog)  # usage errors and --help before the imports below
    import signal

    import ray  # with the driver below: seconds to import
    import redis
    import yaml

    from dagrl.config import to_dict
    from dagrl.jobs import JobState
    from dagrl.local.processes import on_exit_of
    from dagrl.urls import redact_urls
    from dagrl_worker.driver.failure_reasons import failure_reason
    from dagrl_worker.driver.job_driver import Driver
    from dagrl_worker.driver.worker_group import ray_options

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    store = JobStore(redis.Redis.from_url(args.redis_url))
    try:
        spec = spec_from_store(store, args.job_id, args.redis_url)
        log.info("job %s config:\n%s", args.job_id,  # a URL's secrets stay out of the log
                 redact_urls(yaml.safe_dump(to_dict(spec.job_config()), sort_keys=False)))
        ray.init(**ray_options(args.ray_address, spec.plan_view().world_size))
        driver = Driver(spec, store)
        signal.signal(signal.SIGTERM, lambda *_: driver.request_cancel())
        if args.owner_pid is not None:  # a job of `dagrl run` ends with its scheduler
            on_exit_of(args.owner_pid, driver.request_cancel)
        outcome = driver.run(submit_context=dict(store.get(args.job_id).trace_context))
    except Exception as exc:
        log.exception("driver failed")
        store.set_state(args.job_id, JobState.FAILED, f"driver error: {failure_reason(exc)}")
        return 1
    store.set_state(args.job_id, outcome.state, outcome.reason)
    ray.shutdown()
    return 0 if outcome.state == JobState.SUCCEEDED else 1
