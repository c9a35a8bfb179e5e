"""The dev stack picks its services' ports below the kernel's ephemeral range: a port from that range can
become the local port of an outgoing connection (another test worker's) before the service binds it."""

from __future__ import annotations

import socket

from graphledger_server.devstack.ports import LOWEST_PORT, _ephemeral_start, free_port


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound() -> None:
    below = _ephemeral_start()
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= port < below for port in ports)
    assert len(ports) > 1  # at random, so that two workers' stacks seldom pick the same
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))
