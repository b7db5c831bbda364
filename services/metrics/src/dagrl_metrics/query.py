"""MetricsQueryService: GetStepSummary, ListSteps and WatchSteps over the step store.

Errors leave through `dagrl.rpc.status.abort_with` (NOT_FOUND for an unknown job or step,
INVALID_ARGUMENT for a request without a job, RESOURCE_EXHAUSTED for a WatchSteps beyond the
server's stream slots, `dagrl.rpc.streams`).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from dagrl.errors import DagrlError
from dagrl.rpc.gen.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from dagrl.rpc.status import abort_with
from dagrl.rpc.streams import StreamSlots
from dagrl_metrics.errors import BadQueryError
from dagrl_metrics.store import StepStore

_WATCH_POLL_S = 0.5  # how often an idle stream checks that its client is still there


class MetricsQueryServicer(metrics_pb2_grpc.MetricsQueryServiceServicer):
    def __init__(self, store: StepStore, streams: StreamSlots) -> None:
        self._store = store
        self._streams = streams

    def GetStepSummary(self, request: metrics_pb2.GetStepSummaryRequest,
                       context: grpc.ServicerContext) -> metrics_pb2.StepSummary:
        try:
            step = request.step if request.HasField("step") else None
            return self._store.summary(request.job_id, step)
        except DagrlError as exc:
            abort_with(context, exc)

    def ListSteps(self, request: metrics_pb2.ListStepsRequest,
                  context: grpc.ServicerContext) -> metrics_pb2.ListStepsResponse:
        try:
            return metrics_pb2.ListStepsResponse(
                steps=self._store.list_steps(request.job_id, request.limit))
        except DagrlError as exc:
            abort_with(context, exc)

    def WatchSteps(self, request: metrics_pb2.WatchStepsRequest,
                   context: grpc.ServicerContext) -> Iterator[metrics_pb2.StepSummary]:
        try:
            if not request.job_id:
                raise BadQueryError("job_id is empty: name the job to watch")
            with self._streams.hold("WatchSteps"):
                yield from self._watch(request, context)
        except DagrlError as exc:
            abort_with(context, exc)

    def _watch(self, request: metrics_pb2.WatchStepsRequest,
               context: grpc.ServicerContext) -> Iterator[metrics_pb2.StepSummary]:
        cursor = 0
        while context.is_active():
            summaries, cursor = self._store.completed_since(
                request.job_id, cursor, request.from_step)
            yield from summaries
            if not self._store.wait_for_change(_WATCH_POLL_S):
                return
