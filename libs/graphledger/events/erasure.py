"""Erasure events: a subject's data key was destroyed, and every projection drops the subject's rows.

Published by the read API or `graphledger erase` after the key store destroyed the key, so every event
of the subject before the erasure in the log is already unreadable, and so is every event after it.
They name the subject by its reference only (`graphledger/erasure/subjects.py`): the log keeps no identifier of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from graphledger.errors import InvalidEventError
from graphledger.events.codec import EventPayload, Kind, Text, payload_codec, wire


@dataclass(frozen=True, slots=True)
class SubjectRef(Kind):
    """A subject's reference (`subjects.reference`): 1 to 128 letters and digits."""

    def decode(self, value: Any, name: str) -> str:
        if not isinstance(value, str) or not value or len(value) > 128 or not value.isalnum():
            raise InvalidEventError(f"{name} {value!r} is not a subject reference")
        return value


@payload_codec
@dataclass(frozen=True, slots=True)
class ThreadErase(EventPayload):
    """A thread was erased; keyed by the thread's record key, so it follows the thread's events."""

    TYPE: ClassVar[str] = "thread.erase"
    ref: str = field(metadata=wire(kind=SubjectRef()))

    @property
    def key(self) -> str:
        return self.ref


@payload_codec
@dataclass(frozen=True, slots=True)
class NamespaceErase(EventPayload):
    """A store namespace prefix was erased; published to every store partition (its items' keys differ)."""

    TYPE: ClassVar[str] = "namespace.erase"
    ref: str = field(metadata=wire(kind=SubjectRef()))

    @property
    def key(self) -> None:
        return None


@payload_codec
@dataclass(frozen=True, slots=True)
class TenantErase(EventPayload):
    """A tenant was erased, every key of it; published to every partition of both topics."""

    TYPE: ClassVar[str] = "tenant.erase"
    tenant: str = field(metadata=wire(kind=Text(nonempty=True, nul_apart=False)))

    @property
    def key(self) -> None:
        return None
