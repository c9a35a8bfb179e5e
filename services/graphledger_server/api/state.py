"""What the read API's routes share for the life of the process."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
from fastapi import Request
from psycopg_pool import AsyncConnectionPool

from graphledger.errors import SubjectErasedError
from graphledger.events.store import store_key
from graphledger.settings import Settings
from graphledger_server.api.consistency.read_barrier import ReadBarrier
from graphledger_server.api.consistency.read_through import TailEvents, ThreadViews
from graphledger_server.api.errors import ApiError, unavailable
from graphledger_server.api.key_quota import KeyCreationQuota
from graphledger_server.api.reads.store_reader import StoreReader
from graphledger_server.driver_errors import Verdict, verdict_of
from graphledger_server.keys.erase import Eraser, ErasureIncompleteError, NotASubjectError
from graphledger_server.keys.source import StoreKeySource
from graphledger_server.log.applied import AppliedOffsets
from graphledger_server.opening.store_events import StoreEvents

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApiState:
    settings: Settings
    pool: AsyncConnectionPool[Any]
    """psycopg: the checkpoint reads (the official saver's queries) and readiness."""
    store_pool: asyncpg.Pool
    """asyncpg: the store reads."""
    store_reader: StoreReader
    """Runs the store reads' statements on `store_pool`, remembering what it learned of the vector table."""
    offsets: AppliedOffsets
    barrier: ReadBarrier
    """What each read waits for: the log's end, from the broker, against the applied offsets."""
    key_quota: KeyCreationQuota
    """How many data keys each token may still create."""
    keys: StoreKeySource | None = None
    """The key store, with encryption on: record keys are hashes, and clients get their data keys here."""
    eraser: Eraser | None = None
    tail_events: TailEvents | None = None
    """Opens the unprojected records a read folds (`consistency/read_through.py`)."""
    views: ThreadViews | None = None
    """The threads' views the last reads folded (`consistency/read_through.py`)."""
    store_events: StoreEvents | None = None
    """The store projection's validation, for the store records a get folds (`reads/store_through.py`)."""

    async def record_key_of_thread(self, tenant: str, stored_thread_id: str) -> bytes:
        """The record key of the thread's records (a hash with encryption on)."""
        if self.keys is None:
            return stored_thread_id.encode()
        async with key_store_answers():
            return await self.keys.record_key_of_thread(tenant, stored_thread_id)

    async def item_key(self, tenant: str, stored_namespace: tuple[str, ...], item_key: str) -> bytes:
        if self.keys is None:
            return store_key(stored_namespace, item_key).encode()
        async with key_store_answers():
            return await self.keys.item_key(tenant, stored_namespace, item_key)


def api_state(request: Request) -> ApiState:
    """The state the lifespan stored on the app."""
    return request.app.state.api


@asynccontextmanager
async def key_store_answers() -> AsyncIterator[None]:
    """The key store's and the erasure's failures as answers: gone (410), not a subject (400), an outage
    of Postgres or of the log (503, retryable)."""
    try:
        yield
    except SubjectErasedError as exc:
        raise ApiError(410, "subject_erased", str(exc)) from None
    except NotASubjectError as exc:
        raise ApiError(400, "not_a_subject", str(exc)) from None
    except ErasureIncompleteError as exc:
        raise unavailable("erasure_incomplete", str(exc)) from None
    except ApiError:
        raise
    except Exception as exc:
        if getattr(exc, "retryable", False) or verdict_of(exc) is Verdict.RETRY:
            # The driver's message can name internal hosts: the log gets it, the caller only the failure.
            log.warning("the key store or the log is unreachable: %s", exc)
            raise unavailable(
                "key_store_unavailable", f"the key store or the log is unreachable ({type(exc).__name__}); retry"
            ) from exc
        raise
