"""The rollout ranks of a node take over a lost engine's groups (#34 part 3), over a real
redis-server: the databuffer's handoff board gives each offered group to exactly one
claimer and its bytes back unchanged; two ranks (threads, each with an engine that draws the
same tokens for the same sample and position, as vLLM's per-sample seeds do) produce what
they produce without a loss when one of them loses its engine mid-generation, whether the
other rank continues its groups or the owner takes them back once its new engine runs; a
rank that waits on a peer which never finishes gives up with the reason."""

from __future__ import annotations

import socket
import threading
import zlib
from collections.abc import Iterator

import pytest
import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.errors import ShardNotReadyError
from dagrl.local import LocalRedis
from dagrl_databuffer.client import DataBufferClient
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.rank.rollout.base import EngineLost, InFlightWeights
from dagrl_worker.rank.rollout.peers import RolloutPeers
from dagrl_worker.rank.rollout.samples import SampleStates

pytestmark = pytest.mark.integration  # a redis-server

EOS, WIDTH = 1, 10
PARAMS = SamplingParams(n=2, max_new_tokens=WIDTH, do_sample=True, seed=3)


@pytest.fixture
def client(private_redis: LocalRedis) -> Iterator[DataBufferClient]:
    with DataBufferClient(private_redis.url) as buffer:
        yield buffer


def _token(uid: str, position: int) -> int:
    """The token a sample draws at `position`: its uid and position decide it (EOS ~1 in 12)."""
    return zlib.crc32(f"{uid}@{position}".encode()) % 12 + 1


class SeededEngine:
    """An engine that draws `_token`s: `lose_after` tokens into its work it is lost (raises
    `EngineLost`, as `VLLMRollout.advance` does with peers) and is ready again only once
    `rebuilt` is set; `hold` (cleared) keeps it from starting its own work."""

    pad_token_id = 0

    def __init__(self, lose_after: int | None = None) -> None:
        self.lose_after = lose_after
        self.drawn = 0
        self.rebuilt = threading.Event()
        self.rebuilt.set()
        self.hold = threading.Event()
        self.hold.set()
        self.handing_over = False

    def hand_over_on_loss(self, on: bool) -> None:
        self.handing_over = on

    def engine_ready(self) -> bool:
        return self.rebuilt.is_set()

    def advance(self, states: SampleStates, params: SamplingParams,
                in_flight: InFlightWeights | None = None,
                quota_groups: int | None = None) -> None:
        self.hold.wait(timeout=30)
        if not self.rebuilt.is_set():
            raise EngineLost
        for row in states.open_rows().tolist():
            while not bool(states.finished[row]):
                if self.lose_after is not None and self.drawn >= self.lose_after:
                    self.lose_after = None
                    self.rebuilt.clear()
                    raise EngineLost
                token = _token(states.prompts.uids[row], int(states.lengths[row]))
                states.record(row, [token], [-0.25], version=0, ended=token == EOS)
                self.drawn += 1


def _prompts(rank: int, count: int) -> Batch:
    rows = {fields.PROMPT_IDS: [[5 + i, 7, 9 + rank] for i in range(count)],
            "index": list(range(count))}
    return prompts_to_batch(rows, 0, f"r{rank}")


def _expected(prompts: Batch) -> Batch:
    states = SampleStates.fresh(prompts.repeat_interleave(PARAMS.n), WIDTH, 0)
    SeededEngine().advance(states, PARAMS)
    return states.to_batch(with_versions=False)


def _run_ranks(client: DataBufferClient, engines: list[SeededEngine], job: str,
               timeout_s: float = 30.0) -> tuple[list[Batch], list[RolloutPeers]]:
    peers = [RolloutPeers(client.handoffs, job, "rollout", rank, (0, 1), timeout_s)
             for rank in (0, 1)]
    outputs: list[Batch | BaseException | None] = [None, None]

    def rank_main(rank: int) -> None:
        try:
            outputs[rank] = peers[rank].generate(engines[rank], _prompts(rank, 4), PARAMS)
        except BaseException as exc:  # reported below, with the rank
            outputs[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    return _joined(threads, outputs), peers


def _joined(threads: list[threading.Thread], outputs: list) -> list[Batch]:  # type: ignore[type-arg]
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a rank never returned"
    for rank, out in enumerate(outputs):
        if isinstance(out, BaseException):
            raise AssertionError(f"rank {rank} raised") from out
    return outputs


def _same_samples(out: Batch, expected: Batch) -> None:
    assert out.uids == expected.uids
    for name in (fields.RESPONSES, fields.RESPONSE_MASK, fields.ROLLOUT_LOG_PROBS):
        assert torch.equal(out.tensors[name], expected.tensors[name]), name


def test_each_offered_group_is_claimed_once_and_its_bytes_come_back(
        client: DataBufferClient) -> None:
    board = client.handoffs
    offered = {f"g{i}": _expected(_prompts(0, 1)).with_fields(
        columns={"extra_info": [{"i": i, "text": "é"}] * 2}) for i in range(40)}
    board.offer("job", "rollout/1", 0, offered)
    claims: list[tuple[str, Batch]] = []
    lock = threading.Lock()

    def claimer() -> None:
        while (claimed := board.claim("job", "rollout/1", 0)) is not None:
            with lock:
                claims.append(claimed)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(g for g, _ in claims) == sorted(offered)  # each exactly once
    for group, batch in claims:
        assert batch.equals(offered[group]), group
    board.deliver("job", "rollout/1", "g3", claims[0][1])
    assert list(board.collect("job", "rollout/1", ["g3", "g4"])) == ["g3"]
    assert board.collect("job", "rollout/1", ["g3"]) == {}  # collected once
    board.finish("job", "rollout/1", 1)
    assert board.finished("job", "rollout/1") == {1}
    assert board.finished("job", "rollout/2") == set()


class ReplyDroppingProxy:
    """A TCP relay to Redis that, once armed, passes the next claim on (its script, or a
    plain LPOP), swallows Redis's reply and closes the client's connection: a reply lost after
    the command ran."""

    commands = (b"EVALSHA", b"LPOP")

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        with client, upstream:
            while data := client.recv(65536):
                upstream.sendall(data)
                reply = upstream.recv(65536)
                if self.armed.is_set() and any(c in data.upper() for c in self.commands):
                    self.armed.clear()
                    self.dropped.set()
                    return  # the command ran; its reply never reaches the client
                client.sendall(reply)

    def close(self) -> None:
        self.listener.close()


def test_a_claim_whose_reply_was_lost_gets_the_same_group_on_its_retry(
        private_redis: LocalRedis) -> None:
    """The store retries a call whose connection broke; the retried claim must not take a
    second group while the first, popped for the lost reply, vanishes."""
    proxy = ReplyDroppingProxy(private_redis.port)
    offered = {f"g{i}": _expected(_prompts(0, 1)) for i in range(2)}
    relayed_url = private_redis.url.replace(f":{private_redis.port}/", f":{proxy.port}/")
    with DataBufferClient(relayed_url) as relayed:
        board = relayed.handoffs
        assert board.claim("job", "warm-up", 0) is None  # the script loaded, nothing offered
        board.offer("job", "rollout/1", 0, offered)
        proxy.armed.set()
        first = board.claim("job", "rollout/1", 0)
        assert proxy.dropped.is_set()  # the first attempt's reply was lost
        second = board.claim("job", "rollout/1", 0)
        assert board.claim("job", "rollout/1", 0) is None
    proxy.close()
    assert first is not None and second is not None
    assert [first[0], second[0]] == ["g0", "g1"]  # each group claimed, none lost
    assert first[1].equals(offered["g0"])


def test_a_peer_continues_the_groups_of_a_rank_whose_engine_was_lost(
        client: DataBufferClient) -> None:
    lost = SeededEngine(lose_after=5)  # never rebuilt: its peer must do the rest
    lost_outputs, peers = _run_ranks(client, [lost, SeededEngine()], "peers-take-over")
    for rank, out in enumerate(lost_outputs):
        _same_samples(out, _expected(_prompts(rank, 4)))
    assert peers[1].served == 4 and peers[0].served == 0  # all four of rank 0's groups
    assert not lost.rebuilt.is_set()
    assert not lost.handing_over  # switched off again after the round


def test_the_owner_takes_its_groups_back_once_its_new_engine_runs(
        client: DataBufferClient) -> None:
    lost, busy = SeededEngine(lose_after=5), SeededEngine()
    busy.hold.clear()  # rank 1 cannot start before rank 0 has its engine back

    def rebuild_then_release() -> None:
        while lost.lose_after is not None:  # until the loss
            threading.Event().wait(0.01)
        threading.Event().wait(0.2)
        lost.rebuilt.set()
        threading.Event().wait(0.5)
        busy.hold.set()

    helper = threading.Thread(target=rebuild_then_release)
    helper.start()
    outputs, peers = _run_ranks(client, [lost, busy], "owner-takes-back")
    helper.join(timeout=30)
    for rank, out in enumerate(outputs):
        _same_samples(out, _expected(_prompts(rank, 4)))
    assert peers[0].served == peers[1].served == 0  # every group stayed with its owner


def test_a_rank_gives_up_on_a_peer_that_never_finishes(client: DataBufferClient) -> None:
    peers = RolloutPeers(client.handoffs, "lonely", "rollout", 0, (0, 1), timeout_s=0.5)
    with pytest.raises(ShardNotReadyError, match=r"ranks \[1\] not finished"):
        peers.generate(SeededEngine(), _prompts(0, 2), PARAMS)
