"""Free loopback ports and waiting on a condition with a deadline (never a bare sleep)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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
