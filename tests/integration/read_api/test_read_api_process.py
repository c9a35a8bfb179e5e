"""`python -m graphledger_server.api` as a process: ready from its environment, it answers, and stops
cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from graphledger_server.devstack.ports import free_port, wait_until
from read_api_helpers import GET, LOG, SCHEMA


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
async def test_the_process_serves_and_stops_cleanly_on_a_signal(projection: str, stop: signal.Signals) -> None:
    await asyncio.to_thread(serve_and_stop, projection, stop)


def serve_and_stop(projection: str, stop: signal.Signals) -> None:
    """`python -m graphledger_server.api` from the environment: ready, answers, exits 0 on `stop`."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHLEDGER_")}
    env |= {
        "GRAPHLEDGER_POSTGRES_DSN": projection,
        "GRAPHLEDGER_POSTGRES_SCHEMA": SCHEMA,
        "GRAPHLEDGER_API_PORT": str(port),
        "GRAPHLEDGER_KEY_ENCRYPTION_KEYS": os.environ["GRAPHLEDGER_KEY_ENCRYPTION_KEYS"],
        **{f"GRAPHLEDGER_{name.upper()}": str(value) for name, value in LOG.items()},
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "graphledger_server.api"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def ready() -> bool:
            assert process.poll() is None, process.communicate()[0].decode()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, 30, "the read API process to be ready")
        response = httpx.post(f"http://127.0.0.1:{port}{GET}", json={"thread_id": "direct"}, timeout=5)
        assert response.status_code == 200
        assert response.json()["tuple"]["metadata"]["user"] == "alice"
        started = time.monotonic()
        process.send_signal(stop)
        output = process.communicate(timeout=15)[0].decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, output
    assert time.monotonic() - started < 10
    assert "Traceback" not in output
