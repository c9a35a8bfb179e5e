"""`/v1/checkpoints/key-filter`: one checkpoint partition's Bloom filter of record keys, with the offset below
which it holds every key (`graphledger.log.key_filter`), read in one snapshot of the projection.

A client proves a thread new with it (`client/thread_reads.py`), so it is served only to the unnamed
tenant's clients, the ones that read the log themselves: the record keys of a tenant's threads are
sealed with the tenant's hashing key, and a tenant's client does not fetch other tenants' records. The
filter says no more than the partition's record keys do, which every reader of the topic sees.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request, Response
from pydantic import Field

from graphledger.answers import KeyFilterAnswer
from graphledger.log import key_filter
from graphledger_server.api.auth import tenant_of
from graphledger_server.api.codec import decode, respond
from graphledger_server.api.db import snapshot
from graphledger_server.api.errors import ApiError
from graphledger_server.api.models import _Request, request_body
from graphledger_server.api.state import api_state
from graphledger_server.log.key_filter import snapshot_words
from graphledger_server.log.offsets import snapshot_key_filter_offset

router = APIRouter(prefix="/v1/checkpoints", tags=["checkpoints"])


class KeyFilterRequest(_Request):
    partition: Annotated[int, Field(ge=0, lt=2**31)]


@router.post(
    "/key-filter",
    openapi_extra={"requestBody": request_body(KeyFilterRequest)},
)
async def read_key_filter(request: Request) -> Response:
    """The partition's filter: `through` (the projection's next offset), `complete` (whether the filter holds
    every key below it), its shape (`bits`, `hashes`) and its set words as packed little-endian arrays,
    `indexes` (uint32) and `values` (uint64)."""
    state = api_state(request)
    if tenant_of(request).name:
        raise ApiError(
            403, "permission_denied", "the key filter is for clients of the unnamed tenant, which read the log"
        )
    body = await decode(request, KeyFilterRequest, state.settings.api_max_body_bytes)
    topic = state.settings.checkpoint_topic
    async with snapshot(state.pool) as conn:
        through, complete = await snapshot_key_filter_offset(
            conn, state.settings.projector_group_id, topic, body.partition
        )
        indexes, values = await snapshot_words(conn, topic, body.partition)
    answer = KeyFilterAnswer(through, complete, key_filter.BITS, key_filter.HASHES, indexes, values)
    return respond(request, answer.to_wire())
