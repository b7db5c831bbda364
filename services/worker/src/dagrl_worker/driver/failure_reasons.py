"""A job's failure reason from the exception that ended it: the message that says what is wrong,
in dagrl's terms.

`dagrl status` shows one line per failed job, so the reason is the original exception (the
`cause` Ray carries across from the rank, else the last exception block of the traceback Ray
sends), all its lines joined, less the lines that only point elsewhere (pydantic's "For further
information visit ..." was once the whole reason). Engine messages name engine settings and
environment variables a dagrl user never sets: `ENGINE_TERMS` rewrites them to the config keys
that set them (`VLLM_CPU_KVCACHE_SPACE` is `actor_rollout_ref.rollout.cpu_kv_cache_gb`).
The reason is logged as well as stored, so a URL in it loses its password and query string.
"""

from __future__ import annotations

import re

from ray.exceptions import RayError

from dagrl.urls import redact_urls

MAX_REASON_CHARS = 500
_NOISE = re.compile(r"For further information visit https?://\S+|See https?://\S+ for more "
                    r"details\.?")
# a traceback's exception line: `module.Name: message` at the start of a line
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*: ", re.MULTILINE)
_ROLLOUT = "actor_rollout_ref.rollout"
# (what vLLM writes, what a dagrl user sets instead)
ENGINE_TERMS = (
    ("Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE,",
     f"Decrease {_ROLLOUT}.cpu_kv_cache_gb"),
    ("VLLM_CPU_KVCACHE_SPACE", f"{_ROLLOUT}.cpu_kv_cache_gb"),
    ("`gpu_memory_utilization` (which also controls CPU memory on the CPU backend)",
     f"{_ROLLOUT}.gpu_memory_utilization (on CPU: {_ROLLOUT}.cpu_kv_cache_gb)"),
    ("`max_model_len` when initializing the engine", f"{_ROLLOUT}.max_model_len"),
    ("User-specified max_model_len", f"{_ROLLOUT}.max_model_len"),
    ("`max_num_batched_tokens`", f"{_ROLLOUT}.max_num_batched_tokens"),
)


def failure_reason(exc: BaseException) -> str:
    """One line that says what went wrong (module docstring), at most MAX_REASON_CHARS."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, RayError):
        text = f"{type(cause).__name__}: {cause}"
    elif isinstance(exc, RayError):  # Ray's text: a traceback from the rank
        text = _last_exception(str(exc))
    else:
        text = f"{type(exc).__name__}: {exc}"
    lines = (_NOISE.sub("", line).strip() for line in text.splitlines())
    reason = " ".join(line for line in lines if line) or type(exc).__name__
    return redact_urls(in_dagrl_terms(reason))[:MAX_REASON_CHARS]


def in_dagrl_terms(text: str) -> str:
    """`text` with the engine settings it names replaced by dagrl's keys."""
    for engine, dagrl in ENGINE_TERMS:
        text = text.replace(engine, dagrl)
    return text


def _last_exception(traceback_text: str) -> str:
    """From the last `Name: message` line of a traceback to its end (the message may span
    lines); the whole text when there is none."""
    starts = [match.start() for match in _EXCEPTION_LINE.finditer(traceback_text)]
    return traceback_text[starts[-1]:] if starts else traceback_text
