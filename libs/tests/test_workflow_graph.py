"""TaskGraph: validation (ids, dependencies, cycles), deterministic order and structure queries."""

from __future__ import annotations

import itertools
import pickle
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagrl.errors import WorkflowError
from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph


def step(node_id: str, *deps: str, agent_group: int = 0) -> Node:
    """A dependency-only node: BARRIER_SYNC needs no role, model or executable_ref."""
    return Node(node_id, NodeType.BARRIER_SYNC, dependencies=deps, agent_group=agent_group)


def fan_graph() -> TaskGraph:
    """src → {left, right}; left → join ← right; right → side (an extra exit). Fan-out + fan-in."""
    return TaskGraph(
        "fan",
        [
            step("src"),
            step("left", "src"),
            step("right", "src"),
            step("join", "left", "right"),
            step("side", "right"),
        ],
    )


# ---- validation ----------------------------------------------------------------------------


def test_duplicate_ids_are_rejected() -> None:
    with pytest.raises(WorkflowError, match="node id 'a' is declared more than once"):
        TaskGraph("dup", [step("a"), step("b", "a"), step("a")])


def test_unknown_dependency_is_rejected_with_a_suggestion() -> None:
    with pytest.raises(WorkflowError) as info:
        TaskGraph("g", [step("rollout"), step("reward", "rollot")])
    assert "node 'reward': depends on unknown node 'rollot' (did you mean 'rollout'?)" in str(
        info.value
    )


def test_several_structure_problems_are_reported_together() -> None:
    with pytest.raises(WorkflowError) as info:
        TaskGraph("g", [step("a"), step("a"), step("b", "zzz")])
    message = str(info.value)
    assert "workflow 'g' has 2 problems" in message
    assert "'a' is declared more than once" in message and "unknown node 'zzz'" in message


def test_empty_graph_and_bad_dag_id() -> None:
    with pytest.raises(WorkflowError, match="needs at least one node"):
        TaskGraph("empty", [])
    with pytest.raises(WorkflowError, match="dag_id must be a non-empty string"):
        TaskGraph("  ", [step("a")])


def test_cycle_error_names_the_cycle_in_edge_direction() -> None:
    # a depends on c, b on a, c on b: edges a -> b -> c -> a; d hangs off the cycle.
    nodes = [step("a", "c"), step("b", "a"), step("c", "b"), step("d", "c"), step("e")]
    with pytest.raises(WorkflowError) as info:
        TaskGraph("loop", nodes)
    assert "workflow 'loop' has a cycle: a -> b -> c -> a" in str(info.value)


def test_cycle_message_does_not_depend_on_where_the_search_starts() -> None:
    # d (declared first) only feeds into the cycle; the cycle is still reported from b.
    nodes = [step("d", "c"), step("b", "c"), step("c", "b")]
    with pytest.raises(WorkflowError, match=r"has a cycle: b -> c -> b;"):
        TaskGraph("loop", nodes)


def test_self_dependency_is_a_cycle() -> None:
    with pytest.raises(WorkflowError, match=r"has a cycle: a -> a;"):
        TaskGraph("self", [step("a", "a")])


# ---- order and queries ---------------------------------------------------------------------


def test_topological_order_breaks_ties_by_declaration_order() -> None:
    graph = TaskGraph("g", [step("z"), step("y", "z"), step("x"), step("w", "x", "z")])
    assert graph.topological_order() == ("z", "y", "x", "w")


def test_order_puts_late_declared_producers_first() -> None:
    graph = TaskGraph("g", [step("consumer", "producer"), step("producer")])
    assert graph.topological_order() == ("producer", "consumer")
    assert [n.node_id for n in graph] == ["producer", "consumer"]
    assert graph.node_ids == ("consumer", "producer")  # declaration order


def test_fan_out_and_fan_in_queries() -> None:
    graph = fan_graph()
    assert graph.topological_order() == ("src", "left", "right", "join", "side")
    assert graph.entry_nodes() == ("src",)
    assert graph.exit_nodes() == ("join", "side")
    assert graph.children("src") == ("left", "right")
    assert graph.children("right") == ("join", "side")
    assert graph.parents("join") == ("left", "right")
    assert graph.ancestors("join") == ("src", "left", "right")
    assert graph.ancestors("src") == ()
    assert graph.descendants("src") == ("left", "right", "join", "side")
    assert graph.descendants("left") == ("join",)
    assert graph.edges() == (
        ("src", "left"),
        ("src", "right"),
        ("left", "join"),
        ("right", "join"),
        ("right", "side"),
    )


def test_container_protocol() -> None:
    graph = fan_graph()
    assert len(graph) == 5
    assert "join" in graph and "nope" not in graph and 3 not in graph
    assert graph["join"] in graph
    assert step("join") not in graph  # same id, different node
    assert graph["left"].dependencies == ("src",)
    with pytest.raises(KeyError, match="workflow 'fan' has no node 'nope'"):
        graph["nope"]
    with pytest.raises(KeyError, match="no node 'nope'"):
        graph.descendants("nope")


def test_multiple_entries_and_agent_groups() -> None:
    graph = TaskGraph(
        "two",
        [step("a0", agent_group=0), step("a1", agent_group=2), step("m", "a0", "a1")],
    )
    assert graph.entry_nodes() == ("a0", "a1")
    assert graph.exit_nodes() == ("m",)
    assert graph.agent_groups() == (0, 2)


def test_subgraph_drops_dependencies_outside_the_set() -> None:
    graph = fan_graph()
    sub = graph.subgraph(["right", "join", "side"], dag_id="fan_part")
    assert sub.dag_id == "fan_part"
    assert sub.node_ids == ("right", "join", "side")
    assert sub["right"].dependencies == ()
    assert sub["join"].dependencies == ("right",)
    assert sub["side"] is graph["side"]  # unchanged nodes are shared
    assert sub.entry_nodes() == ("right",)
    assert graph["join"].dependencies == ("left", "right")  # the original is untouched
    with pytest.raises(KeyError, match="no node 'ghost'"):
        graph.subgraph(["join", "ghost"])
    with pytest.raises(WorkflowError, match="at least one node"):
        graph.subgraph([])


def test_copy_equality_hash_and_pickle() -> None:
    graph = fan_graph()
    twin = graph.copy()
    assert twin == graph and twin is not graph and hash(twin) == hash(graph)
    renamed = graph.copy(dag_id="other")
    assert renamed.dag_id == "other" and renamed != graph
    restored = pickle.loads(pickle.dumps(graph))
    assert restored == graph
    assert restored.topological_order() == graph.topological_order()


def test_to_dict_round_trips_through_the_constructor() -> None:
    graph = TaskGraph(
        "rt",
        [
            Node("gen", NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT),
            Node("adv", NodeType.COMPUTE, NodeRole.ADVANTAGE, ("gen",), config={"k": [1, 2]}),
        ],
        description="round trip",
    )
    data = graph.to_dict()
    assert data["description"] == "round trip"
    assert data["nodes"][1]["config"] == {"k": [1, 2]}
    rebuilt = TaskGraph(
        data["dag_id"],
        [graph[n["node_id"]] for n in data["nodes"]],
        description=data["description"],
    )
    assert rebuilt == graph


def test_hundreds_of_nodes_are_fast() -> None:
    # a layered DAG: 40 layers x 25 nodes, each node depends on 3 nodes of the layer above
    nodes = []
    for layer in range(40):
        for i in range(25):
            deps = [f"n{layer - 1}_{(i + k) % 25}" for k in range(3)] if layer else []
            nodes.append(step(f"n{layer}_{i}", *deps))
    start = time.perf_counter()
    graph = TaskGraph("big", nodes)
    for node_id in graph.node_ids[::50]:
        graph.ancestors(node_id)
        graph.descendants(node_id)
    graph.subgraph(graph.node_ids[:500])
    assert time.perf_counter() - start < 2.0
    assert len(graph) == 1000 and len(graph.edges()) == 39 * 25 * 3


# ---- property: random DAGs -----------------------------------------------------------------


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[int, set[tuple[int, int]], list[int]]:
    """(n, edges i→j with i < j, a declaration order) — acyclic by construction."""
    n = draw(st.integers(min_value=2, max_value=25))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = set(draw(st.lists(st.sampled_from(pairs), max_size=60)))
    order = draw(st.permutations(range(n)))
    return n, edges, list(order)


def build(n: int, edges: set[tuple[int, int]], order: list[int]) -> list[Node]:
    deps: dict[int, list[str]] = {i: [] for i in range(n)}
    for producer, consumer in sorted(edges):
        deps[consumer].append(f"n{producer}")
    return [step(f"n{i}", *deps[i]) for i in order]


@settings(max_examples=150, deadline=None)
@given(random_dags())
def test_topological_order_respects_every_edge(
    dag: tuple[int, set[tuple[int, int]], list[int]],
) -> None:
    n, edges, order = dag
    graph = TaskGraph("random", build(n, edges, order))
    position = {node_id: i for i, node_id in enumerate(graph.topological_order())}
    assert sorted(position) == sorted(f"n{i}" for i in range(n))
    for producer, consumer in edges:
        assert position[f"n{producer}"] < position[f"n{consumer}"]
    assert set(graph.edges()) == {(f"n{p}", f"n{c}") for p, c in edges}
    # deterministic: the same nodes in the same declaration order give the same order
    assert TaskGraph("again", build(n, edges, order)).topological_order() == tuple(position)
    for node_id in graph.node_ids:
        for ancestor in graph.ancestors(node_id):
            assert node_id in graph.descendants(ancestor)


@settings(max_examples=150, deadline=None)
@given(random_dags(), st.data())
def test_a_back_edge_is_reported_as_a_real_cycle(
    dag: tuple[int, set[tuple[int, int]], list[int]], data: st.DataObject
) -> None:
    n, edges, order = dag
    graph = TaskGraph("random", build(n, edges, order))
    # a back edge: `source` now also depends on itself or on one of its descendants
    source = data.draw(st.sampled_from(graph.node_ids))
    target = data.draw(st.sampled_from([source, *graph.descendants(source)]))
    nodes = [
        step(node.node_id, *node.dependencies, target) if node.node_id == source else node
        for node in graph.nodes
    ]
    with pytest.raises(WorkflowError) as info:
        TaskGraph("cyclic", nodes)
    match = re.search(r"has a cycle: (.+?);", str(info.value))
    assert match, str(info.value)
    cycle = match.group(1).split(" -> ")
    assert cycle[0] == cycle[-1]
    all_edges = {(f"n{p}", f"n{c}") for p, c in edges} | {(target, source)}
    for producer, consumer in itertools.pairwise(cycle):
        assert (producer, consumer) in all_edges
