"""One step's spans -> its StepSummary: wall time, per-node time per rank, stragglers,
the critical path, tokens/s, time per token, MFU and the step-level metrics.

Pure functions over `SpanRecord`s; the store decides when to call them. The DAG comes from
the node spans' `dagrl.node_deps` attribute, not from the workflow file, so the service
needs nothing but the spans. Definitions (also in the proto):

- node time on a rank: the sum of that rank's `node/<id>` spans of the step;
- a node's max / straggler: the slowest rank; lag: its time minus the median rank's;
- a node's mean: weighted by the rank's tokens on that node span (plain mean without);
- a node's step phase (rollout, reward, ...): its node span's `dagrl.step_phase`;
- critical path: the longest path through the DAG with each node weighted by its max;
- tokens: the ranks' step-span `dagrl.tokens`, else the `rollout.generate` tokens;
- MFU: phase-span FLOPs / (wall time x sum of the ranks' peak FLOP/s).

Counts (tokens, bytes, FLOPs) and peak FLOP/s are taken only when they are finite and in
int64 range (`otlp.as_int`); anything else counts as 0, and sums stop at the int64 maximum,
so one bad attribute skews one step's numbers instead of failing its summary.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dagrl.rpc.gen.metrics.v1 import metrics_pb2
from dagrl.telemetry import names
from dagrl_metrics.otlp import INT64_MAX, SpanRecord, as_int, as_rank

_MAX_PARENT_HOPS = 32
_COUNT_KEYS = (names.ATTR_TOKENS, names.ATTR_BYTES, names.ATTR_FLOPS, names.ATTR_PEAK_FLOPS)


@dataclass
class _NodeRank:
    duration_s: float = 0.0
    start_ns: int = 0
    tokens: int = 0
    phases: dict[str, metrics_pb2.PhaseTiming] = field(default_factory=dict)


@dataclass
class _Spans:
    """A step's spans sorted by level."""

    roots: list[SpanRecord] = field(default_factory=list)
    rank_steps: dict[int, SpanRecord] = field(default_factory=dict)
    nodes: list[SpanRecord] = field(default_factory=list)
    others: list[SpanRecord] = field(default_factory=list)


def summarize(job_id: str, step: int, spans: Iterable[SpanRecord], *,
              complete: bool = False) -> metrics_pb2.StepSummary:
    """The summary of one step from whatever spans of it have arrived."""
    spans = sorted(spans, key=lambda s: (s.start_ns, s.span_id))  # order-independent sums
    levels = _split_levels(spans)
    summary = metrics_pb2.StepSummary(job_id=job_id, step=step, complete=complete)
    _set_wall_time(summary, levels, spans)
    per_node = _node_ranks(levels)
    _add_phases(per_node, levels)
    deps = _node_deps(levels.nodes)
    step_phases = _step_phases(levels.nodes)
    for node_id in topological_order(deps, _first_start(per_node)):
        timing = node_timing(node_id, per_node[node_id], deps[node_id])
        timing.step_phase = step_phases.get(node_id, "")
        summary.nodes.append(timing)
    path, path_s = critical_path({n.node_id: (n.max_s, tuple(n.deps)) for n in summary.nodes})
    summary.critical_path.extend(path)
    summary.critical_path_s = path_s
    for node in summary.nodes:
        node.on_critical_path = node.node_id in path
    for rank, span in sorted(levels.rank_steps.items()):
        summary.rank_steps.append(metrics_pb2.RankTiming(
            rank=rank, duration_s=span.duration_s, start_unix_ns=span.start_ns,
            tokens=_count(span, names.ATTR_TOKENS)))
    summary.num_ranks = _num_ranks(levels, per_node)
    _set_throughput(summary, levels)
    summary.metrics.update(step_metrics(levels))
    return summary


def node_timing(node_id: str, ranks: Mapping[int, _NodeRank],
                deps: Sequence[str]) -> metrics_pb2.NodeTiming:
    """A node across ranks: max, token-weighted mean, straggler and its lag."""
    timing = metrics_pb2.NodeTiming(node_id=node_id, deps=list(deps))
    for rank in sorted(ranks):
        data = ranks[rank]
        timing.ranks.append(metrics_pb2.RankTiming(
            rank=rank, duration_s=data.duration_s, start_unix_ns=data.start_ns,
            tokens=data.tokens,
            phases=sorted(data.phases.values(), key=lambda p: (p.start_unix_ns, p.name))))
    if not timing.ranks:
        return timing
    durations = [r.duration_s for r in timing.ranks]
    tokens = [r.tokens for r in timing.ranks]
    straggler = max(timing.ranks, key=lambda r: (r.duration_s, -r.rank))
    timing.max_s = straggler.duration_s
    timing.straggler_rank = straggler.rank
    timing.straggler_lag_s = straggler.duration_s - statistics.median(durations)
    total_tokens = sum(tokens)
    timing.mean_s = (sum(d * t for d, t in zip(durations, tokens, strict=True)) / total_tokens
                     if total_tokens > 0 else statistics.fmean(durations))
    return timing


def critical_path(dag: Mapping[str, tuple[float, Sequence[str]]]) -> tuple[list[str], float]:
    """Longest path through `dag` (node -> (weight, deps)); deps outside `dag` are ignored.

    Ties go to the dependency listed first, so the answer is deterministic."""
    best: dict[str, tuple[float, str | None]] = {}
    for node in topological_order({n: tuple(d) for n, (_w, d) in dag.items()}, {}):
        weight, deps = dag[node]
        known = [d for d in deps if d in best]
        previous = max(known, key=lambda d: best[d][0], default=None)
        best[node] = (weight + (best[previous][0] if previous else 0.0), previous)
    if not best:
        return [], 0.0
    end = max(best, key=lambda n: best[n][0])
    total = best[end][0]
    path: list[str] = []
    cursor: str | None = end
    while cursor is not None:
        path.append(cursor)
        cursor = best[cursor][1]
    return path[::-1], total


def topological_order(deps: Mapping[str, Sequence[str]],
                      start_ns: Mapping[str, int]) -> list[str]:
    """Kahn's order; among ready nodes the one that started first (then by name) goes first.

    A cycle (impossible from a valid workflow) is broken by emitting the rest by start."""
    remaining = {n: {d for d in ds if d in deps and d != n} for n, ds in deps.items()}
    order: list[str] = []
    while remaining:
        ready = [n for n, ds in remaining.items() if not ds] or list(remaining)
        chosen = min(ready, key=lambda n: (start_ns.get(n, 0), n))
        order.append(chosen)
        del remaining[chosen]
        for ds in remaining.values():
            ds.discard(chosen)
    return order


def step_metrics(levels: _Spans) -> dict[str, float]:
    """`dagrl.metric.*` from the driver's span; keys only ranks report are averaged."""
    found: dict[str, list[float]] = defaultdict(list)
    for span in levels.rank_steps.values():
        for key, value in _metric_attributes(span).items():
            found[key].append(value)
    metrics = {key: statistics.fmean(values) for key, values in found.items()}
    for root in levels.roots:
        metrics.update(_metric_attributes(root))
    return metrics


def _metric_attributes(span: SpanRecord) -> dict[str, float]:
    prefix = names.ATTR_METRIC_PREFIX
    return {key[len(prefix):]: float(value) for key, value in span.attributes.items()
            if key.startswith(prefix) and isinstance(value, int | float)}


def _split_levels(spans: Sequence[SpanRecord]) -> _Spans:
    levels = _Spans()
    for span in spans:
        rank = span.step_rank
        if span.is_driver_step:
            levels.roots.append(span)
        elif rank is not None:
            levels.rank_steps[rank] = span
        elif span.name == names.SPAN_STEP:
            continue  # a rank out of range: neither the driver's nor a rank's
        elif span.name.startswith(names.SPAN_NODE_PREFIX):
            levels.nodes.append(span)
        else:
            levels.others.append(span)
    return levels


def _node_id(span: SpanRecord) -> str:
    return str(span.attributes.get(names.ATTR_NODE_ID) or span.name[len(names.SPAN_NODE_PREFIX):])


def _node_ranks(levels: _Spans) -> dict[str, dict[int, _NodeRank]]:
    per_node: dict[str, dict[int, _NodeRank]] = defaultdict(dict)
    for span in levels.nodes:
        rank = span.rank if span.rank is not None else 0
        data = per_node[_node_id(span)].get(rank)
        if data is None:
            data = per_node[_node_id(span)][rank] = _NodeRank(start_ns=span.start_ns)
        data.duration_s += span.duration_s
        data.start_ns = min(data.start_ns, span.start_ns)
        data.tokens = _total([data.tokens, _count(span, names.ATTR_TOKENS)])
    return per_node


def _add_phases(per_node: Mapping[str, dict[int, _NodeRank]], levels: _Spans) -> None:
    """Attach each phase span to the node span above it (through any nesting)."""
    by_id = {s.span_id: s for s in [*levels.nodes, *levels.others]}
    for span in levels.others:
        node = _enclosing_node(span, by_id)
        if node is None:
            continue
        rank = node.rank if node.rank is not None else 0
        data = per_node[_node_id(node)][rank]
        phase = data.phases.get(span.name)
        if phase is None:
            phase = data.phases[span.name] = metrics_pb2.PhaseTiming(
                name=span.name, start_unix_ns=span.start_ns)
        phase.duration_s += span.duration_s
        phase.start_unix_ns = min(phase.start_unix_ns, span.start_ns)
        phase.tokens = _total([phase.tokens, _count(span, names.ATTR_TOKENS)])
        phase.bytes = _total([phase.bytes, _count(span, names.ATTR_BYTES)])


def _enclosing_node(span: SpanRecord, by_id: Mapping[str, SpanRecord]) -> SpanRecord | None:
    cursor = by_id.get(span.parent_span_id)
    for _ in range(_MAX_PARENT_HOPS):
        if cursor is None or cursor.name.startswith(names.SPAN_NODE_PREFIX):
            return cursor
        cursor = by_id.get(cursor.parent_span_id)
    return None


def _node_deps(nodes: Iterable[SpanRecord]) -> dict[str, tuple[str, ...]]:
    deps: dict[str, list[str]] = {}
    for span in nodes:
        listed = deps.setdefault(_node_id(span), [])
        raw = span.attributes.get(names.ATTR_NODE_DEPS) or ""
        for dep in str(raw).split(","):
            if dep.strip() and dep.strip() not in listed:
                listed.append(dep.strip())
    return {node: tuple(d) for node, d in deps.items()}


def _step_phases(nodes: Iterable[SpanRecord]) -> dict[str, str]:
    """What each node does in the step (`dagrl.step_phase`), as its first span says."""
    phases: dict[str, str] = {}
    for span in nodes:
        phase = span.attributes.get(names.ATTR_STEP_PHASE)
        if phase:
            phases.setdefault(_node_id(span), str(phase))
    return phases


def _first_start(per_node: Mapping[str, Mapping[int, _NodeRank]]) -> dict[str, int]:
    return {node: min(r.start_ns for r in ranks.values()) for node, ranks in per_node.items()}


def _set_wall_time(summary: metrics_pb2.StepSummary, levels: _Spans,
                   spans: Sequence[SpanRecord]) -> None:
    if levels.roots:
        root = max(levels.roots, key=lambda s: s.duration_s)
        summary.wall_time_s = root.duration_s
        summary.start_unix_ns = root.start_ns
        summary.trace_id = root.trace_id
        return
    timed = list(levels.rank_steps.values()) or levels.nodes or list(spans)
    if timed:
        start, end = min(s.start_ns for s in timed), max(s.end_ns for s in timed)
        summary.wall_time_s = max(0, end - start) / 1e9
        summary.start_unix_ns = start
        summary.trace_id = timed[0].trace_id


def _num_ranks(levels: _Spans, per_node: Mapping[str, Mapping[int, _NodeRank]]) -> int:
    for root in levels.roots:
        declared = as_rank(root.attributes.get(names.ATTR_NUM_RANKS))
        if declared:
            return declared
    ranks = set(levels.rank_steps)
    for node_ranks in per_node.values():
        ranks.update(node_ranks)
    return len(ranks)


def _set_throughput(summary: metrics_pb2.StepSummary, levels: _Spans) -> None:
    tokens = _total(_count(s, names.ATTR_TOKENS) for s in levels.rank_steps.values())
    if tokens == 0:
        tokens = _total(_count(s, names.ATTR_TOKENS) for s in levels.others
                        if s.name == names.SPAN_ROLLOUT_GENERATE)
    summary.tokens = tokens
    summary.bytes_moved = _total(_count(s, names.ATTR_BYTES) for s in levels.others)
    wall = summary.wall_time_s
    if tokens > 0 and wall > 0:
        summary.tokens_per_s = tokens / wall
        summary.time_per_token_ms = wall * 1000.0 / tokens
    flops = _total(_count(s, names.ATTR_FLOPS) for s in levels.others)
    peak = _total(_count(s, names.ATTR_PEAK_FLOPS) for s in levels.rank_steps.values())
    if flops > 0 and peak > 0 and wall > 0:
        summary.mfu = flops / (wall * peak)


def rejected_numbers(span: SpanRecord) -> list[str]:
    """The count attributes of `span` that are set but count as 0 here (inf, nan, 1e30, "abc",
    negative): the store counts them, so a sender's bug shows."""
    return [key for key in _COUNT_KEYS if key in span.attributes
            and as_int(span.attributes[key], 0) is None]


def _count(span: SpanRecord, key: str) -> int:
    """A count attribute (tokens, bytes, FLOPs): an int in 0..int64 max, else 0."""
    return as_int(span.attributes.get(key), 0) or 0


def _total(counts: Iterable[int]) -> int:
    """A sum of counts, stopped at the int64 maximum (the proto's fields are int64)."""
    return min(sum(counts), INT64_MAX)
