"""All graphledger errors. Each carries `retryable`, so callers branch on an attribute, not a class list."""

from __future__ import annotations


class GraphledgerError(Exception):
    """A graphledger operation failed."""

    retryable: bool = False

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


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
