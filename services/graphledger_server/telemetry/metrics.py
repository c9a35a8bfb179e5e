"""The registry of every metric graphledger emits: name, kind, unit, attributes, and where it comes from.

One module so that a test can list every metric name (and the dashboards can be checked against it),
and so that the instruments are created in one way: on the global meter provider's proxy, which a
service's `telemetry.setup` (or the user's application, for the client) replaces with a real one.
Creating an instrument before `setup` is fine: the proxy rebinds it.

Names follow OpenTelemetry's conventions (dot-separated, unit in `unit`, not in the name); the
Prometheus exporter turns `graphledger.projector.batch.size` with unit `{record}` into
`graphledger_projector_batch_size_bucket/_sum/_count`, and `prometheus_names` says how.

No attribute may carry a checkpoint or store value: attributes are topics, partitions, event types,
routes, status codes and error class names, each from a small, bounded set.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from opentelemetry import metrics as otel_metrics

from graphledger.telemetry import names

Kind = Literal["counter", "histogram", "gauge", "observable_gauge", "updown_counter"]

SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Latency buckets in seconds (the SDK's default buckets are meant for milliseconds)."""
COUNT_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000)
"""Batch-size buckets, up to past the largest `batch_max_events` anyone should configure."""

GRAPHLEDGER = "graphledger"
FASTAPI_INSTRUMENTATION = "opentelemetry-instrumentation-fastapi"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: what a dashboard may query, and how the instrument is created."""

    name: str
    kind: Kind
    unit: str
    description: str
    scope: str
    attributes: tuple[str, ...] = ()
    """Attribute keys its data points carry (Prometheus labels, with `.` turned into `_`)."""
    buckets: tuple[float, ...] | None = None
    emitted_by: str = GRAPHLEDGER
    """`graphledger` for our instruments; the instrumentation library's name for the ones it creates."""

    @property
    def prometheus_base(self) -> str:
        """The name the Prometheus exporter gives the metric family (unit suffix included)."""
        base = _PROMETHEUS_INVALID.sub("_", self.name)
        unit = prometheus_unit(self.unit)
        if unit and not base.endswith(f"_{unit}"):
            base = f"{base}_{unit}"
        return base

    @property
    def prometheus_names(self) -> tuple[str, ...]:
        """Every series name the metric appears under in the Prometheus text format."""
        base = self.prometheus_base
        if self.kind == "counter":
            return (base.removesuffix("_total") + "_total",)
        if self.kind == "histogram":
            return (f"{base}_bucket", f"{base}_sum", f"{base}_count")
        return (base,)


_PROMETHEUS_INVALID = re.compile(r"[^a-zA-Z0-9:]+")
_UNIT_ANNOTATION = re.compile(r"\{.*\}")
# The subset of the exporter's unit mapping our units use (OpenTelemetry's Prometheus compatibility spec).
_PROMETHEUS_UNITS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": ""}


def prometheus_unit(unit: str) -> str:
    """The unit suffix the Prometheus exporter appends: annotations (`{record}`) and `1` add none."""
    unit = _UNIT_ANNOTATION.sub("", unit)
    return _PROMETHEUS_UNITS.get(unit, _PROMETHEUS_INVALID.sub("_", unit).strip("_"))


def prometheus_label(attribute: str) -> str:
    """The Prometheus label name of an attribute key (`http.route` -> `http_route`)."""
    return re.sub(r"[^a-zA-Z0-9]+", "_", attribute)


_TOPIC = names.MESSAGING_DESTINATION_NAME
_PARTITION = names.MESSAGING_DESTINATION_PARTITION_ID
_GROUP = names.MESSAGING_CONSUMER_GROUP_NAME
_HTTP = (names.HTTP_ROUTE, names.HTTP_REQUEST_METHOD, names.HTTP_RESPONSE_STATUS_CODE)

# -- projector -----------------------------------------------------------------------------------------
PROJECTOR_LAG = MetricSpec(
    "graphledger.projector.lag",
    "observable_gauge",
    "{record}",
    "Records of a partition not applied yet: the broker's high watermark (as the last fetch reported it) "
    "minus the partition's stored next offset.",
    names.PROJECTOR_SCOPE,
    (_TOPIC, _PARTITION, _GROUP),
)
PROJECTOR_PARTITIONS_STOPPED = MetricSpec(
    "graphledger.projector.partitions.stopped",
    "observable_gauge",
    "{partition}",
    "1 for each partition a worker has stopped, by reason: `lost_log` (the log no longer holds records the "
    "projection applied; `graphledger offsets reset` resumes it). A record no projector version can apply "
    "stops no partition: it parks its subject (`graphledger.projector.subjects.parked`).",
    names.PROJECTOR_SCOPE,
    (_TOPIC, _PARTITION, _GROUP, names.GRAPHLEDGER_STOP_REASON),
)
PROJECTOR_BATCH_SIZE = MetricSpec(
    "graphledger.projector.batch.size",
    "histogram",
    "{record}",
    "Records in one applied batch (one Postgres transaction).",
    names.PROJECTOR_SCOPE,
    buckets=COUNT_BUCKETS,
)
PROJECTOR_APPLY_DURATION = MetricSpec(
    "graphledger.projector.apply.duration",
    "histogram",
    "s",
    "Time to apply one batch: its transaction from the offset locks to the commit.",
    names.PROJECTOR_SCOPE,
    buckets=SECONDS_BUCKETS,
)
PROJECTOR_FRESHNESS = MetricSpec(
    "graphledger.projector.freshness",
    "histogram",
    "s",
    "Write-to-visible delay: from the record timestamp of the oldest record of a batch (per topic) to the "
    "batch's commit, i.e. the worst delay in the batch. Per batch rather than per record, which would cost "
    "the apply path several microseconds per event.",
    names.PROJECTOR_SCOPE,
    (_TOPIC,),
    buckets=SECONDS_BUCKETS,
)
PROJECTOR_EVENTS_APPLIED = MetricSpec(
    "graphledger.projector.events.applied",
    "counter",
    "{event}",
    "Events applied to the projection, by event type.",
    names.PROJECTOR_SCOPE,
    (names.EVENT_TYPE,),
)
PROJECTOR_EVENTS_DEAD_LETTERED = MetricSpec(
    "graphledger.projector.events.dead_lettered",
    "counter",
    "{event}",
    "Events sent to the dead-letter topic (undecodable, invalid, or rejected by Postgres), by event type.",
    names.PROJECTOR_SCOPE,
    (names.EVENT_TYPE,),
)
PROJECTOR_EVENTS_SKIPPED = MetricSpec(
    "graphledger.projector.events.skipped",
    "counter",
    "{record}",
    "Records skipped because their partition's stored offset was past them (delivered again after a "
    "crash or a rebalance; applied before).",
    names.PROJECTOR_SCOPE,
)
PROJECTOR_FORKS = MetricSpec(
    "graphledger.projector.forks",
    "counter",
    "{checkpoint}",
    "Checkpoint puts whose parent was not their thread namespace's newest checkpoint when applied, by kind: "
    "`branch`, one its writer asked for (time travel, a copy of an older checkpoint); `fork`, one made without "
    "an intent, by a writer outside the one-writer rule (`graphledger forks list`).",
    names.PROJECTOR_SCOPE,
    (names.GRAPHLEDGER_FORK_KIND,),
)
PROJECTOR_WRITES_REFUSED = MetricSpec(
    "graphledger.projector.writes_refused",
    "counter",
    "{record}",
    'Puts and writes the one-writer rule refused (docs/architecture.md, "One writer per thread"), by cause: '
    "`superseded` (another writer's put led the thread first) or `thread_changed` (an operation came after the "
    "writer's read). Never applied; the writer's run fails with ThreadWriteRefusedError.",
    names.PROJECTOR_SCOPE,
    (names.GRAPHLEDGER_REFUSAL_CAUSE,),
)
PROJECTOR_ERASED_RECORDS = MetricSpec(
    "graphledger.projector.erased_records",
    "counter",
    "{record}",
    "Records of erased subjects (their data key destroyed, docs/security.md), skipped unopened, by event type.",
    names.PROJECTOR_SCOPE,
    (names.EVENT_TYPE,),
)
PROJECTOR_LOG_GAPS = MetricSpec(
    "graphledger.projector.log_gaps",
    "counter",
    "{gap}",
    "Offsets a fetch's answer passed over (docs/architecture.md): `fetched_again` when first met, `read_past` "
    "when still missing after 2 s and taken as offsets the log does not hold. tansu answers so near a "
    "partition's end; Kafka does not for graphledger's topics.",
    names.PROJECTOR_SCOPE,
    (names.GRAPHLEDGER_GAP_OUTCOME,),
)
PROJECTOR_BATCH_FAILURES = MetricSpec(
    "graphledger.projector.batch.failures",
    "counter",
    "{batch}",
    "Batch attempts that failed and rolled back, by exception class; a retryable one is retried as is.",
    names.PROJECTOR_SCOPE,
    (names.ERROR_TYPE,),
)
PROJECTOR_OFFSET_COMMIT_FAILURES = MetricSpec(
    "graphledger.projector.offset_commit.failures",
    "counter",
    "{commit}",
    "Commits of applied offsets to the consumer group in Kafka that failed, by exception class. Those commits "
    "are for Kafka's lag tools (and KEDA) only: the projection is not affected, but those tools see stale lag.",
    names.PROJECTOR_SCOPE,
    (names.ERROR_TYPE,),
)
PROJECTOR_SUBJECTS_PARKED = MetricSpec(
    "graphledger.projector.subjects.parked",
    "observable_gauge",
    "{subject}",
    "Subjects (a thread's or a store item's records on one partition) parked at a record no projector "
    "version can apply, by cause: `newer_version` (a version this projector does not read), `beyond_log` (a "
    "copy barrier beyond its copy's log), `copy_parked` (a barrier whose copy a parked subject holds), as "
    "the projector last counted them in graphledger_parked_subjects (`graphledger parked list`).",
    names.PROJECTOR_SCOPE,
    (_TOPIC, names.GRAPHLEDGER_PARK_CAUSE),
)
DEAD_LETTERS_OUTSTANDING = MetricSpec(
    "graphledger.dead_letters.outstanding",
    "observable_gauge",
    "{event}",
    "Dead letters of a source topic not replayed yet (`graphledger dlq list`), as the projector last counted "
    "them in graphledger_dead_letters.",
    names.PROJECTOR_SCOPE,
    (_TOPIC,),
)

# -- read API ------------------------------------------------------------------------------------------
HTTP_SERVER_REQUEST_DURATION = MetricSpec(
    "http.server.request.duration",
    "histogram",
    "s",
    "Read API request latency by route, method and status (OpenTelemetry's HTTP server metric).",
    "opentelemetry.instrumentation.fastapi",
    _HTTP,
    emitted_by=FASTAPI_INSTRUMENTATION,
)
HTTP_SERVER_ACTIVE_REQUESTS = MetricSpec(
    "http.server.active_requests",
    "updown_counter",
    "{request}",
    "Read API requests in flight.",
    "opentelemetry.instrumentation.fastapi",
    (names.HTTP_REQUEST_METHOD,),
    emitted_by=FASTAPI_INSTRUMENTATION,
)
HTTP_SERVER_REQUEST_BODY_SIZE = MetricSpec(
    "http.server.request.body.size",
    "histogram",
    "By",
    "Read API request body sizes.",
    "opentelemetry.instrumentation.fastapi",
    _HTTP,
    emitted_by=FASTAPI_INSTRUMENTATION,
)
HTTP_SERVER_RESPONSE_BODY_SIZE = MetricSpec(
    "http.server.response.body.size",
    "histogram",
    "By",
    "Read API response body sizes.",
    "opentelemetry.instrumentation.fastapi",
    _HTTP,
    emitted_by=FASTAPI_INSTRUMENTATION,
)
API_CONSISTENCY_WAIT = MetricSpec(
    "graphledger.api.consistency.wait.duration",
    "histogram",
    "s",
    "How long a read with a consistency token waited for the projection to reach it (0 when it already had).",
    names.API_SCOPE,
    (names.CONSISTENCY_OUTCOME,),
    buckets=SECONDS_BUCKETS,
)
API_CONSISTENCY_TIMEOUTS = MetricSpec(
    "graphledger.api.consistency.timeouts",
    "counter",
    "{request}",
    "Reads answered 503 consistency_timeout: the projection did not reach their token in time.",
    names.API_SCOPE,
)
API_STORE_SEARCH_DURATION = MetricSpec(
    "graphledger.api.store.search.duration",
    "histogram",
    "s",
    "Time to answer one store search op (vector or filter) inside a /v1/store/batch request.",
    names.API_SCOPE,
    (names.SEARCH_MODE,),
    buckets=SECONDS_BUCKETS,
)

# -- sweeper --------------------------------------------------------------------------------------------
SWEEPER_EXPIRATIONS = MetricSpec(
    "graphledger.sweeper.expirations",
    "counter",
    "{item}",
    "Expiry and retention events the sweeper published, by kind (store_item, idle_thread, old_checkpoints); "
    "each removes what is still due when the projector applies it.",
    names.SWEEPER_SCOPE,
    (names.SWEEP_KIND,),
)
SWEEPER_SWEEP_DURATION = MetricSpec(
    "graphledger.sweeper.sweep.duration",
    "histogram",
    "s",
    "Time of one sweep by the active sweeper: finding due items and threads, publishing, waiting for the "
    "projector to apply them.",
    names.SWEEPER_SCOPE,
    buckets=SECONDS_BUCKETS,
)
SWEEPER_ACTIVE = MetricSpec(
    "graphledger.sweeper.active",
    "gauge",
    "1",
    "1 while this sweeper replica holds the Postgres advisory lock and sweeps, 0 while it stands by.",
    names.SWEEPER_SCOPE,
)

# -- replay (declared before the feature lands, so dashboards and alerts can) -----------------------
REPLAY_PROGRESS = MetricSpec(
    "graphledger.replay.progress",
    "gauge",
    "1",
    "Fraction of a partition's records a replay has applied into its new schema (0 to 1), by the worker "
    "that applies it.",
    names.REPLAY_SCOPE,
    (_TOPIC, _PARTITION, names.GRAPHLEDGER_REPLAY_WORKER),
)

CLIENT_THREAD_READS = MetricSpec(
    names.CLIENT_THREAD_READS,
    "counter",
    "{read}",
    "Agent pods' reads of threads (get_tuple, get_delta_channel_history), by how the client answered them: "
    "`held` (what the pod holds, the log showing no other record), `folded` (other pods' records since folded "
    "onto it), `new` (the log proved the thread new) or `read_api`; and why a read went to the read API "
    "(`not_held`, `key_not_held`, `interleaved`, `operation`, ...: docs/agent-pods.md). Emitted by the client "
    "through the application's meter provider.",
    names.CLIENT_SCOPE,
    (names.GRAPHLEDGER_READ_ANSWERED, names.GRAPHLEDGER_READ_FELL_BACK),
)

REGISTRY: tuple[MetricSpec, ...] = (
    PROJECTOR_LAG,
    PROJECTOR_PARTITIONS_STOPPED,
    PROJECTOR_BATCH_SIZE,
    PROJECTOR_APPLY_DURATION,
    PROJECTOR_FRESHNESS,
    PROJECTOR_EVENTS_APPLIED,
    PROJECTOR_EVENTS_DEAD_LETTERED,
    PROJECTOR_EVENTS_SKIPPED,
    PROJECTOR_FORKS,
    PROJECTOR_WRITES_REFUSED,
    PROJECTOR_ERASED_RECORDS,
    PROJECTOR_LOG_GAPS,
    PROJECTOR_BATCH_FAILURES,
    PROJECTOR_OFFSET_COMMIT_FAILURES,
    DEAD_LETTERS_OUTSTANDING,
    PROJECTOR_SUBJECTS_PARKED,
    HTTP_SERVER_REQUEST_DURATION,
    HTTP_SERVER_ACTIVE_REQUESTS,
    HTTP_SERVER_REQUEST_BODY_SIZE,
    HTTP_SERVER_RESPONSE_BODY_SIZE,
    API_CONSISTENCY_WAIT,
    API_CONSISTENCY_TIMEOUTS,
    API_STORE_SEARCH_DURATION,
    SWEEPER_EXPIRATIONS,
    SWEEPER_SWEEP_DURATION,
    SWEEPER_ACTIVE,
    REPLAY_PROGRESS,
    CLIENT_THREAD_READS,
)
"""Every metric graphledger's processes can emit (the client's through its application's meter provider)."""


def prometheus_series() -> dict[str, MetricSpec]:
    """Every Prometheus series name (with `_total`, `_bucket`, `_sum`, `_count`) -> its metric."""
    return {series: spec for spec in REGISTRY for series in spec.prometheus_names}


# -- instruments ------------------------------------------------------------------------------------------

_instruments: dict[str, Any] = {}
_lock = threading.Lock()


def instrument(spec: MetricSpec) -> Any:
    """The instrument of `spec` (created once per process on the global meter provider)."""
    created = _instruments.get(spec.name)
    if created is not None:
        return created
    if spec.emitted_by != GRAPHLEDGER:
        raise ValueError(f"{spec.name} is created by {spec.emitted_by}, not by graphledger")
    if spec.kind == "observable_gauge":
        raise ValueError(f"{spec.name} is observable: use observe()")
    with _lock:
        created = _instruments.get(spec.name)
        if created is None:
            meter = otel_metrics.get_meter(spec.scope)
            if spec.kind == "counter":
                created = meter.create_counter(spec.name, spec.unit, spec.description)
            elif spec.kind == "updown_counter":
                created = meter.create_up_down_counter(spec.name, spec.unit, spec.description)
            elif spec.kind == "gauge":
                created = meter.create_gauge(spec.name, spec.unit, spec.description)
            else:
                created = meter.create_histogram(
                    spec.name,
                    spec.unit,
                    spec.description,
                    explicit_bucket_boundaries_advisory=list(spec.buckets) if spec.buckets else None,
                )
            _instruments[spec.name] = created
    return created


Observer = Callable[[], Iterable[tuple[float, dict[str, Any]]]]


def observe(spec: MetricSpec, observer: Observer) -> None:
    """Register the callback of observable `spec` once per process; `observer` yields (value, attributes)."""
    if spec.kind != "observable_gauge":
        raise ValueError(f"{spec.name} is not observable")
    with _lock:
        if spec.name in _instruments:
            return

        def callback(options: otel_metrics.CallbackOptions) -> Sequence[otel_metrics.Observation]:
            return [otel_metrics.Observation(value, attributes) for value, attributes in observer()]

        meter = otel_metrics.get_meter(spec.scope)
        _instruments[spec.name] = meter.create_observable_gauge(spec.name, [callback], spec.unit, spec.description)
