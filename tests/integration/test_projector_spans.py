"""The projector's spans on real Postgres: one consumer span per batch linking its producers, a span per
statement under it, and no value in any of them. The rest of graphledger.telemetry is `unit/test_telemetry.py`,
the whole pipeline `acceptance/test_telemetry_e2e.py`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
from opentelemetry.trace import SpanKind

from graphledger.events.checkpoint import ThreadCopy
from graphledger.log.records import LogRecord
from graphledger.opening.records import DeadLetter
from graphledger.settings import Settings
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.migrate import migrate
from graphledger_server.telemetry.projector import ProjectorTelemetry
from projection_helpers import TOPIC, put, record
from telemetry_helpers import captured_spans


async def test_a_batch_gets_a_consumer_span_with_links_and_a_span_per_statement(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    await migrate(settings.postgres_dsn, settings.postgres_schema)
    letters: list[DeadLetter] = []

    async def sink(batch: Any) -> None:
        letters.extend(batch)

    projections = {TOPIC: CheckpointProjection(settings.postgres_schema)}
    applier = BatchApplier(settings.postgres_schema, settings.projector_group_id, projections, sink)
    secret = f"value-{uuid.uuid4().hex}"
    producer = f"00-{0x1234:032x}-{0x5678:016x}-01".encode()
    records = [
        record(put("t", 1, blobs={"messages": secret.encode()}), 0, 0),
        LogRecord(TOPIC, 0, 1, b"t", b"\x92not an envelope", (("gl-type", b"checkpoint.put"),)),
        record(ThreadCopy("t", "u"), 1, 0),
    ]
    records = [
        LogRecord(r.topic, r.partition, r.offset, r.key, r.value, (*r.headers, ("traceparent", producer)), 1000)
        for r in records
    ]
    telemetry = ProjectorTelemetry(settings)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        with captured_spans() as exporter:
            with telemetry.batch(conn, records) as observed:
                result = observed.result = await applier.apply(observed.conn, records)
    finally:
        await conn.close()
    assert result.applied_by_type == {"checkpoint.put": 1, "thread.copy": 1}
    assert result.dead_letters_by_type == {"checkpoint.put": 1} and len(letters) == 1
    spans = exporter.get_finished_spans()
    (apply,) = [s for s in spans if s.kind == SpanKind.CONSUMER]
    assert apply.name == f"apply {TOPIC}"
    assert [(link.context.trace_id, link.context.span_id) for link in apply.links] == [(0x1234, 0x5678)]
    assert apply.attributes["messaging.batch.message_count"] == 3
    assert apply.attributes["graphledger.batch.dead_letters"] == 1
    statements = [s for s in spans if s.kind == SpanKind.CLIENT]
    assert statements and all(s.parent.span_id == apply.context.span_id for s in statements)  # type: ignore[union-attr]
    summaries = [s.attributes["db.query.summary"] for s in statements]
    assert summaries[0] == "SELECT graphledger_offsets"  # the offset locks come first
    assert {"INSERT checkpoints", "INSERT checkpoint_blobs", "INSERT graphledger_dead_letters"} <= set(summaries)
    assert any(s.startswith("INSERT graphledger_copy_stages graphledger_staged_checkpoints") for s in summaries)
    assert secret not in repr([(s.name, dict(s.attributes), s.events) for s in spans])
    assert telemetry.lag == {}  # no consumer yet: nothing to compare the offsets with
