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
asked for.
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

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


class DashboardServer:
    """Serves the pages on (host, port) from a background thread; `stop()` is idempotent."""

    def __init__(self, host: str, port: int, store: StepStore, registry: CollectorRegistry,
                 jaeger_ui_url: str | None = None) -> None:
        handler = type("Handler", (_Handler,), {
            "store": store, "registry": registry, "jaeger_ui_url": jaeger_ui_url})
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
    store: StepStore
    registry: CollectorRegistry
    jaeger_ui_url: str | None
    server_version = "dagrl-metrics"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/") if p]
        try:
            if not parts:
                self._send_html(dashboard.render_index(self.store.latest_complete(),
                                                       self.store.jobs()))
            elif parts == ["metrics"]:
                self._send(HTTPStatus.OK, CONTENT_TYPE_LATEST, exposition(self.registry))
            elif parts == ["healthz"]:
                self._send(HTTPStatus.OK, "text/plain", b"ok\n")
            elif len(parts) == 2 and parts[0] == "jobs":
                self._job_page(parts[1], parse_qs(url.query).get("step", [None])[0])
            elif len(parts) == 4 and parts[:2] == ["api", "jobs"] and parts[3] == "steps":
                steps = self.store.list_steps(parts[2])
                body = json.dumps({"steps": [MessageToDict(s) for s in steps]})
                self._send(HTTPStatus.OK, "application/json", body.encode())
            else:
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"no such page\n")
        except NotFoundError as exc:
            self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", f"{exc}\n".encode())
        except DagrlError as exc:
            self._send(HTTPStatus.BAD_REQUEST, "text/plain; charset=utf-8",
                       f"{exc}\n".encode())

    def _job_page(self, job_id: str, step_text: str | None) -> None:
        try:
            step = int(step_text) if step_text is not None else None
        except ValueError:
            raise InvalidInputError(f"step={step_text!r}: expected a step number") from None
        steps = self.store.list_steps(job_id)
        selected = self.store.summary(job_id, step)
        self._send_html(dashboard.render_job(job_id, steps, selected, is_latest=step is None,
                                             jaeger_ui_url=self.jaeger_ui_url))

    def _send_html(self, page: str) -> None:
        self._send(HTTPStatus.OK, "text/html; charset=utf-8", page.encode())

    def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in _SECURITY_HEADERS:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s - " + format, self.address_string(), *args)
