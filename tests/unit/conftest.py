"""Unit-test fixtures: the in-memory fakes a client test runs against (`fakes.py`), never a server."""

from __future__ import annotations

import pytest

from fakes import FakeTopics
from graphledger.client import runtime


@pytest.fixture
def topics(monkeypatch: pytest.MonkeyPatch) -> FakeTopics:
    """Every client the test builds publishes here instead of to Kafka."""
    fake = FakeTopics()
    monkeypatch.setattr(runtime, "EventPublisher", fake.publisher)
    return fake
