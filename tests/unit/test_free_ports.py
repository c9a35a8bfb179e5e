"""The dev stack picks its services' ports below the kernel's ephemeral range: a port from that range can
become the local port of an outgoing connection (another test worker's) before the service binds it."""

from __future__ import annotations

import random
import socket

import pytest

from graphledger_server.devstack import ports
from graphledger_server.devstack.ports import LOWEST_PORT, _ephemeral_start, free_port, free_port_block


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound() -> None:
    below = _ephemeral_start()
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= port < below for port in ports)
    assert len(ports) > 1  # at random, so that two workers' stacks seldom pick the same
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))


def test_a_port_handed_out_is_not_handed_out_again_before_its_service_binds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dev stack picks a worker's health port after the metrics ports of services it starts later:
    the pick must not land on one of them, free as they still are."""
    base = free_port_block(3)
    picks = iter([base + 1, base + 2, base])
    draw = random.randrange
    monkeypatch.setattr(ports.random, "randrange", lambda low, high: next(picks, None) or draw(low, high))
    assert free_port() not in {base, base + 1, base + 2}
