"""The HTTP listener: dashboard pages, Prometheus `/metrics`, JSON and a health probe.

    /                      job list
    /jobs/<job>[?step=N]   a job's dashboard (latest step when N is absent)
    /api/jobs/<job>/steps  every step summary as JSON (proto JSON mapping)
    /metrics               Prometheus text exposition
    /healthz               200 "ok"

Every response says `X-Content-Type-Options: nosniff`, and pages carry a Content-Security-Policy
that allows no script at all (the pages have none): with the templates' escaping, a hostile
span attribute cannot run code in a reader's browser. A job id is one path segment, quoted
(`%2F` for `/`), unquoted after the path is split. Errors are plain text naming only what was
asked for; a bug answers a short 500 (the traceback goes to the log).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from google.protobuf.json_format import MessageToDict
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from dagrl.errors import DagrlError, InvalidInputError, NotFoundError
from dagrl_metrics import dashboard
from dagrl_metrics.prometheus import exposition
from dagrl_metrics.store import StepStore

log = logging.getLogger(__name__)

_SECURITY_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("Content-Security-Policy",
     "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; frame-ancestors 'none'"),
    ("Referrer-Policy", "no-referrer"),
)


@dataclass(frozen=True)
class Response:
    status: HTTPStatus
    content_type: str
    body: bytes


_TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Pages:
    """What each GET answers, apart from the socket: the handler only sends `respond`'s answer."""

    store: StepStore
    registry: CollectorRegistry
    jaeger_ui_url: str | None = None

    def respond(self, path: str) -> Response:
        """The answer to GET `path`. A bug (any exception not a DagrlError) answers a short 500
        and is logged with its traceback; the connection is not just dropped."""
        try:
            return self._route(urlsplit(path))
        except NotFoundError as exc:
            return Response(HTTPStatus.NOT_FOUND, _TEXT, f"{exc}\n".encode())
        except DagrlError as exc:
            return Response(HTTPStatus.BAD_REQUEST, _TEXT, f"{exc}\n".encode())
        except Exception:
            log.exception("GET %r failed", path)
            return Response(HTTPStatus.INTERNAL_SERVER_ERROR, _TEXT,
                            b"internal error; the metrics service's log has the details\n")

    def _route(self, url: SplitResult) -> Response:
        parts = [unquote(p) for p in url.path.strip("/").split("/") if p]
        if not parts:
            return _html(dashboard.render_index(self.store.latest_complete(), self.store.jobs()))
        if parts == ["metrics"]:
            return Response(HTTPStatus.OK, CONTENT_TYPE_LATEST, exposition(self.registry))
        if parts == ["healthz"]:
            return Response(HTTPStatus.OK, "text/plain", b"ok\n")
        if len(parts) == 2 and parts[0] == "jobs":
            return self._job_page(parts[1], parse_qs(url.query).get("step", [None])[0])
        if len(parts) == 4 and parts[:2] == ["api", "jobs"] and parts[3] == "steps":
            steps = self.store.list_steps(parts[2])
            body = json.dumps({"steps": [MessageToDict(s) for s in steps]})
            return Response(HTTPStatus.OK, "application/json", body.encode())
        return Response(HTTPStatus.NOT_FOUND, "text/plain", b"no such page\n")

    def _job_page(self, job_id: str, step_text: str | None) -> Response:
        try:
            step = int(step_text) if step_text is not None else None
        except ValueError:
            raise InvalidInputError(f"step={step_text!r}: expected a step number") from None
        steps = self.store.list_steps(job_id)
        selected = self.store.summary(job_id, step)
        return _html(dashboard.render_job(job_id, steps, selected, is_latest=step is None,
                                          jaeger_ui_url=self.jaeger_ui_url))


def _html(page: str) -> Response:
    return Response(HTTPStatus.OK, "text/html; charset=utf-8", page.encode())


class DashboardServer:
    """Serves the pages on (host, port) from a background thread; `stop()` is idempotent."""

    def __init__(self, host: str, port: int, store: StepStore, registry: CollectorRegistry,
                 jaeger_ui_url: str | None = None) -> None:
        handler = type("Handler", (_Handler,), {
            "pages": Pages(store, registry, jaeger_ui_url)})
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="dashboard-http",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._stopped = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    pages: Pages
    server_version = "dagrl-metrics"

    def do_GET(self) -> None:
        self._send(self.pages.respond(self.path))

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in _SECURITY_HEADERS:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s - " + format, self.address_string(), *args)
