"""The client's keys come from the read API (`POST /v1/keys`), which scopes them to the token's tenant.

The client names its subjects as stored (its writes' names, under its tenant's prefix); the read API
refuses a name outside the token's tenant, derives the references itself with the tenant's hashing
key, and answers each subject's data key (created on first use) or that it was erased. It also hands
out fresh keys bound to no subject yet (`fresh`), which the client's `FreshKeyPool` holds ahead of use.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Protocol

from graphledger.erasure.sealer import TenantHashing
from graphledger.erasure.sealing import ERASED, Cipher, DataKey, cipher_of
from graphledger.erasure.subjects import Subject
from graphledger.errors import ReadApiError

KEYS_PATH = "/v1/keys"


class ReadApiCalls(Protocol):
    """The read API client's one call this needs (`graphledger.client.reader.ReadApiClient`)."""

    async def call(self, path: str, body: dict[str, Any]) -> Any: ...


class ReadApiKeySource:
    def __init__(self, reader: ReadApiCalls) -> None:
        self._reader = reader

    async def tenant_hashing(self, tenant: str) -> TenantHashing:
        answer = await self._reader.call(KEYS_PATH, {"subjects": []})
        return TenantHashing(_bytes(answer, "hash_key"), _depth(answer))

    async def data_keys(self, tenant: str, subjects: Sequence[tuple[str, Subject]]) -> dict[str, DataKey]:
        body = {"subjects": [{"kind": s.kind, "name": s.name} for _, s in subjects]}
        answer = await self._reader.call(KEYS_PATH, body)
        keys = answer.get("keys") if isinstance(answer, dict) else None
        if not isinstance(keys, list) or len(keys) != len(subjects):
            raise ReadApiError(200, "bad_answer", f"{KEYS_PATH} answered {len(subjects)} subjects with {keys!r:.80}")
        found: dict[str, DataKey] = {}
        for (ref, subject), entry in zip(subjects, keys, strict=True):
            if not isinstance(entry, dict) or entry.get("ref") != ref:
                raise ReadApiError(200, "bad_answer", f"{KEYS_PATH} answered another reference for {subject.kind}")
            found[ref] = ERASED if entry.get("erased") else cipher_of(_bytes(entry, "key"))
        return found

    async def fresh_keys(self, tenant: str, count: int) -> list[tuple[str, Cipher]]:
        answer = await self._reader.call(KEYS_PATH, {"subjects": [], "fresh": count})
        fresh = answer.get("fresh") if isinstance(answer, dict) else None
        if not isinstance(fresh, list) or len(fresh) > count:
            raise ReadApiError(200, "bad_answer", f"{KEYS_PATH} answered no list of at most {count} fresh keys")
        keys = []
        for entry in fresh:
            key_id = entry.get("id") if isinstance(entry, dict) else None
            if not isinstance(key_id, str) or not key_id:
                raise ReadApiError(200, "bad_answer", f"{KEYS_PATH} answered a fresh key without an id")
            keys.append((key_id, cipher_of(_bytes(entry, "key"))))
        return keys


def _bytes(answer: Any, field: str) -> bytes:
    value = answer.get(field) if isinstance(answer, dict) else None
    if isinstance(value, str):
        value = base64.b64decode(value)
    if not isinstance(value, bytes) or len(value) != 32:
        raise ReadApiError(200, "bad_answer", f"{KEYS_PATH} answered no 32-byte {field}")
    return value


def _depth(answer: Any) -> int:
    depth = answer.get("namespace_depth") if isinstance(answer, dict) else None
    if not isinstance(depth, int) or depth < 1:
        raise ReadApiError(200, "bad_answer", f"{KEYS_PATH} answered namespace_depth {depth!r}")
    return depth
