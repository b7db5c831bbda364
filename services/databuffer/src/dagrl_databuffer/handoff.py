"""Work handed between the rollout ranks of one node while one of them rebuilds its engine.

A rank whose engine process died offers its unfinished groups (a prompt's samples with the
tokens they have, as a Batch) on the board; any rank of the node claims one (an atomic pop:
each group is claimed once, by a peer or by its owner taking it back once its new engine
runs), generates it to the end and delivers it; the owner collects what was
delivered. A rank marks itself finished once its own groups are all complete, and its
peers keep serving offers until every rank of the node is finished (`finished`).

    board = HandoffBoard(store)
    board.offer(job, round, owner, {group_id: samples})
    claimed = board.claim(job, round, owner)         # (group id, samples) or None
    board.deliver(job, round, group_id, finished_samples)
    board.collect(job, round, [group_id, ...])       # {group id: samples} delivered so far
    board.finish(job, round, rank); board.finished(job, round)

A claim survives a lost reply: the store retries a call whose connection failed, and a
retried plain `LPOP` would take a second group while the first, popped for a reply that never
came, is lost (its owner waits for it until its timeout). Each claim carries a token of its
own and the pop records which group the token took (`CLAIM_LUA`, atomic), so the retry gets
the same group back.

Payloads go through the Batch codec (`dagrl.batch.codec`): nothing is unpickled. Keys are
`keys.HandoffKeys`; they expire `keys.HANDOFF_TTL_S` after their last write.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from typing import Any, cast

import redis

from dagrl.batch import Batch
from dagrl.batch.codec import decode, encode
from dagrl.errors import DataBufferError
from dagrl_databuffer.keys import HANDOFF_TTL_S, HandoffKeys
from dagrl_databuffer.store import RedisStore

# The group claim token ARGV[1] took (KEYS[2], hash token -> group), else the next one open on
# KEYS[1], recorded under the token. ARGV[2]: the TTL. Returns the group id or nil.
CLAIM_LUA = """
local taken = redis.call('HGET', KEYS[2], ARGV[1])
if taken then return taken end
local group = redis.call('LPOP', KEYS[1])
if not group then return nil end
redis.call('HSET', KEYS[2], ARGV[1], group)
redis.call('EXPIRE', KEYS[2], ARGV[2])
return group
"""


class HandoffBoard:
    """One Redis instance's board (a job's first instance: every rank of a node reaches it)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.claim_script = store.redis.register_script(CLAIM_LUA)

    def offer(self, job: str, round: str, owner: int, groups: Mapping[str, Batch]) -> None:
        """Offer `groups` (group id -> its samples) of rank `owner` to whoever claims them."""
        if not groups:
            return
        keys = HandoffKeys(job, round)
        payloads: dict[str | bytes, bytes] = {g: encode(batch) for g, batch in groups.items()}

        def write(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=True)
            pipe.hset(keys.work, mapping=cast(Any, payloads))  # the samples before their ids
            pipe.rpush(keys.open(owner), *payloads)
            for key in (keys.work, keys.open(owner)):
                pipe.expire(key, HANDOFF_TTL_S)
            pipe.execute()

        self.store.call(f"offer {len(groups)} group(s) of rank {owner}", write)

    def claim(self, job: str, round: str, owner: int) -> tuple[str, Batch] | None:
        """One group rank `owner` offered, taken off the board (no other call gets it), or
        None when it offers none now; a retry after a lost reply gets the same group."""
        keys = HandoffKeys(job, round)
        token = uuid.uuid4().hex  # this claim's, the same in each retry of the call
        group = self.store.call(f"claim a group of rank {owner}", lambda r: self.claim_script(
            keys=[keys.open(owner), keys.claims], args=[token, HANDOFF_TTL_S], client=r))
        if group is None:
            return None
        name = group.decode() if isinstance(group, bytes) else str(group)
        payload = self.store.call(f"read offered group {name!r}",
                                  lambda r: r.hget(keys.work, name))
        if payload is None:  # expired: an offer an hour old belongs to no live round
            return None
        return name, decode(_raw(payload))

    def deliver(self, job: str, round: str, group: str, samples: Batch) -> None:
        """The finished samples of claimed group `group`, for its owner to collect."""
        keys = HandoffKeys(job, round)

        def write(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=True)
            pipe.hset(keys.done, group, encode(samples))
            pipe.hdel(keys.work, group)
            pipe.expire(keys.done, HANDOFF_TTL_S)
            pipe.execute()

        self.store.call(f"deliver group {group!r}", write)

    def collect(self, job: str, round: str, groups: Collection[str]) -> dict[str, Batch]:
        """The groups of `groups` delivered so far (removed from the board)."""
        wanted = list(groups)
        if not wanted:
            return {}
        keys = HandoffKeys(job, round)
        found = self.store.call(f"collect {len(wanted)} delivered group(s)",
                                lambda r: r.hmget(keys.done, wanted))
        delivered = {g: decode(_raw(p)) for g, p in zip(wanted, found, strict=True)
                     if p is not None}
        if delivered:
            self.store.call("forget collected groups",
                            lambda r: r.hdel(keys.done, *delivered))
        return delivered

    def finish(self, job: str, round: str, rank: int) -> None:
        """Rank `rank`'s own groups are all complete."""
        keys = HandoffKeys(job, round)

        def write(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=True)
            pipe.sadd(keys.finished, rank)
            pipe.expire(keys.finished, HANDOFF_TTL_S)
            pipe.execute()

        self.store.call(f"mark rank {rank} finished", write)

    def finished(self, job: str, round: str) -> set[int]:
        """The ranks whose own groups are all complete."""
        keys = HandoffKeys(job, round)
        members = self.store.call("read the finished ranks",
                                  lambda r: r.smembers(keys.finished))
        return {int(m) for m in members}


def _raw(value: bytes | str) -> bytes:
    """A payload as Redis returned it: bytes (the store's client never decodes replies)."""
    if isinstance(value, str):
        raise DataBufferError("a handoff payload came back decoded to text: the Redis client "
                              "must return bytes (decode_responses off)")
    return value
