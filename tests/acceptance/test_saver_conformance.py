"""The PyPI suite `langgraph-checkpoint-conformance` against KafkaSaver, through broker, projector and read API."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, DetectedCapabilities

from graphledger import KafkaSaver


def test_every_capability_is_detected(stack) -> None:
    detected = DetectedCapabilities.from_instance(KafkaSaver(stack.settings))
    assert detected.missing == frozenset()


@pytest.mark.parametrize("capability", sorted(c.value for c in ALL_CAPABILITIES))
async def test_conformance(stack, capability: str) -> None:
    @checkpointer_test(name="KafkaSaver")
    async def kafka_saver():
        async with KafkaSaver(stack.settings) as saver:
            yield saver

    report = await validate(kafka_saver, capabilities={capability})
    result = report.results[capability]
    assert result.detected
    assert result.passed, f"{capability}: {result.tests_failed} failed: {result.failures}"
