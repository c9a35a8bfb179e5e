"""Run the read API under uvicorn until SIGTERM or SIGINT, then shut down gracefully and exit 0."""

from __future__ import annotations

import contextlib
import signal
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

from graphledger.settings import Settings
from graphledger.wire import SERVER_KEEPALIVE_S
from graphledger_server import telemetry
from graphledger_server.api.app import create_app
from graphledger_server.signals import STOP_SIGNALS
from graphledger_server.telemetry import api as api_telemetry


class _Server(uvicorn.Server):
    """uvicorn's server, minus re-raising the stop signal after its graceful shutdown.

    uvicorn re-raises a caught SIGTERM/SIGINT once it has drained, so the process would die of the
    signal (exit 143, or a KeyboardInterrupt traceback) after a clean stop. Here it returns normally.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def server(settings: Settings) -> uvicorn.Server:
    """A uvicorn server for the read API on `settings.api_host:settings.api_port`, over HTTPS when
    `api_tls_certfile` and `api_tls_keyfile` are set."""
    config = uvicorn.Config(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        **tls_options(settings),
        lifespan="on",
        # In-flight reads get to finish: the longest is a consistency wait plus its query.
        timeout_graceful_shutdown=int(settings.consistency_timeout_s) + 5,
        # Idle connections outlive the client's (`client/reader.py`), so a client never sends on one the
        # server is closing.
        timeout_keep_alive=SERVER_KEEPALIVE_S,
        access_log=False,
        log_config=None,  # the process's logging setup, not uvicorn's
    )
    return _Server(config)


def tls_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's certificate options, checked first: a file that is missing, unreadable or not the
    key of its certificate stops the start with a message naming the settings."""
    if settings.api_tls_certfile is None or settings.api_tls_keyfile is None:
        return {}
    certfile, keyfile = settings.api_tls_certfile, settings.api_tls_keyfile
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"api_tls_certfile {certfile!r} with api_tls_keyfile {keyfile!r}: {reason}") from None
    return {"ssl_certfile": certfile, "ssl_keyfile": keyfile}


def main(settings: Settings | None = None) -> None:
    """Serve the read API in this process until SIGTERM or SIGINT; without `settings`
    (`python -m graphledger_server.api`), from `GRAPHLEDGER_*` variables."""
    settings = telemetry.setup("graphledger-api", settings)
    api_telemetry.started()
    server(settings).run()
