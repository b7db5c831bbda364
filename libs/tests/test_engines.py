"""Which rollout engines a machine can run, and the install hint when one is missing."""

import importlib.util

import pytest

from dagrl.engines import is_engine_installed, require_engine
from dagrl.errors import ConfigError


def test_hf_is_always_there() -> None:
    assert is_engine_installed("hf")
    require_engine("hf")


def test_a_missing_vllm_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    assert not is_engine_installed("vllm")
    with pytest.raises(ConfigError, match=r"rollout\.name is 'vllm'.*make install.*"
                                          r"DEVICE=cuda.*rollout\.name=hf"):
        require_engine("vllm")
