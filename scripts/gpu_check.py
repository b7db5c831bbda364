"""`make gpu-check`: dagrl's training path on one GPU, without Ray, Redis or the services.

Built for the GPU machine we can borrow (one H100/H200; Python 3.12 with torch, transformers,
grpcio and protobuf, but no Ray, no vLLM, no Redis, no openai and no network): plain `python3`
runs it from a checkout, taking dagrl's packages from the checkout itself (`sys.path`). The
packages it needs beyond that machine's (OpenTelemetry, google-re2, this venv's protobuf and
what they require: scripts/gpu_wheels.py) `make gpu-wheels` downloads into `.whl/` for
Python 3.12 (carried along, installed there with pip --target). What it imports is tested
against that machine's package list (tests/integration/test_gpu_check_imports.py).

It drives a DAGWorker directly, as the driver would, on the device `trainer.device` picks:
CUDA (`--mode cuda`, what `make gpu-check` passes: it fails without a CUDA device), or CPU
with small shapes (`--mode cpu`, the mode `make test` runs so that this script cannot rot).
It first prints one preflight line (torch, CUDA, the GPU and its free memory), then runs four
checks, each ending in RESULT lines. Every check runs whatever the ones before it did; a
figure off target, or a check that raised (its traceback printed), is a miss, and the script
ends naming each miss (exit 1):
1. demo: the demo's GRPO job (tiny model, 1 rank, assets built here) raises validation
   accuracy;
2. log-probs: one batch's log-probs on the device in fp32 equal the CPU's within 1e-4, and
   under bf16 autocast within BF16_LOG_PROB_TOLERANCE;
3. update: one policy update of a Qwen2.5-1.5B-shaped model (random init, bf16 mixed
   precision, FSDP2 on one rank, micro-batches of 8 x 1024 tokens) in each of
   `UPDATE_VARIANTS`, the update's switches one at a time (gradient checkpointing of every
   layer or every other, the fused log-prob, compiled layers) and all together: tokens/s,
   `perf/mfu/actor` and peak memory of each, and of the best (GPU target: MFU >= 0.40);
4. colocated: the same shape unsharded with `param_offload` and `optimizer_offload`: hf
   rollout -> offload -> update (weights back on the device first) -> offload and reload, the
   memory after each phase, and the parameters bit-equal over an offload round trip.

    python3 scripts/gpu_check.py [--mode cuda|cpu] [--assets DIR] [--checks update,colocated]
                                 [--min-mfu 0.40]
    python3 scripts/gpu_check.py --wheels     # the pinned wheels it needs carried
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.argv[1:] == ["--wheels"]:  # the pins (scripts/gpu_wheels.py), before any heavy import
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_wheels import pins

    print(" ".join(pins()))
    raise SystemExit(0)
_SOURCES = [str(ROOT / p) for p in ("libs", "services/databuffer/src", "services/worker/src")]
sys.path[:0] = _SOURCES
# child processes (the demo assets' portable-kernel build) import dagrl from here too
os.environ["PYTHONPATH"] = os.pathsep.join(
    [*_SOURCES, *filter(None, [os.environ.get("PYTHONPATH")])])
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import yaml  # noqa: E402

from dagrl import telemetry  # noqa: E402
from dagrl.config import (  # noqa: E402
    ActorConfig,
    ModelConfig,
    OptimConfig,
    RolloutCorrectionConfig,
)
from dagrl.models import build_char_tokenizer, load_model_and_tokenizer  # noqa: E402
from dagrl.models.demo import DemoRecipe, prepare_assets  # noqa: E402
from dagrl.workflow import load_workflow  # noqa: E402
from dagrl_worker.rank.builder import for_training  # noqa: E402
from dagrl_worker.rank.dag_worker import DAGWorker  # noqa: E402
from dagrl_worker.rank.device import Precision, RankDevice, rank_device  # noqa: E402
from dagrl_worker.rank.prompts import prompts_to_batch  # noqa: E402
from dagrl_worker.rank.rollout import HFRollout, SamplingParams  # noqa: E402
from dagrl_worker.rank.training.engine import EngineOptions, TrainEngine  # noqa: E402
from dagrl_worker.rank.training.forward import ForwardTarget, compute_log_probs  # noqa: E402
from dagrl_worker.rank.training.parallel import DataParallel  # noqa: E402
from dagrl_worker.rank.training.ppo import ActorUpdate, MiniBatchPlan, update_actor  # noqa: E402
from dagrl_worker.rank.training.token_budget import MicroBatching  # noqa: E402
from dagrl_worker.shared.metrics import MetricSink  # noqa: E402
from dagrl_worker.shared.plan_view import colocated_plan  # noqa: E402
from dagrl_worker.shared.spec import WorkerSpec  # noqa: E402

ACCURACY = "val/arith/accuracy"
FP32_LOG_PROB_TOLERANCE = 1e-4
# bf16 keeps 8 mantissa bits: the demo model's log-probs under bf16 autocast moved by up to
# ~0.03 from fp32 on CPU; a kernel bug moves them by whole nats
BF16_LOG_PROB_TOLERANCE = 0.1
GPU_MFU_TARGET = 0.40
CHECKS = ("demo", "log-probs", "update", "colocated")


@dataclass(frozen=True)
class UpdateVariant:
    """One way to run the big update (`model.*` switches), timed beside the others."""

    name: str
    checkpoint_every: int = 1  # model.gradient_checkpointing_every; 0: no checkpointing
    fused_log_probs: bool = False  # model.log_prob_impl: liger where installed, else chunked
    compile_layers: bool = False  # model.compile_layers (GPU only: inductor on CPU is slow)

    def model(self) -> ModelConfig:
        return ModelConfig(gradient_checkpointing=self.checkpoint_every > 0,
                           gradient_checkpointing_every=max(1, self.checkpoint_every),
                           compile_layers=self.compile_layers)


UPDATE_VARIANTS = (
    UpdateVariant("checkpoint_every_layer"),
    UpdateVariant("checkpoint_every_other_layer", checkpoint_every=2),
    UpdateVariant("fused_log_probs", fused_log_probs=True),
    UpdateVariant("compiled_layers", compile_layers=True),
    UpdateVariant("all_switches", checkpoint_every=2, fused_log_probs=True, compile_layers=True),
)


@dataclass(frozen=True)
class Shapes:
    demo_steps: int
    min_accuracy_gain: float  # validation accuracy points the demo job must add
    hidden: int  # the update model (Qwen2.5-1.5B on GPU)
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rows_per_micro_batch: int
    tokens_per_row: int
    micro_batches: int  # per update (one optimizer step)


GPU_SHAPES = Shapes(demo_steps=100, min_accuracy_gain=0.20, hidden=1536, layers=28, heads=12,
                    kv_heads=2, intermediate=8960, vocab=151936, rows_per_micro_batch=8,
                    tokens_per_row=1024, micro_batches=4)
CPU_SHAPES = Shapes(demo_steps=30, min_accuracy_gain=0.05, hidden=64, layers=2, heads=4,
                    kv_heads=2, intermediate=128, vocab=512, rows_per_micro_batch=2,
                    tokens_per_row=64, micro_batches=2)


def result(name: str, value: float) -> None:
    print(f"RESULT {name} {value:.6g}", flush=True)


def missed(ok: bool, message: str) -> list[str]:
    """A check's miss: `message` where `ok` is false."""
    return [] if ok else [message]


@dataclass
class CheckRunner:
    """Runs every check to its end, whatever the ones before it did. A check returns its
    misses; one that raises is a miss too (its traceback printed). `tidy` runs after each."""

    tidy: Callable[[], None] = lambda: None
    misses: list[str] = field(default_factory=list)

    def run(self, name: str, check: Callable[..., list[str]], *args: Any) -> bool:
        """Whether `check(*args)` ran without a miss."""
        print(f"gpu-check: {name}", flush=True)
        try:
            found = check(*args)
        except Exception as exc:  # reported below; the next checks still run
            traceback.print_exc()
            found = [f"raised {type(exc).__name__}: {exc}"]
        finally:
            self.tidy()
        for message in found:
            self.miss(name, message)
        return not found

    def miss(self, name: str, message: str) -> None:
        print(f"gpu-check: MISSED: {name}: {message}", file=sys.stderr, flush=True)
        self.misses.append(f"{name}: {message}")

    def exit_status(self) -> int:
        if not self.misses:
            print("gpu-check: all checks passed", flush=True)
            return 0
        print(f"gpu-check: FAILED: {len(self.misses)} missed", file=sys.stderr, flush=True)
        for message in self.misses:
            print(f"  {message}", file=sys.stderr, flush=True)
        return 1


def free_device_memory(device: RankDevice) -> None:
    """Collect what died in a reference cycle (the FSDP2 module and its hooks) before handing
    the allocator's free blocks back: `release_cache` alone would keep their memory."""
    gc.collect()
    device.release_cache()


# ------------------------------------------------------------------ 1. the demo job
def demo_job(device: RankDevice, shapes: Shapes, assets: Path, workdir: Path) -> list[str]:
    config = yaml.safe_load((ROOT / "examples" / "grpo_arith.yaml").read_text())
    config["data"]["train_files"] = [str(assets / "data" / "train.parquet")]
    config["data"]["val_files"] = [str(assets / "data" / "val.parquet")]
    config["actor_rollout_ref"]["model"]["path"] = str(assets / "model")
    config["trainer"].update({
        "n_ranks_per_node": 1, "total_training_steps": shapes.demo_steps,
        "device": device.device.type, "resume_mode": "disable", "save_freq": -1,
        "test_freq": -1, "logger": []})
    config["services"] = {"tracing": False}
    plan = colocated_plan(load_workflow("grpo"), world_size=1)
    spec = WorkerSpec("gpu-check", yaml.safe_dump(config), "", (), plan.SerializeToString(),
                      None, str(workdir / "demo"))
    worker = DAGWorker(spec, rank=0, has_gpu=device.is_cuda)
    worker.init_graph()
    started = time.perf_counter()
    before = worker.validate(0)[ACCURACY][1]
    for step in range(1, shapes.demo_steps + 1):
        worker.run_step(step)
    after = worker.validate(shapes.demo_steps)[ACCURACY][1]
    seconds = time.perf_counter() - started
    print(f"demo: validation accuracy {before:.1%} -> {after:.1%} in {shapes.demo_steps} steps "
          f"({seconds:.0f} s)", flush=True)
    result("demo_val_accuracy_before", before)
    result("demo_val_accuracy_after", after)
    result("demo_seconds", seconds)
    return missed(after - before >= shapes.min_accuracy_gain,
                  f"the demo job moved validation accuracy {before:.3f} -> {after:.3f}, less "
                  f"than {shapes.min_accuracy_gain:.2f}")


# ------------------------------------------------------------------ 2. log-prob parity
def log_prob_parity(device: RankDevice, assets: Path) -> list[str]:
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(assets / "model")
    model.eval()
    texts = ["12+34=", "7+8=", "40+51=", "3+6=", "25+13=", "60+22="]
    rows = {"prompt_ids": [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts],
            "index": list(range(len(texts)))}
    batch = HFRollout(model, tokenizer).generate(prompts_to_batch(rows, tokenizer.pad_token_id,
                                                                  "lp"),
                                                 SamplingParams(n=4, max_new_tokens=8))
    micro = MicroBatching(64)
    on_cpu = compute_log_probs(model, batch, micro, 1.0)
    moved = model.to(device.device)
    fp32 = compute_log_probs(ForwardTarget(moved, device.device), batch, micro, 1.0)
    bf16 = Precision(torch.bfloat16)
    mixed = compute_log_probs(
        ForwardTarget(moved, device.device, lambda: bf16.autocast(device.device)), batch, micro,
        1.0)
    mask = batch.tensors["response_mask"].bool()
    fp32_gap = float((fp32 - on_cpu)[mask].abs().max())
    bf16_gap = float((mixed - on_cpu)[mask].abs().max())
    print(f"log-probs on {device.device} vs CPU: fp32 {fp32_gap:.2e}, bf16 {bf16_gap:.2e} "
          f"({int(mask.sum())} tokens)", flush=True)
    result("logprob_fp32_max_abs_diff", fp32_gap)
    result("logprob_bf16_max_abs_diff", bf16_gap)
    return [*missed(fp32_gap <= FP32_LOG_PROB_TOLERANCE,
                    f"fp32 log-probs differ by {fp32_gap:.2e}"),
            *missed(bf16_gap <= BF16_LOG_PROB_TOLERANCE,
                    f"bf16 log-probs differ by {bf16_gap:.2e}")]


# ------------------------------------------------------------------ 3. + 4. the big update
def update_engine(device: RankDevice, shapes: Shapes, colocated: bool,
                  variant: UpdateVariant = UPDATE_VARIANTS[0]) -> TrainEngine:
    """A Qwen2-architecture model of `shapes` (random init, fp32 master weights), bf16 mixed
    precision, `variant`'s switches (`builder.for_training`, as a job's model gets them):
    FSDP2 on a one-rank group (the speed check), or unwrapped with its parameters and
    optimizer state offloaded between phases (the colocated sequence: `TrainEngine.offload`)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=shapes.vocab, hidden_size=shapes.hidden,
                         num_hidden_layers=shapes.layers, num_attention_heads=shapes.heads,
                         num_key_value_heads=shapes.kv_heads,
                         intermediate_size=shapes.intermediate, tie_word_embeddings=True,
                         max_position_embeddings=4096)
    torch.manual_seed(0)
    with device.device:
        module = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                  attn_implementation="sdpa")
    module = for_training(module, variant.model())
    if not dist.is_initialized():  # its rendezvous: a store on a free loopback port, no file
        store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True)
        dist.init_process_group(device.backend, store=store, rank=0, world_size=1)
    if colocated:
        options = EngineOptions("ddp", Precision(torch.bfloat16), param_offload=True,
                                optimizer_offload=True)
        return TrainEngine(module, OptimConfig(lr=1e-5), 100, DataParallel(), options)
    options = EngineOptions("fsdp", Precision(torch.bfloat16))
    return TrainEngine(module, OptimConfig(lr=1e-5), total_steps=100,
                       dp=DataParallel(dist.group.WORLD, 0, 1), options=options)


def update_rows(shapes: Shapes):
    """Rows of random tokens: half prompt, half response, all attended."""
    from dagrl.batch import Batch

    count = shapes.rows_per_micro_batch * shapes.micro_batches
    half = shapes.tokens_per_row // 2
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shapes.vocab, (count, 2 * half), generator=generator)
    ones = torch.ones(count, half, dtype=torch.long)
    return Batch(tensors={
        "prompts": ids[:, :half], "responses": ids[:, half:], "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(2 * half).repeat(count, 1),
        "response_mask": ones, "advantages": torch.randn(count, half, generator=generator)})


def fused_log_prob_impl(device: RankDevice) -> str:
    """liger-kernel's fused linear log-prob on a GPU where it is installed, else the chunked
    one (`training.token_log_probs`)."""
    import importlib.util

    has_liger = importlib.util.find_spec("liger_kernel") is not None
    return "liger" if device.is_cuda and has_liger else "chunked"


def timed_update(engine: TrainEngine, shapes: Shapes, device: RankDevice,
                 log_prob_impl: str = "logits") -> MetricSink:
    sink = MetricSink()
    update = ActorUpdate(ActorConfig(use_kl_loss=False), RolloutCorrectionConfig(), 1.0,
                         log_prob_impl=log_prob_impl)  # type: ignore[arg-type]
    plan = MiniBatchPlan(1, MicroBatching(shapes.rows_per_micro_batch), 1)
    update_actor(engine, update_rows(shapes), update, plan, sink)
    if device.is_cuda:
        torch.cuda.synchronize(device.device)
    return sink


@dataclass(frozen=True)
class UpdateFigures:
    tokens_per_s: float
    mfu: float
    peak_memory_gb: float


def time_variant(device: RankDevice, shapes: Shapes, variant: UpdateVariant
                 ) -> tuple[UpdateFigures, list[str]]:
    """One variant's second update (the first warms the allocator, kernels, compiled code
    and optimizer state); its misses (parameters that are not fp32 master weights)."""
    engine = update_engine(device, shapes, colocated=False, variant=variant)
    impl = fused_log_prob_impl(device) if variant.fused_log_probs else "logits"
    timed_update(engine, shapes, device, impl)
    device.memory_gb()  # resets the peaks
    started = time.perf_counter()
    sink = timed_update(engine, shapes, device, impl)
    seconds = time.perf_counter() - started
    tokens = shapes.rows_per_micro_batch * shapes.micro_batches * shapes.tokens_per_row
    figures = UpdateFigures(tokens / seconds, sink.value(telemetry.KEY_MFU_ACTOR),
                            device.memory_gb()[0])
    params = sum(p.numel() for p in engine.inner.parameters())
    print(f"update ({variant.name}, log-probs {impl}): {params / 1e9:.2f} B parameters, "
          f"{tokens} tokens in {seconds:.2f} s, MFU {figures.mfu:.3f}, peak "
          f"{figures.peak_memory_gb:.1f} GiB", flush=True)
    return figures, missed(all(p.dtype == torch.float32 for p in engine.inner.parameters()),
                           f"{variant.name}: mixed precision left parameters that are not "
                           "fp32 master weights")


def update_speed(device: RankDevice, shapes: Shapes, min_mfu: float | None) -> list[str]:
    """Every variant (compiled ones on CUDA only), each freed before the next; the best's
    MFU is the check's."""
    misses: list[str] = []
    measured: dict[str, UpdateFigures] = {}
    for variant in UPDATE_VARIANTS:
        if variant.compile_layers and not device.is_cuda:
            print(f"update ({variant.name}): skipped on CPU (inductor compiles C++ for "
                  "minutes here; tests/ cover compiled layers' gradients)", flush=True)
            continue
        try:
            figures, found = time_variant(device, shapes, variant)
        except Exception as exc:  # a variant that fails is a miss; the others still run
            traceback.print_exc()
            misses.append(f"{variant.name} raised {type(exc).__name__}: {exc}")
            continue
        finally:
            free_device_memory(device)
        misses.extend(found)
        measured[variant.name] = figures
        result(f"update_tokens_per_s_{variant.name}", figures.tokens_per_s)
        result(f"update_mfu_{variant.name}", figures.mfu)
        result(f"update_peak_memory_gb_{variant.name}", figures.peak_memory_gb)
    if not measured:
        return misses
    best = max(measured, key=lambda name: measured[name].mfu)
    print(f"update: the best variant is {best}", flush=True)
    result("update_tokens_per_s", measured[best].tokens_per_s)
    result("update_mfu", measured[best].mfu)
    result("update_peak_memory_gb", measured[best].peak_memory_gb)
    mfu = measured[best].mfu
    return [*misses, *missed(min_mfu is None or mfu >= min_mfu,
                             f"MFU {mfu:.3f} < {min_mfu} (best variant: {best})")]


def host_parameters(engine: TrainEngine) -> dict[str, torch.Tensor]:
    """Every parameter, unsharded, copied to the host."""
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
            for name, p in engine.inner.named_parameters()}


def colocated_sequence(device: RankDevice, shapes: Shapes) -> list[str]:
    """rollout (hf, the actor's own module) -> offload -> update -> reload: memory after each
    phase; an offload round trip leaves every parameter bit-equal."""
    engine = update_engine(device, shapes, colocated=True)
    tokenizer = build_char_tokenizer()
    rows = {"prompt_ids": [[5 + i, 6 + i, 7 + i] for i in range(16)], "index": list(range(16))}
    prompts = prompts_to_batch(rows, tokenizer.pad_token_id, "co")
    memory: dict[str, float] = {}

    def mark(phase: str) -> None:
        gc.collect()  # what a phase left in reference cycles is not its memory
        allocated = torch.cuda.memory_allocated(device.device) / 2**30 if device.is_cuda else 0
        memory[phase] = allocated
        result(f"colocated_{phase}_allocated_gb", allocated)

    engine.ensure_on_device()
    with engine.compute():
        HFRollout(engine.inner, tokenizer).generate(prompts, SamplingParams(n=4,
                                                                            max_new_tokens=32))
    mark("rollout")
    before = host_parameters(engine)
    engine.offload()
    free_device_memory(device)
    mark("offloaded")
    timed_update(engine, shapes, device)  # brings the weights back first (`compute`)
    mark("update")
    engine.offload()
    engine.ensure_on_device()
    mark("reloaded")
    changed = host_parameters(engine)
    moved = any(not torch.equal(before[name], changed[name]) for name in before)
    engine.offload()
    engine.ensure_on_device()
    after = host_parameters(engine)
    equal = all(torch.equal(changed[name], after[name]) for name in changed)
    result("offload_reload_bit_equal", float(equal))
    return [*missed(moved, "the update after the reload did not change the parameters"),
            *missed(equal, "parameters changed over an offload round trip"),
            *missed(not device.is_cuda or memory["offloaded"] < 0.5 * memory["rollout"],
                    f"offloading freed too little: {memory}")]


def preflight() -> str:
    """Python, torch, the CUDA torch was built for, the GPU and its free memory."""
    line = (f"gpu-check: python {platform.python_version()}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda or 'none (a CPU-only torch)'}")
    if not torch.cuda.is_available():
        return f"{line}, no CUDA device"
    free, total = torch.cuda.mem_get_info()
    return (f"{line}, {torch.cuda.get_device_name()} x{torch.cuda.device_count()}, "
            f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mode", choices=("cuda", "cpu"), default=None,
                        help="cuda (fails without a CUDA device; `make gpu-check`) or cpu "
                             "(small shapes); default: cuda where a GPU is visible, else cpu")
    parser.add_argument("--assets", type=Path, default=None,
                        help="the demo assets (built when missing; default: a temp folder)")
    parser.add_argument("--checks", default=",".join(CHECKS),
                        help=f"which checks to run, comma-separated (default: all: "
                             f"{','.join(CHECKS)})")
    parser.add_argument("--min-mfu", type=float, default=None,
                        help=f"the update's MFU target (default: {GPU_MFU_TARGET} on CUDA, "
                             "none on CPU)")
    args = parser.parse_args()
    args.checks = [name.strip() for name in args.checks.split(",") if name.strip()]
    unknown = sorted(set(args.checks) - set(CHECKS))
    if unknown:
        parser.error(f"--checks names {unknown}; the checks are {', '.join(CHECKS)}")
    return args


def main() -> int:
    args = parse_args()
    print(preflight(), flush=True)
    if args.mode == "cuda" and not torch.cuda.is_available():
        print("gpu-check: FAILED: --mode cuda, but torch sees no CUDA device (see the line "
              "above); run it on the GPU machine, or pass --mode cpu for the small CPU run",
              file=sys.stderr, flush=True)
        return 2
    device = rank_device(args.mode or "auto")
    shapes = GPU_SHAPES if device.is_cuda else CPU_SHAPES
    default_mfu = GPU_MFU_TARGET if device.is_cuda else None  # a CPU has no MFU to reach
    min_mfu = args.min_mfu if args.min_mfu is not None else default_mfu
    name = torch.cuda.get_device_name(device.device) if device.is_cuda else "CPU (small shapes)"
    print(f"gpu-check on {name}: {', '.join(args.checks)}", flush=True)
    result("gpu_check_cuda", float(device.is_cuda))
    runner = CheckRunner(tidy=lambda: free_device_memory(device))
    with tempfile.TemporaryDirectory(prefix="dagrl-gpu-check-") as folder:
        workdir = Path(folder)
        assets = args.assets or workdir / "assets"
        on_assets = [check for check in ("demo", "log-probs") if check in args.checks]
        if on_assets and not runner.run("assets", build_assets, assets):
            for check in on_assets:
                runner.miss(check, "not run: the demo assets did not build")
            on_assets = []
        if "demo" in on_assets:
            runner.run("demo", demo_job, device, shapes, assets, workdir)
        if "log-probs" in on_assets:
            runner.run("log-probs", log_prob_parity, device, assets)
        if "update" in args.checks:
            runner.run("update", update_speed, device, shapes, min_mfu)
        if "colocated" in args.checks:
            runner.run("colocated", colocated_sequence, device, shapes)
    return runner.exit_status()


def build_assets(assets: Path) -> list[str]:
    prepare_assets(assets, DemoRecipe.for_tests())
    return []


if __name__ == "__main__":
    raise SystemExit(main())
