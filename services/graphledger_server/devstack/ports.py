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


_handed_out: set[int] = set()
"""Every port this process chose: free when chosen, it stays free until its service binds it, so a later
choice could take it again (a worker's health port the metrics port of a service not started yet)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on and this process has not handed out, for a service started next. Chosen
    at random below the kernel's ephemeral range: a port from that range (what binding port 0 gives) can
    become the local port of any outgoing connection before the service binds it, which two test
    workers' connections made happen."""
    below = _ephemeral_start()
    if below - LOWEST_PORT >= 1_000:
        for _ in range(100):
            port = random.randrange(LOWEST_PORT, below)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        port = int(sock.getsockname()[1])
    _handed_out.add(port)
    return port


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux; elsewhere IANA's 49152)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49_152


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """A base port with `count` consecutive free ports not handed out before (the dev stack gives each
    service one metrics port); all of them count as handed out."""
    for _ in range(50):
        base = free_port(host)  # handed out now, the rest of the block once it is all free
        rest = range(base + 1, base + count)
        if base + count - 1 <= 65535 and all(p not in _handed_out and _bindable(host, p) for p in rest):
            _handed_out.update(rest)
            return base
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
