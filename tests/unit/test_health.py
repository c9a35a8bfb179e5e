"""`WorkerHealth` (live, ready, and why not), `caught_up`, the `/livez` and `/readyz` server, and the
health settings: pure, with a clock the tests move."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from pydantic import ValidationError

from graphledger.settings import Settings
from graphledger_server.devstack.ports import free_port
from graphledger_server.health.server import HealthServer, serving
from graphledger_server.health.state import WorkerHealth, caught_up
from graphledger_server.sweeper.sweep import MIN_SWEEP_WAIT_S, longest_step_s
from manual_clock import ManualClock


def test_live_until_no_step_completes_for_longer_than_the_deadline() -> None:
    clock = ManualClock()
    health = WorkerHealth(10.0, clock=clock)
    assert health.liveness().ok
    clock.now += 10.0
    assert health.liveness().ok  # exactly at the deadline: still live
    clock.now += 0.5
    verdict = health.liveness()
    assert not verdict.ok and verdict.status == "not live"
    assert verdict.detail["seconds_since_progress"] == 10.5 and verdict.detail["limit_s"] == 10.0
    assert "stuck" in verdict.detail["reason"]
    health.progressed()
    assert health.liveness().ok


def test_the_allowance_covers_a_legitimate_wait_between_steps() -> None:
    clock = ManualClock()
    health = WorkerHealth(10.0, allowance_s=60.0, clock=clock)
    clock.now += 69.0
    assert health.liveness().ok
    clock.now += 2.0
    assert not health.liveness().ok


def test_ready_only_when_told_and_live() -> None:
    clock = ManualClock()
    health = WorkerHealth(5.0, not_ready_reason="waiting for a partition assignment", clock=clock)
    verdict = health.readiness()
    assert not verdict.ok and verdict.detail == {"reason": "waiting for a partition assignment"}
    health.set_ready()
    assert health.readiness().ok and health.readiness().status == "ready"
    health.set_not_ready("a batch keeps failing: ConnectionRefusedError")
    assert health.readiness().detail["reason"] == "a batch keeps failing: ConnectionRefusedError"
    health.set_ready()
    clock.now += 6.0  # frozen: not ready either, and the body says why
    verdict = health.readiness()
    assert not verdict.ok and "stuck" in verdict.detail["reason"]


def test_a_deadline_that_cannot_work_is_refused() -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        WorkerHealth(0.0)
    with pytest.raises(ValueError, match="allowance_s"):
        WorkerHealth(1.0, allowance_s=-1.0)


def test_caught_up_ignores_paused_partitions_and_needs_a_known_lag() -> None:
    assigned = [("t", 0), ("t", 1)]
    assert caught_up([], [], {})  # no partitions: nothing to apply
    assert caught_up(assigned, [], {("t", 0): 0, ("t", 1): 0})
    assert not caught_up(assigned, [], {("t", 0): 0})  # partition 1 not fetched yet: unknown
    assert not caught_up(assigned, [], {("t", 0): 0, ("t", 1): 3})
    assert caught_up(assigned, [("t", 1)], {("t", 0): 0, ("t", 1): 3})  # stopped: cannot hold readiness back


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_server_answers_200_or_503_with_the_reason() -> None:
    clock = ManualClock()
    health = WorkerHealth(5.0, not_ready_reason="before the first try for the sweeper lock", clock=clock)
    server = HealthServer(health, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.address[1]}"
    try:
        assert _get(f"{base}/livez") == (200, {"status": "live", "seconds_since_progress": 0.0, "limit_s": 5.0})
        assert _get(f"{base}/readyz") == (
            503,
            {"status": "not ready", "reason": "before the first try for the sweeper lock"},
        )
        health.set_ready()
        assert _get(f"{base}/readyz") == (200, {"status": "ready"})
        clock.now += 7.5
        code, body = _get(f"{base}/livez?verbose=1")
        assert code == 503 and body["status"] == "not live" and body["seconds_since_progress"] == 7.5
        assert _get(f"{base}/metrics") == (404, {"status": "not found", "paths": ["/livez", "/readyz"]})
    finally:
        server.close()


def test_serving_follows_the_health_port_setting() -> None:
    health = WorkerHealth(5.0)
    with serving(Settings(), health) as server:  # type: ignore[call-arg]
        assert server is None
    port = free_port()
    with serving(Settings(health_port=port), health) as server:  # type: ignore[call-arg]
        assert server is not None and server.address == ("127.0.0.1", port)
        assert _get(f"http://127.0.0.1:{port}/livez")[0] == 200


def test_a_health_deadline_within_the_projector_backoff_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"health_deadline_s 5\.0 must exceed projector_retry_max_s 5\.0"):
        Settings(health_deadline_s=5.0)  # type: ignore[call-arg]
    assert Settings(health_deadline_s=3.0, projector_retry_max_s=1.0).health_deadline_s == 3.0  # type: ignore[call-arg]


def test_the_sweeper_allowance_covers_a_page_and_the_wait_between_sweeps() -> None:
    settings = Settings(sweeper_interval_s=120.0, produce_timeout_s=30.0)  # type: ignore[call-arg]
    assert longest_step_s(settings) == 150.0
    short = Settings(sweeper_interval_s=2.0, produce_timeout_s=30.0)  # type: ignore[call-arg]
    assert longest_step_s(short) == 30.0 + MIN_SWEEP_WAIT_S
