"""Every panel of the Grafana dashboards, evaluated by a real Prometheus against a dev stack at work.

A dev stack of its own serves each service's `/metrics`; a Prometheus (Debian's binary) scrapes them
every second and evaluates the alert rules. The workload goes through `KafkaSaver` and `KafkaStore`
(graph runs, state reads, a store put, a vector search and a filter search), plus what an operator's
panels are for: a malformed record (dead-lettered), an event from a newer graphledger (a parked
subject), a store search while the projector is frozen (a 503 consistency timeout), sweeps every
second. Then each query of each panel of `docker/grafana/dashboards/*.json` must return data (a finite
value) through Prometheus's HTTP API, unless its panel's description says when it is empty ("Empty
while ..."). The alert rules must load and evaluate without error, and the alerts the workload
provokes must be pending or firing.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from graphledger import KafkaSaver, KafkaStore
from graphledger.embeddings import HashEmbedder
from graphledger.events import envelope, to_envelope
from graphledger.events.envelope import Envelope
from graphledger.settings import Settings
from graphledger_server.devstack.demo import build_graph
from graphledger_server.devstack.ports import free_port_block, wait_until
from graphledger_server.devstack.stack import DevStack
from kafka_clients import raw_producer
from projection_helpers import put
from prometheus_server import PrometheusServer

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "docker" / "grafana" / "dashboards").glob("*.json"))
RULES = ROOT / "charts" / "graphledger" / "files" / "prometheus-rules.yaml"
RUN = uuid.uuid4().hex[:10]
WAIT_S = 120.0
THREADS = 4
# Grafana's variables: a window long enough to hold the whole workload, the dashboard's range.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "15s", "$__range": "1h", "${datasource}": ""}
MAY_BE_EMPTY = re.compile(r"\bEmpty while\b")
WORKLOAD_ALERTS = {"GraphledgerSubjectsParked", "GraphledgerDeadLettersOutstanding", "GraphledgerConsistencyTimeouts"}


@pytest.fixture(scope="module")
def observed() -> Iterator[DevStack]:
    """A dev stack of its own: metrics ports, a 1 s consistency timeout, a sweep every second."""
    base = Settings(  # type: ignore[call-arg]
        metrics_port=free_port_block(3),
        topic_prefix=f"dash{RUN}",
        consistency_timeout_s=1.0,
        sweeper_interval_s=1.0,
    )
    with DevStack(partitions=2, base=base) as dev:
        yield dev


@pytest.fixture(scope="module")
def prometheus(observed: DevStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    with PrometheusServer(tmp_path_factory.mktemp("prometheus"), observed.metrics_urls(), [RULES]) as server:
        wait_until(lambda: _targets_up(server, len(observed.metrics_urls())), WAIT_S, "every target to be scraped")
        yield server


def _targets_up(server: PrometheusServer, count: int) -> bool:
    active = server.api("targets")["activeTargets"]
    return len(active) == count and all(target["health"] == "up" for target in active)


async def _produce(settings: Settings) -> None:
    """A record that cannot be decoded (dead-lettered), then an event from a newer graphledger on
    partition 1 (which parks its subject)."""
    producer = raw_producer(settings)
    await producer.start()
    try:
        headers = [("gl-type", b"checkpoint.put"), ("gl-version", b"1")]
        await producer.send_and_wait(
            settings.checkpoint_topic, b"\xc1 not msgpack", key=b"bad", headers=headers, partition=0
        )
        current = to_envelope(put(f"newer-{RUN}", 1))
        newer = Envelope(current.type, current.event_id, current.produced_ms, current.payload, version=99)
        await producer.send_and_wait(
            settings.checkpoint_topic,
            envelope.encode(newer),
            key=b"newer",
            headers=envelope.headers_for(newer),
            partition=1,
        )
    finally:
        await producer.stop()


@pytest.fixture(scope="module")
def workload(observed: DevStack, prometheus: PrometheusServer) -> str:
    """What agents and faults do once: graph runs, a store put, a dead letter, a parked subject; the
    checkpoint topic's name."""
    settings = observed.settings
    with KafkaSaver(settings) as saver:
        graph = build_graph().compile(checkpointer=saver)
        for n in range(THREADS):
            config = {"configurable": {"thread_id": f"dash-{RUN}-{n}"}}
            graph.invoke({"foo": ""}, config)
            assert graph.get_state(config).values
    with _store(settings) as store:
        store.put(("dash", RUN), "note", {"text": "a note for the dashboard", "kind": "note"})
    asyncio.run(_produce(settings))
    return settings.checkpoint_topic


def _store(settings: Settings) -> KafkaStore:
    dims = settings.store_vector_dims or 256
    return KafkaStore(settings, index={"dims": dims, "embed": HashEmbedder(dims), "fields": ["text"]})


def _traffic_round(stack: DevStack, saver: KafkaSaver, store: KafkaStore, round_: int) -> None:
    """One round of traffic: a store put (a projector batch), state reads, both kinds of store search,
    and a store search while the projector is frozen after a put (503 after consistency_timeout_s).
    A rate needs a series to grow between two scrapes, so the test repeats rounds until every panel
    has data, as steady traffic would."""
    store.put(("dash", RUN), f"round-{round_}", {"text": f"round {round_}", "kind": "round"})
    for n in range(THREADS):
        assert saver.get_tuple({"configurable": {"thread_id": f"dash-{RUN}-{n}"}}) is not None
    assert store.search(("dash", RUN), query="note")
    assert store.search(("dash", RUN), filter={"kind": "note"})
    pid = stack.pids()["projector"]
    os.kill(pid, signal.SIGSTOP)
    try:
        store.put(("dash", RUN), f"unapplied-{round_}", {"text": "acknowledged, not applied", "kind": "round"})
        body = {"ops": [{"op": "search", "namespace_prefix": ["dash", RUN]}]}
        response = httpx.post(f"{stack.settings.api_url}/v1/store/batch", json=body, timeout=30)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert response.status_code == 503 and response.json()["error"] == "consistency_timeout", response.text


def _targets() -> list[tuple[str, dict[str, Any], str]]:
    """(dashboard file, panel, query) of every query of every panel."""
    found = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                found.append((path.name, panel, target["expr"]))
    return found


def _grafana_expanded(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
    return expr


def _has_data(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def test_every_dashboard_query_returns_data(observed: DevStack, prometheus: PrometheusServer, workload: str) -> None:
    targets = _targets()
    assert targets and DASHBOARDS
    required = [(name, panel, expr) for name, panel, expr in targets if not MAY_BE_EMPTY.search(panel["description"])]
    missing: list[str] = []

    settings = observed.settings
    with KafkaSaver(settings) as saver, _store(settings) as store:
        rounds = iter(range(10**6))

        def all_have_data() -> bool:
            _traffic_round(observed, saver, store, next(rounds))
            missing[:] = [
                f"{name} {panel['title']!r}: {expr}"
                for name, panel, expr in required
                if not _has_data(prometheus.query(_grafana_expanded(expr)))
            ]
            return not missing

        try:
            wait_until(all_have_data, WAIT_S, "every panel query to return data", poll_s=0.5)
        except TimeoutError:
            raise AssertionError("panels without data:\n" + "\n".join(missing)) from None
    # The exempt ones are still valid PromQL (a syntax error would raise here).
    for _, panel, expr in targets:
        if MAY_BE_EMPTY.search(panel["description"]):
            prometheus.query(_grafana_expanded(expr))


def test_every_panel_that_may_be_empty_says_when(prometheus: PrometheusServer) -> None:
    exempt = {panel["title"] for _, panel, _ in _targets() if MAY_BE_EMPTY.search(panel["description"])}
    assert exempt == {
        "Failed batches",
        "Stopped partitions",
        "Kafka offset commit failures",
        "Erased records skipped",
        "Replay progress",
        "Thread reads by how the pod answered them",
    }


def test_the_alert_rules_evaluate_and_the_workload_raises_its_alerts(
    prometheus: PrometheusServer, workload: str
) -> None:
    def evaluated() -> bool:
        rules = [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]
        return bool(rules) and all(not rule["lastEvaluation"].startswith("0001-") for rule in rules)

    wait_until(evaluated, WAIT_S, "every rule to be evaluated")
    rules = [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]
    assert {rule["name"] for rule in rules} >= WORKLOAD_ALERTS
    for rule in rules:
        assert rule["health"] == "ok" and not rule.get("lastError"), rule

    def raised() -> set[str]:
        return {alert["labels"]["alertname"] for alert in prometheus.api("alerts")["alerts"]}

    wait_until(lambda: WORKLOAD_ALERTS <= raised(), WAIT_S, f"alerts {sorted(WORKLOAD_ALERTS)} to be pending")
    parked = [a for a in prometheus.api("alerts")["alerts"] if a["labels"]["alertname"] == "GraphledgerSubjectsParked"]
    assert [(a["labels"]["messaging_destination_name"], a["labels"]["graphledger_park_cause"]) for a in parked] == [
        (workload, "newer_version")
    ]
