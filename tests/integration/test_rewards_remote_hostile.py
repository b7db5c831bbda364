"""The remote reward client against hostile or careless services (issue 27, items 1, 3, 9):
a reply trickled byte by byte, redirects, scores no float holds, secrets in the URL, and
headers whose values come from the environment. A real HTTP server on loopback."""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dagrl.config.reward import RewardConfig
from dagrl.config.typed import build
from dagrl.errors import ConfigError, RewardError
from dagrl.rewards.remote import RemoteRewardClient, RemoteSample, RemoteSettings
from dagrl.urls import redact_url, redact_urls

# (handler) -> None: answers the request the handler holds
Answer = Callable[[BaseHTTPRequestHandler], None]


pytestmark = pytest.mark.integration  # a real HTTP server on a loopback port


@contextmanager
def serving(answer: Answer) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A loopback HTTP server answering POST and GET with `answer`; yields its base URL and
    the requests it saw (method, path, headers)."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def handle_one(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            seen.append({"method": self.command, "path": self.path,
                         "headers": dict(self.headers)})
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                answer(self)  # (unless the client gave up)

        do_POST = do_GET = handle_one

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def reply(status: int, body: bytes, **headers: str) -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)
    return answer


def client(url: str, **settings: Any) -> RemoteRewardClient:
    defaults: dict[str, Any] = {"timeout_s": 5.0, "max_concurrency": 2, "max_retries": 0,
                                "retry_backoff_s": 0.01, "batch_size": 64}
    return RemoteRewardClient(RemoteSettings(url=url, **{**defaults, **settings}))


def samples(count: int) -> list[RemoteSample]:
    return [RemoteSample(prompt=f"q{i}", response="r", ground_truth="1", data_source="arith",
                         extra_info={}) for i in range(count)]


def test_a_reply_trickled_byte_by_byte_times_out_as_a_whole() -> None:
    """Item 1: 200 at once, then one byte every 0.15 s: each read is quick, the request is
    not. timeout_s=0.5 must end it in about 0.5 s, not after the 6 s the body takes."""
    body = b'{"scores": [1.0, 2.0]}' + b" " * 18

    def trickle(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        for byte in body:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(0.15)

    with serving(trickle) as (host, _):
        started = time.monotonic()
        with pytest.raises(RewardError, match=r"timed out after 0\.5 s"):
            client(f"http://{host}/score", timeout_s=0.5).score(samples(2))
        assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("location", ["/elsewhere", "ftp://127.0.0.1/scores"])
def test_a_redirect_is_refused_not_followed(location: str) -> None:
    """Item 9: a 302 would turn the POST into a GET (then "returned 0 scores"), and a redirect
    may lead off http(s): neither is followed."""
    with (serving(reply(302, b"", Location=location)) as (host, seen),
          pytest.raises(RewardError, match=r"HTTP 302.*redirects are not followed") as caught):
        client(f"http://{host}/score").score(samples(2))
    assert f"http://{host}/score" in str(caught.value)
    assert [request["method"] for request in seen] == ["POST"]


@pytest.mark.parametrize("number", [b"1" * 400, b"9" * 5000, b"-" + b"7" * 320])
def test_a_score_no_float_holds_is_a_reward_error(number: bytes) -> None:
    """Item 9: a 400-digit integer raised OverflowError, a 5000-digit one ValueError."""
    with (serving(reply(200, b'{"scores": [0.5, ' + number + b"]}")) as (host, _),
          pytest.raises(RewardError, match=r"for sample 1.*finite number") as caught):
        client(f"http://{host}/score").score(samples(2))
    assert f"http://{host}/score" in str(caught.value)


def test_deeply_nested_json_is_a_reward_error() -> None:
    with (serving(reply(200, b"[" * 100_000 + b"]" * 100_000)) as (host, _),
          pytest.raises(RewardError, match="invalid JSON")):
        client(f"http://{host}/score").score(samples(1))


@pytest.mark.parametrize("port", ["99999", "65536", "0", "http", "80a"])
def test_a_bad_port_is_refused_before_any_request(port: str) -> None:
    """Item 9: port 99999 used to reach 34463 (modulo 65536); a non-numeric one failed at
    the first step."""
    url = f"http://127.0.0.1:{port}/score"
    with pytest.raises(RewardError, match="invalid port"):
        client(url)
    with pytest.raises(ConfigError, match=r"remote_url .*invalid port.*1 to 65535"):
        build(RewardConfig, {"remote_url": url})


def test_credentials_in_the_url_are_sent_as_basic_auth_and_never_shown() -> None:
    """Item 3: the password and a key in the query reach the service, not the error."""
    with serving(reply(403, b"no")) as (host, seen):
        url = f"http://alice:pa55word@{host}/score?api_key=K3Y"
        with pytest.raises(RewardError, match="HTTP 403") as caught:
            client(url).score(samples(1))
    message = str(caught.value)
    assert "pa55word" not in message and "K3Y" not in message
    assert f"http://alice:***@{host}/score?***" in message
    sent = seen[0]["headers"]["Authorization"]
    assert base64.b64decode(sent.removeprefix("Basic ")) == b"alice:pa55word"
    assert seen[0]["path"] == "/score?api_key=K3Y"


def test_an_unreachable_service_does_not_show_the_secret() -> None:
    url = "http://bob:hunter2@127.0.0.1:9/score?token=T0KEN"  # discard port: nothing listens
    with pytest.raises(RewardError, match="cannot be reached") as caught:
        client(url).score(samples(1))
    assert "hunter2" not in str(caught.value) and "T0KEN" not in str(caught.value)


def test_config_problems_do_not_show_the_secret() -> None:
    with pytest.raises(ConfigError) as caught:
        build(RewardConfig, {"remote_url": "http://u:s3cret@127.0.0.1:99999/x?key=K3Y"})
    assert "s3cret" not in str(caught.value) and "K3Y" not in str(caught.value)


def test_headers_take_their_values_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 3: the config names the variable; the worker sends its value."""
    monkeypatch.setenv("DAGRL_TEST_REWARD_AUTH", "Bearer s3cret")
    monkeypatch.setenv("DAGRL_TEST_REWARD_KEY", "k-123")
    config = build(RewardConfig, {"remote_url": "http://127.0.0.1:8000/score", "remote": {
        "headers_env": {"Authorization": "DAGRL_TEST_REWARD_AUTH",
                        "X-Api-Key": "DAGRL_TEST_REWARD_KEY"}}})
    with serving(reply(200, b'{"scores": [1.0]}')) as (host, seen):
        scores = client(f"http://{host}/score",
                        headers_env=config.remote.headers_env).score(samples(1))
    assert scores == [1.0]
    assert seen[0]["headers"]["Authorization"] == "Bearer s3cret"
    assert seen[0]["headers"]["X-Api-Key"] == "k-123"


def test_an_unset_header_variable_is_named_without_a_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DAGRL_TEST_REWARD_AUTH", raising=False)
    with pytest.raises(RewardError, match="DAGRL_TEST_REWARD_AUTH, which is unset"):
        client("http://127.0.0.1:8000/score",
               headers_env={"Authorization": "DAGRL_TEST_REWARD_AUTH"})


def test_headers_env_must_name_variables_not_secrets() -> None:
    with pytest.raises(ConfigError) as caught:
        build(RewardConfig, {"remote_url": "http://127.0.0.1:8000/score", "remote": {
            "headers_env": {"Authorization": "Bearer abc.def", "Bad Header": "OK_NAME"}}})
    assert "not the secret itself" in str(caught.value)
    assert "not an HTTP header name" in str(caught.value)


@pytest.mark.parametrize(("url", "shown"), [
    ("http://u:pw@h:1/p?key=v#frag", "http://u:***@h:1/p?***"),
    ("https://TOKEN@h/p", "https://***@h/p"),
    ("redis://u:pw@h:1/0", "redis://u:***@h:1/0"),
    ("http://h:8000/score", "http://h:8000/score"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_urls_in_a_failure_reason() -> None:
    text = "remote reward service 'http://a:b@h/x?k=SECRET' failed; see http://h/doc."
    assert redact_urls(text) == "remote reward service 'http://a:***@h/x?***' failed; see http://h/doc."


def test_redact_urls_takes_linear_time_on_long_text() -> None:
    """The driver redacts its whole config log (up to 256 KiB): a long run of letters must not
    make the URL pattern quadratic."""
    started = time.monotonic()
    assert redact_urls("a" * 300_000 + " http://u:p@h/") == "a" * 300_000 + " http://u:***@h/"
    assert time.monotonic() - started < 1.0
