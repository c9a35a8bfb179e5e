"""The read API's bounds, each driven for real (the ASGI app with its lifespan, on real Postgres): request
body size, result count, response size and concurrent consistency waits answer 413 or 503 with a
message naming the setting (and `Retry-After` where retrying helps) instead of growing without bound.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx
import ormsgpack
import pytest
from pydantic import SecretStr

from graphledger.events.store import StorePut
from graphledger.settings import Settings
from graphledger.wire import CONSISTENCY_HEADER, MSGPACK
from graphledger_server.api.app import create_app
from graphledger_server.api.credentials import token_entry
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.migrate import migrate
from graphledger_server.projection.store import StoreProjection
from polling import wait_for
from projection_helpers import TOPIC, put, record
from store_helpers import STORE_TOPIC
from store_helpers import record as store_record

SCHEMA = "limits"
THREAD = "many"
CHECKPOINTS = 5
ITEMS = 5
BIG_BLOB = 20_000


async def _no_dead_letters(letters: Any) -> None:
    raise AssertionError(f"unexpected dead letters: {letters}")


@pytest.fixture(scope="module")
async def projection(pg: Any) -> str:
    """A projection with a thread of 5 checkpoints, one with a 20 kB blob, and 5 store items in 5 namespaces."""
    dsn = pg.create_database(f"t_{uuid.uuid4().hex[:12]}")
    await migrate(dsn, SCHEMA)
    conn = await asyncpg.connect(dsn)
    try:
        store = StoreProjection(SCHEMA)
        await store.prepare(conn)
        applier = BatchApplier(
            SCHEMA, "limits", {TOPIC: CheckpointProjection(SCHEMA), STORE_TOPIC: store}, _no_dead_letters
        )
        events = [put(THREAD, n, n - 1 if n > 1 else None) for n in range(1, CHECKPOINTS + 1)]
        events.append(put("big", 1, blobs={"payload": b"x" * BIG_BLOB}))
        records = [record(e, 0, i) for i, e in enumerate(events)]
        items = [StorePut(("docs", f"n{i}"), f"k{i}", json.dumps({"i": i}).encode(), None, None) for i in range(ITEMS)]
        records += [store_record(e, 1_700_000_000_000, 0, i) for i, e in enumerate(items)]
        await applier.apply(conn, records)
    finally:
        await conn.close()
    return dsn


LOG: dict[str, Any] = {}
"""The session's empty topics (`empty_log`): the read API learns from them that nothing is unprojected."""


@pytest.fixture(autouse=True, scope="module")
def _empty_log(empty_log: dict[str, Any]) -> None:
    LOG.update(empty_log)


@asynccontextmanager
async def running(dsn: str, **overrides: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    values: dict[str, Any] = {**LOG, "postgres_dsn": dsn, "postgres_schema": SCHEMA}
    settings = Settings(**{**values, "projector_group_id": f"g{uuid.uuid4().hex[:8]}", **overrides})
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://read-api", timeout=60) as client:
            yield app, client


async def post(
    client: httpx.AsyncClient, path: str, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    sent = {"Content-Type": MSGPACK, "Accept": MSGPACK, **(headers or {})}
    return await client.post(path, content=ormsgpack.packb(body), headers=sent)


def error(response: httpx.Response) -> dict[str, Any]:
    return ormsgpack.unpackb(response.content)


async def test_a_request_body_over_the_limit_is_a_413(projection: str) -> None:
    async with running(projection, api_max_body_bytes=2048) as (_, client):
        big = {"thread_id": "t", "checkpoint_ns": "x" * 4096}
        declared = await post(client, "/v1/checkpoints/get", big)

        async def stream() -> AsyncIterator[bytes]:  # no Content-Length: counted while reading
            body = ormsgpack.packb(big)
            for i in range(0, len(body), 512):
                yield body[i : i + 512]

        streamed = await client.post(
            "/v1/checkpoints/get", content=stream(), headers={"Content-Type": MSGPACK, "Accept": MSGPACK}
        )
        for response in (declared, streamed):
            assert response.status_code == 413
            assert error(response)["error"] == "body_too_large"
            assert (
                "2048 bytes" in error(response)["message"]
                and "GRAPHLEDGER_API_MAX_BODY_BYTES" in error(response)["message"]
            )
        assert (await post(client, "/v1/checkpoints/get", {"thread_id": "t"})).status_code == 200


async def test_a_list_matching_more_than_the_cap_is_a_413_and_pages_work(projection: str) -> None:
    async with running(projection, api_max_result_items=3) as (_, client):
        for body in ({"thread_id": THREAD}, {"thread_id": THREAD, "limit": 4}, {}):
            response = await post(client, "/v1/checkpoints/list", body)
            assert response.status_code == 413, body
            assert error(response)["error"] == "result_too_large"
            assert "more than 3" in error(response)["message"] and "before_checkpoint_id" in error(response)["message"]
        page = error(await post(client, "/v1/checkpoints/list", {"thread_id": THREAD, "limit": 3}))["tuples"]
        assert len(page) == 3
        last = page[-1]["config"]["checkpoint_id"]
        rest = await post(
            client, "/v1/checkpoints/list", {"thread_id": THREAD, "limit": 3, "before_checkpoint_id": last}
        )
        assert len(error(rest)["tuples"]) == CHECKPOINTS - 3
        # A limit above the cap is fine while fewer match.
        assert len(error(await post(client, "/v1/checkpoints/list", {"thread_id": "big", "limit": 100}))["tuples"]) == 1


async def test_a_store_search_or_listing_over_the_cap_is_a_413(projection: str) -> None:
    async with running(projection, api_max_result_items=3) as (_, client):
        for op in (
            {"op": "search", "namespace_prefix": ["docs"], "limit": 10},
            {"op": "list_namespaces", "limit": 10},
        ):
            response = await post(
                client, "/v1/store/batch", {"ops": [{"op": "get", "namespace": ["docs"], "key": "k"}, op]}
            )
            assert response.status_code == 413, op
            assert (
                error(response)["error"] == "result_too_large"
                and "ops.1 matches more than 3" in error(response)["message"]
            )
        fits = await post(
            client, "/v1/store/batch", {"ops": [{"op": "search", "namespace_prefix": ["docs"], "limit": 3}]}
        )
        assert len(error(fits)["results"][0]) == 3
        listed = await post(client, "/v1/store/batch", {"ops": [{"op": "list_namespaces", "limit": 3, "offset": 3}]})
        assert error(listed)["results"][0] == [["docs", "n3"], ["docs", "n4"]]


async def test_an_answer_over_the_response_limit_is_a_413(projection: str) -> None:
    async with running(projection, api_max_response_bytes=BIG_BLOB // 2) as (_, client):
        response = await post(client, "/v1/checkpoints/get", {"thread_id": "big"})
        assert response.status_code == 413
        assert error(response)["error"] == "response_too_large"
        assert "GRAPHLEDGER_API_MAX_RESPONSE_BYTES" in error(response)["message"]
        assert (await post(client, "/v1/checkpoints/get", {"thread_id": THREAD})).status_code == 200


async def test_consistency_waits_beyond_the_limit_are_503_with_retry_after(
    projection: str, filled_log: dict[str, Any]
) -> None:
    limits = {"api_max_consistency_waits": 2, "consistency_timeout_s": 60, **filled_log}
    async with running(projection, **limits) as (app, client):
        topic = app.state.api.settings.checkpoint_topic
        ahead = {CONSISTENCY_HEADER: f"{topic}:0:5"}  # in the log; the projector has not applied it
        offsets = app.state.api.offsets
        waiting = [
            asyncio.create_task(post(client, "/v1/checkpoints/get", {"thread_id": THREAD}, ahead)) for _ in range(2)
        ]
        await until_waiting(app, 2)
        refused = await post(client, "/v1/checkpoints/get", {"thread_id": THREAD}, ahead)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        body = error(refused)
        assert body["error"] == "too_many_waits" and body["retryable"] is True
        assert "GRAPHLEDGER_API_MAX_CONSISTENCY_WAITS" in body["message"]
        store = await post(client, "/v1/store/batch", {"ops": []}, ahead)
        assert store.status_code == 503 and error(store)["error"] == "too_many_waits"
        # A read that needs no wait still runs while the waits are full.
        assert (await post(client, "/v1/checkpoints/get", {"thread_id": THREAD})).status_code == 200
        # The projector reaching the token releases the waiting reads.
        await apply_through(projection, app, topic, 5)
        assert [r.status_code for r in await asyncio.gather(*waiting)] == [200, 200]
        assert offsets.waiting == 0


async def apply_through(dsn: str, app: Any, topic: str, offset: int) -> None:
    """What the projector does once it applied partition 0 of `topic` through `offset`."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f"INSERT INTO {SCHEMA}.graphledger_offsets (consumer_group, topic, partition, next_offset) "
            "VALUES ($1, $2, 0, $3)",
            app.state.api.settings.projector_group_id,
            topic,
            offset + 1,
        )
        await conn.execute("SELECT pg_notify('graphledger_applied', $1)", SCHEMA)
    finally:
        await conn.close()


async def until_waiting(app: Any, count: int) -> None:
    async def waiting() -> bool:
        return app.state.api.offsets.waiting == count

    await wait_for(waiting, f"{count} reads to wait for the projection", timeout_s=30)


async def test_a_tenant_holding_all_its_wait_slots_does_not_stop_another_tenants_read(
    projection: str, filled_log: dict[str, Any]
) -> None:
    """Four slots, two tenants: acme's reads ahead of the projection take two (then as many are free
    as it holds) and its next is refused; beta's read still gets a slot and is answered."""
    tokens = {"acme": "acme-token", "beta": "beta-token"}
    hashes = SecretStr(",".join(token_entry(tenant, token) for tenant, token in tokens.items()))
    limits = {"api_max_consistency_waits": 4, "consistency_timeout_s": 60, "api_token_hashes": hashes}
    async with running(projection, **limits, **filled_log) as (app, client):
        topic = app.state.api.settings.checkpoint_topic

        def read(tenant: str) -> Any:
            headers = {"Authorization": f"Bearer {tokens[tenant]}", CONSISTENCY_HEADER: f"{topic}:0:5"}
            return post(client, "/v1/checkpoints/get", {"thread_id": THREAD}, headers)

        acme = [asyncio.create_task(read("acme")) for _ in range(2)]
        await until_waiting(app, 2)
        refused = await read("acme")
        assert refused.status_code == 503 and error(refused)["error"] == "too_many_waits"
        assert "2 of them this tenant's" in error(refused)["message"]
        beta = asyncio.create_task(read("beta"))
        await until_waiting(app, 3)  # beta's read waits in a slot of its own
        await apply_through(projection, app, topic, 5)
        assert [r.status_code for r in await asyncio.gather(*acme, beta)] == [200, 200, 200]


async def test_a_token_creates_a_bounded_number_of_data_keys_per_minute(projection: str) -> None:
    """Creating keys for new subjects spends the token's quota; fetching existing ones does not; beyond
    it the answer is a 429 saying when to retry, and a request larger than the quota can never pass."""
    hashes = SecretStr(token_entry("acme", "acme-token"))
    run = uuid.uuid4().hex[:8]
    auth = {"Authorization": "Bearer acme-token"}

    def subjects(*numbers: int) -> dict[str, Any]:
        return {"subjects": [{"kind": "thread", "name": f"acme/{run}-{n}"} for n in numbers]}

    async with running(projection, api_max_key_creations_per_minute=3, api_token_hashes=hashes) as (_, client):
        created = await post(client, "/v1/keys", subjects(0, 1, 2), auth)
        assert created.status_code == 200, error(created)
        fetched = await post(client, "/v1/keys", subjects(0, 1, 2), auth)
        assert fetched.status_code == 200 and error(fetched)["keys"] == error(created)["keys"]
        refused = await post(client, "/v1/keys", subjects(2, 3), auth)
        body = error(refused)
        assert refused.status_code == 429 and body["error"] == "too_many_new_keys" and body["retryable"] is True
        assert int(refused.headers["retry-after"]) >= 1
        assert "GRAPHLEDGER_API_MAX_KEY_CREATIONS_PER_MINUTE" in body["message"]
        never = await post(client, "/v1/keys", subjects(*range(10, 14)), auth)
        assert never.status_code == 429 and error(never)["retryable"] is False
        assert "name fewer new subjects per request" in error(never)["message"]
