"""A job's failure reason says what is wrong, in dagrl's keys (issue 27, item 6): not the last
line of a traceback (for vLLM's settings that was pydantic's "For further information visit
...") and not the engine's environment variables."""

from __future__ import annotations

import pydantic
import pytest
from ray.exceptions import RayError, RayTaskError

from dagrl_worker.driver.failure_reasons import failure_reason

TOO_LONG = ("User-specified max_model_len (4096) is greater than the derived max_model_len "
            "(max_position_embeddings=256 or model_max_length=None in model's config.json).")
KV_CACHE = ("Available memory on node 0 (0.5/23.0 GiB) on kv cache allocation is less than "
            "requested memory for kv (64.0 GiB). Decrease --kv-cache-memory-bytes, "
            "VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.")


class EngineSettings(pydantic.BaseModel):
    max_model_len: int

    @pydantic.field_validator("max_model_len")
    @classmethod
    def fits(cls, value: int) -> int:
        raise ValueError(TOO_LONG)


def pydantic_error() -> pydantic.ValidationError:
    with pytest.raises(pydantic.ValidationError) as caught:
        EngineSettings(max_model_len=4096)
    return caught.value


def from_a_rank(cause: BaseException) -> RayTaskError:
    """What the driver catches when a rank's `execute` raised `cause`."""
    traceback_text = (f"Traceback (most recent call last):\n  File \"vllm_engine.py\", line 105, "
                      f"in __init__\n{type(cause).__module__}.{type(cause).__name__}: {cause}")
    return RayTaskError("execute", traceback_text, cause, proctitle="ray::DAGWorkerActor",
                        pid=1, ip="127.0.0.1")


def test_a_pydantic_error_reads_as_its_message_not_its_link() -> None:
    error = pydantic_error()
    assert str(error).strip().splitlines()[-1].strip().startswith("For further information")
    reason = failure_reason(from_a_rank(error))
    assert "For further information" not in reason
    assert "actor_rollout_ref.rollout.max_model_len (4096) is greater than the derived" in reason


def test_a_cause_ray_could_not_carry_is_read_from_the_traceback() -> None:
    error = pydantic_error()
    traceback_text = (f"Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                      f"pydantic_core._pydantic_core.ValidationError: {error}")
    lost = RayTaskError("execute", traceback_text, RayError("isn't serializable"),
                        proctitle="ray::DAGWorkerActor", pid=1, ip="127.0.0.1")
    reason = failure_reason(lost)
    assert reason.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation error")
    assert "is greater than the derived" in reason and "For further information" not in reason


def test_engine_settings_are_named_by_dagrl_keys() -> None:
    reason = failure_reason(from_a_rank(ValueError(KV_CACHE)))
    assert "VLLM_CPU_KVCACHE_SPACE" not in reason
    assert "Decrease actor_rollout_ref.rollout.cpu_kv_cache_gb or reduce CPU memory" in reason
    assert reason.startswith("ValueError: Available memory on node 0")


def test_a_multi_line_message_is_kept_whole_on_one_line() -> None:
    reason = failure_reason(ValueError("2 problems:\n  - first\n  - second"))
    assert reason == "ValueError: 2 problems: - first - second"


def test_a_url_in_a_reason_loses_its_secrets() -> None:
    """The driver logs the reason (its log is 0644) before the store redacts it again."""
    reason = failure_reason(from_a_rank(OSError("cannot open http://u:pw@h:1/x?key=K3Y")))
    assert reason == "OSError: cannot open http://u:***@h:1/x?***"
