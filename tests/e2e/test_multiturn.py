"""Multi-turn GRPO with the calculator tool env, trained through the real driver on 2 ranks.

The policy is the tiny model warm-started to call the calculator on half of its examples
(`examples/calculator_tool.yaml`'s assets): it writes `<tool>a+b</tool>` itself, the built-in
`CalculatorToolEnv` evaluates it and answers `<result>...</result>`, and the policy answers.
The env here (`LoggedCalculator`, in a file the Ray workers import) is that env, logging each
call it executes to a file the test reads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from dagrl.batch import Batch
from dagrl.engines import is_engine_installed
from dagrl.jobs import JobState
from dagrl.local import LocalRedis
from dagrl.workflow import load_workflow
from dagrl_worker.driver.job_driver import Driver
from dagrl_worker.rank import checkpoint
from dagrl_worker.rank.dag_worker import DAGWorker
from dagrl_worker.rank.executors.base import Executor, StepContext
from dagrl_worker.shared.plan_view import colocated_plan
from dagrl_worker.shared.spec import WorkerSpec

from .conftest import job_config

pytestmark = pytest.mark.e2e
RANKS = 2
STEPS = 3

LOGGED_CALCULATOR = '''
import json

from dagrl.envs import CalculatorToolEnv

CALLS_LOG = {log!r}


class LoggedCalculator(CalculatorToolEnv):
    """The calculator env, logging every call it executes and its result."""

    def __init__(self):
        super().__init__(max_turns=2)

    async def step(self, action, ground_truth):
        result = await super().step(action, ground_truth)
        if "tool_call" in result.info:
            with open(CALLS_LOG, "a") as log:
                log.write(json.dumps([result.info["tool_call"], result.observation]) + "\\n")
        return result
'''

WORKFLOW = """
dag_id: multiturn_calculator
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT,
     agent_options: {env: "ENV_REF", max_assistant_turns: 2, max_response_tokens_per_turn: 24}}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rollout]}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward]}
  - {node_id: old_log_prob, node_type: MODEL_TRAIN, node_role: ACTOR, only_forward_compute: true,
     dependencies: [advantage]}
  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [old_log_prob]}
"""


def calculator_job(assets: Path, tmp_path: Path, steps: int,
                   backend: str = "hf") -> tuple[dict, Path]:
    """The calculator example on `assets` with the logged calculator; returns (config, log)."""
    log = tmp_path / "tool_calls.jsonl"  # sampled calls may hold any character
    env_file = tmp_path / "logged_calculator.py"
    env_file.write_text(LOGGED_CALCULATOR.format(log=str(log)))
    workflow = tmp_path / "workflow.yaml"
    workflow.write_text(WORKFLOW.replace("ENV_REF", f"{env_file}:LoggedCalculator"))
    config = job_config(
        assets, "calculator_tool",
        data={"train_batch_size": 8},
        actor_rollout_ref={"rollout.n": 4, "actor.ppo_mini_batch_size": 8,
                           "rollout.name": backend},
        trainer={"total_training_steps": steps, "save_freq": steps, "logger": ["console"],
                 "val_before_train": False, "test_freq": -1,
                 "default_local_dir": str(tmp_path)},
        workflow={"source": str(workflow)})
    return config, log


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.skipif(
    not is_engine_installed("vllm"), reason="vllm is not installed"))])
def test_calculator_episodes_train_on_two_ranks(ray_session: None, tool_assets: Path,
                                                redis_server: LocalRedis, tmp_path: Path,
                                                backend: str) -> None:
    config, log = calculator_job(tool_assets, tmp_path, STEPS, backend)
    plan = colocated_plan(load_workflow(config["workflow"]["source"]), world_size=RANKS)
    spec = WorkerSpec(job_id=f"e2e-{tmp_path.name}", config_yaml=yaml.safe_dump(config),
                      workflow_yaml="", overrides=(), plan=plan.SerializeToString(),
                      redis_url=redis_server.url, checkpoint_dir=str(tmp_path / "ckpt"))
    outcome = Driver(spec).run()
    assert outcome.state == JobState.SUCCEEDED, outcome.reason
    # the policy wrote calls itself, and the tool really evaluated them
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) >= STEPS * 8 * 4 // 4
    for expression, observation in calls:
        left, plus, right = expression.partition("+")
        if plus and left.isdigit() and right.isdigit():
            assert observation == f"<result>{int(left) + int(right)}</result>", expression
    counted = [m["tool/calls"] for m in outcome.history if "tool/calls" in m]
    assert len(counted) == STEPS and sum(counted) == len(calls)
    turns = [m["num_turns/max"] for m in outcome.history if "num_turns/max" in m]
    assert len(turns) == STEPS and max(turns) > 1
    losses = [m["actor/pg_loss"] for m in outcome.history if "actor/pg_loss" in m]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    # the turns' own log-probs of the policy tokens agree with the actor on the whole episode
    gaps = [m["rollout_corr/max_abs_diff"] for m in outcome.history
            if "rollout_corr/max_abs_diff" in m]
    assert len(gaps) == STEPS and max(gaps) <= 1e-4, gaps
    saved = load_file(str(checkpoint.step_dir(tmp_path / "ckpt", STEPS) / "agent0" / "actor"
                          / "model.safetensors"))
    initial = load_file(str(tool_assets / "model" / "model.safetensors"))
    assert any(not torch.equal(saved[name], initial[name]) for name in initial if name in saved)


class Capture:
    """Wraps the rollout executor and keeps what it returned."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.outputs: list[Batch] = []

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        self.outputs.append(self.inner.run(batch, ctx))
        return self.outputs[-1]


def test_env_tokens_are_masked_out_of_the_loss(tool_assets: Path, tmp_path: Path) -> None:
    """One rollout on one rank, in-process: only the policy's own tokens have response_mask 1."""
    config, log = calculator_job(tool_assets, tmp_path, 1)
    plan = colocated_plan(load_workflow(config["workflow"]["source"]), world_size=1)
    spec = WorkerSpec(job_id="mask", config_yaml=yaml.safe_dump(config), workflow_yaml="",
                      overrides=(), plan=plan.SerializeToString(), redis_url=None,
                      checkpoint_dir=str(tmp_path / "ckpt"))
    worker = DAGWorker(spec, rank=0)
    worker.init_graph()
    tokenizer = worker.models[0].tokenizer
    capture = Capture(worker.executors["rollout"])
    worker.executors["rollout"] = capture
    worker.run_step(1)
    batch = capture.outputs[0]
    results = [json.loads(line)[1] for line in log.read_text().splitlines()]
    width = batch.tensors["prompts"].shape[1]
    seen = 0
    for row in range(len(batch)):
        responses = batch.tensors["responses"][row]
        mask = batch.tensors["response_mask"][row].bool()
        attended = batch.tensors["attention_mask"][row, width:].bool()
        policy = tokenizer.decode(responses[mask])
        appended = tokenizer.decode(responses[attended & ~mask])
        assert "<result>" not in policy and "<|im_start|>user" not in policy, policy
        if batch.columns["num_turns"][row] > 1:
            assert "<result>" in appended and "<|im_start|>user" in appended, appended
            seen += 1
    assert seen > 0 and len(results) >= seen
