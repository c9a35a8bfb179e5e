"""Topics that hold records, so that consistency tokens can name offsets within the log (`filled_log`
in conftest.py): every partition of the checkpoint and store topics holds `FILLER_RECORDS` records keyed
`FILLER_KEY`, no thread's or item's, so a read of a thread or item finds none of its own there."""

from __future__ import annotations

from graphledger.settings import Settings
from graphledger_server.log.topics import ensure_topics
from kafka_clients import raw_producer

FILLER_RECORDS = 10
FILLER_KEY = b"filler"


async def fill_topics(settings: Settings) -> None:
    await ensure_topics(settings)
    producer = raw_producer(settings)
    await producer.start()
    try:
        for topic in (settings.checkpoint_topic, settings.store_topic):
            for partition in range(settings.topic_partitions):
                for _ in range(FILLER_RECORDS):
                    await producer.send_and_wait(topic, b"filler", key=FILLER_KEY, partition=partition)
    finally:
        await producer.stop()
