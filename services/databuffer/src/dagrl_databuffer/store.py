"""The databuffer's Redis connection: bounded retries, typed errors, scripts, bulk transfer.

Owns how bytes move to and from Redis; what the keys mean is `keys`, what a shard looks
like is `shard`, and the put/get protocol is `writer`, `planner` and `reader`.

- Every call goes through `call`: connection failures are retried with exponential
  backoff (`BufferSettings.retry_attempts`, `retry_backoff_s`), then raise
  RedisUnavailableError naming the URL and the time it really took. Socket timeouts are
  always set, so nothing hangs, and inside a caller's deadline (`deadline.within`) they and
  the retries end at it.
- Writes are pipelined SETs of memoryviews: redis-py's pure-Python packer sends them
  as they are, without a copy (hiredis's packer would copy every value: NOTES).
- Reads: redis-py's pure-Python parser copies a bulk reply about four times on its way
  through a BytesIO. `read_blocks` sends pipelined GETs on a pooled connection and
  receives each reply with `recv_into` straight into the caller's buffer, one kernel copy
  — about twice the throughput here. It falls back to a plain pipeline when the
  connection is not the plain-socket, pure-Python-parser kind it knows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dagrl.errors import (
    ConfigError,
    DataBufferError,
    QuotaExceededError,
    RedisUnavailableError,
    ShardCorruptError,
)
from dagrl_databuffer import deadline
from dagrl_databuffer.config import BufferSettings, redact_url

log = logging.getLogger(__name__)
T = TypeVar("T")
_READ_WINDOW_BYTES = 8 << 20  # GET replies per window (8 MiB beat 4, 16, 32, 64 here)
_WRITE_WINDOW_BYTES = 64 << 20  # SET values per pipeline round trip
_WINDOWS_IN_FLIGHT = 2  # Redis buffers at most this many windows of replies per client
_LINE_READ_BYTES = 1 << 16
_RETRYABLE = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError)

# Reserve a shard's bytes against the job quota and record its keys in the step index;
# a (re-)put also forgets who has read the edge. KEYS: usage hash, step index, producers,
# readers, the shard's meta. ARGV: field, bytes, quota, ttl, producer size (0: not given),
# index members... Returns {1, used, the meta being replaced or false},
# {-1, used without this shard} or {-2, the other producer size}.
RESERVE_LUA = """
local size = redis.call('GET', KEYS[3])
if ARGV[5] ~= '0' and size and size ~= ARGV[5] then return {-2, tonumber(size)} end
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local used = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do used = used + tonumber(v) end
local after = used - old + tonumber(ARGV[2])
if tonumber(ARGV[3]) > 0 and after > tonumber(ARGV[3]) then return {-1, used - old} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
if ARGV[5] ~= '0' then redis.call('SET', KEYS[3], ARGV[5], 'EX', ARGV[4]) end
redis.call('DEL', KEYS[4])
for i = 6, #ARGV, 500 do
  redis.call('SADD', KEYS[2], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
redis.call('EXPIRE', KEYS[2], ARGV[4])
return {1, after, redis.call('GET', KEYS[5])}
"""

# Record that a reader read the edge; the last of its readers (dp size x replicas) deletes it.
# KEYS: readers, usage, step index, then the edge's keys. ARGV: reader index, readers, ttl,
# usage fields... Returns {0, readers so far}, {1, keys deleted} or {-1, other readers}.
RELEASE_LUA = """
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  if v ~= ARGV[2] then return {-1, tonumber(v)} end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local readers = redis.call('HLEN', KEYS[1])
if readers < tonumber(ARGV[2]) then return {0, readers} end
for i = 4, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
local deleted = redis.call('UNLINK', KEYS[1])
redis.call('SREM', KEYS[3], KEYS[1])
for i = 4, #KEYS do
  deleted = deleted + redis.call('UNLINK', KEYS[i])
  redis.call('SREM', KEYS[3], KEYS[i])
end
return {1, deleted}
"""


class RedisStore:
    """One Redis connection pool with the retry, error and transfer rules above."""

    def __init__(self, settings: BufferSettings) -> None:
        self.settings = settings
        self.url = redact_url(settings.redis_url)
        self.redis = redis.Redis.from_url(
            settings.redis_url,
            connection_class=deadline.connection_class(settings.redis_url),
            socket_connect_timeout=settings.connect_timeout_s,
            socket_timeout=settings.socket_timeout_s,
            socket_read_size=1 << 20,
            retry=Retry(NoBackoff(), 0),  # retries are ours: bounded, with backoff
            protocol=2,  # RESP2: no push messages, so `read_blocks` can parse replies itself
            health_check_interval=0,
        )
        self.reserve_script = self.redis.register_script(RESERVE_LUA)
        self.release_script = self.redis.register_script(RELEASE_LUA)

    def close(self) -> None:
        self.redis.close()

    def call(self, what: str, fn: Callable[[redis.Redis], T]) -> T:
        """`fn(redis)` with bounded retries on connection failures; typed errors otherwise.
        Within a caller's deadline, no retry starts that would end after it."""
        started = time.monotonic()
        delay = self.settings.retry_backoff_s
        attempts = 0
        while True:
            attempts += 1
            try:
                return fn(self.redis)
            except redis.AuthenticationError as exc:
                raise RedisUnavailableError(
                    f"Redis at {self.url} refused the credentials while trying to {what}: {exc}; "
                    "fix the user/password in DAGRL_REDIS_URL", url=self.url) from exc
            except _RETRYABLE as exc:
                last: Exception = exc
            except redis.ResponseError as exc:
                raise self._response_error(what, exc) from exc
            except redis.RedisError as exc:  # protocol errors and the like: not retryable
                raise DataBufferError(f"Redis at {self.url}: {what} failed: {exc}") from exc
            remaining = deadline.remaining_s()
            out_of_time = remaining is not None and remaining <= delay
            if attempts > self.settings.retry_attempts or out_of_time:
                break
            log.warning("redis %s: %s failed (%s); retry in %.2f s", self.url, what, last, delay)
            time.sleep(delay)
            delay *= 2
        why = f"; the call's timeout_s={deadline.timeout_s():g} ran out" if out_of_time else ""
        raise RedisUnavailableError(
            f"Redis at {self.url} is unreachable: {what} failed {attempts} time(s) in "
            f"{time.monotonic() - started:.1f} s ({type(last).__name__}: {last}){why}; check "
            "that redis-server is running (and not stopped) and that DAGRL_REDIS_URL points to "
            "it", url=self.url) from last

    def _response_error(self, what: str, exc: redis.ResponseError) -> DataBufferError:
        if isinstance(exc, redis.exceptions.OutOfMemoryError) or "maxmemory" in str(exc):
            return QuotaExceededError(
                f"Redis at {self.url} is full (used memory > maxmemory) while trying to "
                f"{what}; nothing was evicted and this write was refused. Read or delete "
                "finished steps, or raise Redis's maxmemory")
        return DataBufferError(f"Redis at {self.url} answered an error to {what}: {exc}")

    def check_server(self) -> dict[str, Any]:
        """Redis's memory settings; refuses any eviction policy but `noeviction`."""
        info = self.call("read INFO memory", lambda r: r.info("memory"))
        policy = str(info.get("maxmemory_policy", "unknown"))
        if policy != "noeviction":
            raise ConfigError(
                f"Redis at {self.url} has maxmemory-policy {policy}: a full Redis would evict "
                "shards silently. Set `maxmemory-policy noeviction` (redis.conf, or CONFIG SET "
                "maxmemory-policy noeviction) so that it refuses writes instead",
                source=self.url)
        if not int(info.get("maxmemory", 0)):
            log.warning("redis %s has no maxmemory limit: shards can fill the host's memory",
                        self.url)
        return {"used_memory": int(info.get("used_memory", 0)),
                "maxmemory": int(info.get("maxmemory", 0)), "maxmemory_policy": policy}

    # ----------------------------------------------------------------- bulk writes
    def write_values(self, what: str, keys: Sequence[str], values: Sequence[memoryview]) -> None:
        """SET every key to its value with the TTL, pipelined in windows (values not copied)."""
        ttl = self.settings.ttl_s
        for window in _windows([v.nbytes for v in values], _WRITE_WINDOW_BYTES):
            def write(r: redis.Redis, window: range = window) -> None:
                pipe = r.pipeline(transaction=False)
                for i in window:
                    pipe.set(keys[i], values[i], ex=ttl)
                pipe.execute()
            self.call(what, write)

    # ------------------------------------------------------------------ bulk reads
    def read_blocks(self, blocks: Sequence[Sequence[tuple[str, int]]]) -> list[memoryview]:
        """Each block's chunk values, concatenated into one fresh writable buffer per block.

        A block is a list of (key, expected size). A missing key or a value of another size
        raises ShardCorruptError naming the key: no partial block is ever returned.
        """
        buffers = [_new_buffer(sum(size for _, size in block)) for block in blocks]
        targets: list[tuple[str, memoryview]] = []
        for block, buffer in zip(blocks, buffers, strict=True):
            offset = 0
            for key, size in block:
                targets.append((key, buffer[offset:offset + size]))
                offset += size
        problem = self.call("read shard chunks", lambda r: self._read_targets(r, targets))
        if problem is not None:
            raise ShardCorruptError(problem[1], key=problem[0])
        return buffers

    def _read_targets(self, r: redis.Redis, targets: list[tuple[str, memoryview]]) -> Problem:
        if self.settings.fast_reads:
            conn = r.connection_pool.get_connection()
            try:
                if _raw_socket(conn) is not None:
                    return _get_into(conn, targets)
            except BaseException:
                conn.disconnect()  # the stream position is unknown now
                raise
            finally:
                r.connection_pool.release(conn)
        for window in _windows([target.nbytes for _, target in targets]):
            problem = _read_window_pipelined(r, [targets[i] for i in window])
            if problem is not None:
                return problem
        return None


Problem = tuple[str, str] | None  # (key, what is wrong with it)


def _new_buffer(nbytes: int) -> memoryview:
    return memoryview(np.empty(nbytes, dtype=np.uint8))  # type: ignore[arg-type]


def _read_window_pipelined(r: redis.Redis, targets: list[tuple[str, memoryview]]) -> Problem:
    pipe = r.pipeline(transaction=False)
    for key, _ in targets:
        pipe.get(key)
    for (key, target), value in zip(targets, pipe.execute(), strict=True):
        message = _check_value(key, None if value is None else len(value), target.nbytes)
        if message is not None:
            return key, message
        target[:] = value
    return None


def _windows(sizes: Sequence[int], limit: int = _READ_WINDOW_BYTES) -> list[range]:
    """Consecutive index ranges of at most `limit` bytes each (at least one item each)."""
    windows, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            windows.append(range(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        windows.append(range(start, len(sizes)))
    return windows


def _check_value(key: str, size: int | None, expected: int) -> str | None:
    if size is None:
        return (f"chunk {key} is missing (expired by the TTL, deleted by DeleteStep, or "
                "replaced by a re-put of the shard); the shard cannot be read whole")
    if size != expected:
        return f"chunk {key} holds {size} bytes, its shard meta says {expected}"
    return None


def _raw_socket(conn: Any) -> Any:
    """The connection's socket, if reading it directly cannot confuse redis-py's parser."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        conn.connect()
        sock = getattr(conn, "_sock", None)
    buffer = getattr(getattr(conn, "_parser", None), "_buffer", None)
    unread = getattr(buffer, "unread_bytes", None)
    if sock is None or unread is None or unread() != 0 or not hasattr(sock, "recv_into"):
        return None
    return sock


def _get_into(conn: Any, targets: list[tuple[str, memoryview]]) -> Problem:
    """Pipelined GETs whose bulk replies land in the target views; (key, problem) or None.

    GETs go out in windows of about _READ_WINDOW_BYTES, two windows in flight, so Redis
    always has the next replies ready while bounding what it buffers for this client.
    Every reply is consumed even after a problem, so the connection stays usable.
    """
    sock = conn._sock
    windows = _windows([target.nbytes for _, target in targets])

    def send(window: range) -> None:
        conn.send_packed_command(conn.pack_commands([("GET", targets[i][0]) for i in window]))

    for window in windows[:_WINDOWS_IN_FLIGHT]:
        send(window)
    pending = bytearray()
    problem: Problem = None
    for number, window in enumerate(windows):
        for i in window:
            key, target = targets[i]
            sock.settimeout(deadline.socket_timeout(conn.socket_timeout))  # these recvs too
            pending, message = _receive_reply(sock, pending, key, target)
            if message is not None and problem is None:
                problem = (key, message)
        if number + _WINDOWS_IN_FLIGHT < len(windows):
            send(windows[number + _WINDOWS_IN_FLIGHT])
    if pending:
        raise redis.exceptions.InvalidResponse("Redis sent more than the replies asked for")
    return problem


def _receive_reply(sock: Any, pending: bytearray, key: str,
                   target: memoryview) -> tuple[bytearray, str | None]:
    """One GET reply into `target`; returns the bytes read past it and any problem."""
    while b"\r\n" not in pending:
        _recv_more(sock, pending)
    line, _, rest = bytes(pending).partition(b"\r\n")
    pending = bytearray(rest)
    if line.startswith(b"-"):
        raise redis.ResponseError(line[1:].decode(errors="replace"))
    if line == b"_":  # RESP3's null, should a server answer in it
        return pending, _check_value(key, None, target.nbytes)
    if not line.startswith(b"$"):
        raise redis.exceptions.InvalidResponse(f"unexpected Redis reply {line[:40]!r} to GET")
    size = int(line[1:])
    message = _check_value(key, None if size < 0 else size, target.nbytes)
    if size < 0:
        return pending, message
    sink = target if message is None else memoryview(bytearray(size))
    pending = _receive_exactly(sock, pending, sink)
    while len(pending) < 2:
        _recv_more(sock, pending)
    del pending[:2]  # the reply's trailing CRLF
    return pending, message


def _receive_exactly(sock: Any, pending: bytearray, sink: memoryview) -> bytearray:
    """Fill `sink` from the already-read bytes, then from the socket; returns what is left."""
    take = min(len(pending), sink.nbytes)
    sink[:take] = pending[:take]
    filled = take
    while filled < sink.nbytes:
        got = sock.recv_into(sink[filled:], sink.nbytes - filled)
        if not got:
            raise redis.ConnectionError("Redis closed the connection during a reply")
        filled += got
    return pending[take:]


def _recv_more(sock: Any, pending: bytearray) -> None:
    data = sock.recv(_LINE_READ_BYTES)
    if not data:
        raise redis.ConnectionError("Redis closed the connection during a reply")
    pending += data
