"""Erasure events: a subject's data key was destroyed, and every projection drops the subject's rows.

Published by the read API or `graphledger erase` after the key store destroyed the key, so every event
of the subject before the erasure in the log is already unreadable, and so is every event after it.
They name the subject by its reference only (`subjects.py`): the log keeps no identifier of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from graphledger.errors import InvalidEventError


@dataclass(frozen=True, slots=True)
class ThreadErase:
    """A thread was erased; keyed by the thread's record key, so it follows the thread's events."""

    TYPE: ClassVar[str] = "thread.erase"
    ref: str

    @property
    def key(self) -> str:
        return self.ref

    def to_payload(self) -> dict[str, Any]:
        return {"ref": self.ref}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> ThreadErase:
        return cls(_ref(p))


@dataclass(frozen=True, slots=True)
class NamespaceErase:
    """A store namespace prefix was erased; published to every store partition (its items' keys differ)."""

    TYPE: ClassVar[str] = "namespace.erase"
    ref: str

    @property
    def key(self) -> None:
        return None

    def to_payload(self) -> dict[str, Any]:
        return {"ref": self.ref}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> NamespaceErase:
        return cls(_ref(p))


@dataclass(frozen=True, slots=True)
class TenantErase:
    """A tenant was erased, every key of it; published to every partition of both topics."""

    TYPE: ClassVar[str] = "tenant.erase"
    tenant: str

    @property
    def key(self) -> None:
        return None

    def to_payload(self) -> dict[str, Any]:
        return {"tenant": self.tenant}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> TenantErase:
        tenant = p.get("tenant")
        if not isinstance(tenant, str) or not tenant or "\x00" in tenant:
            raise InvalidEventError(f"tenant {tenant!r} is not a non-empty string without NUL")
        return cls(tenant)


def _ref(p: dict[str, Any]) -> str:
    ref = p.get("ref")
    if not isinstance(ref, str) or not ref or len(ref) > 128 or not ref.isalnum():
        raise InvalidEventError(f"ref {ref!r} is not a subject reference")
    return ref
