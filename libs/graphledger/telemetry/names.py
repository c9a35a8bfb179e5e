"""Names every graphledger span, attribute and meter uses, in one place.

Attribute keys follow the OpenTelemetry semantic conventions (messaging, database, HTTP) where one
exists, written out as strings rather than imported from `opentelemetry.semconv._incubating`, whose
module paths change between releases. Our own keys live under `graphledger.`.
"""

from __future__ import annotations

from typing import Final

INSTRUMENTATION_NAME: Final = "graphledger"
"""Tracer and meter name prefix; each component gets its own scope (`graphledger.client`, ...)."""

CLIENT_SCOPE: Final = "graphledger.client"
PROJECTOR_SCOPE: Final = "graphledger.projector"
API_SCOPE: Final = "graphledger.api"
SWEEPER_SCOPE: Final = "graphledger.sweeper"
REPLAY_SCOPE: Final = "graphledger.replay"

# -- messaging (Kafka) ----------------------------------------------------------------------------------
MESSAGING_SYSTEM: Final = "messaging.system"
MESSAGING_SYSTEM_KAFKA: Final = "kafka"
MESSAGING_DESTINATION_NAME: Final = "messaging.destination.name"
MESSAGING_DESTINATION_PARTITION_ID: Final = "messaging.destination.partition.id"
MESSAGING_OPERATION_TYPE: Final = "messaging.operation.type"
MESSAGING_OPERATION_NAME: Final = "messaging.operation.name"
MESSAGING_BATCH_MESSAGE_COUNT: Final = "messaging.batch.message_count"
MESSAGING_CONSUMER_GROUP_NAME: Final = "messaging.consumer.group.name"
MESSAGING_MESSAGE_ID: Final = "messaging.message.id"
MESSAGING_MESSAGE_BODY_SIZE: Final = "messaging.message.body.size"
MESSAGING_KAFKA_MESSAGE_KEY: Final = "messaging.kafka.message.key"
MESSAGING_KAFKA_OFFSET: Final = "messaging.kafka.offset"

# -- database (Postgres) ------------------------------------------------------------------------------
DB_SYSTEM_NAME: Final = "db.system.name"
DB_SYSTEM_POSTGRESQL: Final = "postgresql"
DB_NAMESPACE: Final = "db.namespace"
DB_OPERATION_NAME: Final = "db.operation.name"
DB_COLLECTION_NAME: Final = "db.collection.name"
DB_QUERY_SUMMARY: Final = "db.query.summary"

# -- HTTP and network ------------------------------------------------------------------------------------
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
HTTP_ROUTE: Final = "http.route"
URL_FULL: Final = "url.full"
URL_TEMPLATE: Final = "url.template"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"

# -- graphledger's own ----------------------------------------------------------------------------------
EVENT_TYPE: Final = "graphledger.event.type"
"""A known event type (`checkpoint.put`, `store.delete`, ...); anything else is reported as `other`."""
GRAPHLEDGER_STOP_REASON: Final = "graphledger.stop.reason"
"""Why a projector stopped a partition: `lost_log`."""
GRAPHLEDGER_PARK_CAUSE: Final = "graphledger.park.cause"
"""Why a subject is parked: `newer_version`, `beyond_log` or `copy_parked`."""
GRAPHLEDGER_FORK_KIND: Final = "graphledger.fork.kind"
"""A put whose parent was not the newest: `branch` (its writer asked for it) or `fork` (a writer outside the rule)."""
GRAPHLEDGER_REFUSAL_CAUSE: Final = "graphledger.refusal.cause"
"""Why the rule refused a write (`graphledger.ownership`): `superseded` or `thread_changed`."""
GRAPHLEDGER_GAP_OUTCOME: Final = "graphledger.gap.outcome"
"""What a reader did with offsets a fetch's answer passed over: `fetched_again` or `read_past`."""
GRAPHLEDGER_REPLAY_WORKER: Final = "graphledger.replay.worker"
"""Which worker of a replay split by partition (`replay run --workers N`) applies the partition: `i/N`."""
GRAPHLEDGER_READ_ANSWERED: Final = "graphledger.read.answered"
"""How a client answered a read of a thread: `held`, `folded` (other pods' records folded onto what it held),
`new` (the log proved the thread new) or `read_api`."""
GRAPHLEDGER_READ_FELL_BACK: Final = "graphledger.read.fell_back"
"""Why a client's read of a thread went to the read API (`ThreadReads.fell_back`'s reasons), `` otherwise."""
CLIENT_THREAD_READS: Final = "graphledger.client.thread_reads"
"""The client's one metric: its reads of threads, by how each was answered and why it fell back."""
BATCH_APPLIED: Final = "graphledger.batch.applied"
BATCH_DEAD_LETTERS: Final = "graphledger.batch.dead_letters"
BATCH_SKIPPED: Final = "graphledger.batch.skipped"
BATCH_ISOLATED: Final = "graphledger.batch.isolated"
BATCH_LINKS_DROPPED: Final = "graphledger.batch.links_dropped"
CONSISTENCY_OUTCOME: Final = "graphledger.consistency.outcome"
SEARCH_MODE: Final = "graphledger.search.mode"
SWEEP_KIND: Final = "graphledger.sweep.kind"
"""What a sweeper expiry removes: `store_item`, `idle_thread` or `old_checkpoints` (a keep-last-N prune)."""
OTHER: Final = "other"
