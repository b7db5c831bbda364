"""The scheduler's plan is deterministic across processes: two interpreters with different hash
seeds plan the same nested workflow to the same proto bytes. The plan's rules in one process:
services/scheduler/tests/test_groups.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler.planning import Plan

_PLAN_SCRIPT = textwrap.dedent("""
    from dagrl.workflow import parse_workflow
    from dagrl_scheduler.planning import Cluster, make_plan
    text = '''
    dag_id: nested
    nodes:
      - {node_id: load_a, node_type: DATA_LOAD}
      - {node_id: load_b, node_type: DATA_LOAD}
      - {node_id: gen_a, node_type: MODEL_INFERENCE, node_role: ROLLOUT, dependencies: [load_a],
         config: {model_params: 7B}}
      - {node_id: gen_b, node_type: MODEL_INFERENCE, node_role: ROLLOUT, dependencies: [load_b],
         config: {model_params: 3B}}
      - {node_id: judge, node_type: MODEL_INFERENCE, node_role: REWARD,
         dependencies: [gen_a, gen_b], config: {model_params: 13B}}
      - {node_id: train_a, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [judge],
         config: {model_params: 7B}}
      - {node_id: train_b, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [judge],
         config: {model_params: 3B}}
    '''
    plan = make_plan(parse_workflow(text), Cluster.homogeneous(5, 8))
    print(plan.to_proto().SerializeToString(deterministic=True).hex())
""")


@pytest.mark.integration  # two child processes
def test_the_same_plan_comes_out_of_two_independent_processes() -> None:
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", _PLAN_SCRIPT], env=env, check=True,
                              capture_output=True, text=True, timeout=60)
        outputs.append(done.stdout.strip())
    assert outputs[0] and outputs[0] == outputs[1]
    plan = Plan.from_proto(scheduler_pb2.Plan.FromString(bytes.fromhex(outputs[0])))
    assert len(plan.subgraphs) == 4
    assert len(plan.process_groups) >= 4
