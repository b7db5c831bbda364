"""A stand-in for the worker's job driver, for scheduler tests (the real one needs Ray).

Speaks the launch contract: `fake_driver.py --job-id JOB --redis-url URL [--ray-address A]`.
What it does depends on the job's name:
    succeed  report steps 1..3 of 3, then SUCCEEDED
    fail     report step 1, then FAILED("loss is nan")
    crash    print "boom" to stderr and exit with code 3 (no final state)
    sleep    wait for SIGTERM, then exit 0 (like a driver stopping its workers)
    stubborn ignore SIGTERM, start a child process (logged as `child pid N`), create the job's
             rendezvous file as its ranks would (logged as `rendezvous PATH`) and sleep
    oblivious wait for SIGTERM without reading the job's state first (a driver still starting
             up, which has not seen that its job was cancelled)
It checks that it received the plan, and fails the job when it did not.
Every process it starts (itself, the stubborn child) is appended to the file named by
`DAGRL_TEST_FAKE_DRIVER_PIDS` when set: the integration tests' fixture stops each by PID.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

import redis

from dagrl.jobs import JobState, JobStore
from dagrl.rendezvous import rendezvous_file
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2

PIDS_ENV = "DAGRL_TEST_FAKE_DRIVER_PIDS"


def record_pid(pid: int) -> None:
    """Tell the tests' fixture (tests/integration/conftest.py) to stop `pid` at teardown."""
    if path := os.environ.get(PIDS_ENV):
        with open(path, "a") as pids:
            pids.write(f"{pid}\n")


def main() -> int:
    record_pid(os.getpid())
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--ray-address")
    args = parser.parse_args()
    store = JobStore(redis.Redis.from_url(args.redis_url))
    record = store.get(args.job_id)
    if record.name == "oblivious":
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        print(f"fake driver for {args.job_id}: oblivious", flush=True)
        stop.wait(120)
        return 0
    plan = scheduler_pb2.Plan.FromString(record.plan)
    if plan.world_size < 1 or record.state is not JobState.RUNNING:
        store.set_state(args.job_id, JobState.FAILED, "fake driver: no plan or not RUNNING")
        return 1
    print(f"fake driver for {args.job_id}: {record.name} on {plan.world_size} ranks", flush=True)
    if record.name == "succeed":
        for step in (1, 2, 3):
            store.report_progress(args.job_id, step, 3, {"reward": 0.1 * step})
        store.set_state(args.job_id, JobState.SUCCEEDED)
    elif record.name == "fail":
        store.report_progress(args.job_id, 1, 3, {"reward": 0.0})
        store.set_state(args.job_id, JobState.FAILED, "loss is nan")
    elif record.name == "crash":
        print("boom: the fake driver crashed", file=sys.stderr, flush=True)
        return 3
    elif record.name == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        record_pid(child.pid)
        print(f"child pid {child.pid}", flush=True)
        rendezvous = rendezvous_file(args.job_id)
        rendezvous.touch()
        print(f"rendezvous {rendezvous}", flush=True)
        store.report_progress(args.job_id, 1, 100, {})
        time.sleep(120)
    elif record.name == "sleep":
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        store.report_progress(args.job_id, 1, 100, {})
        if stop.wait(120):
            print("fake driver: stopping on SIGTERM", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
