"""`GRAPHLEDGER_API_TOKEN_HASHES` is checked when the read API is built: a malformed entry or tenant name
stops it from starting. Tenancy through a running read API is `acceptance/test_tenancy.py`."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from graphledger.settings import Settings
from graphledger_server.api.app import create_app


def test_token_hashes_are_checked_at_start() -> None:
    for bad in ("acme", "acme:1234", "a.b:" + "0" * 64, f"acme:{'0' * 64},globex:{'0' * 64}", " , "):
        with pytest.raises(ValueError, match=r"api_token_hashes|tenant name"):
            create_app(Settings(api_token_hashes=SecretStr(bad)))
