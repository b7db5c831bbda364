"""Hostile and broken calls to the agent endpoint, over real HTTP in front of the `hf` backend
on the tiny model: token ids outside the vocabulary, absurd numbers and malformed JSON are 400s
naming what is wrong (never a 500, never a traceback) and cost the calls batched beside them
nothing; half-sent requests do not hold the rollout's end (`Gateway.stop`)."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from typing import Any

import aiohttp
import openai
import pytest

from dagrl_worker.rank.agents.gateway import STOP_GRACE_S, Gateway
from tests.integration.agent_endpoint import QUESTION, SeenBackend, serve
from tests.integration.agent_endpoint import policy as policy  # the fixture

pytestmark = pytest.mark.integration


async def post(gateway: Gateway, key: str, raw: bytes, route: str = "completions"
               ) -> tuple[int, dict[str, Any]]:
    """POST `raw` bytes as they are (no client re-encodes them): the status and the JSON
    answer (an answer that is not JSON, aiohttp's 500 page, as `{"text": ...}`)."""
    async with aiohttp.ClientSession() as http, http.post(
            f"{gateway.base_url}/{route}", data=raw,
            headers={"Authorization": f"Bearer {key}",
                     "Content-Type": "application/json"}) as answer:
        if answer.content_type != "application/json":
            return answer.status, {"text": await answer.text()}
        return answer.status, await answer.json()


def refusal(answer: dict[str, Any]) -> tuple[str | None, str]:
    """The `param` and `message` of an OpenAI error body (None, "" when it is none)."""
    error = answer.get("error", {})
    return error.get("param"), error.get("message", "")


def completion(**fields: str) -> bytes:
    """A completion body with each field's JSON text spliced in verbatim (`9` * 5000, `NaN`)."""
    return ("{" + ", ".join([f'"{k}": {v}' for k, v in
                             {"model": '"policy"', "prompt": '"Q:"', **fields}.items()])
            + "}").encode()


def server_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What aiohttp logged at ERROR: an 'Error handling request' is a 500 and its traceback."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("aiohttp")]


def test_a_token_id_outside_the_vocabulary_fails_only_its_own_call(
        policy: tuple[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    """Episode A's bad ids and episode B's chat call arrive in one batching window: A gets a
    400 naming `prompt`, B its completion, and the engine sees only B's row."""
    caplog.set_level(logging.ERROR, logger="aiohttp")

    async def body(gateway: Gateway, backend: SeenBackend) -> None:
        a, b = gateway.sessions.open(), gateway.sessions.open()
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=b.key, max_retries=0)
        (status, refused), answer = await asyncio.gather(
            post(gateway, a.key, b'{"model": "policy", "prompt": [1000000000]}'),
            client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=4))
        await client.close()
        param, message = refusal(refused)
        assert (status, param) == (400, "prompt"), refused
        assert "1000000000" in message and "0 to 104" in message  # the char tokenizer's 105
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert answer.usage.completion_tokens >= 1 and b.calls == 1 and a.calls == 0
        assert backend.batch_sizes == [1]
    serve(policy, body, window_s=0.5)
    assert server_errors(caplog) == []


def test_every_malformed_token_prompt_is_a_400_naming_prompt(
        policy: tuple[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="aiohttp")
    vocab_size = len(policy[1])
    refused = {  # the prompt's JSON text: what the message must show
        str(2**70): f"prompt[0]={2**70}", "-1": "prompt[0]=-1", "1.5": "prompt[0]=1.5",
        "true": "prompt[0]=True", '"a"': "prompt[0]='a'", "null": "prompt[0]=None",
        str(vocab_size): f"prompt[0]={vocab_size}", "9" * 400: "prompt[0]=",
        "1e400": "prompt[0]=inf", "NaN": "prompt[0]=nan"}

    async def body(gateway: Gateway, backend: SeenBackend) -> None:
        key = gateway.sessions.open().key
        for ids, shown in refused.items():
            status, answer = await post(gateway, key, completion(prompt=f"[{ids}]"))
            param, message = refusal(answer)
            assert (status, param) == (400, "prompt") and shown in message, (ids, answer)
        status, _ = await post(gateway, key, completion(prompt=f"[{vocab_size - 1}]",
                                                        max_tokens="1"))
        assert status == 200  # the last id of the vocabulary is a token
        assert backend.batch_sizes == [1]
    serve(policy, body)
    assert server_errors(caplog) == []


ABSURD = ["9" * 400, "-" + "9" * 400, "9" * 5000, "1e400", "-1e400", "NaN", "Infinity", "1e30",
          '"1"', "true", "[1]"]


def test_absurd_numbers_are_400s_naming_their_field(
        policy: tuple[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="aiohttp")

    async def body(gateway: Gateway, backend: SeenBackend) -> None:
        key = gateway.sessions.open().key
        for field in ("max_tokens", "max_completion_tokens", "n", "temperature", "top_p"):
            for value in ABSURD:
                for route, raw in (("completions", completion(**{field: value})),
                                   ("chat/completions", completion(**{field: value}).replace(
                                       b'"prompt": "Q:"', b'"messages": [{"role": "user", '
                                                          b'"content": "Q:"}]'))):
                    status, answer = await post(gateway, key, raw, route)
                    param, message = refusal(answer)
                    assert (status, param) == (400, field), (route, field, value[:20], answer)
                    assert len(message) < 300, answer  # not 5000 digits
        assert backend.batch_sizes == []
    serve(policy, body, max_body_bytes=1 << 16)
    assert server_errors(caplog) == []


def test_absurd_numbers_in_fields_the_endpoint_ignores_are_ignored(
        policy: tuple[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    """`seed`, penalties and `logprobs` are not acted on (SECURITY.md): any number there is
    answered, never a 500."""
    caplog.set_level(logging.ERROR, logger="aiohttp")

    async def body(gateway: Gateway, backend: SeenBackend) -> None:
        key = gateway.sessions.open().key
        huge = "9" * 5000
        raw = completion(max_tokens="1", seed=huge, presence_penalty="1e400",
                         frequency_penalty="NaN", top_logprobs=huge, logprobs="9" * 400)
        status, answer = await post(gateway, key, raw)
        assert status == 200 and answer["usage"]["completion_tokens"] == 1, answer
        assert len(answer["choices"][0]["logprobs"]["token_logprobs"]) == 1
    serve(policy, body, max_body_bytes=1 << 16)
    assert server_errors(caplog) == []


def test_malformed_json_is_a_400(policy: tuple[Any, Any],
                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="aiohttp")
    bodies = [b"[" * 3000 + b"]" * 3000, b'{"model": "policy", "x": ' + b"[" * 20000, b"{",
              b"\xff\xfe{", b'"policy"', b"[]", b"", b'{"model": "policy"} {}']

    async def body(gateway: Gateway, backend: SeenBackend) -> None:
        key = gateway.sessions.open().key
        for raw in bodies:
            for route in ("completions", "chat/completions"):
                status, answer = await post(gateway, key, raw, route)
                assert status == 400 and "JSON" in refusal(answer)[1], (raw[:30], answer)
    serve(policy, body, max_body_bytes=1 << 16)
    assert server_errors(caplog) == []


async def half_sent(gateway: Gateway, key: str | None) -> tuple[asyncio.StreamReader,
                                                               asyncio.StreamWriter]:
    """A raw connection that announces a 100-byte body and sends 1 byte of it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    authorization = f"Authorization: Bearer {key}\r\n" if key else ""
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{authorization}"
                 "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode())
    await writer.drain()
    return reader, writer


def test_a_keyless_half_sent_request_is_refused_at_once_and_does_not_hold_stop(
        policy: tuple[Any, Any]) -> None:
    async def body(gateway: Gateway, backend: SeenBackend) -> float:
        reader, writer = await half_sent(gateway, None)
        # a second one that never finishes its headers
        _, idle = await asyncio.open_connection("127.0.0.1", gateway.port)
        idle.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        await idle.drain()
        answer = await asyncio.wait_for(reader.read(), 2.0)  # the 401, then the server's close
        assert answer.startswith(b"HTTP/1.1 401") and b"invalid_api_key" in answer
        started = time.perf_counter()
        await gateway.stop()
        for stream in (writer, idle):
            stream.close()
        return time.perf_counter() - started
    assert serve(policy, body) < 0.5


def test_keyless_clients_that_reset_at_once_leave_no_traceback(
        policy: tuple[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    """The 401 is written while the connection may already be gone (reset by the client)."""
    caplog.set_level(logging.ERROR, logger="aiohttp")

    async def body(gateway: Gateway, backend: SeenBackend) -> None:
        for _ in range(50):
            with socket.create_connection(("127.0.0.1", gateway.port)) as raw:
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            b"Content-Length: 100\r\n\r\n{")
            await asyncio.sleep(0)  # the server reads the headers, the client has reset
        await asyncio.sleep(0.2)
    serve(policy, body)
    assert server_errors(caplog) == []


def test_an_authenticated_half_sent_request_holds_stop_at_most_the_grace(
        policy: tuple[Any, Any]) -> None:
    async def body(gateway: Gateway, backend: SeenBackend) -> float:
        _, writer = await half_sent(gateway, gateway.sessions.open().key)
        await asyncio.sleep(0.2)  # its handler is reading the body
        started = time.perf_counter()
        await gateway.stop()
        writer.close()
        return time.perf_counter() - started
    took = serve(policy, body)
    assert took <= STOP_GRACE_S + 0.5, took


def test_a_stop_of_another_shape_is_a_400_naming_stop(
        policy: tuple[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="aiohttp")

    async def body(gateway: Gateway, backend: SeenBackend) -> None:
        key = gateway.sessions.open().key
        for stop in ("5", "true", '{"a": 1}', "[1]", '[""]', '["a", "b", "c", "d", "e"]'):
            status, answer = await post(gateway, key, completion(stop=stop))
            assert (status, refusal(answer)[0]) == (400, "stop"), (stop, answer)
        assert backend.batch_sizes == []
    serve(policy, body)
    assert server_errors(caplog) == []
