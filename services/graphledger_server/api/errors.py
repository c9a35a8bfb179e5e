"""The read API's one exception: an HTTP status plus the body every error shares.

Every error body is `{"error": code, "message": text, "retryable": bool}`, so the client branches on
`retryable` and `error`, never on the status line or on message text.
"""

from __future__ import annotations


class ApiError(Exception):
    """An error answer: `status`, machine-readable `code`, human `message`, and whether to retry."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {"error": self.code, "message": self.message, "retryable": self.retryable}


def unavailable(code: str, message: str) -> ApiError:
    """503 the client may retry after a second (Postgres down, projection not ready, token not reached)."""
    return ApiError(503, code, message, retryable=True, headers={"Retry-After": "1"})
