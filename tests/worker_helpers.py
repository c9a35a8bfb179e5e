"""An in-process projector, publishing checkpoint events to chosen partitions and reading `/livez` and
`/readyz`: for the worker health and Kafka group offset tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaProducer

from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import CheckpointEvent
from graphledger.settings import Settings
from graphledger_server.projector.main import run_projector
from kafka_clients import raw_producer
from polling import WAIT_S


@contextlib.asynccontextmanager
async def running_projector(settings: Settings) -> AsyncIterator[asyncio.Task[None]]:
    """A projector in this process (its health served when `health_port` is set), stopped gracefully on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)


@contextlib.asynccontextmanager
async def producer_for(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    producer = raw_producer(settings)
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def publish(producer: AIOKafkaProducer, settings: Settings, event: CheckpointEvent, partition: int) -> int:
    """Publish one event to one partition of the checkpoint topic, alone in its batch; returns its offset."""
    env = to_envelope(event)
    value, headers = envelope.encode(env), envelope.headers_for(env)
    topic = settings.checkpoint_topic
    meta = await producer.send_and_wait(topic, value, key=b"k", headers=headers, partition=partition)
    return meta.offset


def probe(url: str) -> tuple[int, dict[str, Any]]:
    """GET a health endpoint: (status code, JSON body); a refused connection is (0, {})."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError:
        return 0, {}


async def aprobe(url: str) -> tuple[int, dict[str, Any]]:
    return await asyncio.to_thread(probe, url)
