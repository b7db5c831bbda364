"""Every dagrl error survives pickling as itself: a rank's error reaches the driver through Ray,
and one that did not unpickle (a keyword-only constructor argument) arrived as Ray's
`UnserializableException`, which the driver did not know as a rank's failure."""

from __future__ import annotations

import inspect
import pickle

import pytest

from dagrl import errors
from dagrl.errors import ConfigError, DagrlError, RedisUnavailableError, ShardCorruptError

BUILT = {
    RedisUnavailableError: lambda: RedisUnavailableError("Redis at r:1 is unreachable",
                                                         url="redis://r:1/0"),
    ShardCorruptError: lambda: ShardCorruptError("bad meta", key="job:1:edge:0"),
    ConfigError: lambda: ConfigError(["a is wrong", "b is missing"], source="job.yaml"),
}
ERRORS = sorted((cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                 if issubclass(cls, DagrlError)), key=lambda cls: cls.__name__)


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_each_error_round_trips_pickle_with_its_message_and_fields(cls: type) -> None:
    error = BUILT[cls]() if cls in BUILT else cls("what went wrong")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert str(back) == str(error)
    assert vars(back) == vars(error)


def test_the_errors_built_with_keywords_are_among_those_checked() -> None:
    assert set(BUILT) <= set(ERRORS)
    assert pickle.loads(pickle.dumps(BUILT[RedisUnavailableError]())).url == "redis://r:1/0"
