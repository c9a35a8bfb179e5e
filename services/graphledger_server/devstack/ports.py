"""Free loopback ports and waiting on a condition with a deadline (never a bare sleep)."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from pathlib import Path

LOWEST_PORT = 10_000
"""Where the ports handed out here start (below it: well-known and registered services)."""
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a service started next. Chosen at random below the kernel's
    ephemeral range: a port from that range (what binding port 0 gives) can become the local port of any
    outgoing connection before the service binds it, which two test workers' connections made happen."""
    below = _ephemeral_start()
    if below - LOWEST_PORT >= 1_000:
        for _ in range(100):
            port = random.randrange(LOWEST_PORT, below)
            with socket.socket() as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux; elsewhere IANA's 49152)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49_152


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """A base port with `count` consecutive free ports (the dev stack gives each service one metrics port)."""
    for _ in range(50):
        base = free_port(host)
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no block of {count} free ports on {host}")


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
    """Poll `condition` until it is true; raise TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


def port_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False
