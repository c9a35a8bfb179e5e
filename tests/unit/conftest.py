"""Unit-test fixtures: the in-memory fakes a client test runs against (`fakes.py`), never a server, and
the Helm chart's value sets rendered once for the run (`chart_checks.py`)."""

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


@pytest.fixture(scope="session")
def rendered() -> dict[str, dict[str, str]]:
    """Each value set of the chart rendered once for the run (`test_chart_*.py`), by path of the output file."""
    from chart_checks import VALUE_SETS, load_values, render  # Helm's SDK, loaded only by the chart's tests

    return {name: render(load_values(name)) for name in VALUE_SETS}
