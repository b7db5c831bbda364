"""Every span name, attribute key and metric name dagrl emits, defined once.

Workers, services, the metrics service and the dashboard all import these constants;
nobody spells a name as a string literal anywhere else. The span tree of one step is

    step                        driver: one per job step, the root of that step's trace
      step                      one per rank (dagrl.rank set), a child of the driver's span
        node/<node_id>          one per workflow node the rank runs
          databuffer.get | rollout.generate | actor.forward_backward |
          critic.forward_backward | ...                                     phases

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
SPAN_ACTOR_FORWARD_BACKWARD: Final = "actor.forward_backward"  # one actor micro-batch
SPAN_CRITIC_FORWARD_BACKWARD: Final = "critic.forward_backward"  # one critic micro-batch
SPAN_OPTIMIZER_STEP: Final = "optimizer.step"
SPAN_WEIGHT_SYNC: Final = "weight_sync"
SPAN_CHECKPOINT_SAVE: Final = "checkpoint.save"
SPAN_REWARD_SCORE: Final = "reward.score"
SPAN_LOG_PROB: Final = "log_prob.forward"
SPAN_REWARD_MODEL_FORWARD: Final = "reward_model.forward"  # a reward-model node's scoring
SPAN_JUDGE_GENERATE: Final = "judge.generate"  # an LLM judge node's verdicts

PHASE_SPANS: Final = frozenset({
    SPAN_DATABUFFER_GET, SPAN_DATABUFFER_PUT, SPAN_ROLLOUT_GENERATE, SPAN_ACTOR_FORWARD_BACKWARD,
    SPAN_CRITIC_FORWARD_BACKWARD, SPAN_OPTIMIZER_STEP, SPAN_WEIGHT_SYNC, SPAN_CHECKPOINT_SAVE,
    SPAN_REWARD_SCORE, SPAN_LOG_PROB, SPAN_REWARD_MODEL_FORWARD, SPAN_JUDGE_GENERATE,
})


def node_span_name(node_id: str) -> str:
    """`node/<node_id>`: the span name of one workflow node on one rank."""
    return f"{SPAN_NODE_PREFIX}{node_id}"


# ---- span attribute keys ------------------------------------------------------------------
ATTR_JOB_ID: Final = "dagrl.job_id"
ATTR_STEP: Final = "dagrl.step"
# the driver's attempt (restart count) that ran the step: its step span and every span
# under it on the ranks; a restart reruns steps, and the metrics service keeps the newest
ATTR_ATTEMPT: Final = "dagrl.attempt"
ATTR_RANK: Final = "dagrl.rank"
ATTR_NUM_RANKS: Final = "dagrl.num_ranks"  # on the driver's step span: how many ranks report
ATTR_NODE_ID: Final = "dagrl.node_id"
ATTR_NODE_DEPS: Final = "dagrl.node_deps"  # comma-separated node ids this node depends on
ATTR_STEP_PHASE: Final = "dagrl.step_phase"  # node span: rollout, reward, ... (dagrl.step_phases)
ATTR_PHASE: Final = "dagrl.phase"  # metric attribute: which phase a duration belongs to
ATTR_TOKENS: Final = "dagrl.tokens"
ATTR_BATCH_SIZE: Final = "dagrl.batch_size"
ATTR_BYTES: Final = "dagrl.bytes"
ATTR_FLOPS: Final = "dagrl.flops"  # floating-point operations the span performed
ATTR_PEAK_FLOPS: Final = "dagrl.peak_flops"  # rank step span: the device's peak FLOP/s
ATTR_DIRECTION: Final = "dagrl.direction"  # metric attribute: get | put
ATTR_METRIC_PREFIX: Final = "dagrl.metric."  # step span: `dagrl.metric.<name>` = float value

# ---- per-step summary keys of the worker's MetricSink (console, JSONL, trackers) ---------
# verl's names where verl has one. In a multi-agent workflow each is recorded under
# `agent_prefix(g)` (`agent1/actor/pg_loss`), except the job-wide `perf/` and `tokens/`.
# rollout
KEY_TOKENS_GENERATED: Final = "tokens/generated"  # response tokens sampled (sum)
KEY_TOKENS_TRAINED: Final = "tokens/trained"  # response tokens x actor epochs (sum)
KEY_RESPONSE_LENGTH_MEAN: Final = "response_length/mean"  # policy tokens per sample
KEY_RESPONSE_LENGTH_MAX: Final = "response_length/max"
KEY_RESPONSE_LENGTH_CLIP_RATIO: Final = "response_length/clip_ratio"  # share at max length
# data: training prompts over data.max_prompt_length (job-wide counts, in each step's metrics
# once there is one: nothing else in a step says that prompts were cut or left out)
KEY_DATA_TRUNCATED_PROMPTS: Final = "data/truncated_prompts"  # cut to their last tokens (left)
KEY_DATA_DROPPED_PROMPTS: Final = "data/dropped_prompts"  # left out (data.truncation=right)
KEY_NUM_TURNS_MEAN: Final = "num_turns/mean"  # multi-turn: assistant turns per episode
KEY_NUM_TURNS_MAX: Final = "num_turns/max"
KEY_TOOL_CALLS: Final = "tool/calls"  # sum over episodes (env info TOOL_CALLS)
KEY_TOOL_ERRORS: Final = "tool/errors"
KEY_TOOL_CALLS_PER_EPISODE_MEAN: Final = "tool/calls_per_episode/mean"
KEY_ENV_FAILED: Final = "env/failed"  # multi-turn episodes their env failed (sum; not trained)
KEY_ENV_TIMEOUTS: Final = "env/timeouts"  # of those, an env call past its timeout (sum)
# agent programs (agent_options.agent): episodes run against the rollout's endpoint
KEY_AGENT_EPISODES: Final = "agent/episodes"  # episodes started (sum)
KEY_AGENT_FAILED: Final = "agent/failed"  # episodes whose program raised (sum; not trained)
KEY_AGENT_TIMEOUTS: Final = "agent/timeouts"  # episodes cancelled at their timeout (sum)
KEY_AGENT_CALLS_PER_EPISODE_MEAN: Final = "agent/calls_per_episode/mean"  # endpoint calls
KEY_AGENT_TOKENS_PER_EPISODE_MEAN: Final = "agent/tokens_per_episode/mean"  # sampled tokens
KEY_AGENT_SAMPLES_PER_EPISODE_MEAN: Final = "agent/samples_per_episode/mean"  # sequences
KEY_AGENT_GENERATE_S: Final = "agent/generate_s"  # seconds the episodes waited on generation
KEY_AGENT_TOOL_S: Final = "agent/tool_s"  # the rest of their time: own code, tools, HTTP
KEY_AGENT_BATCH_SIZE_MEAN: Final = "agent/batch_size/mean"  # calls per backend generation
# what a validation pass reports of its rollouts (under val/)
ROLLOUT_METRIC_PREFIXES: Final = ("num_turns/", "response_length/", "tool/", "env/", "agent/")
# reward and advantage
KEY_SCORE_MEAN: Final = "critic/score/mean"  # per sample: the reward function's score
KEY_SCORE_MAX: Final = "critic/score/max"
KEY_SCORE_MIN: Final = "critic/score/min"
KEY_REWARDS_MEAN: Final = "critic/rewards/mean"  # score minus the in-reward KL penalty
KEY_ADVANTAGES_MEAN: Final = "critic/advantages/mean"  # token mean
KEY_RETURNS_MEAN: Final = "critic/returns/mean"  # token mean
# how much of the returns' variance the rollout-time values explain (PPO: the critic's fit)
KEY_VF_EXPLAINED_VAR: Final = "critic/vf_explained_var"
KEY_REWARD_KL_PENALTY: Final = "actor/reward_kl_penalty"  # mean KL folded into the reward
KEY_REWARD_KL_PENALTY_COEFF: Final = "actor/reward_kl_penalty_coeff"
# the COMPUTE REWARD node: each source's mean score before weighting (`reward_source_key`),
# DAPO's overlong penalty, and math-verify checks that ran out of time
KEY_REWARD_SOURCE_PREFIX: Final = "reward/"  # + source + "/mean": rule, remote, rm, judge
KEY_REWARD_OVERLONG_PENALTY_MEAN: Final = "reward/overlong_penalty/mean"  # <= 0, per sample
KEY_REWARD_OVERLONG_RATIO: Final = "reward/overlong_ratio"  # share of samples penalised
KEY_REWARD_MATH_VERIFY_TIMEOUTS: Final = "reward/math_verify_timeouts"  # checks scored 0 (sum)
# model reward nodes (MODEL_INFERENCE + REWARD): what they add, before any combining
KEY_REWARD_MODEL_SCORE_MEAN: Final = "reward_model/score/mean"  # rm_scores, mean over samples
KEY_JUDGE_SCORE_MEAN: Final = "judge/score/mean"  # judge_scores (defaults included)
KEY_JUDGE_UNPARSEABLE: Final = "judge/unparseable"  # verdicts the parser could not read
KEY_JUDGE_UNPARSEABLE_RATIO: Final = "judge/unparseable_ratio"  # their share of the samples
KEY_JUDGE_VERDICT_LENGTH_MEAN: Final = "judge/verdict_length/mean"  # tokens per verdict
# DAPO dynamic sampling
KEY_DYNAMIC_SAMPLING_FILTERED_GROUPS: Final = "dynamic_sampling/filtered_groups"  # dropped
KEY_DYNAMIC_SAMPLING_KEPT_GROUPS: Final = "dynamic_sampling/kept_groups"
KEY_DYNAMIC_SAMPLING_ROUNDS: Final = "dynamic_sampling/generation_rounds"
# actor update (token means over the mini-batches, unless said otherwise)
KEY_ACTOR_PG_LOSS: Final = "actor/pg_loss"
KEY_ACTOR_PG_CLIPFRAC: Final = "actor/pg_clipfrac"
KEY_ACTOR_PG_CLIPFRAC_LOWER: Final = "actor/pg_clipfrac_lower"  # dual-clip share
KEY_ACTOR_PPO_KL: Final = "actor/ppo_kl"  # KL(old || new) of the update
KEY_ACTOR_ENTROPY: Final = "actor/entropy"
KEY_ACTOR_KL_LOSS: Final = "actor/kl_loss"  # KL(actor || reference) as a loss
KEY_ACTOR_GRAD_NORM: Final = "actor/grad_norm"  # mean over optimizer steps
KEY_ACTOR_LR: Final = "actor/lr"
# critic update
KEY_CRITIC_VF_LOSS: Final = "critic/vf_loss"
KEY_CRITIC_VF_CLIPFRAC: Final = "critic/vf_clipfrac"
KEY_CRITIC_GRAD_NORM: Final = "critic/grad_norm"
KEY_CRITIC_LR: Final = "critic/lr"
# time and accounting
KEY_TIMING_PREFIX: Final = "timing_s/"  # + node id: s the node took on the slowest rank
KEY_TIME_PER_STEP: Final = "perf/time_per_step"  # s, slowest rank
KEY_COMPUTE_SECONDS: Final = "perf/compute_s"  # s a rank spent in model compute
KEY_THROUGHPUT: Final = "perf/throughput"  # tokens/s over the job (the driver's)
KEY_STEP_SECONDS: Final = "perf/step_seconds"  # the driver's wall time of the step
KEY_OVERHEAD_FRACTION: Final = "perf/overhead_fraction"  # share of the step not in compute
KEY_DRIVER_BYTES: Final = "perf/driver_bytes_received"  # summaries the driver received
KEY_PADDING_RATIO: Final = "perf/padding_ratio"  # share of update micro-batch slots padding
KEY_TOKENS_PER_MICRO_BATCH: Final = "perf/tokens_per_micro_batch"  # real tokens, mean
KEY_MFU_ACTOR: Final = "perf/mfu/actor"  # model FLOPs of the actor update / (time x peak)
KEY_MFU_CRITIC: Final = "perf/mfu/critic"  # the same for the critic update
# GiB, the busiest rank: its GPU's peak allocated / reserved memory over the step (0 on
# CPU), and the resident memory of its process (any device)
KEY_MAX_MEMORY_ALLOCATED: Final = "perf/max_memory_allocated_gb"
KEY_MAX_MEMORY_RESERVED: Final = "perf/max_memory_reserved_gb"
KEY_CPU_MEMORY_USED: Final = "perf/cpu_memory_used_gb"
KEY_TIMING_PER_TOKEN_PREFIX: Final = "timing_per_token_ms/"  # + node id: ms per generated token
JOB_WIDE_PREFIXES: Final = ("perf/", "tokens/")  # never under agent{g}/
KEY_VAL_PREFIX: Final = "val/"  # validation figures: val/<data_source>/accuracy, ...
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
# asynchronous training (trainer.max_staleness): the policy version a sample was generated
# with is the number of updates behind it; staleness = trainer's version - rollout_version
KEY_ASYNC_STALENESS_MEAN: Final = "async/staleness/mean"  # versions behind, mean over samples
KEY_ASYNC_STALENESS_MAX: Final = "async/staleness/max"
KEY_ASYNC_STALE_DROPPED: Final = "async/stale_dropped"  # samples beyond the bound, not trained
KEY_ASYNC_STALE_DROPPED_TOKENS: Final = "async/stale_dropped_tokens"  # tokens beyond it
# rollout.partial: versions loaded while a rollout generated, samples continued under them
KEY_ROLLOUT_IN_FLIGHT_LOADS: Final = "rollout/in_flight_weight_loads"
KEY_ROLLOUT_CONTINUED_SAMPLES: Final = "rollout/continued_samples"
# rollout.over_sample: samples carried unfinished into the next step, prompts drawn beyond
# the step's batch to keep the over-sampled pool full
KEY_ROLLOUT_CARRIED_SAMPLES: Final = "rollout/carried_samples"
KEY_ROLLOUT_OVER_SAMPLED_PROMPTS: Final = "rollout/over_sampled_prompts"
# rollout.engine_process: engines started anew after one died, prompts they continued
KEY_ROLLOUT_ENGINE_RESTARTS: Final = "rollout/engine_restarts"
KEY_ROLLOUT_REQUEUED_PROMPTS: Final = "rollout/requeued_prompts"
# groups a rollout rank continued for another rank of its node whose engine was lost
KEY_ROLLOUT_PEER_GROUPS: Final = "rollout/peer_groups"
# rollout.stream: s a rank's nodes waited for their inputs in a streamed step (the training
# side waits for each mini-batch the rollout side hands over); s the training of a step ran
# while its rollout was still generating (the driver's)
KEY_STREAM_INPUT_WAIT: Final = "stream/input_wait_s"
KEY_STREAM_OVERLAP: Final = "stream/overlap_s"
KEY_ASYNC_ROLLOUT_IDLE: Final = "async/rollout_idle_s"  # s the rollout side waited for weights
KEY_ASYNC_TRAINER_IDLE: Final = "async/trainer_idle_s"  # s the training side waited for data
KEY_ASYNC_QUEUE_DEPTH: Final = "async/queue_depth"  # steps generated, not yet trained
KEY_ASYNC_ROLLOUT_VERSION: Final = "async/rollout_version"  # weights the step's rollout used

# ---- step-level metric keys (reported with `SpanScope.record_metric`) -------------------
STEP_METRIC_REWARD_MEAN: Final = KEY_SCORE_MEAN


def node_timing_key(node_id: str) -> str:
    """`timing_s/<node_id>`: the seconds one node took this step (max over ranks)."""
    return f"{KEY_TIMING_PREFIX}{node_id}"


def reward_source_key(source: str) -> str:
    """`reward/<source>/mean`: one reward source's mean score (before its weight) this step."""
    return f"{KEY_REWARD_SOURCE_PREFIX}{source}/mean"


def agent_prefix(agent_group: int) -> str:
    """`agent<g>/`: where one agent's metrics go in a multi-agent workflow."""
    return f"agent{agent_group}/"


def val_source_keys(data_source: str, n: int) -> tuple[str, str, str]:
    """A validation set's figures per data source, under `val/`: accuracy (mean score),
    mean@n (the same mean, verl's name) and best@n (mean over prompts of the best of n)."""
    return f"{data_source}/accuracy", f"{data_source}/mean@{n}", f"{data_source}/best@{n}"

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
    SPAN_CRITIC_FORWARD_BACKWARD: METRIC_TOKENS_TRAINED,  # as before it had a span of its own
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
