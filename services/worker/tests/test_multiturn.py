"""Multi-turn rollouts: processing and masks, the concurrent loop, the builder, tool-call
metrics, a DAGWorker step."""

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
import yaml

from dagrl.algorithms import FixedKLController
from dagrl.batch import Batch
from dagrl.config import load_job_config
from dagrl.data import make_dataset
from dagrl.envs import AgentOptions, MathEnv, StepResult, agent_options
from dagrl.errors import ConfigError
from dagrl.models import build_char_tokenizer
from dagrl.tokenizing import encode_chat_prompt, load_tokenizer
from dagrl.workflow import Node, NodeRole, NodeType, load_workflow
from dagrl_worker.rank.dag_worker import DAGWorker
from dagrl_worker.rank.executors.base import AgentModels, StepContext
from dagrl_worker.rank.executors.multiturn import MultiTurnRolloutExecutor
from dagrl_worker.rank.executors.table import build_executor
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams, multiturn
from dagrl_worker.rank.rollout.multiturn import (
    TurnLimits,
    backend_generate_fn,
    episodes_to_batch,
    run_episodes,
)
from dagrl_worker.rank.rollout.processing import ProcessingError, TurnProcessor
from dagrl_worker.rank.training.model_outputs import response_log_probs
from dagrl_worker.shared.metrics import MetricSink, merge
from dagrl_worker.shared.plan_view import colocated_plan
from dagrl_worker.shared.spec import WorkerSpec

TOKENIZER = build_char_tokenizer()


def ids(text: str) -> list[int]:
    return list(TOKENIZER(text, add_special_tokens=False)["input_ids"])


class ScriptedEnv:
    """Ends after `turns` steps (from the sample), reward = turns; optional latency per step."""

    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s
        self.turns_wanted = 0
        self.turns = 0

    async def reset(self, sample: dict[str, Any]) -> str:
        self.turns_wanted = int(sample["extra_info"]["turns"])
        return ""

    async def step(self, action: str, ground_truth: str) -> StepResult:
        self.turns += 1
        await asyncio.sleep(self.latency_s * self.turns_wanted)
        done = self.turns >= self.turns_wanted
        return StepResult(f"obs{self.turns}", float(self.turns) if done else 0.0, done)


def fixed_generate(reply: str):
    calls: list[int] = []

    def generate(contexts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        calls.append(len(contexts))
        return [ids(reply)[:max_new_tokens] for _ in contexts]
    return generate, calls


def samples_batch(turns: list[int], prompt: str = "hi") -> Batch:
    rows = {"prompt_ids": [ids(prompt)] * len(turns), "index": list(range(len(turns))),
            "ground_truth": ["7"] * len(turns), "data_source": ["arith"] * len(turns),
            "extra_info": [{"turns": t} for t in turns]}
    return prompts_to_batch(rows, TOKENIZER.pad_token_id, "t")


def play(batch: Batch, generate, limits: TurnLimits, env_latency_s: float = 0.0,
         lockstep: bool = False, options: AgentOptions | None = None):
    processor = TurnProcessor(TOKENIZER, options or agent_options("r", {"env": "math"}))
    rows = [{k: v[i] for k, v in batch.columns.items()} for i in range(len(batch))]
    prompts = [row[m.bool()].tolist() for row, m in zip(batch.tensors["prompt_ids"],
                                                         batch.tensors["prompt_mask"], strict=True)]
    episodes = asyncio.run(run_episodes(rows, prompts, lambda: ScriptedEnv(env_latency_s),
                                        processor, generate, limits, lockstep=lockstep))
    return episodes, episodes_to_batch(batch, episodes, TOKENIZER.pad_token_id,
                                       limits.max_response_tokens)


def test_templates_and_masks_on_a_concrete_sequence() -> None:
    generate, _ = fixed_generate("ab<|im_end|>")
    _, out = play(samples_batch([2]), generate, TurnLimits(3, 8, 64))
    expected = ("ab<|im_end|>" "\n" "<|im_start|>user\nobs1<|im_end|>\n<|im_start|>assistant\n"
                "ab<|im_end|>")
    length = len(ids(expected))
    assert out.tensors["responses"][0, :length].tolist() == ids(expected)
    policy = len(ids("ab<|im_end|>"))
    mask = [1] * policy + [0] * (length - 2 * policy) + [1] * policy + [0] * (64 - length)
    assert out.tensors["response_mask"][0].tolist() == mask
    prompt_len = int(out.tensors["attention_mask"][0, :out.tensors["prompts"].shape[1]].sum())
    assert out.tensors["attention_mask"][0].sum() == prompt_len + length  # env tokens attended
    scores = out.tensors["token_level_scores"][0]
    assert scores[length - 1] == 2.0 and scores.sum() == 2.0  # reward on the last policy token
    assert out.columns["num_turns"] == [2]
    assert out.tensors["input_ids"].shape == (1, out.tensors["prompts"].shape[1] + 64)


def test_user_hooks_must_only_append(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.py"
    hooks.write_text("def post(tokenizer, prompt_ids, response_ids, **kw):\n"
                     "    return prompt_ids + response_ids + [7]\n"
                     "def bad_pre(tokenizer, prompt_ids, observation, **kw):\n"
                     "    return prompt_ids[1:]\n")
    options = agent_options("r", {"env": "math", "post_process": f"{hooks}:post",
                                  "pre_process": f"{hooks}:bad_pre"})
    processor = TurnProcessor(TOKENIZER, options)
    assert processor.after_response([1, 2], [3]) == [7]
    with pytest.raises(ProcessingError, match="pre_process returned a context"):
        processor.before_turn([1, 2], "x")


def test_turn_counts_and_budget_with_a_stub_generator() -> None:
    generate, calls = fixed_generate("a<|im_end|>")
    episodes, out = play(samples_batch([1, 3, 2, 5]), generate, TurnLimits(4, 8, 128))
    assert [e.num_turns for e in episodes] == [1, 3, 2, 4]  # 5 capped by max_assistant_turns
    assert calls == [4, 3, 2, 1]  # ready samples share each generate call
    assert [e.reward for e in episodes] == [1.0, 3.0, 2.0, 0.0]
    assert int(out.tensors["response_mask"][1].sum()) == 3 * len(ids("a<|im_end|>"))
    # a tight response budget ends the episode early, policy tokens never cut off
    short, _ = play(samples_batch([3]), generate, TurnLimits(3, 8, 10))
    assert short[0].num_turns == 1 and len(short[0].response_ids) == 10


def test_slow_env_does_not_hold_back_the_others() -> None:
    generate, calls = fixed_generate("a<|im_end|>")
    started = time.perf_counter()
    concurrent, _ = play(samples_batch([1, 1, 1, 3]), generate, TurnLimits(3, 4, 64),
                         env_latency_s=0.02)
    assert time.perf_counter() - started < 1.0
    lockstep_generate, lockstep_calls = fixed_generate("a<|im_end|>")
    synced, _ = play(samples_batch([1, 1, 1, 3]), lockstep_generate, TurnLimits(3, 4, 64),
                     env_latency_s=0.02, lockstep=True)
    assert [e.num_turns for e in concurrent] == [e.num_turns for e in synced] == [1, 1, 1, 3]
    assert calls == lockstep_calls == [4, 1, 1]


def test_real_tiny_model_multi_turn(tiny_checkpoint: Path) -> None:
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(tiny_checkpoint)
    module = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    backend = HFRollout(module, tokenizer)
    torch.manual_seed(0)
    generate = backend_generate_fn(backend, tokenizer.pad_token_id,
                                   SamplingParams(do_sample=True))
    prompt = encode_chat_prompt(tokenizer, [{"role": "user", "content": "1+2="}])
    rows = {"prompt_ids": [prompt] * 6, "index": list(range(6)), "ground_truth": ["3"] * 6,
            "data_source": ["arith"] * 6, "extra_info": [{}] * 6}
    batch = prompts_to_batch(rows, tokenizer.pad_token_id, "m")
    processor = TurnProcessor(tokenizer, agent_options("r", {"env": "math"}))
    samples = [{k: v[i] for k, v in batch.columns.items()} for i in range(6)]
    episodes = asyncio.run(run_episodes(samples, [prompt] * 6, lambda: MathEnv(max_turns=3),
                                        processor, generate, TurnLimits(3, 4, 96)))
    out = episodes_to_batch(batch, episodes, tokenizer.pad_token_id, 96)
    for episode, response, mask in zip(episodes, out.tensors["responses"],
                                       out.tensors["response_mask"], strict=True):
        assert 1 <= episode.num_turns <= 3 and 1 <= int(mask.sum()) <= 4 * episode.num_turns
        text = tokenizer.decode(response[~mask.bool()][:len(episode.response_ids)].tolist())
        if episode.num_turns > 1:  # the env's answer and the template are in, masked out
            assert "<|im_start|>user\n" in text and ("wrong" in text or "correct" in text)
    assert any(e.num_turns == 3 for e in episodes)  # an untrained model is mostly wrong
    # each policy token's log-prob as its turn sampled it = the actor's on the whole episode
    with torch.no_grad():
        actor, _ = response_log_probs(module, out, temperature=1.0)
    policy = out.tensors["response_mask"].bool()
    assert float((actor - out.tensors["rollout_log_probs"])[policy].abs().max()) <= 1e-4
    assert float(out.tensors["rollout_log_probs"][~policy].abs().sum()) == 0.0


def test_a_backend_without_log_probs_leaves_them_out() -> None:
    generate, _ = fixed_generate("ab<|im_end|>")
    _, out = play(samples_batch([2, 1]), generate, TurnLimits(3, 8, 64))
    assert "rollout_log_probs" not in out and "responses" in out


class FlakyEnv:
    """One step; what it does is the sample's `extra_info["mode"]`: answer 1.0, or fail in
    one of the ways an env can."""

    async def reset(self, sample: dict[str, Any]) -> str:
        self.mode = sample["extra_info"]["mode"]
        if self.mode == "reset_raises":
            raise ConnectionError("sandbox unreachable")
        return ""

    async def step(self, action: str, ground_truth: str) -> StepResult:
        if self.mode == "hangs":
            await asyncio.Event().wait()
        if self.mode == "step_raises":
            raise KeyError("sandbox")
        rewards = {"nan": float("nan"), "none": None, "bool": True,
                   "float32": numpy.float32(1.0)}
        return StepResult("", rewards.get(self.mode, 1.0), True)  # type: ignore[arg-type]

    def get_rewards(self, trajectory: Any) -> Any:
        if self.mode == "rewards_raise":
            raise ValueError("no verifier")
        value = trajectory.results[-1].reward
        return float("inf") if self.mode == "inf" else value


def play_flaky(modes: list[str]) -> tuple[list[Any], Batch]:
    rows = {"prompt_ids": [ids("hi")] * len(modes), "index": list(range(len(modes))),
            "data_source": ["arith"] * len(modes), "extra_info": [{"mode": m} for m in modes]}
    batch = prompts_to_batch(rows, TOKENIZER.pad_token_id, "t")
    processor = TurnProcessor(TOKENIZER, agent_options("r", {"env": "math"}))
    samples = [{k: v[i] for k, v in batch.columns.items()} for i in range(len(batch))]
    prompts = [ids("hi")] * len(modes)
    generate, _ = fixed_generate("ab<|im_end|>")
    limits = replace(TurnLimits(3, 8, 64), env_timeout_s=0.2)
    episodes = asyncio.run(asyncio.wait_for(run_episodes(
        samples, prompts, FlakyEnv, processor, generate, limits), 10))
    return episodes, episodes_to_batch(batch, episodes, TOKENIZER.pad_token_id, 64)


def test_an_env_that_fails_an_episode_leaves_only_that_episode_out() -> None:
    modes = ["ok", "reset_raises", "step_raises", "rewards_raise", "hangs", "nan", "inf",
             "none", "bool", "float32"]
    started = time.perf_counter()
    episodes, out = play_flaky(modes)
    assert time.perf_counter() - started < 5  # the hung step timed out
    assert [e.failed for e in episodes] == [False] + [True] * 8 + [False]
    errors = {mode: e.error for mode, e in zip(modes, episodes, strict=True)}
    assert errors["reset_raises"] == ("ConnectionError: FlakyEnv.reset (sample t:1): sandbox "
                                      "unreachable")
    assert errors["step_raises"] == "KeyError: FlakyEnv.step (sample t:2): 'sandbox'"
    assert errors["rewards_raise"].startswith("ValueError: FlakyEnv.get_rewards (sample t:3)")
    assert errors["hangs"] == "TimeoutError: FlakyEnv.step (sample t:4) took longer than 0.2 s"
    assert [e.timed_out for e in episodes] == [m == "hangs" for m in modes]
    for mode in ("nan", "inf", "none", "bool"):
        assert errors[mode].startswith("TypeError: FlakyEnv.get_rewards"), errors[mode]
        assert "a reward must be a finite real number" in errors[mode]
    assert out.columns["uid"] == ["t:0", "t:9"]  # the failed episodes' rows are left out
    assert out.tensors["token_level_scores"].sum(dim=1).tolist() == [1.0, 1.0]


def test_the_failed_episodes_are_counted_and_left_out_of_the_length_metrics() -> None:
    episodes, out = play_flaky(["ok", "step_raises", "hangs", "ok"])
    config = load_job_config(data={})
    ctx = StepContext(step=1, rank=0, config=config, sink=MetricSink(),
                      kl_controller=FixedKLController(0.0))
    policy_tokens = out.tensors["response_mask"].sum(dim=1).float()
    MultiTurnRolloutExecutor._add_metrics(ctx, episodes, policy_tokens)
    summary = ctx.sink.summary()
    assert summary["env/failed"][1] == 2 and summary["env/timeouts"][1] == 1
    # the mean response length is over the two rows kept, weighted by them
    assert summary["response_length/mean"] == ["mean", float(policy_tokens.mean()), 2.0]


def test_a_step_where_every_episode_failed_names_the_env_and_the_first_error() -> None:
    with pytest.raises(multiturn.EnvEpisodeError) as failed:
        play_flaky(["step_raises", "nan"])
    message = str(failed.value)
    assert "every one of the 2 multi-turn episodes failed" in message
    assert "KeyError: FlakyEnv.step (sample t:0): 'sandbox'" in message


def node(**kw: Any) -> Node:
    return Node(**{"node_id": "n", "node_type": NodeType.MODEL_INFERENCE,
                   "node_role": NodeRole.ROLLOUT, **kw})


def test_builder_validates_and_refuses_env_interact() -> None:
    models = AgentModels(tokenizer=TOKENIZER, rollout=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"node 'n': agent_options\.turns: unknown key"):
        build_executor(node(agent_options={"env": "math", "turns": 3}), models, None, 1, None)
    with pytest.raises(ConfigError, match="env is not set"):
        build_executor(node(agent_options={"max_assistant_turns": 3}), models, None, 1, None)
    with pytest.raises(ConfigError, match=r"is ENV_INTERACT.*agent_options\.env"):
        build_executor(Node("env", NodeType.ENV_INTERACT), models, None, 1, None)
    with pytest.raises(ConfigError, match="only a ROLLOUT node"):
        build_executor(Node("r", NodeType.COMPUTE, NodeRole.REWARD,
                            agent_options={"env": "math"}), models, None, 1, None)
    executor = build_executor(node(agent_options={"env": "calculator"}), models,
                              load_job_config(data={}), 1, None)
    assert isinstance(executor, MultiTurnRolloutExecutor)


def calculator_reply(context: str) -> str:
    """Calls the calculator as often as the prompt's `calls=<k>` says (the second call divides
    by zero), then answers 12."""
    wanted = int(context.split("calls=")[1][0])
    results = context.count("<result>")
    if results < wanted:
        return "<tool>1/0</tool>" if results == 1 else "<tool>3*4</tool>"
    return "12"


def test_tool_calls_metric_counts_the_calls_the_env_ran(scripted_backend) -> None:
    models = AgentModels(tokenizer=TOKENIZER, rollout=scripted_backend(calculator_reply))
    config = load_job_config(data={"data": {"max_response_length": 256},
                                   "actor_rollout_ref": {"rollout": {"n": 2}}})
    executor = build_executor(node(agent_options={"env": "calculator"}), models, config, 1, None)
    ctx = StepContext(step=1, rank=0, config=config, sink=MetricSink(),
                      kl_controller=FixedKLController(0.0))
    rows = {"prompt_ids": [ids(f"calls={k}") for k in (0, 1, 2)], "index": [0, 1, 2],
            "ground_truth": ["12"] * 3, "data_source": ["arith"] * 3}
    out = executor.run(prompts_to_batch(rows, TOKENIZER.pad_token_id, "c"), ctx)
    assert out.columns["num_turns"] == [1, 1, 2, 2, 3, 3]  # k tool calls, then the answer
    assert out.tensors["token_level_scores"].sum(dim=1).tolist() == [1.0] * 6
    summary = ctx.sink.summary()
    assert summary["tool/calls"][1] == 2 * (0 + 1 + 2)
    assert summary["tool/errors"][1] == 2  # the second call of each calls=2 sample
    assert summary["tool/calls_per_episode/mean"][1] == 1.0
    assert merge([summary, summary])["tool/calls"] == 12  # summed over ranks


# A user env from a file: the reward is the parity of the action's characters (so samples of
# one prompt differ and GRPO has a signal); the episode ends after two turns.
PARITY_ENV = """
from dagrl.envs import StepResult

class ParityEnv:
    async def reset(self, sample):
        self.turns = 0
        return ""

    async def step(self, action, ground_truth):
        self.turns += 1
        done = self.turns == 2
        reward = float(sum(map(ord, action)) % 2) if done else 0.0
        return StepResult("ok", reward, done)
"""

WORKFLOW = """
dag_id: multiturn
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT,
     agent_options: {env: "ENV_FILE:ParityEnv", max_assistant_turns: 3,
                     max_response_tokens_per_turn: 4}}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rollout]}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward]}
  - {node_id: old_log_prob, node_type: MODEL_TRAIN, node_role: ACTOR, only_forward_compute: true,
     dependencies: [advantage]}
  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [old_log_prob]}
"""


def test_dag_worker_trains_with_a_multi_turn_rollout(tiny_checkpoint: Path,
                                                     tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_dataset("arith", 32, 8, data, seed=0)
    (tmp_path / "parity_env.py").write_text(PARITY_ENV)
    workflow = tmp_path / "multiturn.yaml"
    workflow.write_text(WORKFLOW.replace("ENV_FILE", str(tmp_path / "parity_env.py")))
    config = {
        "data": {"train_files": [str(data / "train.parquet")],
                 "val_files": [str(data / "val.parquet")],
                 "train_batch_size": 4, "max_prompt_length": 32, "max_response_length": 64},
        "actor_rollout_ref": {
            "model": {"path": str(tiny_checkpoint)},
            "actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_rank": 4,
                      "use_kl_loss": False, "optim": {"lr": 1e-3}},
            "rollout": {"n": 4}},
        "trainer": {"total_training_steps": 2, "seed": 3},
        "workflow": {"source": str(workflow)},
    }
    plan = colocated_plan(load_workflow(str(workflow)), world_size=1)
    spec = WorkerSpec(job_id="unit", config_yaml=yaml.safe_dump(config), workflow_yaml="",
                      overrides=(), plan=plan.SerializeToString(), redis_url=None,
                      checkpoint_dir=str(tmp_path / "ckpt"))
    worker = DAGWorker(spec, rank=0)
    worker.init_graph()
    before = [p.detach().clone() for p in worker.models[0].actor.inner.parameters()]
    summary = worker.run_step(1)
    assert summary["num_turns/mean"][1] == summary["num_turns/max"][1] == 2.0
    # the env's rewards reached the advantage node through the REWARD node unchanged
    assert summary["critic/score/max"][1] == 1.0 and summary["critic/score/min"][1] == 0.0
    assert torch.isfinite(torch.tensor(summary["actor/pg_loss"][1]))
    assert summary["actor/grad_norm"][1] > 0
    after = list(worker.models[0].actor.inner.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
