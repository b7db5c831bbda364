"""The remote reward client (`dagrl.rewards.remote`) against a real HTTP server on loopback:
scores come back in order, chunked and concurrent; every kind of failure is a RewardError that
names the URL (and the status), after retries where retrying can help."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dagrl.errors import RewardError
from dagrl.rewards.remote import RemoteRewardClient, RemoteSample, RemoteSettings

# (request body) -> (status, reply bytes); may sleep to be slow
Behaviour = Callable[[dict[str, Any]], tuple[int, bytes]]


pytestmark = pytest.mark.integration  # a real HTTP server on a loopback port


@dataclass
class Service:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    behaviour: Behaviour | None = None
    in_flight: int = 0
    most_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def length_scores(body: dict[str, Any]) -> tuple[int, bytes]:
    """Scores each sample by its response's length: the order is checkable."""
    return 200, json.dumps({"scores": [len(s["response"]) for s in body["samples"]]}).encode()


@pytest.fixture
def service() -> Iterator[Service]:
    state = Service(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.requests.append(body)
                state.in_flight += 1
                state.most_in_flight = max(state.most_in_flight, state.in_flight)
            try:
                status, reply = (state.behaviour or length_scores)(body)
            finally:
                with state.lock:
                    state.in_flight -= 1
            try:
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/score"
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def samples(count: int) -> list[RemoteSample]:
    return [RemoteSample(prompt=f"q{i}", response="x" * i, ground_truth=str(i),
                         data_source="arith", extra_info={"index": i}) for i in range(count)]


def client(url: str, **settings: Any) -> RemoteRewardClient:
    defaults: dict[str, Any] = {"timeout_s": 5.0, "max_concurrency": 4, "max_retries": 2,
                                "retry_backoff_s": 0.01, "batch_size": 64}
    return RemoteRewardClient(RemoteSettings(url=url, **{**defaults, **settings}))


def test_scores_come_back_in_order_over_concurrent_chunks(service: Service) -> None:
    def slow_length_scores(body: dict[str, Any]) -> tuple[int, bytes]:
        time.sleep(0.1)  # long enough for the chunks to overlap
        return length_scores(body)

    service.behaviour = slow_length_scores
    scores = client(service.url, batch_size=3, max_concurrency=2).score(samples(10))
    assert scores == [float(i) for i in range(10)]
    assert sorted(len(r["samples"]) for r in service.requests) == [1, 3, 3, 3]
    assert service.most_in_flight == 2  # bounded by max_concurrency, and really concurrent
    sent = service.requests[0]["samples"][0]
    assert set(sent) == {"prompt", "response", "ground_truth", "data_source", "extra_info"}


def test_no_samples_sends_no_request(service: Service) -> None:
    assert client(service.url).score([]) == []
    assert service.requests == []


def test_a_500_is_retried_then_reported_with_url_and_status(service: Service) -> None:
    service.behaviour = lambda body: (500, b"model server crashed")
    with pytest.raises(RewardError) as caught:
        client(service.url, max_retries=2).score(samples(2))
    message = str(caught.value)
    assert service.url in message and "HTTP 500" in message and "3 attempt(s)" in message
    assert "model server crashed" in message
    assert len(service.requests) == 3


def test_a_transient_503_recovers(service: Service) -> None:
    replies = iter([(503, b"warming up"), (200, b'{"scores": [0.25, 0.75]}')])
    service.behaviour = lambda body: next(replies)
    assert client(service.url).score(samples(2)) == [0.25, 0.75]
    assert len(service.requests) == 2


def test_a_400_is_not_retried(service: Service) -> None:
    service.behaviour = lambda body: (400, b'{"error": "no ground_truth"}')
    with pytest.raises(RewardError, match=r"HTTP 400.*not retried"):
        client(service.url).score(samples(2))
    assert len(service.requests) == 1


def test_a_slow_service_times_out(service: Service) -> None:
    def too_slow(body: dict[str, Any]) -> tuple[int, bytes]:
        time.sleep(1.0)
        return length_scores(body)

    service.behaviour = too_slow
    started = time.monotonic()
    with pytest.raises(RewardError, match=r"timed out after 0\.2 s") as caught:
        client(service.url, timeout_s=0.2, max_retries=1).score(samples(2))
    assert service.url in str(caught.value)
    assert time.monotonic() - started < 2.0  # two attempts of 0.2 s, not two of 1 s
    assert len(service.requests) == 2


def test_an_unreachable_service_names_the_url() -> None:
    url = "http://127.0.0.1:9/score"  # discard port: nothing listens
    with pytest.raises(RewardError, match="cannot be reached") as caught:
        client(url, max_retries=0).score(samples(1))
    assert url in str(caught.value)


@pytest.mark.parametrize(("reply", "problem"), [
    (b'{"scores": [1.0]}', "returned 1 scores for 2 samples"),
    (b'{"scores": [1.0, 2.0, 3.0]}', "returned 3 scores for 2 samples"),
    (b'{"scores": [1.0, NaN]}', "score nan for sample 1"),
    (b'{"scores": [1.0, Infinity]}', "score inf for sample 1"),
    (b'{"scores": [1.0, "high"]}', "score 'high' for sample 1"),
    (b'{"scores": [true, 1.0]}', "score True for sample 0"),
    (b"<html>oops</html>", "invalid JSON"),
    (b'[0.1, 0.2]', "expected a JSON object"),
    (b'{"score": [0.1, 0.2]}', "expected a JSON object"),
])
def test_a_bad_reply_is_a_clear_error_and_not_retried(service: Service, reply: bytes,
                                                      problem: str) -> None:
    service.behaviour = lambda body: (200, reply)
    with pytest.raises(RewardError, match=problem) as caught:
        client(service.url).score(samples(2))
    assert service.url in str(caught.value)
    assert len(service.requests) == 1


def test_one_bad_chunk_fails_the_whole_call(service: Service) -> None:
    def second_chunk_breaks(body: dict[str, Any]) -> tuple[int, bytes]:
        if body["samples"][0]["prompt"] == "q2":
            return 200, b'{"scores": [1.0]}'
        return length_scores(body)

    service.behaviour = second_chunk_breaks
    with pytest.raises(RewardError, match="returned 1 scores for 2 samples"):
        client(service.url, batch_size=2).score(samples(6))


def test_only_http_urls_are_accepted() -> None:
    with pytest.raises(RewardError, match="not an http"):
        client("file:///etc/passwd")


def test_samples_that_are_not_json_are_refused_before_sending(service: Service) -> None:
    bad = [RemoteSample(prompt="q", response="r", ground_truth="1", data_source="arith",
                        extra_info={"when": object()})]
    with pytest.raises(RewardError, match="cannot be sent as JSON"):
        client(service.url).score(bad)
    assert service.requests == []
