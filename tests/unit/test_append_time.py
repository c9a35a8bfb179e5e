"""An event's time is its record's (the broker's at its first append), never its writer's clock: the
rule (`envelope.append_time_ms`), the header a copy carries it in, and what each reader makes of it."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from aiokafka.structs import ConsumerRecord

from graphledger.errors import InvalidEventError, TimestampTypeError
from graphledger.events import envelope, to_envelope
from graphledger.events.envelope import HEADER_APPENDED, MAX_EPOCH_MS, append_time_ms
from graphledger.log.records import LogRecord
from graphledger.opening.checkpoint_events import TimedCheckpointEvent
from graphledger.opening.records import DeadLetter, Decoded, classify, with_append_time
from graphledger_server.log.topics import LOG_APPEND_TIME, check_timestamp_type
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.dead_letters import outgoing_records
from graphledger_server.projector.worker import _warn_of_create_time
from projection_helpers import TOPIC, put

APPENDED = 1_767_225_600_000
HOUR = 3_600_000


def _carrying(ms: int | str) -> list[tuple[str, bytes]]:
    return [(HEADER_APPENDED, str(ms).encode())]


def test_an_events_time_is_its_records_timestamp() -> None:
    assert append_time_ms(APPENDED, ()) == APPENDED
    assert append_time_ms(0, None) == 0


def test_a_copy_keeps_the_time_it_carries_and_no_header_dates_an_event_forward() -> None:
    assert append_time_ms(APPENDED + HOUR, _carrying(APPENDED)) == APPENDED  # a copy, appended later
    assert append_time_ms(APPENDED, _carrying(APPENDED + HOUR)) == APPENDED  # a writer claiming the future
    assert append_time_ms(-1, _carrying(APPENDED)) == APPENDED  # a record without a timestamp of its own


@pytest.mark.parametrize(
    ("timestamp", "headers", "error"),
    [
        (-1, [], "carries no timestamp"),
        (APPENDED, _carrying("soon"), "is not a time in ms"),
        (APPENDED, _carrying(-5), "is not a time in ms"),
        (APPENDED, _carrying("١٢٣"), "is not a time in ms"),  # digits, not ASCII ones
        (APPENDED, _carrying(10**20), "is not a time in ms"),
        (MAX_EPOCH_MS + 1, [], "is not a time between 1970 and 9999"),
    ],
)
def test_a_record_without_a_time_is_an_invalid_event(timestamp: int, headers: list, error: str) -> None:
    with pytest.raises(InvalidEventError, match=error):
        append_time_ms(timestamp, headers)


def test_an_envelope_copied_with_its_time_carries_it_in_a_header() -> None:
    env = to_envelope(put("t", 1))
    assert envelope.header(envelope.headers_for(env), HEADER_APPENDED) is None
    copied = dataclasses.replace(env, appended_ms=APPENDED)
    assert envelope.header(envelope.headers_for(copied), HEADER_APPENDED) == str(APPENDED).encode()
    assert envelope.encode(copied) == envelope.encode(env)  # the value is the same event
    assert envelope.decode(envelope.encode(copied)).appended_ms is None


@pytest.mark.parametrize("skew", [HOUR, -HOUR])
def test_a_writer_whose_clock_is_off_does_not_date_its_event(skew: int) -> None:
    env = dataclasses.replace(to_envelope(put("t", 1)), produced_ms=APPENDED + skew)
    record = LogRecord(TOPIC, 0, 0, b"t", envelope.encode(env), tuple(envelope.headers_for(env)), APPENDED)
    decoded = classify(record, CheckpointProjection("gl").to_event)
    assert isinstance(decoded, Decoded) and isinstance(decoded.event, TimedCheckpointEvent)
    assert decoded.event.ts_ms == APPENDED


def test_a_record_without_a_time_is_dead_lettered() -> None:
    env = to_envelope(put("t", 1))
    record = LogRecord(TOPIC, 0, 0, b"t", envelope.encode(env), tuple(envelope.headers_for(env)))
    letter = classify(record, CheckpointProjection("gl").to_event)
    assert isinstance(letter, DeadLetter) and "no timestamp" in letter.reason


def test_a_dead_letter_is_a_copy_carrying_its_events_time() -> None:
    env = to_envelope(put("t", 1))
    record = LogRecord(TOPIC, 0, 7, b"t", envelope.encode(env), (*envelope.headers_for(env),), APPENDED + HOUR)
    assert envelope.header(with_append_time(record), HEADER_APPENDED) == str(APPENDED + HOUR).encode()
    copy = dataclasses.replace(record, headers=(*record.headers, *_carrying(APPENDED)))
    headers = with_append_time(copy)
    assert [v for k, v in headers if k == HEADER_APPENDED] == [str(APPENDED).encode()]  # one, the earlier
    (out,) = outgoing_records(DeadLetter(copy, "bad", env.type, copy.value), 1_000_000)
    assert envelope.header(out.headers, HEADER_APPENDED) == str(APPENDED).encode()
    timeless = dataclasses.replace(record, timestamp=-1)
    assert with_append_time(timeless) == timeless.headers


def test_topics_ensure_refuses_a_source_topic_stamped_with_its_writers_clock() -> None:
    check_timestamp_type("p.checkpoints", LOG_APPEND_TIME)
    check_timestamp_type("p.checkpoints", None)  # the broker did not say (tansu, for a topic made without it)
    with pytest.raises(
        TimestampTypeError, match=r"p\.checkpoints has message\.timestamp\.type=CreateTime.*--add-config"
    ):
        check_timestamp_type("p.checkpoints", "CreateTime")


def _consumed(topic: str, timestamp_type: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic, 0, 0, APPENDED, timestamp_type, b"k", b"v", None, 1, 1, ())


def test_the_projector_warns_once_per_topic_of_records_stamped_by_their_producers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    warned: set[str] = set()
    with caplog.at_level(logging.WARNING):
        _warn_of_create_time(_consumed("a", 1), warned)  # LogAppendTime: the broker's clock
        for _ in range(3):
            _warn_of_create_time(_consumed("b", 0), warned)
    assert warned == {"b"}
    assert [r.getMessage().split(" carry")[0] for r in caplog.records] == ["records of b"]
