"""Every span name, attribute key and metric name dagrl emits, defined once.

Workers, services, the metrics service and the dashboard all import these constants;
nobody spells a name as a string literal anywhere else. The span tree of one step is

    step                        driver: one per job step, the root of that step's trace
      step                      one per rank (dagrl.rank set), a child of the driver's span
        node/<node_id>          one per workflow node the rank runs
          databuffer.get | rollout.generate | actor.forward_backward | ...   phases

Attribute values: `dagrl.tokens`, `dagrl.batch_size`, `dagrl.bytes` and `dagrl.flops` are
totals for the span they sit on (a rank's step span: the tokens its samples hold this step).
"""

from __future__ import annotations

from typing import Final

# ---- resource attributes (one per process) ---------------------------------------------
RESOURCE_SERVICE_NAME: Final = "service.name"
RESOURCE_JOB_ID: Final = "dagrl.job_id"
RESOURCE_RANK: Final = "dagrl.rank"

# ---- span names ---------------------------------------------------------------------------
SPAN_STEP: Final = "step"
SPAN_NODE_PREFIX: Final = "node/"
SPAN_JOB_START: Final = "job.start"
SPAN_DATABUFFER_GET: Final = "databuffer.get"
SPAN_DATABUFFER_PUT: Final = "databuffer.put"
SPAN_ROLLOUT_GENERATE: Final = "rollout.generate"
SPAN_ACTOR_FORWARD_BACKWARD: Final = "actor.forward_backward"
SPAN_OPTIMIZER_STEP: Final = "optimizer.step"
SPAN_WEIGHT_SYNC: Final = "weight_sync"
SPAN_CHECKPOINT_SAVE: Final = "checkpoint.save"
SPAN_ENV_STEP: Final = "env.step"
SPAN_REWARD_SCORE: Final = "reward.score"
SPAN_LOG_PROB: Final = "log_prob.forward"

PHASE_SPANS: Final = frozenset({
    SPAN_DATABUFFER_GET, SPAN_DATABUFFER_PUT, SPAN_ROLLOUT_GENERATE, SPAN_ACTOR_FORWARD_BACKWARD,
    SPAN_OPTIMIZER_STEP, SPAN_WEIGHT_SYNC, SPAN_CHECKPOINT_SAVE, SPAN_ENV_STEP,
    SPAN_REWARD_SCORE, SPAN_LOG_PROB,
})


def node_span_name(node_id: str) -> str:
    """`node/<node_id>`: the span name of one workflow node on one rank."""
    return f"{SPAN_NODE_PREFIX}{node_id}"


# ---- span attribute keys ------------------------------------------------------------------
ATTR_JOB_ID: Final = "dagrl.job_id"
ATTR_STEP: Final = "dagrl.step"
ATTR_RANK: Final = "dagrl.rank"
ATTR_NUM_RANKS: Final = "dagrl.num_ranks"  # on the driver's step span: how many ranks report
ATTR_NODE_ID: Final = "dagrl.node_id"
ATTR_NODE_DEPS: Final = "dagrl.node_deps"  # comma-separated node ids this node depends on
ATTR_PHASE: Final = "dagrl.phase"  # metric attribute: which phase a duration belongs to
ATTR_TOKENS: Final = "dagrl.tokens"
ATTR_BATCH_SIZE: Final = "dagrl.batch_size"
ATTR_BYTES: Final = "dagrl.bytes"
ATTR_FLOPS: Final = "dagrl.flops"  # floating-point operations the span performed
ATTR_PEAK_FLOPS: Final = "dagrl.peak_flops"  # rank step span: the device's peak FLOP/s
ATTR_DIRECTION: Final = "dagrl.direction"  # metric attribute: get | put
ATTR_METRIC_PREFIX: Final = "dagrl.metric."  # step span: `dagrl.metric.<name>` = float value

# ---- step-level metric keys (reported with `SpanScope.record_metric`) -------------------
STEP_METRIC_REWARD_MEAN: Final = "critic/score/mean"

# ---- per-step summary keys of the worker's MetricSink (console, JSONL, trackers) ---------
KEY_WEIGHT_SYNC_TIME: Final = "timing_s/weight_sync"  # s: actor -> rollout engine(s)
KEY_WEIGHT_SYNC_BYTES: Final = "weight_sync/bytes"  # bytes loaded into engines / sent
KEY_WEIGHT_SYNC_GBPS: Final = "weight_sync/gb_per_s"  # 1e9 bytes/s over the sync
# engine vs actor log-probs on the sampled tokens: a failed weight sync shows up as a jump
KEY_ROLLOUT_CORR_LOG_PPL_DIFF: Final = "rollout_corr/log_ppl_diff"  # mean log pi_actor - pi_rollout
KEY_ROLLOUT_CORR_KL: Final = "rollout_corr/kl"  # KL(rollout || actor), k3 estimator
KEY_ROLLOUT_CORR_MAX_ABS_DIFF: Final = "rollout_corr/max_abs_diff"  # max |log-prob gap|
KEY_ROLLOUT_CORR_TIS_MEAN: Final = "rollout_corr/tis_weight_mean"  # truncated IS weight
KEY_ROLLOUT_CORR_TIS_CLIPFRAC: Final = "rollout_corr/tis_clipfrac"  # share at the cap
KEY_OLD_LOG_PROB_SKIPPED: Final = "actor/old_log_prob_pass_skipped"  # 1: rollout's used

# ---- OTel instruments (exported by every process over OTLP) ---------------------------
METRIC_STEP_DURATION: Final = "dagrl.step.duration"  # histogram, s
METRIC_NODE_DURATION: Final = "dagrl.node.duration"  # histogram, s; attrs node_id
METRIC_PHASE_DURATION: Final = "dagrl.phase.duration"  # histogram, s; attrs phase
METRIC_TOKENS_GENERATED: Final = "dagrl.tokens.generated"  # counter
METRIC_TOKENS_TRAINED: Final = "dagrl.tokens.trained"  # counter
METRIC_DATABUFFER_BYTES: Final = "dagrl.databuffer.bytes"  # counter, By; attrs direction
METRIC_WEIGHT_SYNC_BYTES: Final = "dagrl.weight_sync.bytes"  # counter, By
METRIC_CHECKPOINT_BYTES: Final = "dagrl.checkpoint.bytes"  # counter, By
METRIC_PROCESS_MEMORY: Final = "dagrl.process.memory"  # gauge, By: resident set size
METRIC_DEVICE_MEMORY: Final = "dagrl.device.memory"  # gauge, By: accelerator memory allocated

UNIT_SECONDS: Final = "s"
UNIT_BYTES: Final = "By"
UNIT_TOKENS: Final = "{token}"

# Which counter a phase's `add_tokens` / `add_bytes` feeds, and with which fixed attributes.
PHASE_TOKEN_COUNTERS: Final = {
    SPAN_ROLLOUT_GENERATE: METRIC_TOKENS_GENERATED,
    SPAN_ACTOR_FORWARD_BACKWARD: METRIC_TOKENS_TRAINED,
}
PHASE_BYTE_COUNTERS: Final = {
    SPAN_DATABUFFER_GET: (METRIC_DATABUFFER_BYTES, ((ATTR_DIRECTION, "get"),)),
    SPAN_DATABUFFER_PUT: (METRIC_DATABUFFER_BYTES, ((ATTR_DIRECTION, "put"),)),
    SPAN_WEIGHT_SYNC: (METRIC_WEIGHT_SYNC_BYTES, ()),
    SPAN_CHECKPOINT_SAVE: (METRIC_CHECKPOINT_BYTES, ()),
}

# ---- Prometheus names the metrics service derives from step summaries -----------------
PROM_STEP_WALL_TIME: Final = "dagrl_step_wall_time_seconds"
PROM_STEP_LAST: Final = "dagrl_step_last"
PROM_STEP_TOKENS_PER_S: Final = "dagrl_step_tokens_per_second"
PROM_STEP_MFU: Final = "dagrl_step_mfu_ratio"
PROM_STEP_CRITICAL_PATH: Final = "dagrl_step_critical_path_seconds"
PROM_NODE_MAX: Final = "dagrl_step_node_max_seconds"
PROM_NODE_STRAGGLER_LAG: Final = "dagrl_step_node_straggler_lag_seconds"
PROM_STEP_METRIC: Final = "dagrl_step_metric"
PROM_SPANS_RECEIVED: Final = "dagrl_metrics_spans_received_total"
