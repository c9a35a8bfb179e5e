"""Events read back from the log as the projector reads them: sealed payloads opened with their
subjects' data keys, fetched from the key store."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from graphledger.erasure.sealing import ERASED, MISBOUND, sealed_key_id, sealed_ref, unseal
from graphledger.events.envelope import Envelope
from graphledger.settings import Settings
from graphledger_server.keys.key_store import key_store_for
from graphledger_server.keys.lookup import DataKeyCache


async def unsealed(settings: Settings, envelopes: Sequence[Envelope]) -> list[Envelope]:
    """`envelopes` with every sealed payload opened; an erased subject's event fails the test."""
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=1, max_size=1)
    try:
        keys = DataKeyCache(key_store_for(settings, pool))
        await keys.load({(ref, sealed_key_id(e)) for e in envelopes if (ref := sealed_ref(e)) is not None})
        opened = []
        for envelope in envelopes:
            ref = sealed_ref(envelope)
            if ref is None:
                opened.append(envelope)
                continue
            key = keys.get(ref, sealed_key_id(envelope))
            assert key is not None and key is not ERASED and key is not MISBOUND, f"no data key for subject {ref}"
            opened.append(unseal(envelope, key)[0])
        return opened
    finally:
        await pool.close()
