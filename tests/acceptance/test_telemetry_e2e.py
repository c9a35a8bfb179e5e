"""One trace from the agent's span to the projection and back, metrics on every service, and no values.

A dev stack of its own, started with the standard `OTEL_*` variables pointing at a real OTLP/HTTP
receiver (`otlp_receiver.py`) and `GRAPHLEDGER_METRICS_PORT` set, runs one workload: the seed graph
invoked inside a span the test (the "application") creates, `get_state`, a store put and search, and
one malformed record that must be dead-lettered. The application's tracer provider exports the
client's spans to the same receiver. The tests then check what came out:
- the trace: producer spans are children of the application's span, the projector's apply spans link
  to every one of them, each has statement spans, and the read API's server span of every read is a
  child of the client's HTTP span; attribute names are the semantic conventions';
- each service's Prometheus endpoint: lag back to 0 on every partition, applied + dead-lettered equals
  what the topics hold, by event type, and the other metrics have sane values;
- sentinel strings put in the graph state, a store value and the malformed record appear nowhere in
  what was exported (OTLP bodies as received, Prometheus text) or logged (the services' JSON logs),
  while they do round-trip through the projection.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import ormsgpack
import pytest
from aiokafka import TopicPartition
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from prometheus_client.parser import text_string_to_metric_families

from graphledger import KafkaSaver, KafkaStore
from graphledger.embeddings import HashEmbedder
from graphledger.settings import Settings
from graphledger_server.devstack.demo import build_graph
from graphledger_server.devstack.ports import free_port_block, wait_until
from graphledger_server.devstack.stack import DevStack
from graphledger_server.telemetry import metrics as registry
from kafka_clients import raw_consumer, raw_producer
from otlp_receiver import KIND_CLIENT, KIND_CONSUMER, KIND_PRODUCER, KIND_SERVER, Link, OtlpReceiver, ReceivedSpan
from telemetry_helpers import AGENT_SERVICE, gated, sdk_tracer_provider

pytestmark = pytest.mark.slow

EXPORT_TIMEOUT_S = 60.0
RUN = uuid.uuid4().hex[:12]
STATE_SENTINEL = f"sentinel-state-{RUN}"
STORE_SENTINEL = f"sentinel-store-{RUN}"
BAD_RECORD_SENTINEL = f"sentinel-bad-{RUN}"
SENTINELS = (STATE_SENTINEL, STORE_SENTINEL, BAD_RECORD_SENTINEL)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def agent_tracer(receiver: OtlpReceiver) -> Iterator[trace.Tracer]:
    """The application's tracer: its provider exports (the client's spans too) to the receiver."""
    with gated(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces"))):
        yield sdk_tracer_provider().get_tracer("test-agent")


@pytest.fixture(scope="module")
def observed(receiver: OtlpReceiver) -> Iterator[DevStack]:
    """A dev stack whose services export to `receiver` and serve /metrics (exporters by env only)."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }
    base = Settings(metrics_port=free_port_block(3), topic_prefix=f"obs{RUN}")  # type: ignore[call-arg]
    stack = DevStack(partitions=2, base=base)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        stack.start()
    try:
        yield stack
    finally:
        stack.stop()


@dataclass(frozen=True)
class Workload:
    trace_id: str
    parent_span_id: str
    thread_id: str
    state: dict[str, Any]
    store_value: dict[str, Any] | None


async def _produce_malformed(settings: Settings) -> None:
    """A checkpoint.put whose blobs row is malformed and carries a sentinel: it must be dead-lettered."""
    payload = {
        "thread_id": f"bad-{RUN}", "checkpoint_ns": "", "checkpoint_id": "1", "parent_checkpoint_id": None,
        "checkpoint": b"{}", "metadata": b"{}", "blobs": [["channel", BAD_RECORD_SENTINEL.encode()]],
    }  # fmt: skip
    value = ormsgpack.packb({"v": 1, "type": "checkpoint.put", "id": str(uuid.uuid4()), "ts": 0, "p": payload})
    producer = raw_producer(settings)
    await producer.start()
    try:
        headers = [("gl-type", b"checkpoint.put"), ("gl-version", b"1")]
        await producer.send_and_wait(settings.checkpoint_topic, value, key=f"bad-{RUN}".encode(), headers=headers)
    finally:
        await producer.stop()


@pytest.fixture(scope="module")
def workload(observed: DevStack, agent_tracer: trace.Tracer) -> Workload:
    settings = observed.settings
    thread_id = f"obs-{RUN}"
    config = {"configurable": {"thread_id": thread_id}}
    dims = settings.store_vector_dims or 256
    with agent_tracer.start_as_current_span("agent turn") as parent:
        with KafkaSaver(settings) as saver:
            graph = build_graph().compile(checkpointer=saver)
            graph.invoke({"foo": STATE_SENTINEL, "bar": [STATE_SENTINEL]}, config)
            state = graph.get_state(config).values
        with KafkaSaver(settings) as other:  # another process's read waits for the projection of the run
            assert other.get_tuple(config) is not None
        with KafkaStore(settings, index={"dims": dims, "embed": HashEmbedder(dims), "fields": ["text"]}) as store:
            store.put(("obs", RUN), "note", {"text": STORE_SENTINEL})
            item = store.get(("obs", RUN), "note")
            _search_waiting_for_the_projector(observed, store)
    asyncio.run(_produce_malformed(settings))
    context = parent.get_span_context()
    return Workload(
        f"{context.trace_id:032x}", f"{context.span_id:016x}", thread_id, state, item.value if item else None
    )


def _search_waiting_for_the_projector(observed: DevStack, store: KafkaStore) -> None:
    """A search that arrives while the projector is stopped with the put before it unapplied: it waits
    (one consistency wait, reached once the projector goes on), then runs once more on the projection."""
    api = observed.metrics_urls()["api"]
    found: list[Any] = []
    with observed.projector_frozen():
        store.put(("obs", RUN), "later", {"text": "applied after the search arrived"})
        searching = threading.Thread(target=lambda: found.append(store.search(("obs", RUN), query="note")))
        searching.start()

        def in_flight() -> bool:
            return _total(_scrape(api), "http_server_active_requests", http_request_method="POST") >= 1

        wait_until(in_flight, EXPORT_TIMEOUT_S, "the search to reach the read API", 0.05)
    searching.join()
    assert found and found[0]


# -- the trace ----------------------------------------------------------------------------------------


def _by_kind(spans: list[ReceivedSpan], service: str, kind: int) -> list[ReceivedSpan]:
    return [s for s in spans if s.service == service and s.kind == kind]


def test_one_trace_from_the_agent_span_to_the_projection_and_the_read(
    receiver: OtlpReceiver, observed: DevStack, workload: Workload
) -> None:
    settings = observed.settings
    checkpoint_topic = settings.checkpoint_topic

    def producers() -> list[ReceivedSpan]:
        return [
            s for s in _by_kind(receiver.spans, AGENT_SERVICE, KIND_PRODUCER)
            if s.trace_id == workload.trace_id and s.attributes["messaging.destination.name"] == checkpoint_topic
        ]  # fmt: skip

    def reads() -> list[ReceivedSpan]:
        return [
            s for s in _by_kind(receiver.spans, AGENT_SERVICE, KIND_CLIENT)
            if s.trace_id == workload.trace_id and s.attributes.get("url.template") == "/v1/checkpoints/get"
        ]  # fmt: skip

    def complete() -> bool:
        linked = {link for s in _by_kind(receiver.spans, "graphledger-projector", KIND_CONSUMER) for link in s.links}
        servers = {s.parent_span_id for s in _by_kind(receiver.spans, "graphledger-api", KIND_SERVER)}
        return (
            bool(producers())
            and all(Link(p.trace_id, p.span_id) in linked for p in producers())
            and bool(reads())
            and all(r.span_id in servers for r in reads())
        )

    receiver.wait_for(complete, EXPORT_TIMEOUT_S)
    spans = list(receiver.spans)

    # Producer spans: children of the application's span, one per event, messaging conventions.
    sent = producers()
    assert len(sent) >= 7, "the seed graph makes 4 checkpoints and 3 write sets"
    for span in sent:
        assert span.parent_span_id == workload.parent_span_id
        assert span.name == f"send {checkpoint_topic}"
        assert span.attributes["messaging.system"] == "kafka"
        assert span.attributes["messaging.destination.name"] == checkpoint_topic
        assert span.attributes["messaging.operation.type"] == "send"
        # The thread's record key: its keyed hash (events are sealed), the same on every record of it.
        assert span.attributes["messaging.kafka.message.key"] == sent[0].attributes["messaging.kafka.message.key"]
        assert re.fullmatch("[0-9a-f]{32}", span.attributes["messaging.kafka.message.key"])
        assert int(span.attributes["messaging.destination.partition.id"]) in range(observed.partitions)
        assert isinstance(span.attributes["messaging.kafka.offset"], int)
    store_sends = [s for s in _by_kind(spans, AGENT_SERVICE, KIND_PRODUCER) if s.name == f"send {settings.store_topic}"]
    assert store_sends and all("messaging.kafka.message.key" not in s.attributes for s in store_sends)

    # The projector's apply spans: consumer spans linking every producer span, statement spans below.
    applies = _by_kind(spans, "graphledger-projector", KIND_CONSUMER)
    sent_links = {Link(s.trace_id, s.span_id) for s in sent}
    linking = [a for a in applies if sent_links & set(a.links)]
    assert sent_links <= {link for a in linking for link in a.links}
    for apply in linking:
        # A batch of one topic is named for it; one that also took records of another topic (the store
        # put after the run, when the projector is behind) names none, as the conventions ask.
        if "messaging.destination.name" in apply.attributes:
            assert apply.name == f"apply {checkpoint_topic}"
            assert apply.attributes["messaging.destination.name"] == checkpoint_topic
        else:
            assert apply.name == "apply"
            assert apply.attributes["messaging.batch.message_count"] > len(sent_links & set(apply.links))
        assert apply.attributes["messaging.system"] == "kafka"
        assert apply.attributes["messaging.operation.type"] == "process"
        assert apply.attributes["messaging.consumer.group.name"] == settings.projector_group_id
        assert apply.attributes["messaging.batch.message_count"] >= len(sent_links & set(apply.links))
        statements = [s for s in spans if s.parent_span_id == apply.span_id and s.trace_id == apply.trace_id]
        assert statements and all(s.kind == KIND_CLIENT for s in statements)
        for statement in statements:
            assert statement.attributes["db.system.name"] == "postgresql"
            assert statement.name == statement.attributes["db.query.summary"]
            assert statement.attributes["db.operation.name"] in statement.name
            assert statement.attributes["db.namespace"].endswith(f"|{settings.postgres_schema}")
    summaries = {s.attributes["db.query.summary"] for s in _by_kind(spans, "graphledger-projector", KIND_CLIENT)}
    assert {"INSERT checkpoints", "INSERT checkpoint_writes", "UPDATE graphledger_offsets"} <= summaries
    assert any(s.attributes.get("db.collection.name") == "checkpoints" for s in spans)

    # Every read: the client's HTTP span under the application's span, the API's server span under it.
    api_servers = {s.parent_span_id: s for s in _by_kind(spans, "graphledger-api", KIND_SERVER)}
    for client in reads():
        assert client.parent_span_id == workload.parent_span_id
        assert client.name == "POST /v1/checkpoints/get"
        assert client.attributes["http.request.method"] == "POST"
        assert client.attributes["url.full"] == f"{settings.api_url}/v1/checkpoints/get"
        assert client.attributes["http.response.status_code"] == 200
        server = api_servers[client.span_id]
        assert server.trace_id == workload.trace_id
        assert server.name == "POST /v1/checkpoints/get"
        assert server.attributes["http.route"] == "/v1/checkpoints/get"
        assert server.attributes["http.request.method"] == "POST"
        assert server.attributes["http.response.status_code"] == 200

    # The sweeper traces on its own: a root span of its own trace.
    sweeper = [s for s in spans if s.service == "graphledger-sweeper"]
    assert sweeper and all(not s.parent_span_id for s in sweeper)


# -- metrics ------------------------------------------------------------------------------------------


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Series name -> [(labels, value)] of one Prometheus text endpoint."""
    series: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return series


def _total(series: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for lbl, v in series.get(name, []) if all(lbl.get(k) == x for k, x in labels.items()))


async def _records_by_type(settings: Settings) -> Counter[str]:
    """Every record in the checkpoint and store topics, counted by `gl-type`: what was produced."""
    consumer = raw_consumer(settings)
    await consumer.start()
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic in (settings.checkpoint_topic, settings.store_topic)
            for p in range(settings.topic_partitions)
        ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        counts: Counter[str] = Counter()
        while True:
            fetched = await consumer.getmany(timeout_ms=500)
            for messages in fetched.values():
                for m in messages:
                    counts[dict(m.headers)["gl-type"].decode()] += 1
            # The fetch's high watermark (tansu's ListOffsets answer runs low): done when every
            # partition's position has reached it.
            positions = [(await consumer.position(tp), consumer.highwater(tp)) for tp in partitions]
            if not fetched and all(high is not None and pos >= high for pos, high in positions):
                return counts
    finally:
        await consumer.stop()


def test_each_service_serves_prometheus_metrics_with_sane_values(observed: DevStack, workload: Workload) -> None:
    urls = observed.metrics_urls()
    assert set(urls) == {"projector", "api", "sweeper"}
    produced = asyncio.run(_records_by_type(observed.settings))
    assert produced["checkpoint.put"] >= 5 and produced["store.put"] >= 1

    def caught_up() -> bool:
        projector = _scrape(urls["projector"])
        lags = projector.get("graphledger_projector_lag", [])
        done = _total(projector, "graphledger_projector_events_applied_total") + _total(
            projector, "graphledger_projector_events_dead_lettered_total"
        )
        return len(lags) == 2 * observed.partitions and all(v == 0 for _, v in lags) and done == sum(produced.values())

    wait_until(caught_up, EXPORT_TIMEOUT_S, "the projector's lag to return to 0 with every record counted", 0.2)
    projector = _scrape(urls["projector"])
    for event_type, count in produced.items():
        applied = _total(projector, "graphledger_projector_events_applied_total", graphledger_event_type=event_type)
        dead = _total(projector, "graphledger_projector_events_dead_lettered_total", graphledger_event_type=event_type)
        assert applied + dead == count, event_type
    assert _total(projector, "graphledger_projector_events_dead_lettered_total") == 1
    batches = _total(projector, "graphledger_projector_batch_size_count")
    assert 1 <= batches <= sum(produced.values())
    assert _total(projector, "graphledger_projector_batch_size_sum") == sum(produced.values())
    assert _total(projector, "graphledger_projector_apply_duration_seconds_count") == batches
    assert 0 < _total(projector, "graphledger_projector_apply_duration_seconds_sum") < 60 * batches
    freshness = _total(projector, "graphledger_projector_freshness_seconds_count")
    assert freshness >= batches
    # The malformed record's timestamp is its produce time too: every observation is recent.
    assert 0 <= _total(projector, "graphledger_projector_freshness_seconds_sum") < 60 * freshness
    topics = {lbl["messaging_destination_name"] for lbl, _ in projector["graphledger_projector_lag"]}
    assert topics == {observed.settings.checkpoint_topic, observed.settings.store_topic}

    api = _scrape(urls["api"])
    get = {"http_route": "/v1/checkpoints/get", "http_response_status_code": "200", "http_request_method": "POST"}
    # The other process's get; the turn's own read of its new thread is proved new in the client.
    assert _total(api, "http_server_request_duration_seconds_count", **get) >= 1
    key_filter = {"http_route": "/v1/checkpoints/key-filter", "http_response_status_code": "200"}
    assert _total(api, "http_server_request_duration_seconds_count", **key_filter) >= 1
    assert 0 < _total(api, "http_server_request_duration_seconds_sum", **get) < 60
    waits = "graphledger_api_consistency_wait_duration_seconds_count"
    assert _total(api, waits, graphledger_consistency_outcome="reached") >= 1
    assert _total(api, "graphledger_api_consistency_timeouts_total") == 0
    # The search ran ahead of the log's end, was discarded, and ran again after its wait: counted once.
    assert _total(api, "graphledger_api_store_search_duration_seconds_count", graphledger_search_mode="vector") == 1

    sweeper = _scrape(urls["sweeper"])
    assert sweeper["graphledger_sweeper_expirations_total"] == [({}, 0.0)] or all(
        v == 0 for _, v in sweeper["graphledger_sweeper_expirations_total"]
    )

    # Every graphledger or HTTP series a service serves is one the registry declares.
    known = registry.prometheus_series()
    for scraped in (projector, api, sweeper):
        ours = {name for name in scraped if name.startswith(("graphledger_", "http_server_"))}
        assert ours <= set(known), ours - set(known)


# -- logs and the absence of values --------------------------------------------------------------------


def test_service_logs_are_json_lines_with_trace_ids_inside_spans(
    receiver: OtlpReceiver, observed: DevStack, workload: Workload
) -> None:
    receiver.wait_for(lambda: any(s.service == "graphledger-sweeper" for s in receiver.spans), EXPORT_TIMEOUT_S)
    span_ids = {(s.trace_id, s.span_id) for s in receiver.spans}
    in_spans: dict[str, list[dict[str, Any]]] = {}
    for name in ("projector", "api", "sweeper"):
        path = observed.log_dir / f"{name}.log"
        for line in path.read_text().splitlines():
            entry = json.loads(line)  # every line: one JSON object
            assert {"time", "level", "logger", "message"} <= set(entry), line
            if "trace_id" in entry:
                in_spans.setdefault(name, []).append(entry)
    # The sweeper's start line and the projector's dead-letter line are written inside spans that
    # were exported: their ids lead to them.
    assert any((e["trace_id"], e["span_id"]) in span_ids for e in in_spans.get("sweeper", []))
    dead = [e for e in in_spans.get("projector", []) if e["message"].startswith("dead letter")]
    assert dead and all((e["trace_id"], e["span_id"]) in span_ids for e in dead)


def test_no_checkpoint_or_store_value_is_exported_or_logged(
    receiver: OtlpReceiver, observed: DevStack, workload: Workload
) -> None:
    # The values did travel: through Kafka into the projection and back.
    assert STATE_SENTINEL in workload.state["bar"]
    assert workload.store_value == {"text": STORE_SENTINEL}
    receiver.wait_for(lambda: any(m.service == "graphledger-projector" for m in receiver.metrics), EXPORT_TIMEOUT_S)

    exported = b"".join(receiver.bodies)
    scraped = "".join(httpx.get(url, timeout=5).text for url in observed.metrics_urls().values())
    logs = {name: (observed.log_dir / f"{name}.log").read_text() for name in ("projector", "api", "sweeper")}
    # The searches can see: ids, topics and names do appear where values must not.
    assert observed.settings.checkpoint_topic.encode() in exported and observed.settings.checkpoint_topic in scraped
    assert workload.thread_id.encode() not in exported  # record keys are keyed hashes of the thread id
    assert observed.settings.checkpoint_topic in logs["projector"]
    for sentinel in SENTINELS:
        assert sentinel.encode() not in exported, f"{sentinel} in an OTLP export"
        assert sentinel not in scraped, f"{sentinel} in a /metrics page"
        for name, text in logs.items():
            assert sentinel not in text, f"{sentinel} in the {name} log"
    assert os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") is None, "the stack's OTEL_* must not leak into the test env"
