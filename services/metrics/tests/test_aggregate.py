"""Cross-rank aggregation on hand-made spans: max, token-weighted mean, straggler and lag,
critical path, wall time, throughput, MFU and step metrics."""

from __future__ import annotations

import math
import random

import pytest

from dagrl.telemetry import names
from dagrl_metrics.aggregate import critical_path, summarize, topological_order
from dagrl_metrics.otlp import SpanRecord

T0 = 1_700_000_000_000_000_000  # ns
TRACE = "ab" * 16


def span(name: str, span_id: str, parent: str, start_s: float, dur_s: float,
         **attrs: object) -> SpanRecord:
    return SpanRecord(trace_id=TRACE, span_id=span_id, parent_span_id=parent, name=name,
                      start_ns=T0 + int(start_s * 1e9), end_ns=T0 + int((start_s + dur_s) * 1e9),
                      attributes={names.ATTR_JOB_ID: "job", names.ATTR_STEP: 7, **attrs},
                      resource={})


# rollout fans out to reward and ref, which fan in to train.
DEPS = {"rollout": "", "reward": "rollout", "ref": "rollout", "train": "reward,ref"}
STEP_PHASES = {"rollout": "rollout", "reward": "reward", "ref": "log_probs", "train": "update"}
ROLLOUT_S = [1.0, 1.2, 0.8, 1.6]
ROLLOUT_TOKENS = [100, 300, 100, 0]
OTHER_S = {"reward": 0.1, "ref": 0.3, "train": 0.2}


def four_rank_step() -> list[SpanRecord]:
    spans = [span(names.SPAN_STEP, "root", "", 0.0, 2.5, **{
        names.ATTR_NUM_RANKS: 4, f"{names.ATTR_METRIC_PREFIX}critic/score/mean": 0.5})]
    for rank in range(4):
        rid = f"r{rank}"
        spans.append(span(names.SPAN_STEP, rid, "root", 0.01, 2.4, **{
            names.ATTR_RANK: rank, names.ATTR_TOKENS: ROLLOUT_TOKENS[rank],
            names.ATTR_PEAK_FLOPS: 1e12, f"{names.ATTR_METRIC_PREFIX}actor/kl": 0.1 * rank}))
        clock = 0.02
        for node in ("rollout", "reward", "ref", "train"):
            duration = ROLLOUT_S[rank] if node == "rollout" else OTHER_S[node]
            nid = f"{rid}-{node}"
            attrs = {names.ATTR_RANK: rank, names.ATTR_NODE_ID: node,
                     names.ATTR_NODE_DEPS: DEPS[node]}
            if node != "reward":  # a worker from before step phases: the node says none
                attrs[names.ATTR_STEP_PHASE] = STEP_PHASES[node]
            if node == "rollout":
                attrs[names.ATTR_TOKENS] = ROLLOUT_TOKENS[rank]
            spans.append(span(names.node_span_name(node), nid, rid, clock, duration, **attrs))
            if node == "rollout":
                spans.append(span(names.SPAN_ROLLOUT_GENERATE, f"{nid}-gen", nid, clock,
                                  duration * 0.9, **{names.ATTR_TOKENS: ROLLOUT_TOKENS[rank]}))
            if node == "train":
                spans.append(span(names.SPAN_ACTOR_FORWARD_BACKWARD, f"{nid}-fb", nid, clock,
                                  duration / 2, **{names.ATTR_FLOPS: 10**12}))
                # nested deeper: still counted for the train node
                spans.append(span(names.SPAN_DATABUFFER_GET, f"{nid}-get", f"{nid}-fb", clock,
                                  0.01, **{names.ATTR_BYTES: 1000}))
            clock += duration
    return spans


def test_four_ranks_max_weighted_mean_and_straggler() -> None:
    summary = summarize("job", 7, four_rank_step(), complete=True)
    rollout = summary.nodes[0]
    assert rollout.node_id == "rollout"
    assert [r.rank for r in rollout.ranks] == [0, 1, 2, 3]
    assert rollout.max_s == pytest.approx(1.6)
    # (1.0*100 + 1.2*300 + 0.8*100 + 1.6*0) / 500
    assert rollout.mean_s == pytest.approx(1.08)
    assert rollout.straggler_rank == 3
    assert rollout.straggler_lag_s == pytest.approx(1.6 - 1.1)  # minus the median
    reward = next(n for n in summary.nodes if n.node_id == "reward")
    assert reward.mean_s == pytest.approx(0.1)  # no tokens: the plain mean
    assert reward.straggler_rank == 0  # a tie goes to the lowest rank
    assert reward.straggler_lag_s == pytest.approx(0.0, abs=1e-9)


def test_each_node_carries_the_step_phase_its_span_named() -> None:
    summary = summarize("job", 7, four_rank_step())
    phases = {n.node_id: n.step_phase for n in summary.nodes}
    assert phases == {"rollout": "rollout", "reward": "", "ref": "log_probs", "train": "update"}


def test_dag_order_and_critical_path_through_fan_out_and_fan_in() -> None:
    summary = summarize("job", 7, four_rank_step())
    order = [n.node_id for n in summary.nodes]
    assert (order[0], order[-1]) == ("rollout", "train")
    assert list(summary.critical_path) == ["rollout", "ref", "train"]
    assert summary.critical_path_s == pytest.approx(1.6 + 0.3 + 0.2)
    flags = {n.node_id: n.on_critical_path for n in summary.nodes}
    assert flags == {"rollout": True, "reward": False, "ref": True, "train": True}
    assert list(next(n for n in summary.nodes if n.node_id == "train").deps) == ["reward", "ref"]


def test_step_totals_throughput_mfu_and_metrics() -> None:
    summary = summarize("job", 7, four_rank_step())
    assert summary.wall_time_s == pytest.approx(2.5)
    assert summary.trace_id == TRACE
    assert summary.num_ranks == 4
    assert summary.tokens == 500
    assert summary.tokens_per_s == pytest.approx(200.0)
    assert summary.time_per_token_ms == pytest.approx(5.0)
    assert summary.mfu == pytest.approx(4e12 / (2.5 * 4e12))
    assert summary.bytes_moved == 4000
    assert summary.metrics["critic/score/mean"] == pytest.approx(0.5)
    assert summary.metrics["actor/kl"] == pytest.approx(0.15)  # only ranks report it: mean
    assert [r.rank for r in summary.rank_steps] == [0, 1, 2, 3]


def test_phases_attach_to_their_node_through_nesting() -> None:
    summary = summarize("job", 7, four_rank_step())
    train = next(n for n in summary.nodes if n.node_id == "train")
    phases = {p.name: p for p in train.ranks[2].phases}
    assert set(phases) == {names.SPAN_ACTOR_FORWARD_BACKWARD, names.SPAN_DATABUFFER_GET}
    assert phases[names.SPAN_DATABUFFER_GET].bytes == 1000
    rollout_gen = summary.nodes[0].ranks[1].phases[0]
    assert rollout_gen.tokens == 300
    assert rollout_gen.duration_s == pytest.approx(1.2 * 0.9)


def test_arrival_order_does_not_matter() -> None:
    spans = four_rank_step()
    expected = summarize("job", 7, spans)
    random.Random(3).shuffle(spans)
    assert summarize("job", 7, spans) == expected


def test_without_driver_span_wall_time_spans_the_ranks() -> None:
    spans = [s for s in four_rank_step() if not (s.name == names.SPAN_STEP and s.span_id == "root")]
    summary = summarize("job", 7, spans)
    assert summary.wall_time_s == pytest.approx(2.4)
    assert summary.num_ranks == 4
    assert "critic/score/mean" not in summary.metrics


def test_no_flops_means_no_mfu() -> None:
    spans = [s for s in four_rank_step() if s.name != names.SPAN_ACTOR_FORWARD_BACKWARD]
    assert not summarize("job", 7, spans).HasField("mfu")


def test_critical_path_ignores_unknown_deps_and_picks_heaviest_branch() -> None:
    dag = {"a": (1.0, ()), "b": (5.0, ("a", "ghost")), "c": (2.0, ("a",)), "d": (1.0, ("b", "c"))}
    assert critical_path(dag) == (["a", "b", "d"], pytest.approx(7.0))
    assert critical_path({}) == ([], 0.0)


def test_topological_order_breaks_ties_by_start_then_name() -> None:
    deps = {"x": (), "b": ("x",), "a": ("x",)}
    assert topological_order(deps, {}) == ["x", "a", "b"]
    assert topological_order(deps, {"b": 1, "a": 2}) == ["x", "b", "a"]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e30, -5, "abc", True])
def test_a_count_that_is_no_finite_int64_counts_as_zero(bad: object) -> None:
    spans = four_rank_step()
    for key in (names.ATTR_TOKENS, names.ATTR_BYTES, names.ATTR_FLOPS, names.ATTR_PEAK_FLOPS):
        spans.append(span(names.SPAN_STEP, "r9", "root", 0.0, 1.0, **{
            names.ATTR_RANK: 9, key: bad}))
        spans.append(span("x.phase", f"p-{key}", "r0-train", 0.0, 0.1, **{key: bad}))
    summary = summarize("job", 7, spans)
    assert summary.tokens == 500 and summary.bytes_moved == 4000
    assert summary.mfu == pytest.approx(4e12 / (2.5 * 4e12))
    assert next(r for r in summary.rank_steps if r.rank == 9).tokens == 0


def test_counts_stop_at_the_int64_maximum() -> None:
    huge = 2**62
    spans = [span(names.SPAN_STEP, f"r{r}", "", 0.0, 1.0, **{
        names.ATTR_RANK: r, names.ATTR_TOKENS: huge}) for r in range(3)]
    assert summarize("job", 7, spans).tokens == 2**63 - 1


def test_ranks_and_rank_counts_out_of_int32_range_are_ignored() -> None:
    spans = [span(names.SPAN_STEP, "root", "", 0.0, 2.0, **{names.ATTR_NUM_RANKS: 2**40}),
             span(names.SPAN_STEP, "r0", "root", 0.0, 1.0, **{names.ATTR_RANK: 0}),
             span(names.SPAN_STEP, "rx", "root", 0.0, 1.0, **{names.ATTR_RANK: 2**40}),
             span("node/a", "n", "r0", 0.0, 0.5, **{names.ATTR_RANK: math.nan})]
    summary = summarize("job", 7, spans)
    assert [r.rank for r in summary.rank_steps] == [0]
    assert summary.wall_time_s == pytest.approx(2.0)  # the driver's span, not the bad rank's
    assert summary.num_ranks == 1  # rank 0 (the node span's NaN rank counts as rank 0)
