"""Redis key schema of the databuffer: every key pattern lives here and nowhere else.

All keys of one job share the hash tag `{job}`, so a Redis Cluster keeps a job on one slot
and the multi-key Lua scripts stay valid there.

    dagrl:{job}:usage                                hash  "<step>:<edge>:r<rank>" -> bytes
    dagrl:{job}:<step>:keys                          set   every key the step wrote
    dagrl:{job}:<step>:<edge>:producers              str   producer dp size of the edge
    dagrl:{job}:<step>:<edge>:readers                hash  reader -> readers (dp x replicas)
    dagrl:{job}:<step>:<edge>:r<rank>:meta           str   JSON ShardMeta, written last
    dagrl:{job}:<step>:<edge>:r<rank>:w<write>:c<i>  str   chunk i of one write of a shard

    dagrl:{job}:handoff:<round>:open:r<rank>         list  group ids rank r offers its peers
    dagrl:{job}:handoff:<round>:work                 hash  group id -> its samples, offered
    dagrl:{job}:handoff:<round>:done                 hash  group id -> its samples, finished
    dagrl:{job}:handoff:<round>:finished             set   ranks whose own groups are complete
    dagrl:{job}:handoff:<round>:claims               hash  claim token -> the group it took

The usage hash is the per-job quota ledger; the step set is what DeleteStep removes; the
write id in chunk keys lets a re-put of a shard write new chunks next to the old ones and
switch over by replacing the meta.

Where a shard lives: a buffer can be several Redis instances, one per machine of the job
(`services.databuffer_per_machine`, `services.databuffer_urls`), numbered by the plan's
machine order (its `node_rank`). Every key of producer rank r's shard (meta and chunks), and
that instance's own copy of the edge's `producers`, `readers`, step index and usage entry,
lives on the instance of the machine that ran rank r: its `home`. A consumer computes the
home of each producer rank from the same plan (`dagrl_worker.shared.plan_view.PlanView.machine_of`),
reads the metas and the blocks it needs from there, and records its read on every instance
holding a shard of the edge, so each instance empties itself when its last consumer has read.
With one instance every home is 0.

The handoff keys hold what the rollout ranks of one node pass each other while one of them
rebuilds a lost engine (`handoff`); they are in no step index and expire an hour after
their last write (`HANDOFF_TTL_S`).

A job's data can live under derived job names (`attempt_namespace`, `validation_namespace`):
a run restarted after a failure, and each validation pass, use names of their own, so they
never read shards or reader counts that another attempt or a training step left. Each name
has its own quota ledger and its own steps (Stats and DeleteStep take the derived name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dagrl.errors import DataBufferRequestError

PREFIX = "dagrl"
MAX_NAME_CHARS = 128
MAX_DP_SIZE = 1 << 16
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/>]*")
HANDOFF_TTL_S = 3600
USAGE_SCAN_PATTERN = f"{PREFIX}:{{*}}:usage"


def attempt_namespace(job: str, attempt: int) -> str:
    """The job name run attempt `attempt` stores its shards under: `<job>`, then `<job>.r<n>`
    for the n-th restart after a failure."""
    return job if attempt == 0 else f"{job}.r{attempt}"


def validation_namespace(job: str, step: int) -> str:
    """The job name of the validation pass after training step `step` of `job` (a name
    `attempt_namespace` made): `<job>.val<step>`."""
    return f"{job}.val{step}"


def check_name(kind: str, value: str) -> str:
    """A job or edge name, checked: letters, digits and `_.-/>`, at most 128 characters."""
    if not isinstance(value, str) or not value:
        raise DataBufferRequestError(f"{kind} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME_CHARS or not _NAME.fullmatch(value):
        raise DataBufferRequestError(
            f"{kind} {value[:40]!r} is not a valid name: use 1-{MAX_NAME_CHARS} letters, digits "
            "and `_.-/>`, starting with a letter or digit (no `:`, braces or spaces)"
        )
    return value


def check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise DataBufferRequestError(f"step must be an integer >= 0, got {step!r}")
    return step


def check_rank(kind: str, rank: int, size: int) -> None:
    """`rank` of `size` (dp rank of dp size), checked."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_DP_SIZE:
        raise DataBufferRequestError(f"{kind} size must be in 1..{MAX_DP_SIZE}, got {size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise DataBufferRequestError(
            f"{kind} rank must be in 0..{size - 1} for a {kind} size of {size}, got {rank!r}"
        )


def job_prefix(job: str) -> str:
    return f"{PREFIX}:{{{check_name('job', job)}}}"


def job_usage(job: str) -> str:
    return f"{job_prefix(job)}:usage"


def job_from_usage_key(key: str) -> str | None:
    """The job of a `dagrl:{job}:usage` key (from a SCAN), or None for other keys."""
    head, brace, rest = key.partition(":{")
    if head != PREFIX or not brace or not rest.endswith("}:usage"):
        return None
    return rest[: -len("}:usage")]


def step_index(job: str, step: int) -> str:
    return f"{job_prefix(job)}:{check_step(step)}:keys"


@dataclass(frozen=True)
class EdgeKeys:
    """Key names of one edge of one step of one job (names checked on construction)."""

    job: str
    step: int
    edge: str

    def __post_init__(self) -> None:
        check_name("job", self.job)
        check_step(self.step)
        check_name("edge", self.edge)

    @property
    def base(self) -> str:
        return f"{job_prefix(self.job)}:{self.step}:{self.edge}"

    @property
    def usage(self) -> str:
        return job_usage(self.job)

    @property
    def step_index(self) -> str:
        return step_index(self.job, self.step)

    @property
    def producers(self) -> str:
        return f"{self.base}:producers"

    @property
    def readers(self) -> str:
        return f"{self.base}:readers"

    def meta(self, rank: int) -> str:
        return f"{self.base}:r{rank}:meta"

    def chunk(self, rank: int, write_id: str, index: int) -> str:
        return f"{self.base}:r{rank}:w{write_id}:c{index}"

    def usage_field(self, rank: int) -> str:
        """The shard's field in the job's usage hash."""
        return f"{self.step}:{self.edge}:r{rank}"


def parse_meta_key(job: str, step: int, key: str) -> tuple[str, int] | None:
    """(edge, producer rank) of a shard meta key of this job and step, or None."""
    head = f"{job_prefix(job)}:{step}:"
    if not key.startswith(head) or not key.endswith(":meta"):
        return None
    edge, _, rank = key[len(head):-len(":meta")].rpartition(":r")
    return (edge, int(rank)) if edge and rank.isdigit() else None


def step_usage_prefix(step: int) -> str:
    """Prefix of the usage-hash fields of one step (see `EdgeKeys.usage_field`)."""
    return f"{check_step(step)}:"


@dataclass(frozen=True)
class HandoffKeys:
    """Key names of one round of work handed between the rollout ranks of a node
    (`handoff.HandoffBoard`); `round` names the node and the rollout call."""

    job: str
    round: str

    def __post_init__(self) -> None:
        check_name("job", self.job)
        check_name("handoff round", self.round)

    @property
    def base(self) -> str:
        return f"{job_prefix(self.job)}:handoff:{self.round}"

    def open(self, rank: int) -> str:
        return f"{self.base}:open:r{rank}"

    @property
    def work(self) -> str:
        return f"{self.base}:work"

    @property
    def done(self) -> str:
        return f"{self.base}:done"

    @property
    def finished(self) -> str:
        return f"{self.base}:finished"

    @property
    def claims(self) -> str:
        """hash: claim token -> the group that claim took (a retried claim gets it again)."""
        return f"{self.base}:claims"
