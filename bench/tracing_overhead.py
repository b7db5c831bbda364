"""Tracing overhead: the same short job with tracing on and off, in one run. Target <= 1.03x.

"On" is what `dagrl run` does by default: `dagrl.telemetry.setup` with an OTLP endpoint, the
worker's span tree per step (step -> node/<id> -> phases, with token/byte/FLOP counts and
the metric instruments), exported with the stock exporters to a real metrics service
(`python -m dagrl_metrics`, a separate process as in `dagrl run`). "Off" is the same code
with `setup(..., endpoint=None)`: the no-op telemetry.

The job: until the worker's `dagrl run` is wired in, a GRPO-shaped step on the tiny model
(0.5 M parameters, NOTES.md): rollout = `generate`, reward, advantage, old/ref log-prob =
forward passes, actor_train = forward + backward + optimizer step, walked in the built-in
GRPO workflow's order with the spans the worker emits. Modes alternate (on, off, off, on,
...) so drift hits both; the ratio is median traced step time / median untraced step time.

    .venv/bin/python bench/tracing_overhead.py [--steps 5] [--rounds 4]

Ends with `RESULT tracing_overhead_ratio <r>`.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dagrl import telemetry
from dagrl.models.tiny import TinyModelSpec, build_tiny_model
from dagrl.models.tokenizer import build_char_tokenizer
from dagrl.telemetry import names
from dagrl.workflow import load_workflow

Phase = Callable[[str], AbstractContextManager[telemetry.SpanScope]]
PROMPTS, PROMPT_LEN, NEW_TOKENS = 64, 16, 32  # the tiny GRPO step NOTES.md measures


class TinyGrpoJob:
    """A GRPO-shaped step on the tiny model; each workflow node is one method."""

    def __init__(self, workdir: str) -> None:
        torch.manual_seed(0)
        tokenizer = build_char_tokenizer()
        self.model = build_tiny_model(TinyModelSpec(), tokenizer, workdir)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.prompts = torch.randint(5, len(tokenizer), (PROMPTS, PROMPT_LEN))  # [B, T]
        self.pad_id = tokenizer.pad_token_id
        self.sequences = self.prompts
        self.rewards = torch.zeros(PROMPTS)

    def rollout(self, phase: Phase) -> None:
        with phase(names.SPAN_ROLLOUT_GENERATE) as gen, torch.no_grad():
            self.model.eval()
            self.sequences = self.model.generate(  # type: ignore[operator]
                self.prompts, attention_mask=torch.ones_like(self.prompts), do_sample=True,
                max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=self.pad_id)
            gen.add_tokens(PROMPTS * NEW_TOKENS)
        with phase(names.SPAN_DATABUFFER_PUT) as put:
            put.add_bytes(self.sequences.numel() * self.sequences.element_size())

    def reward(self, phase: Phase) -> None:
        with phase(names.SPAN_REWARD_SCORE):
            self.rewards = (self.sequences[:, PROMPT_LEN:] % 7 == 0).float().mean(dim=1)

    def advantage(self, phase: Phase) -> None:
        self.rewards = (self.rewards - self.rewards.mean()) / (self.rewards.std() + 1e-6)

    def log_prob(self, phase: Phase) -> None:
        with phase(names.SPAN_LOG_PROB), torch.no_grad():
            self.model(self.sequences)

    def actor_train(self, phase: Phase) -> None:
        with phase(names.SPAN_ACTOR_FORWARD_BACKWARD) as fb:
            self.model.train()
            logits = self.model(self.sequences).logits[:, PROMPT_LEN - 1:-1]  # [B, T, V]
            logp = torch.log_softmax(logits, -1).gather(
                -1, self.sequences[:, PROMPT_LEN:, None])[..., 0]  # [B, T]
            loss = -(logp.mean(dim=1) * self.rewards).mean()
            loss.backward()
            fb.add_tokens(self.sequences.numel())
        with phase(names.SPAN_OPTIMIZER_STEP):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def run_steps(job: TinyGrpoJob, job_id: str, first_step: int, steps: int) -> list[float]:
    graph = load_workflow("grpo")
    handlers = {"rollout": job.rollout, "reward": job.reward, "advantage": job.advantage,
                "old_log_prob": job.log_prob, "ref_log_prob": job.log_prob,
                "actor_train": job.actor_train}
    times = []
    for step in range(first_step, first_step + steps):
        started = time.perf_counter()
        with telemetry.step_span(step, job_id) as step_scope:
            step_scope.add_tokens(PROMPTS * (PROMPT_LEN + NEW_TOKENS))
            for node_id in graph.topological_order():
                with telemetry.node_span(node_id, deps=graph[node_id].dependencies):
                    handlers[node_id](telemetry.phase_span)
            step_scope.record_metric(names.STEP_METRIC_REWARD_MEAN, float(job.rewards.mean()))
        times.append(time.perf_counter() - started)
    return times


def span_cost_us(repeats: int = 2000) -> float:
    """Microseconds one node span (with one phase span inside) costs under the active telemetry."""
    started = time.perf_counter()
    with telemetry.step_span(10**6, "span-cost"):
        for _ in range(repeats):
            with telemetry.node_span("x"), telemetry.phase_span(names.SPAN_REWARD_SCORE):
                pass
    return (time.perf_counter() - started) / repeats / 2 * 1e6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_metrics_service() -> tuple[subprocess.Popen[bytes], int]:
    otlp, query = free_port(), free_port()
    env = {**os.environ, "DAGRL_METRICS_OTLP_PORT": str(otlp),
           "DAGRL_METRICS_QUERY_PORT": str(query), "DAGRL_METRICS_HTTP_PORT": str(free_port())}
    process = subprocess.Popen([sys.executable, "-m", "dagrl_metrics"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with grpc.insecure_channel(f"127.0.0.1:{query}") as channel:
        health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True)
    return process, otlp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per round and mode")
    parser.add_argument("--rounds", type=int, default=4, help="on/off rounds (alternating)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    service, otlp_port = start_metrics_service()
    try:
        with tempfile.TemporaryDirectory() as workdir:
            job = TinyGrpoJob(workdir)
            run_steps(job, "warmup", 0, 2)  # first generate/backward allocate
            timings: dict[bool, list[float]] = {True: [], False: []}
            costs: dict[bool, float] = {}
            step = 0
            for round_index in range(args.rounds):
                order = (True, False) if round_index % 2 == 0 else (False, True)
                for traced in order:
                    endpoint = f"127.0.0.1:{otlp_port}" if traced else None
                    tel = telemetry.setup("dagrl-bench", "tracing-overhead", 0, endpoint)
                    timings[traced] += run_steps(job, "tracing-overhead", step, args.steps)
                    step += args.steps
                    if round_index == 0:
                        costs[traced] = span_cost_us()
                    tel.shutdown()
    finally:
        service.terminate()
        service.wait(timeout=10)
    on, off = statistics.median(timings[True]), statistics.median(timings[False])
    print(f"step time, median of {len(timings[True])} steps: traced {on * 1000:.1f} ms, "
          f"untraced {off * 1000:.1f} ms")
    spans_per_step = 1 + 2 * len(load_workflow("grpo").topological_order())
    print(f"one span: {costs[True]:.1f} us traced, {costs[False]:.1f} us untraced; about "
          f"{spans_per_step} spans per rank step -> "
          f"{spans_per_step * (costs[True] - costs[False]) / 1000:.2f} ms per step")
    print(f"RESULT tracing_overhead_ratio {on / off:.4f}")


if __name__ == "__main__":
    main()
