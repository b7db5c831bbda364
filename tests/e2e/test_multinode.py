"""The plan, honoured on a multi-node Ray cluster (Ray's test cluster: several raylets on this
host, `multinode_job.py`): every rank runs on the node bound to the machine the plan put it on,
a data-parallel group spanning two nodes trains, a heterogeneous plan lands by device kind, and
a plan the cluster cannot hold fails at start with what is missing, and a lost node is waited
for (the job store says so), re-placed and resumed from the checkpoint, or reported after the
wait. With a databuffer Redis per machine, the bytes of a step land on the instances the layout
says: on the producers' machines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dagrl.local import LocalRedis

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).with_name("multinode_job.py")


@pytest.fixture(scope="module")
def cluster_runs(assets: Path, redis_server: LocalRedis,
                 tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("multinode")
    done = subprocess.run([sys.executable, str(SCRIPT), str(assets), redis_server.url,
                           str(work)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ranks_on_bound_nodes(run: dict) -> None:
    planned = {int(rank): machine for rank, machine in run["planned"].items()}
    assert len(set(run["binding"].values())) == len(run["binding"]) == len(set(planned.values()))
    for rank, machine in planned.items():
        assert run["rank_nodes"][rank] == run["binding"][machine], (rank, machine)


def test_ranks_run_where_the_plan_puts_them_and_a_group_spans_nodes(cluster_runs: dict) -> None:
    run = cluster_runs["spread"]
    assert run["state"] == "SUCCEEDED", run["reason"]
    _ranks_on_bound_nodes(run)
    assert len(set(run["rank_nodes"])) == 2  # one rank a node: the actor's dp group spans both
    assert len(run["pg_loss"]) == 2


def test_each_machine_buffer_holds_the_shards_of_its_own_ranks(cluster_runs: dict) -> None:
    """`spread` (every node on both ranks, dp 2): each rank writes its training shard on its
    own machine, so the two instances receive about equal bytes. `kinds` (rollout side on
    m-a, training side on m-b): every shard is the rollout side's, so m-b's instance receives
    next to nothing."""
    received = cluster_runs["spread"]["buffer_bytes"]
    assert set(received) == {"node-0", "node-1"}
    total = sum(received.values())
    assert total > 100_000, received  # real shards went through, not just handshakes
    assert all(0.3 < count / total < 0.7 for count in received.values()), received
    split = cluster_runs["kinds"]
    assert split["state"] == "SUCCEEDED", split["reason"]
    assert split["buffer_bytes"]["m-a"] > 100_000, split["buffer_bytes"]
    assert split["buffer_bytes"]["m-b"] < split["buffer_bytes"]["m-a"] / 50, split["buffer_bytes"]


def test_heterogeneous_plan_lands_by_device_kind(cluster_runs: dict) -> None:
    run, kinds = cluster_runs["kinds"], cluster_runs["node_kinds"]
    assert run["state"] == "SUCCEEDED", run["reason"]
    _ranks_on_bound_nodes(run)
    for rank, kind in run["subgraph_kinds"].items():
        assert kind and kinds[run["rank_nodes"][int(rank)]] == kind, (rank, kind)


def test_a_plan_the_cluster_cannot_hold_fails_at_start(cluster_runs: dict) -> None:
    run = cluster_runs["too_big"]
    assert run["state"] == "FAILED"
    assert "cannot hold the plan's 3 machine(s)" in run["reason"]
    assert "node-2" in run["reason"] and "live nodes" in run["reason"]
    assert run["seconds"] < 30 and run["rank_nodes"] == []


def test_a_plan_whose_nodes_stay_taken_fails_after_the_placement_timeout(
        cluster_runs: dict) -> None:
    run = cluster_runs["held"]
    assert run["state"] == "FAILED"
    assert "got no resources on their Ray node within 3 s (trainer.placement_timeout_s)" in \
        run["reason"], run["reason"]
    assert 3 <= run["seconds"] < 30 and run["rank_nodes"] == []


def test_dagrl_submit_without_a_cluster_plans_for_the_live_ray_nodes(cluster_runs: dict) -> None:
    """No `--nodes`/`--cluster`: the scheduler read the Ray nodes (kinds from their labels),
    planned a machine on each, and the driver bound every machine to the node it came from."""
    run, kinds = cluster_runs["submitted"], cluster_runs["node_kinds"]
    assert run["exit_code"] == 0
    [placed] = run["placed"]  # the driver's log: "ranks placed: 0 on ray-1a2b3c4d (id), ..."
    workers = {node_id for node_id, kind in kinds.items() if kind}
    assert set(run["planned"].values()) == {f"ray-{node_id[:8]}" for node_id in workers}
    for part in placed.split("ranks placed: ")[1].split(", "):
        rank, _, rest = part.split(" ", 2)
        machine, node = rest.split(" (")
        assert machine == run["planned"][rank]
        assert node.rstrip(")").startswith(machine.removeprefix("ray-")), placed
        [node_id] = [n for n in workers if n.startswith(machine.removeprefix("ray-"))]
        assert kinds[node_id] == run["subgraph_kinds"][rank], (rank, placed)


def test_a_lost_node_is_waited_for_and_the_job_resumes_when_one_joins(cluster_runs: dict) -> None:
    run = cluster_runs["node_lost"]
    assert run["state"] == "SUCCEEDED", run["reason"]
    assert run["restarts"] == 1 and run["last_step"] == 4  # multinode_job.LOST_NODE_STEPS
    assert run["waiting_seen"].startswith("a rank was lost; waiting until")  # dagrl status
    assert "machine 'node-1'" in run["waiting_seen"]
    assert run["removed"] not in run["rank_nodes"]  # rank 1 re-placed on the node that joined
    assert run["waiting_after"] == ""
    assert set(run["buffer_bytes"]) == {"node-0", "node-1"}  # new instances for the new attempt


def test_a_lost_node_that_never_returns_fails_the_job_after_the_wait(cluster_runs: dict) -> None:
    run = cluster_runs["node_gone"]
    assert run["state"] == "FAILED"
    assert run["reason"].startswith("waited 8 s (trainer.node_wait_timeout_s)")
    assert "machine 'node-1'" in run["reason"] and run["waiting_seen"]
