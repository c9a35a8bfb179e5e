"""JSON log lines for the services: one object per line, with the trace and span of the code that logged.

`{"time": "2025-01-01T12:00:00.123Z", "level": "INFO", "logger": "...", "message": "...",
"trace_id": "...", "span_id": "..."}`; `exception` holds a formatted traceback when there is one.
A log collector then needs no parsing rules, and a line written inside a span (a batch apply, a read
API request) leads to its trace. The ids come from the span current when the record is formatted,
which is the logging call's own context: handlers format synchronously in the calling thread.

Messages are written by graphledger's code with `%` arguments it chooses (positions, counts, type
names); no log call passes checkpoint or store content.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from types import TracebackType
from typing import TextIO

from opentelemetry import trace

# Record attributes that are not `extra=` fields; uvicorn's `color_message` is its message with ANSI colours.
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName", "color_message"}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line (newlines in messages stay escaped by JSON)."""

    def __init__(self, service: str | None = None) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.service:
            entry["service"] = self.service
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            entry["trace_id"] = f"{context.trace_id:032x}"
            entry["span_id"] = f"{context.span_id:016x}"
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        for key, value in record.__dict__.items():  # `extra=` fields, when a caller passes any
            if key not in _RESERVED and not key.startswith("_") and key not in entry:
                entry[key] = value
        return json.dumps(entry, default=str, ensure_ascii=False)


def use_json_logs(service: str | None = None, stream: TextIO | None = None) -> logging.Handler:
    """Make the root logger write JSON lines to `stream` (stderr), keeping its level; returns the handler.

    Warnings and uncaught exceptions go through it too, so a log collector never meets a bare
    traceback split over lines.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    return handler


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    logging.getLogger("graphledger").critical("uncaught %s", kind.__name__, exc_info=(kind, exc, tb))
