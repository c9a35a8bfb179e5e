"""`/livez` and `/readyz` of a worker on their own port, answered from a thread of their own.

A thread, not the worker's event loop: a loop that is blocked (a synchronous call that never returns)
could not answer at all, and Kubernetes would see a timeout instead of the reason. 200 when healthy,
503 when not, with a JSON body that says why (`{"status": "not live", "reason": ...}`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from graphledger.settings import Settings
from graphledger_server.health.state import Verdict, WorkerHealth

log = logging.getLogger(__name__)

LIVEZ = "/livez"
READYZ = "/readyz"


class HealthServer:
    """Serves one `WorkerHealth` over HTTP until `close`."""

    def __init__(self, health: WorkerHealth, host: str, port: int) -> None:
        probes = {LIVEZ: health.liveness, READYZ: health.readiness}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                probe = probes.get(self.path.split("?", 1)[0])
                if probe is None:
                    self._answer(404, {"status": "not found", "paths": sorted(probes)})
                    return
                verdict: Verdict = probe()
                self._answer(200 if verdict.ok else 503, {"status": verdict.status, **verdict.detail})

            def _answer(self, code: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: no access log
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)
        self._thread.start()
        self.address: tuple[str, int] = (host, self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@contextmanager
def serving(settings: Settings, health: WorkerHealth) -> Iterator[HealthServer | None]:
    """Serve `health` on `health_host:health_port` while the block runs (nothing when the port is unset)."""
    if not settings.health_port:
        yield None
        return
    server = HealthServer(health, settings.health_host, settings.health_port)
    log.info("health: %s and %s on http://%s:%d", LIVEZ, READYZ, *server.address)
    try:
        yield server
    finally:
        server.close()
