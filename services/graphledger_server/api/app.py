"""`create_app(settings)`: the FastAPI read API, its Postgres pools, its applied-offsets watcher and its
window on the log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version

from fastapi import FastAPI

from graphledger.log.tail import LogTail
from graphledger.opening import checkpoint_events
from graphledger.opening.records import ToEvent
from graphledger.settings import Settings
from graphledger.wire import SERVER_REQUEST_SLACK_S
from graphledger_server.api import handlers
from graphledger_server.api.auth import AccessPolicy, TenantAuth, document_bearer_auth, whoami_router
from graphledger_server.api.consistency.read_barrier import ReadBarrier
from graphledger_server.api.consistency.read_through import TailEvents, ThreadViews
from graphledger_server.api.consistency.unprojected import Unprojected
from graphledger_server.api.consistency.wait_slots import WaitSlots
from graphledger_server.api.db import open_pool, open_store_pool
from graphledger_server.api.deadline import RequestDeadline
from graphledger_server.api.key_quota import KeyCreationQuota
from graphledger_server.api.reads.store_reader import StoreReader
from graphledger_server.api.routes import checkpoints, health, key_filter, keys, store
from graphledger_server.api.state import ApiState
from graphledger_server.keys.erase import Eraser
from graphledger_server.keys.key_store import check_key_settings, key_store_for
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.keys.source import StoreKeySource
from graphledger_server.log.applied import AppliedOffsets
from graphledger_server.opening.opener import RecordOpener
from graphledger_server.opening.store_events import StoreEvents
from graphledger_server.telemetry import api as telemetry


def create_app(settings: Settings) -> FastAPI:
    """The read API for `settings`; the pool and the watcher live as long as the app's lifespan.

    A bad `api_token_hashes` or missing key-encryption keys fail here, before the server listens.
    """
    policy = AccessPolicy(settings)
    check_key_settings(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = open_pool(settings)
        # Not waiting for connections: the process starts (and /healthz answers) while Postgres is down;
        # /readyz and the reads report the outage until it is back.
        await pool.open(wait=False)
        store_pool = await open_store_pool(settings)
        offsets = AppliedOffsets(settings.postgres_dsn, settings.postgres_schema, settings.projector_group_id)
        await offsets.start()
        log = LogTail(settings)
        await log.start()
        key_store = key_store_for(settings, store_pool, settings.api_pool_timeout_s)
        source = StoreKeySource(key_store, settings) if key_store is not None and settings.encrypt_events else None
        eraser = Eraser(settings, source, store_pool, offsets) if source is not None else None
        slots = WaitSlots(settings.api_max_consistency_waits, policy.tenant_count)
        topics = (settings.checkpoint_topic, settings.store_topic)
        # The projector's key cache and validation: records open and decode here as they do there.
        store_events = StoreEvents(settings.postgres_schema)
        to_event: dict[str, ToEvent] = {
            settings.checkpoint_topic: checkpoint_events.to_event,
            settings.store_topic: store_events.to_event,
        }
        unprojected = Unprojected(log, offsets, topics, settings.api_read_through_max_bytes)
        opener = RecordOpener(
            DataKeyCache(key_store), to_event.__getitem__, clear_refused=settings.clear_events_refused
        )
        tail_events = TailEvents(unprojected, opener)
        unprojected.on_erasure = tail_events.erasure
        unprojected.on_unread = tail_events.unread
        await unprojected.start()
        barrier = ReadBarrier(settings, log, offsets, slots, unprojected)
        quota = KeyCreationQuota(settings.api_max_key_creations_per_minute)
        reader = StoreReader(store_pool, settings.postgres_schema, acquire_timeout_s=settings.api_pool_timeout_s)
        app.state.api = ApiState(
            settings,
            pool,
            store_pool,
            reader,
            offsets,
            barrier,
            quota,
            source,
            eraser,
            tail_events,
            ThreadViews(),
            store_events,
        )
        try:
            yield
        finally:
            await unprojected.stop()
            if eraser is not None:
                await eraser.close()
            await log.stop()
            await offsets.stop()
            await store_pool.close()
            await pool.close()

    app = FastAPI(
        title="graphledger read API",
        version=version("graphledger"),
        summary="Reads of the checkpoint and store projections, as langgraph-checkpoint-postgres answers them.",
        lifespan=lifespan,
    )
    handlers.install(app)
    app.add_middleware(TenantAuth, policy=policy)  # every /v1 route: 401, 403 or request.state.caller
    app.add_middleware(RequestDeadline, limit_s=settings.consistency_timeout_s + SERVER_REQUEST_SLACK_S)
    # Server spans continuing the caller's trace, HTTP server metrics; outside the auth, so refused
    # requests are traced too.
    telemetry.instrument_app(app)
    app.include_router(health.router)
    app.include_router(whoami_router)
    app.include_router(checkpoints.router)
    app.include_router(key_filter.router)
    app.include_router(store.router)
    app.include_router(keys.router)
    document_bearer_auth(app)
    return app
