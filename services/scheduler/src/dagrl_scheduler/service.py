"""The gRPC servicer: request validation, proto <-> domain conversion, errors -> status codes.

Business logic lives behind `JobManager` (`manager`, which composes the job planner, the
dispatcher, the driver supervisor and the watcher) and in `planning`; each RPC here checks its
request, calls one manager method and converts the answer. Every error leaves through
`dagrl.rpc.status.abort_with`, the one place that maps errors to status codes. A WatchJob
stream holds one of the server's stream slots (`dagrl.rpc.streams`) while it is open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import NoReturn

import grpc

from dagrl.errors import DagrlError, InvalidInputError
from dagrl.jobs import JobEvent, JobRecord, JobState
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from dagrl.rpc.status import abort_with, as_dagrl_error
from dagrl.rpc.streams import StreamSlots
from dagrl_scheduler.manager import JobManager

log = logging.getLogger(__name__)

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
# Methods that change jobs: they need the bearer token when the scheduler has one.
PROTECTED_METHODS = (f"/{SERVICE_NAME}/SubmitJob", f"/{SERVICE_NAME}/CancelJob")
# A private scheduler (`dagrl run`'s embedded one) needs the token on every method of its own.
ALL_METHODS = tuple(f"/{SERVICE_NAME}/{method.name}" for method in
                    scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].methods)

_STATE_TO_PROTO = {state: common_pb2.JobState.Value(f"JOB_STATE_{state.value}")
                   for state in JobState}


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, manager: JobManager, streams: StreamSlots) -> None:
        self._manager = manager
        self._streams = streams

    def PlanJob(self, request: scheduler_pb2.PlanJobRequest,
                context: grpc.ServicerContext) -> scheduler_pb2.PlanJobResponse:
        try:
            plan = self._manager.plan(request.spec, request.cluster)
            return scheduler_pb2.PlanJobResponse(plan=plan.to_proto())
        except Exception as exc:
            _abort(context, exc, "PlanJob")

    def SubmitJob(self, request: scheduler_pb2.SubmitJobRequest,
                  context: grpc.ServicerContext) -> scheduler_pb2.SubmitJobResponse:
        try:
            record = self._manager.submit(request.spec, request.cluster, request.priority)
            return scheduler_pb2.SubmitJobResponse(job=job_to_proto(record, with_plan=True))
        except Exception as exc:
            _abort(context, exc, "SubmitJob")

    def GetJob(self, request: scheduler_pb2.GetJobRequest,
               context: grpc.ServicerContext) -> scheduler_pb2.GetJobResponse:
        try:
            record = self._manager.get(_job_id(request.job_id))
            return scheduler_pb2.GetJobResponse(job=job_to_proto(record, with_plan=True))
        except Exception as exc:
            _abort(context, exc, "GetJob")

    def ListJobs(self, request: scheduler_pb2.ListJobsRequest,
                 context: grpc.ServicerContext) -> scheduler_pb2.ListJobsResponse:
        try:
            if request.limit < 0:
                raise InvalidInputError(f"limit must be >= 0 (0: all), got {request.limit}")
            records = self._manager.list_jobs(request.limit)
            return scheduler_pb2.ListJobsResponse(jobs=[job_to_proto(r) for r in records])
        except Exception as exc:
            _abort(context, exc, "ListJobs")

    def CancelJob(self, request: scheduler_pb2.CancelJobRequest,
                  context: grpc.ServicerContext) -> scheduler_pb2.CancelJobResponse:
        try:
            record = self._manager.cancel(_job_id(request.job_id))
            return scheduler_pb2.CancelJobResponse(job=job_to_proto(record))
        except Exception as exc:
            _abort(context, exc, "CancelJob")

    def WatchJob(self, request: scheduler_pb2.WatchJobRequest,
                 context: grpc.ServicerContext) -> Iterator[scheduler_pb2.JobEvent]:
        try:
            with self._streams.hold("WatchJob"):
                for event, record in self._manager.watch(_job_id(request.job_id),
                                                         context.is_active):
                    yield scheduler_pb2.JobEvent(job=event_to_proto(event, record))
        except Exception as exc:
            _abort(context, exc, "WatchJob")


def job_to_proto(record: JobRecord, *, with_plan: bool = False) -> scheduler_pb2.Job:
    job = scheduler_pb2.Job(
        job_id=record.job_id, name=record.name, state=_STATE_TO_PROTO[record.state],
        failure_reason=record.failure_reason,
        progress=common_pb2.StepProgress(step=record.step, total_steps=record.total_steps,
                                         metrics=dict(record.metrics)),
        created_unix_ms=record.created_unix_ms, updated_unix_ms=record.updated_unix_ms,
        driver_log=record.driver_log, waiting_reason=record.waiting_reason,
        queue_position=record.queue_position,
    )
    if with_plan and record.plan:
        job.plan.ParseFromString(record.plan)
    return job


def event_to_proto(event: JobEvent, record: JobRecord) -> scheduler_pb2.Job:
    """The job as of `event`: its state, step, metrics, reason and time (`updated_unix_ms`)
    then; its name, log and queue place as now."""
    job = job_to_proto(record)
    job.state = _STATE_TO_PROTO[event.state]
    job.failure_reason = event.failure_reason
    job.progress.CopyFrom(common_pb2.StepProgress(
        step=event.step, total_steps=event.total_steps, metrics=dict(event.metrics)))
    job.updated_unix_ms = event.unix_ms
    return job


def _job_id(job_id: str) -> str:
    if not job_id.strip():
        raise InvalidInputError("job_id is empty; `dagrl status` lists the known jobs")
    return job_id.strip()


def _abort(context: grpc.ServicerContext, exc: Exception, method: str) -> NoReturn:
    if not isinstance(as_dagrl_error(exc), DagrlError):
        log.exception("%s failed unexpectedly", method)
    abort_with(context, exc)
