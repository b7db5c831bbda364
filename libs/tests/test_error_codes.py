"""Bad algorithm or reward input is the caller's to fix: INVALID_ARGUMENT at the gRPC boundary
(`dagrl.rpc.status`, the one place errors become status codes), not INTERNAL."""

from __future__ import annotations

import grpc
import pytest
import torch

from dagrl.algorithms import AdvantageInputs, AlgorithmError, compute_advantage
from dagrl.errors import InvalidInputError, RewardError
from dagrl.rewards import compute_score
from dagrl.rpc.status import error_from_rpc, status_code_for


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _raised_by_the_libraries() -> list[Exception]:
    inputs = AdvantageInputs(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3))
    raised: list[Exception] = []
    with pytest.raises(AlgorithmError) as unknown:
        compute_advantage("grpo_typo", inputs)
    raised.append(unknown.value)
    with pytest.raises(AlgorithmError) as no_groups:
        compute_advantage("grpo", inputs)
    raised.append(no_groups.value)
    with pytest.raises(RewardError) as no_number:
        compute_score("arith", "the answer is 4", "four", None)  # a dataset bug
    raised.append(no_number.value)
    return raised


def test_algorithm_and_reward_errors_are_invalid_argument() -> None:
    for exc in _raised_by_the_libraries():
        assert status_code_for(exc) == grpc.StatusCode.INVALID_ARGUMENT, type(exc).__name__
        assert isinstance(exc, InvalidInputError)
        back = error_from_rpc(_Failed(status_code_for(exc), str(exc)))
        assert isinstance(back, InvalidInputError) and str(back) == str(exc)
