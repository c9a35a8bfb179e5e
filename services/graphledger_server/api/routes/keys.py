"""`/v1/keys` and `/v1/erase`: the data keys a client seals its writes with, and erasure
(docs/security.md). Both are the token's tenant's only, and each needs its permission (`api/auth.py`).

A client names its subjects as stored (under its tenant's prefix); a name outside the tenant is a 403,
so a token can never obtain another tenant's keys. References are derived here, with the tenant's
hashing key, never taken from the client. The keys a token creates are bounded per minute (`api/key_quota.py`).
"""

from __future__ import annotations

import logging
import math
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import Field, StringConstraints, model_validator

from graphledger.erasure.sealing import ERASED, Erased
from graphledger.erasure.subjects import LABEL_SEPARATOR, Subject, reference
from graphledger.tenancy import THREAD_SEPARATOR
from graphledger_server.api.auth import Caller, caller_of, tenant_of
from graphledger_server.api.codec import decode, respond
from graphledger_server.api.credentials import Permission
from graphledger_server.api.errors import ApiError
from graphledger_server.api.models import Text, _Request
from graphledger_server.api.state import ApiState, api_state, key_store_answers
from graphledger_server.api.tenant import Tenant
from graphledger_server.keys.erase import ErasureReport
from graphledger_server.keys.key_store import RawKey
from graphledger_server.keys.source import StoreKeySource

router = APIRouter(prefix="/v1", tags=["erasure"])
log = logging.getLogger(__name__)

MAX_SUBJECTS = 1_000


class SubjectName(_Request):
    kind: Literal["thread", "namespace"]
    name: Annotated[str, StringConstraints(min_length=1)]
    """A thread id, or a namespace prefix's labels joined by U+001F, as stored (with the tenant's prefix)."""


MAX_FRESH = 256
"""Most fresh keys one request asks for (a client's pool asks for up to this many at a time)."""


class KeysRequest(_Request):
    subjects: list[SubjectName] = Field(max_length=MAX_SUBJECTS)
    fresh: int = Field(0, ge=0, le=MAX_FRESH)
    """New keys bound to no subject yet (`graphledger.erasure.fresh_keys`), charged like new subjects' keys."""


class EraseRequest(_Request):
    """Exactly one of: a thread, a store namespace (its first labels), the token's whole tenant."""

    thread_id: Annotated[str, StringConstraints(min_length=1)] | None = None
    namespace: list[Text] | None = Field(None, min_length=1)
    tenant: bool = False

    @model_validator(mode="after")
    def _one(self) -> EraseRequest:
        if sum((self.thread_id is not None, self.namespace is not None, self.tenant)) != 1:
            raise ValueError("name exactly one of thread_id, namespace and tenant: true")
        return self


@router.post("/keys")
async def keys(request: Request) -> Response:
    """The tenant's hashing key and namespace depth, and the data key of every subject named (created on
    first use), or `erased: true`."""
    caller = caller_of(request)
    tenant = caller.tenant
    state = api_state(request)
    body = await decode(request, KeysRequest, state.settings.api_max_body_bytes)
    source = _source(state)
    subjects = [_subject(tenant, s, state.settings.erasure_namespace_depth) for s in body.subjects]
    async with key_store_answers():
        hashing = await source.tenant_hashing(tenant.name)
        named = [(reference(hashing.hash_key, s), s) for s in subjects]
        found = await _data_keys(state, caller, named)
        if body.fresh:
            _charge(state, caller, body.fresh)
            fresh = await source.store.fresh_keys(tenant.name, body.fresh)
    answer: dict[str, Any] = {
        "hash_key": hashing.hash_key,
        "namespace_depth": hashing.namespace_depth,
        "keys": [_key_entry(ref, found[ref]) for ref, _ in named],
    }
    if body.fresh:
        answer["fresh"] = [{"id": key_id, "key": key} for key_id, key in fresh]
    return respond(request, answer)


@router.post("/erase")
async def erase(request: Request) -> Response:
    """Erase a thread (and the threads copied from it), a store namespace, or the token's tenant; answers
    the subjects erased and where their erasure events are in the log (a consistency token's positions)."""
    tenant = tenant_of(request)
    state = api_state(request)
    body = await decode(request, EraseRequest, state.settings.api_max_body_bytes)
    if state.eraser is None:
        raise ApiError(
            501, "erasure_off", "the read API seals no events (GRAPHLEDGER_ENCRYPT_EVENTS off): nothing to erase"
        )
    who = f"read API, token of tenant {tenant.name!r}" if tenant.name else "read API"
    async with key_store_answers():
        if body.thread_id is not None:
            report = await state.eraser.erase_thread(tenant.name, tenant.thread(body.thread_id), who)
        elif body.namespace is not None:
            stored = (tenant.name, *body.namespace) if tenant.name else tuple(body.namespace)
            report = await state.eraser.erase_namespace(tenant.name, stored, who)
        else:
            report = await state.eraser.erase_tenant(tenant.name, who)
    return respond(request, _report(report))


async def offered_thread_key(state: ApiState, caller: Caller, stored_thread_id: str) -> bytes | None:
    """The own data key of an existing thread a get answered (`X-Graphledger-Thread-Key`), for a token that may
    have keys: what `/v1/keys` would answer next (a key it creates is charged to the token). Looked up once the
    read showed the thread exists, so a new thread's read costs nothing more. It never fails the read: any
    failure (the key store away, the token's key creations spent) offers nothing, and the client asks
    `/v1/keys` as before."""
    if state.keys is None or Permission.KEYS not in caller.permissions:
        return None
    subject = Subject("thread", caller.tenant.name, stored_thread_id)
    try:
        hashing = await state.keys.tenant_hashing(caller.tenant.name)
        ref = reference(hashing.hash_key, subject)
        key = (await _data_keys(state, caller, [(ref, subject)]))[ref]
    except Exception as exc:  # the read stands without it
        log.info("a get offers no thread key: %s", exc)
        return None
    return None if isinstance(key, Erased) else key


async def _data_keys(state: ApiState, caller: Caller, named: list[tuple[str, Subject]]) -> dict[str, RawKey]:
    """The named subjects' keys; those to create are charged to the caller's token first (a 429 when it
    holds too few). No token: only a loopback read API hands out keys (`api/auth.py`), unbounded."""
    store = _source(state).store
    if not named:
        return {}
    if caller.token is None:
        return await store.data_keys(named)
    found = await store.find([ref for ref, _ in named])
    missing = list({ref: subject for ref, subject in named if ref not in found}.items())
    _charge(state, caller, len(missing))
    return found | (await store.data_keys(missing) if missing else {})


def _charge(state: ApiState, caller: Caller, created: int) -> None:
    """Charge `created` new keys to the caller's token (a 429 when it holds too few); no token: only a
    loopback read API hands out keys (`api/auth.py`), unbounded."""
    if caller.token is None or not created:
        return
    wait_s = state.key_quota.take(caller.token, created)
    if wait_s is not None:
        per_minute = state.settings.api_max_key_creations_per_minute
        if math.isinf(wait_s):
            raise ApiError(
                429,
                "too_many_new_keys",
                f"the request creates {created} data keys, more than a token may per minute "
                f"({per_minute}, GRAPHLEDGER_API_MAX_KEY_CREATIONS_PER_MINUTE): name fewer new subjects per request",
            )
        raise ApiError(
            429,
            "too_many_new_keys",
            f"this token created its {per_minute} data keys of the minute "
            f"(GRAPHLEDGER_API_MAX_KEY_CREATIONS_PER_MINUTE); retry in {math.ceil(wait_s)}s",
            retryable=True,
            headers={"Retry-After": str(math.ceil(wait_s))},
        )


def _source(state: ApiState) -> StoreKeySource:
    if state.keys is None:
        raise ApiError(501, "encryption_off", "the read API seals no events (GRAPHLEDGER_ENCRYPT_EVENTS off)")
    return state.keys


def _subject(tenant: Tenant, named: SubjectName, depth: int) -> Subject:
    """The subject, if it is the tenant's (403 otherwise) and a subject at all (400 otherwise)."""
    if named.kind == "thread":
        if tenant.name and not named.name.startswith(tenant.name + THREAD_SEPARATOR):
            raise ApiError(403, "subject_outside_tenant", "a thread outside the token's tenant")
        return Subject("thread", tenant.name, named.name)
    labels = named.name.split(LABEL_SEPARATOR)
    own = 1 if tenant.name else 0
    if tenant.name and labels[0] != tenant.name:
        raise ApiError(403, "subject_outside_tenant", "a namespace outside the token's tenant")
    if not own < len(labels) <= depth + own or not all(labels):
        raise ApiError(400, "not_a_subject", f"a namespace subject has 1 to {depth} non-empty labels")
    return Subject("namespace", tenant.name, named.name)


def _key_entry(ref: str, key: bytes | Erased) -> dict[str, Any]:
    if key is ERASED:
        return {"ref": ref, "erased": True}
    return {"ref": ref, "key": key}


def _report(report: ErasureReport) -> dict[str, Any]:
    return {
        "erased": [{"kind": kind, "ref": ref} for kind, ref in report.erased],
        "positions": [list(p) for p in report.positions],
    }
