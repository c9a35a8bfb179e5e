"""Capped exponential backoff and the one retry loop (`graphledger/retry.py`)."""

from __future__ import annotations

import pytest

from graphledger.retry import Backoff, retried


class Passing(Exception):
    """A failure worth waiting out."""


def test_delays_double_up_to_the_cap_and_start_again_after_a_reset() -> None:
    backoff = Backoff(0.1, 0.5)
    assert [backoff.delay() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert backoff.failures == 5
    backoff.reset()
    assert (backoff.failures, backoff.delay()) == (0, 0.1)


def test_a_backoff_that_cannot_grow_is_refused() -> None:
    with pytest.raises(ValueError, match="want 0 < initial <= max"):
        Backoff(1.0, 0.5)


async def test_an_attempt_is_retried_after_each_delay_while_its_failure_passes() -> None:
    failures = [Passing("broker away"), Passing("broker away"), None]
    waited: list[float] = []
    told: list[tuple[str, float]] = []

    async def attempt() -> str:
        failure = failures.pop(0)
        if failure is not None:
            raise failure
        return "applied"

    async def wait(delay: float) -> None:
        waited.append(delay)

    backoff = Backoff(0.1, 1.0)
    result = await retried(
        attempt,
        backoff,
        retry_if=lambda exc: isinstance(exc, Passing),
        on_retry=lambda exc, delay: told.append((str(exc), delay)),
        wait=wait,
    )
    assert result == "applied"
    assert waited == [0.1, 0.2]
    assert told == [("broker away", 0.1), ("broker away", 0.2)]
    assert backoff.failures == 0  # reset by the success


async def test_a_failure_the_caller_does_not_retry_is_raised_at_once() -> None:
    waited: list[float] = []

    async def attempt() -> None:
        raise KeyError("a bug")

    async def wait(delay: float) -> None:
        waited.append(delay)

    with pytest.raises(KeyError):
        await retried(attempt, Backoff(0.1, 1.0), retry_if=lambda exc: isinstance(exc, Passing), wait=wait)
    assert waited == []


async def test_an_asynchronous_on_retry_is_awaited_before_the_wait() -> None:
    order: list[str] = []
    attempts = iter([Passing(), None])

    async def attempt() -> int:
        failure = next(attempts)
        if failure is not None:
            raise failure
        return 1

    async def on_retry(exc: Exception, delay: float) -> None:
        order.append("told")

    async def wait(delay: float) -> None:
        order.append("waited")

    assert await retried(attempt, Backoff(0.1, 1.0), retry_if=lambda exc: True, on_retry=on_retry, wait=wait) == 1
    assert order == ["told", "waited"]
