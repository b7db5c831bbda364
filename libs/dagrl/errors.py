"""The exception root of the `dagrl` package.

Every error that `dagrl` raises on purpose derives from `DagrlError`, so callers can
catch one type. Each module defines its own subclasses here, in one place, so that the
gRPC boundary (`dagrl.rpc.status`) can map them to status codes without importing
half the package.
"""

from __future__ import annotations

from typing import Any


class DagrlError(Exception):
    """Root of every error dagrl raises on purpose.

    Every one pickles whatever its constructor takes (`__reduce__`): a rank's error crosses
    to the driver through Ray, and one that did not unpickle (a keyword-only argument) reached
    the driver as Ray's `UnserializableException` instead of the error it was.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type[DagrlError], args: tuple[Any, ...],
             state: dict[str, Any]) -> DagrlError:
    """A pickled DagrlError as it was, without calling its constructor again."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


# Categories: each maps to one gRPC status code in `dagrl.rpc.status`. Concrete errors
# derive from the category that says what the caller should do about them.


class InvalidInputError(DagrlError):
    """The caller's input is wrong (INVALID_ARGUMENT): fix it and retry."""


class NotFoundError(DagrlError):
    """The named thing does not exist (NOT_FOUND)."""


class ResourceExhaustedError(DagrlError):
    """A quota or capacity limit is hit (RESOURCE_EXHAUSTED): free space or raise the limit."""


class UnauthenticatedError(DagrlError):
    """The call lacks valid credentials (UNAUTHENTICATED)."""


class UnavailableError(DagrlError):
    """A dependency (Redis, Ray, a service) cannot be reached (UNAVAILABLE): retry later."""


class FailedPreconditionError(DagrlError):
    """The request is valid but the system is not in a state to do it (FAILED_PRECONDITION)."""


class ConfigError(InvalidInputError):
    """A job or service configuration is wrong; `problems` lists every issue found."""

    def __init__(self, problems: list[str] | str, *, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} configuration problem(s){where}:\n{lines}")


class YamlInputError(InvalidInputError):
    """YAML text is malformed or over `dagrl.safe_yaml`'s limits (aliases, depth, size)."""


class WorkflowError(InvalidInputError):
    """A workflow DAG is malformed: bad YAML, unknown key, cycle, bad reference."""


class BatchError(InvalidInputError):
    """A Batch operation got inconsistent input (mismatched rows, unknown column)."""


class BatchFieldError(BatchError):
    """A node's input carries a built-in field otherwise than `dagrl.batch.schema` declares it
    (another dtype or number of dims, a column for a tensor): `dagrl.batch.views`."""


class MissingFieldError(BatchFieldError):
    """A node's input lacks a built-in field the node reads, or its output one its kind adds;
    the message names the node, the field, what the batch carries and which node adds it."""


class BatchDecodeError(BatchError):
    """Bytes could not be decoded as a Batch: truncated, corrupt or a foreign format."""


class DatasetError(InvalidInputError):
    """A dataset file is missing, unreadable or lacks a required column."""


class RewardError(InvalidInputError):
    """A reward function could not be resolved or returned an invalid score (the job's reward
    code or its dataset's ground truth is wrong: INVALID_ARGUMENT, not a dagrl bug)."""


class RefResolutionError(InvalidInputError):
    """A `module:attr` or `path/to/file.py:attr` reference does not resolve."""


class BindError(DagrlError):
    """A server cannot listen on its address: the port is in use or the host is not local."""


class LocalServerError(DagrlError):
    """A local helper process (e.g. a private redis-server) could not be started."""


class DataBufferError(DagrlError):
    """Root of the databuffer's errors (client library and service)."""


class DataBufferRequestError(DataBufferError, InvalidInputError):
    """A databuffer call got an invalid argument (bad name, rank out of range, ...)."""


class RedisUnavailableError(DataBufferError, UnavailableError):
    """Redis could not be reached after bounded retries; `url` names the server."""

    def __init__(self, message: str, *, url: str) -> None:
        self.url = url
        super().__init__(message)


class QuotaExceededError(DataBufferError, ResourceExhaustedError):
    """A write would exceed the job's byte quota or Redis's maxmemory; nothing was stored."""


class ShardNotReadyError(DataBufferError, NotFoundError):
    """Not every producer shard of an edge was written within the wait timeout."""


class ShardCorruptError(DataBufferError):
    """A stored shard is malformed (bad meta, missing chunk, undecodable bytes); `key` names it."""

    def __init__(self, message: str, *, key: str) -> None:
        self.key = key
        super().__init__(message)


class RunFolderBusyError(FailedPreconditionError):
    """Another live job or `dagrl run` holds the run folder's lock (`dagrl.run_lock`)."""


class CheckpointDamagedError(FailedPreconditionError):
    """A checkpoint file cannot be read (`dagrl_worker.rank.checkpoint_files`): the message names
    the file and how to resume without it."""


class CheckpointPlanError(FailedPreconditionError):
    """A checkpoint was saved under another plan (world size, a node's ranks or parallel
    layout) than the job resuming from it: its ranks' states would not fit
    (`dagrl_worker.rank.checkpoint.check_saved_plan`)."""


class RunReportError(NotFoundError):
    """`dagrl dashboard` found no metrics file in the folder it was given."""
