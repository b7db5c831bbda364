"""Asynchronous training (`trainer.max_staleness: 1`) against synchronous steps, same run.

Every job runs through the real job driver, Ray actors, gloo and a private redis-server on
2 ranks, on the demo's tiny model (`make demo`'s assets); the first WARMUP steps are left
out of every mean. Each comparison runs its two jobs ROUNDS times in the order A B B A (then
again), and pools the steps of each: this machine's speed drifts over minutes, and a drift
that slows the later job of a plain A B pair would bias the ratio; in A B B A a linear drift
cancels.

(a) The synchronous step on the split plan (rollout, reward and advantage on rank 0;
    log-probs, reference and the update on rank 1): rollout seconds a (the rollout side's
    nodes) and training seconds b (the training side's nodes), from the driver's per-node
    timings; the ideal overlap speedup is (a + b) / max(a, b).
(b) The same job with `max_staleness: 1` on the same plan: steps/s async / steps/s sync
    (`async_vs_sync_split`), and that ratio over the ideal (`async_overlap_efficiency`,
    target >= 0.85). The workload is the demo's GRPO job without the KL term (DAPO's choice:
    no reference pass, the rollout's log-probs as the old ones, so the workflow is rollout ->
    reward -> advantage -> update) on a random-init model of the demo's shape, which rarely
    stops early: most samples run to RESPONSE_TOKENS. a and b each come to 40 % or more of
    the synchronous step (checked: the script fails otherwise, the overlap would have little
    to hide).
(c) Multi-turn with environment latency: the episodes of `bench/multiturn.py` (1 to 4
    turns, every turn a 5 ms tool call, 250 ms for one sample in eight; `_latency_env.py`)
    on the demo's model; samples/s of the async job on the split plan against the
    synchronous job on the colocated plan, today's default. Headline
    (`async_vs_colocated_multiturn`, target >= 1.3): the multi-turn example's workflow as it
    is (old-log-prob pass and reference included), with `rollout_correction.mode: token`:
    decoupled PPO, the recomputed log-probs the proximal policy, the rollout's
    importance-weighted to it (in both jobs). Also reported
    (`async_vs_colocated_multiturn_lean`): the lean workflow of (b), no reference and the
    rollout's log-probs as the old ones, where training is cheaper and async has less to
    hide behind the env latency.

The script checks what it measures: the plans have the subgraphs and ranks stated above, the
async runs really overlapped (the rollout of t + 1 started before the training of t ended)
and kept the bound (staleness at most 1), and the multi-turn episodes took several turns.

    .venv/bin/python bench/async_pipeline.py [--steps 16] [--rounds 2] [--part all|split|multiturn]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import yaml
from _demo_jobs import ROOT, bench_config, run_to_end, start  # bench/_demo_jobs.py

from dagrl.local import LocalRedis
from dagrl.models import TinyModelSpec, build_char_tokenizer, build_tiny_model
from dagrl.models.demo import DemoRecipe
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import load_workflow
from dagrl.workflow.sides import split_sides
from dagrl_scheduler.planning import Cluster, make_plan
from dagrl_worker.driver.job_driver import JobOutcome

WARMUP = 2
RANKS = 2
RESPONSE_TOKENS = 64
PROMPTS_PER_STEP = 8
NO_REFERENCE_GRPO = {"dag_id": "grpo_no_reference", "nodes": [
    {"node_id": "rollout", "node_type": "MODEL_INFERENCE", "node_role": "ROLLOUT"},
    {"node_id": "reward", "node_type": "COMPUTE", "node_role": "REWARD",
     "dependencies": ["rollout"]},
    {"node_id": "advantage", "node_type": "COMPUTE", "node_role": "ADVANTAGE",
     "dependencies": ["reward"], "config": {"adv_estimator": "grpo"}},
    {"node_id": "actor_train", "node_type": "MODEL_TRAIN", "node_role": "ACTOR",
     "dependencies": ["advantage"]},
]}
LATENCY_ENV = ROOT / "bench" / "_latency_env.py"
MAX_TURNS = 4  # the latency environment's episodes run 1 + index % MAX_TURNS turns
MULTITURN_PROMPTS = 4  # x rollout.n 8: 32 episodes a step, where env latency weighs most
RANDOM_MODEL = ROOT / "outputs" / "bench_async" / "random_model"


def plan_for(workflow: Any, split: bool) -> scheduler_pb2.Plan:
    cluster = Cluster.homogeneous(1, RANKS, device_kind="cpu")
    plan = make_plan(workflow, cluster, split_rollout=split)
    if split:
        ranks = [set(s.ranks) for s in plan.subgraphs]
        if len(ranks) != 2 or ranks[0] & ranks[1]:
            sys.exit(f"the split plan should have 2 subgraphs on disjoint ranks, got {ranks}")
    elif [sorted(s.ranks) for s in plan.subgraphs] != [list(range(RANKS))]:
        sys.exit("the colocated plan should be one subgraph on every rank, got "
                 f"{[sorted(s.ranks) for s in plan.subgraphs]}")
    return plan.to_proto()


def steady(outcomes: list[JobOutcome]) -> list[dict[str, float]]:
    """The steps of every job in `outcomes` after its first WARMUP."""
    return [m for outcome in outcomes
            for m in [m for m in outcome.history if "perf/step_seconds" in m][WARMUP:]]


def step_seconds(outcomes: list[JobOutcome]) -> float:
    return statistics.mean(m["perf/step_seconds"] for m in steady(outcomes))


def interleaved(run_a: Callable[[str], JobOutcome], run_b: Callable[[str], JobOutcome],
                rounds: int) -> tuple[list[JobOutcome], list[JobOutcome]]:
    """Each job `rounds` times, in the order A B B A A B ...: `run_x(suffix)` runs one."""
    outcomes: tuple[list[JobOutcome], list[JobOutcome]] = ([], [])
    for round_index in range(rounds):
        order = (0, 1) if round_index % 2 == 0 else (1, 0)
        for which in order:
            outcomes[which].append((run_a, run_b)[which](f"-{round_index}"))
    return outcomes


def side_seconds(outcomes: list[JobOutcome], workflow: Any) -> tuple[float, float]:
    """(a, b): mean seconds of the rollout side's nodes and the training side's per step."""
    sides = split_sides(workflow)
    rows = steady(outcomes)
    a = statistics.mean(sum(m[f"timing_s/{n}"] for n in sides.rollout) for m in rows)
    # the weight sync is left out: on the split plan the rollout rank's share of it is
    # waiting for the update to end (the timing is the slowest rank's)
    b = statistics.mean(sum(m[f"timing_s/{n}"] for n in sides.training) for m in rows)
    return a, b


def check_async(name: str, outcome: JobOutcome) -> None:
    windows = {(side, step): (start, end) for side, step, start, end in outcome.timeline}
    steps = outcome.last_step
    overlapped = [t for t in range(1, steps)
                  if windows["rollout", t + 1][0] < windows["training", t][1]]
    if len(overlapped) < (steps - 1) // 2:
        sys.exit(f"{name}: the rollout of t+1 overlapped the training of t in only "
                 f"{len(overlapped)} of {steps - 1} steps: this would not time overlap")
    staleness = max(m.get("async/staleness/max", 0.0) for m in outcome.history)
    if staleness > 1:
        sys.exit(f"{name}: a trained sample was {staleness:.0f} versions behind (bound 1)")


def random_model() -> Path:
    """The demo's shape and tokenizer, random weights (`dagrl.models`)."""
    if not (RANDOM_MODEL / "config.json").is_file():
        recipe = DemoRecipe()
        spec = TinyModelSpec(hidden_size=recipe.hidden_size, num_layers=recipe.num_layers,
                             intermediate_size=4 * recipe.hidden_size, seed=recipe.seed)
        build_tiny_model(spec, build_char_tokenizer(), RANDOM_MODEL)
    return RANDOM_MODEL


def grpo_config(steps: int, staleness: int | None) -> dict[str, Any]:
    config = bench_config("grpo_arith", steps, RANKS)
    config["data"]["max_response_length"] = RESPONSE_TOKENS
    config["data"]["train_batch_size"] = PROMPTS_PER_STEP
    policy = config["actor_rollout_ref"]
    policy["model"]["path"] = str(random_model())
    policy["actor"]["ppo_mini_batch_size"] = PROMPTS_PER_STEP  # one optimizer step
    policy["actor"]["ppo_micro_batch_size_per_rank"] = PROMPTS_PER_STEP * policy["rollout"]["n"]
    policy["actor"]["use_rollout_log_probs"] = True
    config["trainer"]["max_staleness"] = staleness
    config["workflow"]["source"] = str(bench_file("grpo_no_reference.yaml",
                                                  yaml.safe_dump(NO_REFERENCE_GRPO)))
    return config


def multiturn_config(steps: int, staleness: int | None, lean: bool) -> dict[str, Any]:
    config = bench_config("multiturn_math", steps, RANKS)
    config["workflow"]["source"] = str(multiturn_workflow(lean))
    config["data"]["train_batch_size"] = MULTITURN_PROMPTS
    actor = config["actor_rollout_ref"]["actor"]
    actor["use_rollout_log_probs"] = lean
    if not lean:  # decoupled PPO: the recomputed log-probs are the proximal policy, the
        # rollout's importance-weighted to it (in both jobs, so the losses are the same)
        config.setdefault("algorithm", {})["rollout_correction"] = {"mode": "token"}
    actor["ppo_mini_batch_size"] = config["data"]["train_batch_size"]  # one optimizer step
    # a micro-batch as large as a rank's share: the split plan's trainer holds the whole
    # batch, the colocated plan's ranks half of it each
    actor["ppo_micro_batch_size_per_rank"] = (config["data"]["train_batch_size"]
                                              * config["actor_rollout_ref"]["rollout"]["n"])
    config["trainer"]["max_staleness"] = staleness
    return config


def bench_file(name: str, text: str) -> Path:
    """A workflow file of this benchmark's, written under outputs/bench_async/."""
    path = ROOT / "outputs" / "bench_async" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def multiturn_workflow(lean: bool) -> Path:
    """`examples/multiturn_math_workflow.yaml` with the latency environment, up to MAX_TURNS
    turns; `lean`: as in (b), no reference and no old-log-prob pass."""
    workflow = yaml.safe_load((ROOT / "examples" / "multiturn_math_workflow.yaml").read_text())
    nodes = {node["node_id"]: node for node in workflow["nodes"]}
    nodes["rollout"]["agent_options"].update(env=f"{LATENCY_ENV}:LatencyToolEnv",
                                             max_assistant_turns=MAX_TURNS)
    if lean:
        nodes["actor_train"]["dependencies"] = ["advantage"]
        nodes = {node_id: node for node_id, node in nodes.items()
                 if node_id not in ("old_log_prob", "ref_log_prob")}
    workflow["nodes"] = list(nodes.values())
    workflow["dag_id"] = "multiturn_latency_lean" if lean else "multiturn_latency"
    return bench_file(f"{workflow['dag_id']}.yaml", yaml.safe_dump(workflow))


def multiturn_rates(steps: int, rounds: int, lean: bool, redis_url: str,
                    folder: Path) -> tuple[float, float, float]:
    """(async split samples/s, sync colocated samples/s, turns per episode) on the
    multi-turn workload."""
    workflow = load_workflow(str(multiturn_workflow(lean)))
    name = "mt-lean" if lean else "mt"
    sync_config, async_config = (multiturn_config(steps, k, lean) for k in (None, 1))
    colocated, split = plan_for(workflow, False), plan_for(workflow, True)
    sync, overlapped = interleaved(
        lambda suffix: run_to_end(f"{name}-sync-colocated{suffix}", sync_config, colocated,
                                  redis_url, folder),
        lambda suffix: checked_async(f"{name}-async-split{suffix}", async_config, split,
                                     redis_url, folder),
        rounds)
    turns = statistics.mean(m.get("num_turns/mean", 0.0) for m in steady(overlapped))
    if turns < 1.5:
        sys.exit(f"multi-turn episodes averaged {turns:.2f} assistant turns: not multi-turn")
    return samples_per_s(overlapped, async_config), samples_per_s(sync, sync_config), turns


def checked_async(name: str, config: dict[str, Any], plan: scheduler_pb2.Plan,
                  redis_url: str, folder: Path) -> JobOutcome:
    outcome = run_to_end(name, config, plan, redis_url, folder)
    check_async(name, outcome)
    return outcome


def samples_per_s(outcomes: list[JobOutcome], config: dict[str, Any]) -> float:
    samples = config["data"]["train_batch_size"] * config["actor_rollout_ref"]["rollout"]["n"]
    return samples / step_seconds(outcomes)


def split_figures(steps: int, rounds: int, redis_url: str, folder: Path) -> dict[str, float]:
    """(a) and (b): printed, and their RESULT figures."""
    grpo = load_workflow(NO_REFERENCE_GRPO)
    split = plan_for(grpo, split=True)
    sync, overlapped = interleaved(
        lambda suffix: run_to_end(f"sync-split{suffix}", grpo_config(steps, None), split,
                                  redis_url, folder),
        lambda suffix: checked_async(f"async-split{suffix}", grpo_config(steps, 1), split,
                                     redis_url, folder),
        rounds)
    a, b = side_seconds(sync, grpo)
    sync_step, async_step = step_seconds(sync), step_seconds(overlapped)
    ideal = (a + b) / max(a, b)
    speedup = sync_step / async_step
    print(f"(a) sync step on the split plan {sync_step:.3f} s: rollout side a = {a:.3f} s, "
          f"training side b = {b:.3f} s, ideal overlap (a+b)/max(a,b) = {ideal:.3f}")
    print(f"(b) async step {async_step:.3f} s: async/sync {speedup:.3f}, "
          f"{speedup / ideal:.1%} of the ideal")
    for side, seconds in (("rollout", a), ("training", b)):
        if seconds < 0.4 * sync_step:
            sys.exit(f"the {side} side takes {seconds:.3f} s of a {sync_step:.3f} s step, under "
                     "40 %: the overlap would have little to hide")
    return {"async_vs_sync_split": speedup, "async_overlap_efficiency": speedup / ideal}


def multiturn_figures(steps: int, rounds: int, redis_url: str,
                      folder: Path) -> dict[str, float]:
    """(c), on the example's workflow and the lean one: printed, and their RESULT figures."""
    example_mt = multiturn_rates(steps, rounds, False, redis_url, folder)
    lean_mt = multiturn_rates(steps, rounds, True, redis_url, folder)
    for label, (fast, slow, turns) in (("the example's workflow", example_mt),
                                       ("lean: no reference, no old-log-prob pass", lean_mt)):
        print(f"(c) multi-turn with env latency, {label} ({turns:.2f} turns/episode): async "
              f"split {fast:.1f} samples/s, sync colocated {slow:.1f} samples/s")
    return {"async_vs_colocated_multiturn": example_mt[0] / example_mt[1],
            "async_vs_colocated_multiturn_lean": lean_mt[0] / lean_mt[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="steps of each job")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each job of a comparison, interleaved A B B A")
    parser.add_argument("--part", choices=("all", "split", "multiturn"), default="all",
                        help="split: (a) and (b) only; multiturn: (c) only")
    args = parser.parse_args()
    if args.steps <= WARMUP or args.rounds < 1:
        parser.error(f"--steps must exceed the {WARMUP} warm-up steps and --rounds be >= 1")
    start()
    folder = ROOT / "outputs" / "bench_async"
    results: dict[str, float] = {}
    with LocalRedis() as redis:
        if args.part in ("all", "split"):
            results.update(split_figures(args.steps, args.rounds, redis.url, folder))
        if args.part in ("all", "multiturn"):
            results.update(multiturn_figures(args.steps, args.rounds, redis.url, folder))
    ray.shutdown()
    for name, value in results.items():
        print(f"RESULT {name} {value:.3f}")


if __name__ == "__main__":
    main()
