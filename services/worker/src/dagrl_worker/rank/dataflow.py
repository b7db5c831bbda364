"""Moving Batches along the DAG's edges: the local cache or the databuffer.

For an edge producer -> consumer, the consumer reads from this rank's local cache when
the producer ran here with the same layout (same ranks, same dp size): nothing is
serialized. Otherwise the producer puts its shard into the databuffer and every consumer
rank gets its resharded part (groups whole, balanced by tokens). A lineage edge (a later
agent's samples joining the earlier agent's samples they answer) is the exception: each
consumer rank gets exactly the children of the parent samples it holds. Edges into a training
node also go through the databuffer when `trainer.balance_batch` is on and the node is
data parallel, so ranks train on token-balanced shards (rollout lengths vary).

Nothing here sends batch data to the driver.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dagrl import telemetry
from dagrl.batch import GROUP_ID, UID, Batch
from dagrl.batch import schema as fields
from dagrl.config import ServicesConfig
from dagrl.envs import is_chain_rollout, row_origin
from dagrl.errors import BatchError
from dagrl.workflow import NodeRole, NodeType, TaskGraph
from dagrl_worker.shared.plan_view import PlanView

if TYPE_CHECKING:
    from dagrl_databuffer.handoff import HandoffBoard


class ShardStore(Protocol):
    """The part of the databuffer client (`dagrl_databuffer.client`) the worker uses."""

    @property
    def instance_count(self) -> int: ...

    @property
    def handoffs(self) -> HandoffBoard: ...

    def put(self, job: str, step: int, edge: str, producer_rank: int, batch: Batch, *,
            producer_size: int | None = None, home: int = 0) -> Any: ...

    def get(self, job: str, step: int, edge: str, dp_rank: int, dp_size: int,
            producers: int | None = None, *, timeout_s: float = 60.0,
            homes: Sequence[int] | None = None, replica: int = 0,
            replicas: int = 1) -> Batch: ...

    def get_groups(self, job: str, step: int, edge: str, group_ids: Collection[str],
                   dp_rank: int, dp_size: int, producers: int | None = None, *,
                   timeout_s: float = 60.0, homes: Sequence[int] | None = None,
                   replica: int = 0, replicas: int = 1) -> Batch: ...


def edge_name(producer: str, consumer: str) -> str:
    return f"{producer}->{consumer}"


@dataclass
class EdgeRouter:
    """Decides, per edge, local or databuffer, and moves the Batches accordingly."""

    graph: TaskGraph
    plan: PlanView
    rank: int
    job_id: str
    store: ShardStore | None
    balance_batch: bool = True
    local: dict[str, Batch] = field(default_factory=dict)
    # a consumer waits this long for its producers' shards (services.databuffer_wait_s)
    timeout_s: float = ServicesConfig.databuffer_wait_s
    # the nodes that run (None: all); a validation pass runs part of the graph, and an edge
    # into a node that does not run is never written (nobody would read it)
    running: frozenset[str] | None = None
    # per edge, decided once from the graph and the plan: (stays local, chained ROLLOUT node
    # whose samples it hands back by lineage, or None)
    routes: dict[tuple[str, str], tuple[bool, str | None]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.routes = {}
        for producer, consumer in self.graph.edges():
            link = lineage_link(self.graph, producer, consumer)
            self.routes[producer, consumer] = (self._stays_local(producer, consumer, link),
                                               link[1] if link else None)

    def is_local(self, producer: str, consumer: str) -> bool:
        """Whether the edge's rows stay on this rank (no databuffer)."""
        return self.routes[producer, consumer][0]

    def _stays_local(self, producer: str, consumer: str, link: tuple[str, str] | None) -> bool:
        """Same layout at both ends, not a balanced training input, and for a lineage edge
        (`lineage_link`), every hop from the common row origin to both joined parents also
        rank-local (so this rank's children are exactly the answers to this rank's parent
        samples)."""
        if not self._same_rows(producer, consumer):
            return False
        if link is None:
            return True
        base, _chain = link
        origin = row_origin(self.graph, base)
        upstream = {*self.graph.ancestors(base), *self.graph.ancestors(producer)}
        on_paths = (set(self.graph.descendants(origin)) & upstream) | {base, producer}
        return all(self._same_rows(a, b) for a, b in self.graph.edges()
                   if a in on_paths | {origin} and b in on_paths)

    def _same_rows(self, producer: str, consumer: str) -> bool:
        made, used = self.plan.layout(producer), self.plan.layout(consumer)
        if made.ranks != used.ranks or made.dp_size != used.dp_size:
            return False
        node = self.graph[consumer]
        trains = (node.node_type == NodeType.MODEL_TRAIN and not node.only_forward_compute
                  and node.node_role in (NodeRole.ACTOR, NodeRole.CRITIC))
        return not (self.balance_batch and trains and used.dp_size > 1)

    def publish(self, step: int, producer: str, batch: Batch, part: str = "") -> None:
        """Hand a node's output to each consumer edge (a databuffer shard goes to this
        machine's instance when there is one per machine); `part` tells the parts of a
        streamed step's edge apart (`graph_runner.wave_part`)."""
        self.local[producer] = batch
        layout = self.plan.layout(producer)
        dp_rank = layout.dp_rank(self.rank)
        # the ranks of one tensor-parallel replica hold the same output: its first writes it
        # (a second put of the same shard replaced the first under its readers)
        writes = layout.leads_replica(self.rank)
        for consumer in self.graph.children(producer):
            if self.running is not None and consumer not in self.running:
                continue
            if not writes and not self.is_local(producer, consumer):
                continue
            if not self.is_local(producer, consumer):
                edge = edge_name(producer, consumer) + part
                store = self._require_store()
                home = self.plan.home_of(producer, dp_rank) if store.instance_count > 1 else 0
                with telemetry.phase_span(telemetry.SPAN_DATABUFFER_PUT) as span:
                    info = store.put(self.job_id, step, edge, dp_rank, batch,
                                     producer_size=layout.dp_size, home=home)
                    span.add_bytes(int(info.nbytes))

    def inputs(self, step: int, consumer: str, part: str = "") -> Batch:
        """The consumer's input on this rank: its parents' outputs, joined row by row.

        A lineage parent (a later agent's samples, `lineage_link`) read from the databuffer
        brings exactly the children of the first parent's samples on this rank, wherever the
        later agent ran.
        """
        parents = self.graph.parents(consumer)
        parts: list[Batch] = []  # the first parent (never a lineage edge) comes first
        for producer in parents:
            local, chain = self.routes[producer, consumer]
            if local:
                parts.append(self.local[producer])
                continue
            wanted = None
            if chain is not None:
                wanted = {chained_group_id(uid, self.graph[chain].agent_group)
                          for uid in parts[0].uids}
            parts.append(self._get(step, producer, consumer, wanted, part))
        return join_by_uid(parts)

    def _get(self, step: int, producer: str, consumer: str,
             group_ids: set[str] | None, part: str = "") -> Batch:
        """This rank's part of a databuffer edge: its dp share, or the groups named. Each
        of a tensor-parallel consumer's ranks reads its replica's share, and the edge goes
        once all of them have (not when the first of each share has)."""
        layout = self.plan.layout(consumer)
        reader = {"replica": layout.replica_rank(self.rank), "replicas": layout.replicas}
        store = self._require_store()
        edge = edge_name(producer, consumer) + part
        producers = self.plan.layout(producer).dp_size
        homes = ([self.plan.home_of(producer, d) for d in range(producers)]
                 if store.instance_count > 1 else None)
        with telemetry.phase_span(telemetry.SPAN_DATABUFFER_GET) as span:
            if group_ids is None:
                shard = store.get(self.job_id, step, edge, layout.dp_rank(self.rank),
                                 layout.dp_size, producers=producers, timeout_s=self.timeout_s,
                                 homes=homes, **reader)
            else:
                shard = store.get_groups(self.job_id, step, edge, group_ids,
                                        layout.dp_rank(self.rank), layout.dp_size,
                                        producers=producers, timeout_s=self.timeout_s,
                                        homes=homes, **reader)
            span.set_batch_size(len(shard))
        return shard

    def clear(self) -> None:
        self.local.clear()

    def _require_store(self) -> ShardStore:
        if self.store is None:
            raise RuntimeError("this plan moves data between layouts but the worker has no "
                               "databuffer: set services.redis_url")
        return self.store


def chained_group_id(parent_uid: str, agent_group: int) -> str:
    """The group of the samples agent `agent_group` draws for the previous agent's sample
    `parent_uid` (GRPO compares them; the databuffer hands them back to the parent's rank)."""
    return f"{parent_uid}|a{agent_group}"


def lineage_link(graph: TaskGraph, producer: str, consumer: str) -> tuple[str, str] | None:
    """(base, chain) when `producer`'s rows reach `consumer` as the children of its first
    parent's rows: `producer` carries the samples that `chain` (a chained ROLLOUT node) drew
    from rows with the same origin as `base`, the consumer's first parent, whose rows the
    consumer keeps (`dagrl.envs.row_origin`). None for an ordinary edge."""
    base = graph.parents(consumer)[0]
    chain = row_origin(graph, producer)
    if producer == base or not is_chain_rollout(graph[chain]):
        return None
    drawn_from = row_origin(graph, graph.parents(chain)[0])
    return (base, chain) if row_origin(graph, base) == drawn_from else None


def join_by_uid(parts: list[Batch]) -> Batch:
    """Fan-in: the union of the parents' fields over the first parent's rows (by uid).

    A parent whose rows are the first parent's children in a multi-agent chain (a later
    agent's samples, whose `parent_uid` are the first parent's uids) contributes only their
    scores, carried back by lineage (`scores_by_lineage`): the shared reward of a chain.
    """
    joined = parts[0]
    for other in parts[1:]:
        if fields.PARENT_UID in other and other.uids != joined.uids:
            other = scores_by_lineage(joined, other)
        if other.uids != joined.uids:
            position = {uid: i for i, uid in enumerate(other.uids)}
            missing = [u for u in joined.uids if u not in position]
            if missing:
                raise BatchError(f"fan-in: {len(missing)} samples (e.g. {missing[0]!r}) reached "
                                 "one parent edge but not the other")
            other = other.select([position[u] for u in joined.uids])
        shared = set(joined.field_names) & set(other.field_names)
        joined = joined.union(other.without_fields(shared - {fields.UID, fields.GROUP_ID}))
    return joined


def scores_by_lineage(parents: Batch, children: Batch) -> Batch:
    """`token_level_scores` [B, R] for the `parents` rows: each sample's score is the mean
    sequence score of its children (rows whose `parent_uid` is its uid), on its last
    response token, like `RewardExecutor` puts it."""
    if fields.TOKEN_LEVEL_SCORES not in children:
        raise BatchError("fan-in by lineage: the later agent's samples carry no "
                         "'token_level_scores'; join after the REWARD node that scores them")
    totals: dict[str, list[float]] = {}
    for parent, score in zip(children.columns[fields.PARENT_UID],
                             children.tensors[fields.TOKEN_LEVEL_SCORES].sum(dim=1).tolist(),
                             strict=True):
        totals.setdefault(parent, []).append(score)
    orphans = [uid for uid in parents.uids if uid not in totals]
    if orphans and len(orphans) == len(parents) and totals:
        raise BatchError(
            f"fan-in by lineage: the later agent's samples answer other samples (e.g. "
            f"{next(iter(totals))!r}) than these (e.g. {orphans[0]!r}); scores flow back one "
            "chain level per join: join each agent with the agent right after it")
    if orphans:
        raise BatchError(f"fan-in by lineage: {len(orphans)} samples (e.g. {orphans[0]!r}) "
                         "have no later-agent sample scored; every sample must be answered")
    mask = parents.tensors[fields.RESPONSE_MASK]  # [B, R]
    scores = torch.zeros(mask.shape, dtype=torch.float32)  # [B, R]
    last = (mask.sum(dim=1) - 1).clamp(min=0)  # [B]
    for row, uid in enumerate(parents.uids):
        scores[row, last[row]] = sum(totals[uid]) / len(totals[uid])
    return Batch(tensors={fields.TOKEN_LEVEL_SCORES: scores},
                 columns={UID: list(parents.uids), GROUP_ID: list(parents.group_ids)})


def open_shard_store(redis_url: str | None, machine_urls: Sequence[str] = ()) -> ShardStore | None:
    """The databuffer client: one instance per machine (`machine_urls`, in the plan's machine
    order), else `redis_url` alone (None with neither: no databuffer, local edges only)."""
    from dagrl_databuffer.client import DataBufferClient

    if machine_urls:
        return DataBufferClient(machine_urls[0], instances=machine_urls)
    return None if redis_url is None else DataBufferClient(redis_url)
