"""A small remote reward service: what `reward.remote_url` talks to, scoring with dagrl's rules.

    python examples/remote_reward_server.py --port 8000     # then, in another shell:
    dagrl run examples/grpo_remote_reward.yaml

It answers `POST /score` with `{"samples": [{prompt, response, ground_truth, data_source,
extra_info}, ...]}` by `{"scores": [...]}`, one score per sample in order, each from
`dagrl.rewards.compute_score` (the rule of the sample's data_source). Any other service that
speaks this JSON works the same way: replace `score_samples` with a model, a sandbox, a
human-feedback queue. A request it cannot read gets HTTP 400 with `{"error": ...}`.
`GET /health` answers 200 once it is serving. It binds 127.0.0.1 unless told `--host`.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dagrl.errors import RewardError
from dagrl.rewards import compute_score

MAX_REQUEST_BYTES = 64 * 1024 * 1024


def score_samples(samples: list[dict[str, Any]]) -> list[float]:
    """One score per sample, by the rule of its data_source."""
    return [compute_score(s["data_source"], s["response"], s["ground_truth"],
                          s.get("extra_info")) for s in samples]


class RewardHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(200, {"status": "ok"})
        else:
            self._reply(404, {"error": f"no such path {self.path}; POST /score"})

    def do_POST(self) -> None:
        if self.path != "/score":
            self._reply(404, {"error": f"no such path {self.path}; POST /score"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST_BYTES:
            self._reply(413, {"error": f"request of {length} bytes is over {MAX_REQUEST_BYTES}"})
            return
        try:
            body = json.loads(self.rfile.read(length))
            samples = body["samples"]
            if not isinstance(samples, list):
                raise TypeError("samples must be a list")
            scores = score_samples(samples)
        except (ValueError, KeyError, TypeError, AttributeError, RewardError) as exc:
            self._reply(400, {"error": f"cannot score this request: {exc}"})
            return
        self._reply(200, {"scores": scores})

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a training job sends a request per chunk of samples every step."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), RewardHandler)
    host, port = server.server_address[:2]
    print(f"serving on http://{host}:{port}/score", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
