"""Settings that would lose data are refused when the settings are read, naming both settings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from graphledger.settings import Settings


@pytest.mark.parametrize("schema", ["graphledger", "graphledger_rebuild", "graphledger_old_20261123t000000"])
def test_the_key_store_cannot_live_where_a_replay_renames_or_drops_schemas(schema: str) -> None:
    with pytest.raises(ValidationError, match=r"key_store_schema .* a replay of postgres_schema 'graphledger'"):
        Settings(postgres_schema="graphledger", key_store_schema=schema)  # type: ignore[call-arg]


def test_a_key_store_schema_of_its_own_is_accepted() -> None:
    assert Settings(postgres_schema="graphledger", key_store_schema="graphledger_keys").key_store_schema == (  # type: ignore[call-arg]
        "graphledger_keys"
    )
