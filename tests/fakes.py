"""Stand-ins for what a client talks to, so client tests run as unit tests without a broker or a server.

- `FakeTopics`: every client a test builds publishes into it instead of to Kafka (`FakePublisher`, in
  place of `EventPublisher`); it keeps each event as a consumer would decode it, with the partition a
  Kafka producer would choose and the next offset there, so consistency tokens look as on a broker.
- `FakeReadApi`: a read API on a local port answering `POST /v1/store/batch` from canned results and
  recording every request, so the client's real HTTP path (msgpack bodies, headers) is what is tested.

Unit tests get them from `tests/unit/conftest.py`. Integration and acceptance tests never use them:
they run against the real broker, Postgres and read API.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import ormsgpack
from aiokafka.partitioner import murmur2
from opentelemetry.context import Context

from graphledger.events import Event, checkpoint_event, envelope, store_event
from graphledger.events.envelope import Envelope
from graphledger.settings import Settings
from graphledger.wire import MSGPACK


def client_settings(api_url: str = "http://127.0.0.1:9", **overrides: Any) -> Settings:
    """Settings of a client whose reads go to `api_url`. It never fetches the log's tail itself
    (`client_log_reads`): that needs the producer's connection to a broker. It publishes in the clear
    unless told otherwise: these fakes hold no key store (sealing is tested against the real one)."""
    values = {"api_url": api_url, "client_log_reads": False, "encrypt_events": False, **overrides}
    return Settings(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Published:
    """One event a fake publisher took, where a broker would have put it."""

    topic: str
    partition: int
    offset: int
    key: str | None
    event: Event


class FakeTopics:
    """What the clients of one test published, in order, over every topic."""

    def __init__(self) -> None:
        self.records: list[Published] = []
        self._ends: dict[tuple[str, int], int] = {}

    def publisher(self, settings: Settings) -> FakePublisher:
        """A publisher for one client (built where the client would build an `EventPublisher`)."""
        return FakePublisher(self, settings)

    def events(self, topic: str | None = None) -> list[Event]:
        return [r.event for r in self.records if topic is None or r.topic == topic]

    def append(self, topic: str, partition: int, key: str | None, event: Event) -> tuple[str, int, int]:
        offset = self._ends.get((topic, partition), 0)
        self._ends[(topic, partition)] = offset + 1
        self.records.append(Published(topic, partition, offset, key, event))
        return topic, partition, offset


class FakePublisher:
    """`EventPublisher`'s interface over `FakeTopics`: each event is acknowledged at once, as one record."""

    def __init__(self, topics: FakeTopics, settings: Settings) -> None:
        self._topics = topics
        self._settings = settings
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    @property
    def kafka_client(self) -> Any:
        raise AssertionError("a fake publisher has no Kafka connection: build the client with client_settings()")

    async def partitions(self, topic: str) -> list[int]:
        return list(range(self._settings.topic_partitions))

    async def publish(
        self,
        topic: str,
        key: str | None,
        event: Envelope,
        *,
        context: Context | None = None,
        partition: int | None = None,
    ) -> list[tuple[str, int, int]]:
        assert self.started, "publisher not started"
        decoded = envelope.decode(envelope.encode(event))  # what a consumer of the topic would read
        typed = store_event(decoded) if topic == self._settings.store_topic else checkpoint_event(decoded)
        if partition is None:
            # The Kafka producer's default partitioner for keyed records.
            assert key is not None, "an event without a key names its partition"
            partition = (murmur2(key.encode()) & 0x7FFFFFFF) % self._settings.topic_partitions
        return [self._topics.append(topic, partition, key, typed)]


class FakeReadApi:
    """Answers `POST /v1/store/batch` op by op with `answer(op)`; records path, headers and body."""

    def __init__(self, answer: Callable[[dict[str, Any]], Any]) -> None:
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.answer = answer
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = ormsgpack.unpackb(self.rfile.read(int(self.headers["Content-Length"])))
                with api._lock:
                    api.requests.append((self.path, dict(self.headers), body))
                try:
                    status, payload = 200, ormsgpack.packb({"results": [api.answer(op) for op in body["ops"]]})
                except Exception as exc:
                    status, payload = 500, ormsgpack.packb({"error": "boom", "message": str(exc), "retryable": False})
                self.send_response(status)
                self.send_header("Content-Type", MSGPACK)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # `shutdown` waits for the serving loop's next look at its flag: every 20 ms, not the default 0.5 s.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def ops(self) -> list[list[dict[str, Any]]]:
        return [body["ops"] for _, _, body in self.requests]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
