"""The read API's guards and failures: the bearer token, keys and erasure without a token only on a
loopback API, the OpenAPI document, readiness, the connection pool, and Postgres or the broker out of
reach (retryable 503s naming the failure, not the internal addresses).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import asyncpg
import psycopg
import pytest

from graphledger.wire import JSON, MSGPACK, THREAD_KEY_HEADER, THREAD_KEY_WANTED
from graphledger_server.api.db import open_pool
from graphledger_server.devstack.ports import free_port
from read_api_helpers import DELTA, GET, LIST, Api, answer, call, ok, running, settings_for


async def test_bearer_token_guards_reads_but_not_health(projection: str) -> None:
    async with running(settings_for(projection, api_token="s3cret")) as guarded:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0"}):
            response = await call(guarded.client, GET, {"thread_id": "direct"}, headers=headers)
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            assert answer(response)["error"] == "unauthorized"
        right = await call(guarded.client, GET, {"thread_id": "direct"}, headers={"Authorization": "Bearer s3cret"})
        assert right.status_code == 200
        assert (await guarded.client.get("/healthz")).status_code == 200
        assert (await guarded.client.get("/readyz")).status_code == 200


@pytest.mark.parametrize(("host", "keys_status"), [("127.0.0.1", 200), ("0.0.0.0", 403)])
async def test_without_a_token_keys_and_erasure_need_a_loopback_api(
    projection: str, host: str, keys_status: int
) -> None:
    """No token configured: everyone reads; keys and erasure only where nobody but this host can ask
    (`graphledger dev`). On every address they are refused, saying what to configure."""
    async with running(settings_for(projection, api_host=host)) as anonymous:
        assert (await call(anonymous.client, GET, {"thread_id": "direct"})).status_code == 200
        keys = await call(anonymous.client, "/v1/keys", {"subjects": [{"kind": "thread", "name": "anonymous-t"}]})
        # A body naming nothing: past the permission check it is a 422, and erases nothing in the shared log.
        erase = await call(anonymous.client, "/v1/erase", {})
    assert keys.status_code == keys_status, answer(keys)
    if keys_status == 200:
        assert len(answer(keys)["keys"][0]["key"]) == 32
        assert erase.status_code == 422 and answer(erase)["error"] == "invalid_request", answer(erase)
        return
    for refused in (keys, erase):
        assert refused.status_code == 403 and answer(refused)["error"] == "token_required"
        assert "GRAPHLEDGER_API_HOST" in answer(refused)["message"]


async def test_a_get_offers_an_existing_threads_own_key_to_a_caller_that_may_have_keys(projection: str) -> None:
    """`X-Graphledger-Thread-Key: want` (a sealing client that holds no key of the thread): beside an existing
    thread's checkpoint, the thread's own key, the one `/v1/keys` answers; nothing for a thread with no
    checkpoint, nothing unasked, and nothing to a caller that may not have keys."""
    want = {THREAD_KEY_HEADER: THREAD_KEY_WANTED}
    settings = settings_for(projection)
    count_keys = f"SELECT count(*) FROM {settings.key_store_schema}.data_keys"
    async with running(settings) as loopback:
        await ok(loopback.client, "/v1/keys", {"subjects": []})  # the key store is ready
        keys_before = await _fetchval(projection, count_keys)
        offered = answer(await call(loopback.client, GET, {"thread_id": "direct"}, headers=want))
        in_json = answer(await call(loopback.client, GET, {"thread_id": "direct"}, "json", headers=want))
        unasked = answer(await call(loopback.client, GET, {"thread_id": "direct"}))
        missing = answer(await call(loopback.client, GET, {"thread_id": "no-such-thread"}, headers=want))
        keys_after = await _fetchval(projection, count_keys)
        keys = await ok(loopback.client, "/v1/keys", {"subjects": [{"kind": "thread", "name": "direct"}]})
    async with running(settings_for(projection, api_host="0.0.0.0")) as read_only:
        refused = answer(await call(read_only.client, GET, {"thread_id": "direct"}, headers=want))
    assert offered["tuple"] is not None and offered["thread_key"] == keys["keys"][0]["key"]
    assert base64.b64decode(in_json["thread_key"]) == offered["thread_key"]
    assert "thread_key" not in unasked and unasked["tuple"] == offered["tuple"]
    assert missing["tuple"] is None and "thread_key" not in missing
    assert keys_after == keys_before + 1  # the existing thread's, created by the offer; none for the missing one
    assert refused["tuple"] is not None and "thread_key" not in refused


async def _fetchval(dsn: str, sql: str) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def test_openapi_documents_the_three_reads(api: Api) -> None:
    schema = (await api.client.get("/openapi.json")).json()
    for path in (GET, LIST, DELTA):
        content = schema["paths"][path]["post"]["requestBody"]["content"]
        assert set(content) == {JSON, MSGPACK}
        assert "thread_id" in content[JSON]["schema"]["properties"]
    assert "channels" in schema["paths"][DELTA]["post"]["requestBody"]["content"][MSGPACK]["schema"]["required"]
    assert {"/healthz", "/readyz"} <= set(schema["paths"])
    # The bearer token (checked by middleware, not a dependency) is declared on every /v1 operation.
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            assert (operation.get("security") == [{"HTTPBearer": []}]) == path.startswith("/v1/"), path


async def test_readyz_needs_the_migrated_schema(api: Api, fresh_database: str) -> None:
    assert (await api.client.get("/readyz")).status_code == 200
    async with running(settings_for(fresh_database)) as unmigrated:
        assert (await unmigrated.client.get("/healthz")).status_code == 200
        response = await unmigrated.client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["error"] == "not_ready" and response.json()["retryable"] is True
        read = await call(unmigrated.client, GET, {"thread_id": "t"})
        assert read.status_code == 503 and answer(read)["error"] == "not_ready"


async def test_the_pool_hands_out_the_connection_returned_last(projection: str) -> None:
    """At low load reads stay on the backend that ran the last one (warm caches), not on each of the
    pool's connections in turn; `check()` keeps every connection."""
    pool = open_pool(settings_for(projection, api_pool_size=3))
    await pool.open(wait=True)
    try:

        async def backend(conn: psycopg.AsyncConnection[Any]) -> int:
            return (await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone())["pid"]

        taken = [await pool.getconn() for _ in range(3)]
        pids = [await backend(conn) for conn in taken]
        for conn in taken:
            await pool.putconn(conn)
        for _ in range(3):
            async with pool.connection() as conn:
                assert await backend(conn) == pids[-1]
        await pool.check()
        assert pool.get_stats()["pool_available"] == 3
        async with pool.connection() as a, pool.connection() as b:
            assert {await backend(a), await backend(b)} <= set(pids)
    finally:
        await pool.close()


async def test_a_store_read_that_gets_no_connection_in_time_is_a_retryable_503(projection: str) -> None:
    """The store reads' pool (asyncpg) answers as the checkpoint reads' does when every connection is
    busy: a 503 after `api_pool_timeout_s`, not a wait without end."""
    async with running(settings_for(projection, api_pool_size=1, api_pool_timeout_s=0.3)) as busy:
        store_pool = busy.app.state.api.store_pool
        # A first read, as every process makes: the tenant's hashing key (which the key store, on the
        # same pool, answers) is cached from then on, and what follows is about the reads' own connection.
        get = {"ops": [{"op": "get", "namespace": ["a"], "key": "k"}]}
        assert (await call(busy.client, "/v1/store/batch", get)).status_code == 200
        async with store_pool.acquire():  # the pool's only connection, held
            read = call(busy.client, "/v1/store/batch", get)
            response = await asyncio.wait_for(read, 10.0)
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert answer(response)["error"] == "postgres_unavailable" and answer(response)["retryable"] is True
        # Released, the connection serves the next read.
        again = await call(busy.client, "/v1/store/batch", get)
        assert again.status_code == 200


async def test_unreachable_postgres_is_a_retryable_503_not_a_500() -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=1"
    async with running(settings_for(nowhere, api_pool_timeout_s=0.3)) as cut_off:
        assert (await cut_off.client.get("/healthz")).status_code == 200
        store_reads = [{"op": "get", "namespace": ["a"], "key": "k"}, {"op": "search", "namespace_prefix": ["a"]}]
        for response in (
            await cut_off.client.get("/readyz"),
            await call(cut_off.client, GET, {"thread_id": "t"}),
            await call(cut_off.client, "/v1/store/batch", {"ops": store_reads}),  # asyncpg's pool, not psycopg's
        ):
            assert response.status_code == 503
            assert response.headers["retry-after"] == "1"
            body = answer(response)
            assert body["retryable"] is True
            assert "select" not in body["message"].lower()


async def test_error_bodies_name_the_failure_not_the_internal_addresses(projection: str) -> None:
    """An unreachable broker or key store is a retryable 503 whose body says which failed; the address
    the driver's message names stays in the log."""
    broker = f"127.0.0.1:{free_port()}"
    database = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=1"
    no_broker = settings_for(projection, kafka_bootstrap_servers=broker, consistency_timeout_s=1)
    no_database = settings_for(database, api_pool_timeout_s=0.5)
    async with running(no_broker) as api:
        log = await call(api.client, GET, {"thread_id": "direct"})
    async with running(no_database) as api:
        keys = await call(api.client, "/v1/keys", {"subjects": [{"kind": "thread", "name": "t"}]})
    for response, code in ((log, "log_unavailable"), (keys, "key_store_unavailable")):
        body = answer(response)
        assert response.status_code == 503 and body["error"] == code and body["retryable"] is True, body
        assert "127.0.0.1" not in body["message"] and broker.split(":")[1] not in body["message"], body
