"""Every graphledger error. Each carries `retryable`, so callers branch on an attribute, not a class list.

The client's and the events' errors come first, then the ones only the services raise: they are plain
classes with no server imports, so they live here too and the client install stays free of them at
no cost. Two exceptions that are not errors of graphledger's own live elsewhere: the read API's HTTP
answer (`graphledger_server.api.errors.ApiError`, which carries `retryable` into the response body),
and what drivers raise, which `graphledger_server.driver_errors` classifies as retry, reject or fatal.
"""

from __future__ import annotations


class GraphledgerError(Exception):
    """A graphledger operation failed."""

    retryable: bool = False
    """Whether the same operation may succeed when tried again (as aiokafka's `KafkaError.retriable`)."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


# -- client and events ---------------------------------------------------------------------------------


class InvalidInputError(GraphledgerError, ValueError):
    """A client call was given input graphledger cannot store; nothing was published."""


class InvalidFilterError(InvalidInputError):
    """A store search filter is outside the filter language (`graphledger.store_filter`).

    The client raises it before anything is sent; the read API answers it as a 422 `invalid_request`.
    """

    def __init__(self, path: str, value: object, message: str) -> None:
        super().__init__(message)
        self.path = path
        """Where in the filter: `filter.<field>`, then `.key`, `[index]` or `.$operator` per level."""
        self.value = value
        """The refused value, key or operator."""


class InvalidEventError(GraphledgerError):
    """An event on a topic could not be decoded or validated; it belongs in the dead-letter topic."""


class UnknownEventVersionError(GraphledgerError):
    """An event was written by a newer graphledger than this worker knows."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version
        """The envelope version the record claims."""


class PublishError(GraphledgerError):
    """The broker did not acknowledge a write in time; the write may be retried."""

    retryable = True


class ReadApiError(GraphledgerError):
    """The read API answered with an error."""

    def __init__(self, status: int, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(f"read API {status} {code}: {message}")
        self.status = status
        self.code = code
        self.retryable = retryable


class ConsistencyTimeoutError(ReadApiError):
    """The projection did not reach the read's consistency token before the deadline."""


class LogUnavailableError(GraphledgerError):
    """The read API could not learn from Kafka where a partition's log ends, so it cannot tell which
    acknowledged writes a read must reflect; the read fails rather than answer from an older state."""

    retryable = True


class PartitionCountChangedError(LogUnavailableError):
    """The broker reports another partition count for a source topic than the one its layout records:
    a thread's records would go to (or be looked for on) another partition than its earlier ones."""

    retryable = False

    def __init__(self, topic: str, recorded: int, found: int, layout_topic: str) -> None:
        super().__init__(
            f"Kafka reports {found} partitions for {topic}, which {layout_topic} records with {recorded}: a "
            f"thread's records would go to another partition than its earlier ones, so nothing is written to "
            f"or read from it. A partition count changes only by copying the log into new topics "
            f'(docs/operations.md, "Changing the partition count")'
        )
        self.topic = topic
        self.recorded = recorded
        self.found = found


class SubjectErasedError(GraphledgerError):
    """The thread, store namespace or tenant was erased: nothing more can be read or written for it."""


class ThreadWriteRefusedError(GraphledgerError):
    """A write of this run was refused: another writer superseded the thread as this run read it, or the
    thread changed since (docs/architecture.md, "One writer per thread"). Nothing more of the run counts:
    read the thread again and retry the turn from its head."""

    def __init__(self, thread_id: str, checkpoint_ns: str, reason: str, superseded_by: str | None = None) -> None:
        where = f"thread {thread_id!r}" + (f" namespace {checkpoint_ns!r}" if checkpoint_ns else "")
        by = f" (superseded by checkpoint {superseded_by})" if superseded_by else ""
        super().__init__(
            f"{where}: this run's write was refused: {reason}{by}. The run cannot continue; read the thread "
            "again and retry the turn from its head"
        )
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.reason = reason
        self.superseded_by = superseded_by


# -- services ------------------------------------------------------------------------------------------


class SchemaSwitchedError(GraphledgerError):
    """A replay renamed the projection schema while this batch waited for its offset rows; re-run it."""

    retryable = True


class VectorIndexMismatchError(GraphledgerError):
    """The schema's vector table was built with another shape than the settings ask for."""


class ReencodeRefusedError(GraphledgerError):
    """This read needs a stored value re-encoded, which the read API cannot do without deserializing it.

    The official saver re-encodes only when it migrates the pending sends of a checkpoint written before
    checkpoint format v4; such a checkpoint has to be read with the agent's own serde.
    """


class LossRefusedError(GraphledgerError):
    """The source topics no longer hold every event; the replay would lose some (see `--accept-loss`)."""


class ReplayVerificationError(GraphledgerError):
    """The rebuilt schema differs from the live one at the same offsets; nothing was switched."""


class SourceError(GraphledgerError):
    """The source database is not a langgraph-checkpoint-postgres database graphledger can import."""


class ImportMismatchError(GraphledgerError):
    """The source cannot be imported into this projection as configured (vector dims differ)."""


class FiniteRetentionError(GraphledgerError):
    """A source-of-truth topic has finite retention: replaying it would not rebuild every projection."""


class TopicConfigError(GraphledgerError):
    """A topic's configuration on the broker cannot work as graphledger needs; nothing was changed."""


class SingleBrokerAcksError(TopicConfigError):
    """A source topic's writes may be acknowledged by a single broker: losing it loses acknowledged writes."""


class TimestampTypeError(TopicConfigError):
    """A source-of-truth topic stamps records with their producer's clock (`CreateTime`): expiry would
    follow the writers' clocks instead of the broker's."""


class OffsetResetError(GraphledgerError):
    """The reset was refused: it names what was wrong."""


class ParkedSubjectError(GraphledgerError):
    """A parked subject that is not parked (released or dropped already), or a name that is not one."""


class DeadLetterError(GraphledgerError):
    """A dead letter that does not exist, was replayed already, or whose replacement is invalid."""
