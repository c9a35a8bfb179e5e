"""Every setting of graphledger, read from `GRAPHLEDGER_*` environment variables.

One flat model so that one table (docs/settings.md) documents them all; the client reads the Kafka and
read-API part, the services the rest. Defaults are named constants with their unit.
"""

from __future__ import annotations

import re
import ssl
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_TOPIC_PREFIX = "graphledger"
DEFAULT_PARTITIONS = 12
DEFAULT_MAX_MESSAGE_BYTES = 900_000  # below Kafka's default 1 MiB message.max.bytes, with room for headers
DEFAULT_MAX_DECOMPRESSED_BATCH_BYTES = 64 * 1024 * 1024
DEFAULT_PRODUCE_TIMEOUT_S = 30.0
DEFAULT_CONSISTENCY_TIMEOUT_S = 10.0
DEFAULT_BATCH_MAX_EVENTS = 5_000
DEFAULT_BATCH_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_BATCH_MAX_WAIT_MS = 10
DEFAULT_REPLAY_BATCH_MAX_EVENTS = 10_000
DEFAULT_FETCH_MAX_WAIT_MS = 10
DEFAULT_PROJECTOR_RETRY_MAX_S = 5.0
DEFAULT_API_PORT = 8080
DEFAULT_API_POOL_TIMEOUT_S = 5.0
DEFAULT_SWEEPER_INTERVAL_S = 60.0
DEFAULT_SWEEPER_BATCH_SIZE = 500
DEFAULT_STORE_REFRESH_COALESCE_S = 30.0
DEFAULT_MAX_INFLIGHT_BYTES = 256 * 1024 * 1024
DEFAULT_API_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_API_MAX_RESPONSE_BYTES = 128 * 1024 * 1024  # above a 50 MB checkpoint as base64 JSON
DEFAULT_API_MAX_RESULT_ITEMS = 10_000
DEFAULT_API_MAX_CONSISTENCY_WAITS = 1_000
DEFAULT_API_MAX_KEY_CREATIONS_PER_MINUTE = 6_000
DEFAULT_API_READ_THROUGH_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_ERASURE_NAMESPACE_DEPTH = 2
DEFAULT_KEY_CACHE_TTL_S = 60.0
DEFAULT_CLIENT_THREAD_MEMORY_BYTES = 64 * 1024 * 1024
DEFAULT_CLIENT_FRESH_KEYS = 512
DEFAULT_HEALTH_DEADLINE_S = 60.0

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class Settings(BaseSettings):
    """graphledger configuration; each field is `GRAPHLEDGER_<FIELD>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="GRAPHLEDGER_", extra="ignore")

    # Kafka, for client and services alike.
    kafka_bootstrap_servers: str = Field("localhost:9092", description="Kafka bootstrap servers, comma separated.")
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security protocol."
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism when the protocol is SASL_*."
    )
    kafka_sasl_username: str | None = Field(None, description="SASL user name.")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password.")
    kafka_ssl_cafile: str | None = Field(None, description="CA bundle file for Kafka TLS.")
    kafka_ssl_certfile: str | None = Field(None, description="Client certificate file for Kafka mTLS.")
    kafka_ssl_keyfile: str | None = Field(None, description="Client key file for Kafka mTLS.")
    kafka_idempotence: bool = Field(
        True, description="Idempotent producer. Off for brokers without InitProducerId (the embedded tansu)."
    )
    topic_prefix: str = Field(DEFAULT_TOPIC_PREFIX, description="Prefix of every graphledger topic.")
    topic_partitions: int = Field(DEFAULT_PARTITIONS, ge=1, description="Partitions `topics ensure` creates.")
    topic_replication_factor: int = Field(3, ge=1, description="Replication factor `topics ensure` creates.")
    topic_min_insync_replicas: int | None = Field(
        None,
        ge=1,
        description="`min.insync.replicas` `topics ensure` gives the source topics: an `acks=all` write counts once "
        "this many replicas hold it. Unset: min(2, `topic_replication_factor`).",
    )
    topic_allow_single_broker_acks: bool = Field(
        False,
        description="Let `topics ensure` accept source topics whose writes one broker alone may acknowledge "
        "(replication factor or `min.insync.replicas` 1): losing that broker loses acknowledged writes. For a "
        "one-broker cluster (the dev stack); `--allow-single-broker-acks` sets it for one run.",
    )
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES,
        ge=10_000,
        description="Largest record the client publishes; bigger events are split into chunks.",
    )
    max_decompressed_batch_bytes: int = Field(
        DEFAULT_MAX_DECOMPRESSED_BATCH_BYTES,
        ge=1024 * 1024,
        description="Most bytes a compressed record batch may decompress to when read from Kafka (graphledger never "
        "compresses; a hostile producer may): a larger one is not read, and the projector dead-letters it.",
    )
    produce_timeout_s: float = Field(
        DEFAULT_PRODUCE_TIMEOUT_S, gt=0, description="Seconds a write waits for the broker's acknowledgement."
    )
    max_inflight_bytes: int = Field(
        DEFAULT_MAX_INFLIGHT_BYTES,
        ge=1024,
        description="Most event bytes one client holds unacknowledged; a write beyond it waits for room up to "
        "`produce_timeout_s`, then fails (retryable). One event larger than this goes out alone.",
    )

    # Read API, for the client.
    api_url: str = Field(f"http://127.0.0.1:{DEFAULT_API_PORT}", description="Base URL of the read API.")
    api_ca_file: str | None = Field(
        None,
        description="CA bundle (PEM) the client verifies an `https://` read API's certificate with, instead of the "
        "system CAs.",
    )
    api_token: SecretStr | None = Field(
        None,
        description="Bearer token the client sends to the read API. On the server, without `api_token_hashes`: "
        "the one token accepted, for a tenant with no prefix (single-tenant).",
    )
    consistency_timeout_s: float = Field(
        DEFAULT_CONSISTENCY_TIMEOUT_S,
        gt=0,
        description="Seconds a read waits for the projection to reflect every write it must see (else a retryable "
        "503); also the deadline of the read API's and the client's fetches of the log's end.",
    )

    client_log_reads: bool | None = Field(
        None,
        description="A client reading a thread it holds checks the thread's partition in Kafka itself (needs READ on "
        "the checkpoint topic) and answers without the read API when only its own records came since; off, it asks "
        "the read API, which checks the same (no Postgres read). Unset: on, but for a client with a tenant token, "
        "whose READ would show it other tenants' (sealed) records' sizes and times: grant it and set true to opt in.",
    )
    client_thread_memory_bytes: int = Field(
        DEFAULT_CLIENT_THREAD_MEMORY_BYTES,
        ge=0,
        description="Bytes of thread state a client holds (the newest checkpoint of each thread it wrote or read, "
        "and its own records the projection may lack); beyond, the least recently used threads are forgotten and "
        "their next read goes to the read API.",
    )

    # Erasure (docs/security.md): user content sealed with per-subject data keys held outside the log.
    write_ownership: Literal["refuse", "record"] = Field(
        "refuse",
        description="One writer per thread (docs/architecture.md): `refuse` sends, with each write of a LangGraph "
        "run, what the run read of the thread, and the log refuses a write whose thread changed since (a "
        "superseded or concurrent writer: ThreadWriteRefusedError, as the Agent Server's `reject`); `record` sends "
        "none, so every write counts as with the official savers, and the projector records forks. Only the "
        "writer reads it: projector, read API and replay apply the rule to every write that carries an intent.",
    )
    encrypt_events: bool = Field(
        True,
        description="Seal every event's user content with its subject's data key and hash identifiers in record "
        "keys, so that erasing a subject makes its data unreadable in the log. Clients and services must agree; "
        "turning it on for an existing log goes through `graphledger encrypt-log`.",
    )
    accept_clear_events: bool = Field(
        False,
        description="With encryption on, apply events of a thread or store namespace that reach the log in the "
        "clear (a log written before encryption was turned on, until `graphledger encrypt-log` has sealed it). "
        "Off, the projector and the read API dead-letter them: any producer could write one for any tenant.",
    )
    erasure_namespace_depth: int = Field(
        DEFAULT_ERASURE_NAMESPACE_DEPTH,
        ge=1,
        le=32,
        description="Labels of a store namespace (after the tenant's) that name its erasure subject: with 2, the "
        "items of (users, 42, ...) share the key of (users, 42). Set on the read API; clients follow it.",
    )
    key_cache_ttl_s: float = Field(
        DEFAULT_KEY_CACHE_TTL_S,
        gt=0,
        description="Seconds after which a client asks the read API again for a data key it uses (in the background: "
        "it keeps writing meanwhile). A writer learns of an erasure then, or at its next read of the subject; what it "
        "writes for an erased subject before it learns is never readable.",
    )
    client_fresh_keys: int = Field(
        DEFAULT_CLIENT_FRESH_KEYS,
        ge=0,
        description="Fresh data keys a client holds ahead of use (asked for again when half, or 256, are used): a new "
        "subject's first write waits on no key, and a pod starts up to this many new subjects through an outage of the "
        "read API. 0: each new subject asks the read API for its key.",
    )
    key_encryption_keys: SecretStr | None = Field(
        None,
        description="The services' key-encryption keys: comma-separated `id:base64` entries of 32 random bytes. The "
        "first wraps new data keys, every one unwraps (rotation: put a new key first, run `graphledger keys rotate`, "
        "then drop the old one).",
    )
    key_store_schema: str = Field(
        "graphledger_keys",
        description="Schema of the key store (wrapped data keys, erasures); never dropped or switched by a replay.",
    )

    # Postgres, for the services.
    postgres_dsn: str = Field("postgresql://postgres@localhost/postgres", description="Projection database DSN.")
    postgres_schema: str = Field("graphledger", description="Schema holding the projection tables.")

    # Projector.
    projector_group_id: str = Field("graphledger-projector", description="Kafka consumer group of the projector.")
    batch_max_events: int = Field(DEFAULT_BATCH_MAX_EVENTS, ge=1, description="Most events in one apply batch.")
    batch_max_bytes: int = Field(
        DEFAULT_BATCH_MAX_BYTES,
        ge=1024,
        description="Most record bytes in one batch, and most bytes of stored chunks one batch reassembles.",
    )
    batch_max_wait_ms: int = Field(
        DEFAULT_BATCH_MAX_WAIT_MS,
        ge=0,
        description="Longest a batch waits to fill before it is applied. Longer: fewer transactions per agent "
        "turn (less projector and Postgres CPU), and up to this much more write-to-visible time.",
    )
    projector_retry_max_s: float = Field(
        DEFAULT_PROJECTOR_RETRY_MAX_S,
        gt=0,
        description="Cap of the projector's exponential backoff (from 0.1 s, doubling) while a batch cannot "
        "be applied (Postgres or Kafka down); the batch is retried, never skipped.",
    )

    fetch_max_wait_ms: int = Field(
        DEFAULT_FETCH_MAX_WAIT_MS,
        ge=1,
        description="Longest the broker holds an empty fetch; bounds write-to-visible latency on brokers "
        "that do not answer a fetch as soon as data arrives.",
    )

    # Replay (`graphledger replay`).
    replay_batch_max_events: int = Field(
        DEFAULT_REPLAY_BATCH_MAX_EVENTS,
        ge=1,
        description="Most events in one rebuild batch (split between its two connections); larger than the "
        "projector's: a rebuild wants throughput, not latency.",
    )

    # Read API server.
    api_host: str = Field(
        "127.0.0.1",
        description="Address the read API listens on. With no token configured, it hands out data keys and "
        "erases only while this is a loopback address.",
    )
    api_port: int = Field(DEFAULT_API_PORT, ge=0, le=65535, description="Port the read API listens on.")
    api_tls_certfile: str | None = Field(
        None, description="Certificate chain (PEM) the read API serves HTTPS with; set with `api_tls_keyfile`."
    )
    api_tls_keyfile: str | None = Field(None, description="Private key (PEM) of `api_tls_certfile`.")
    api_token_hashes: SecretStr | None = Field(
        None,
        description="The read API's tokens, hashed: comma-separated `tenant:sha256hex` entries, `:erase` appended "
        "for a token that may erase (`graphledger token new`). Set: each token reads only its tenant's data; "
        "`api_token` is then only what a client sends.",
    )
    api_max_body_bytes: int = Field(
        DEFAULT_API_MAX_BODY_BYTES, ge=1024, description="Largest read request body; larger is a 413."
    )
    api_max_response_bytes: int = Field(
        DEFAULT_API_MAX_RESPONSE_BYTES, ge=1024, description="Largest read answer; larger is a 413 (page the read)."
    )
    api_max_result_items: int = Field(
        DEFAULT_API_MAX_RESULT_ITEMS,
        ge=1,
        description="Most checkpoints a list, or items/namespaces a store op, answers; more matching is a 413.",
    )
    api_max_consistency_waits: int = Field(
        DEFAULT_API_MAX_CONSISTENCY_WAITS,
        ge=1,
        description="Most reads one API process holds waiting for the projection, shared fairly between tenants "
        "(a tenant takes one only while it holds fewer than are free); beyond: 503 + Retry-After.",
    )
    api_max_key_creations_per_minute: int = Field(
        DEFAULT_API_MAX_KEY_CREATIONS_PER_MINUTE,
        ge=1,
        description="Most data keys one token creates per minute on one read API process (new subjects; fetching "
        "existing keys is free); beyond: 429 + Retry-After.",
    )
    api_read_through_max_bytes: int = Field(
        DEFAULT_API_READ_THROUGH_MAX_BYTES,
        ge=0,
        description="Most bytes of records the projector has not applied yet that a read API process holds to "
        "answer reads of a thread or store item without waiting for the projector (read-through); beyond, such a "
        "read waits for the projection (503 `consistency_timeout` at the deadline, naming this setting). 0: off.",
    )
    api_pool_size: int = Field(
        10,
        ge=1,
        description="Postgres connections of each of a read API process's two pools: checkpoint reads "
        "(this many, kept open) and store reads (opened as needed, up to this many).",
    )
    api_pool_timeout_s: float = Field(
        DEFAULT_API_POOL_TIMEOUT_S,
        gt=0,
        description="Seconds a read waits for a Postgres connection before answering 503 (retryable).",
    )

    # Store (long-term memory) projection. `migrate` builds the vector table from these once; the
    # schema then records its shape, and migrating with another one fails (dims: re-embed).
    store_vector_dims: int | None = Field(
        None,
        ge=1,
        le=16_000,
        description="Dims of `store_vectors.embedding` (the writers' embedder's); unset: no vector table "
        "(an existing one stays and is served).",
    )
    store_vector_type: Literal["vector", "halfvec"] = Field(
        "vector", description="pgvector column type: `vector` (float4) or `halfvec` (float2, half the size)."
    )
    store_distance: Literal["cosine", "l2", "inner_product"] = Field(
        "cosine", description="Distance of vector search; scores as `AsyncPostgresStore` reports them."
    )
    store_index: Literal["hnsw", "flat"] = Field(
        "hnsw", description="HNSW index on `store_vectors`, or `flat` (no index: exact search only)."
    )
    store_hnsw_m: int = Field(16, ge=2, le=100, description="HNSW `m` (links per node) of the vector index.")
    store_hnsw_ef_construction: int = Field(
        64, ge=4, le=1000, description="HNSW `ef_construction` of the vector index (at least 2 * m)."
    )
    store_hnsw_ef_search: int = Field(
        80,
        ge=1,
        le=1000,
        description="HNSW `ef_search` of the read API's index searches (recall vs latency; recall@10 on "
        "`make bench`'s 20,000 docstring sentences measured 0.90 with pgvector's 40, 0.95 with 64, 0.96 with 80, "
        "0.97 with 100; each step up scans more of the index).",
    )

    # TTL and retention: the sweeper's settings, and the store client's refresh coalescing (docs/retention.md).
    sweeper_interval_s: float = Field(
        DEFAULT_SWEEPER_INTERVAL_S,
        gt=0,
        description="Seconds between two sweeps of the active sweeper (and between a standby's tries to take over).",
    )
    sweeper_batch_size: int = Field(
        DEFAULT_SWEEPER_BATCH_SIZE,
        ge=1,
        le=100_000,
        description="Most items or threads one sweeper query selects (and one round of expiry events covers).",
    )
    thread_ttl_minutes: float | None = Field(
        None,
        gt=0,
        description="Thread TTL: threads without a checkpoint or write for this long are deleted; unset: off.",
    )
    checkpoint_keep_last: int | None = Field(
        None,
        ge=1,
        description="Keep-last-N retention: each thread namespace keeps its newest N checkpoints (plus what a "
        "DeltaChannel needs); unset: off.",
    )
    store_refresh_coalesce_s: float = Field(
        DEFAULT_STORE_REFRESH_COALESCE_S,
        ge=0,
        description="A KafkaStore refreshes one item's TTL on read at most once per this many seconds (keep it "
        "well below the shortest TTL); 0: every read.",
    )

    # Telemetry of the services (traces and OTLP metrics are configured by the standard OTEL_* variables).
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port of each service's Prometheus endpoint (`/metrics`); unset or 0: none. "
        "`graphledger dev` gives the projector this port, the read API the next, the sweeper the one after.",
    )
    metrics_host: str = Field("127.0.0.1", description="Address the Prometheus endpoint listens on.")

    # Health of the projector and the sweeper (the read API answers /healthz and /readyz on its own port).
    health_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port where the projector and the sweeper answer `/livez` and `/readyz`; unset or 0: none.",
    )
    health_host: str = Field("127.0.0.1", description="Address the `/livez` and `/readyz` endpoint listens on.")
    health_deadline_s: float = Field(
        DEFAULT_HEALTH_DEADLINE_S,
        gt=0,
        description="Longest a worker's loop may go without completing a step (the projector: a poll or a batch "
        "attempt; the sweeper: a sweep page or a try for its lock, after its interval) before `/livez` answers "
        "503. Above `projector_retry_max_s`, so a worker backing off from an outage stays live.",
    )

    @field_validator("postgres_schema", "key_store_schema")
    @classmethod
    def _schema_is_identifier(cls, value: str, info: ValidationInfo) -> str:
        # Schema names are the identifiers spliced into SQL; they must be plain identifiers.
        if not _IDENTIFIER.match(value):
            raise ValueError(f"{info.field_name} {value!r} is not a lower-case SQL identifier")
        return value

    @model_validator(mode="after")
    def _min_insync_within_replicas(self) -> Settings:
        # More in-sync replicas than replicas: the broker would refuse every `acks=all` write.
        wanted = self.topic_min_insync_replicas
        if wanted is not None and wanted > self.topic_replication_factor:
            raise ValueError(
                f"topic_min_insync_replicas {wanted} exceeds topic_replication_factor {self.topic_replication_factor}: "
                "the broker would refuse every write"
            )
        return self

    @model_validator(mode="after")
    def _tls_files_come_in_pairs(self) -> Settings:
        if (self.api_tls_certfile is None) != (self.api_tls_keyfile is None):
            given = "api_tls_certfile" if self.api_tls_keyfile is None else "api_tls_keyfile"
            raise ValueError(f"{given} is set without its pair: set both api_tls_certfile and api_tls_keyfile")
        return self

    @model_validator(mode="after")
    def _ca_file_needs_https(self) -> Settings:
        # A CA that verifies nothing would look like protection while tokens and keys cross in clear.
        if self.api_ca_file is not None and not self.api_url.lower().startswith("https://"):
            raise ValueError(
                f"api_ca_file is set but api_url {self.api_url!r} is not https://: the read API's answers are keys"
            )
        return self

    @model_validator(mode="after")
    def _health_deadline_outlasts_backoff(self) -> Settings:
        # A projector waiting out its backoff is not frozen; with a shorter deadline /livez would say it is.
        if self.health_deadline_s <= self.projector_retry_max_s:
            raise ValueError(
                f"health_deadline_s {self.health_deadline_s} must exceed projector_retry_max_s "
                f"{self.projector_retry_max_s}: a projector backing off between retries would be reported frozen"
            )
        return self

    @model_validator(mode="after")
    def _key_store_outlives_replays(self) -> Settings:
        # A replay renames the projection schema away, then drops it: keys there would go with it.
        projection = self.postgres_schema
        store = self.key_store_schema
        if store in (projection, f"{projection}_rebuild") or store.startswith(f"{projection}_old_"):
            raise ValueError(
                f"key_store_schema {store!r} is a schema a replay of postgres_schema {projection!r} renames or "
                "drops: the keys must live in a schema of their own"
            )
        return self

    @property
    def checkpoint_topic(self) -> str:
        return f"{self.topic_prefix}.checkpoints"

    @property
    def store_topic(self) -> str:
        return f"{self.topic_prefix}.store"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.topic_prefix}.dead-letters"

    @property
    def layout_topic(self) -> str:
        """Where `topics ensure` records the source topics' partition counts (`graphledger.log.layout`)."""
        return f"{self.topic_prefix}.layout"

    @property
    def clear_events_refused(self) -> bool:
        """Events of a thread or namespace that reach the log in the clear are dead-lettered, not applied."""
        return self.encrypt_events and not self.accept_clear_events

    @property
    def min_insync_replicas(self) -> int:
        """The `min.insync.replicas` `topics ensure` gives the source topics."""
        if self.topic_min_insync_replicas is not None:
            return self.topic_min_insync_replicas
        return min(2, self.topic_replication_factor)

    def api_ssl_context(self) -> ssl.SSLContext | None:
        """The context verifying the read API's certificate against `api_ca_file` alone; None: the system CAs.
        A file that is missing or holds no certificate fails here, naming the setting."""
        if self.api_ca_file is None:
            return None
        try:
            return ssl.create_default_context(cafile=self.api_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"api_ca_file {self.api_ca_file!r}: {exc.strerror or exc}") from None

    def kafka_client_options(self) -> dict[str, object]:
        """Connection options shared by every aiokafka client (producer, consumer, admin)."""
        options: dict[str, object] = {
            "bootstrap_servers": self.kafka_bootstrap_servers,
            "security_protocol": self.kafka_security_protocol,
        }
        if self.kafka_security_protocol.startswith("SASL"):
            options["sasl_mechanism"] = self.kafka_sasl_mechanism or "PLAIN"
            options["sasl_plain_username"] = self.kafka_sasl_username
            options["sasl_plain_password"] = (
                self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else None
            )
        if self.kafka_security_protocol.endswith("SSL"):
            from aiokafka.helpers import create_ssl_context

            options["ssl_context"] = create_ssl_context(
                cafile=self.kafka_ssl_cafile, certfile=self.kafka_ssl_certfile, keyfile=self.kafka_ssl_keyfile
            )
        return options
