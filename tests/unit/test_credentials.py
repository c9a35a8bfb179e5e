"""`GRAPHLEDGER_API_TOKEN_HASHES`: each entry a tenant, a token's hash and what the token may beyond
an agent's reads and keys; checked when the read API is built, so a malformed entry stops it from
starting. Tenancy through a running read API is `acceptance/test_tenancy.py`."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from graphledger.settings import Settings
from graphledger.tenancy import hash_token
from graphledger_server.api.app import create_app
from graphledger_server.api.credentials import AGENT, Permission, parse_token_hashes, token_entries, token_entry

ZEROS = "0" * 64


def test_token_hashes_are_checked_at_start() -> None:
    for bad in ("acme", "acme:1234", "a.b:" + ZEROS, f"acme:{ZEROS},globex:{ZEROS}", " , ", f"acme:{ZEROS}:x:y"):
        with pytest.raises(ValueError, match=r"api_token_hashes|tenant name"):
            create_app(Settings(api_token_hashes=SecretStr(bad)))


def test_an_entry_without_permissions_is_an_agents_token_and_erase_is_granted_by_name() -> None:
    agent, operator = parse_token_hashes(f"acme:{hash_token('a')}, acme:{hash_token('o').upper()}:erase")
    assert agent.permissions == AGENT == {Permission.READ, Permission.KEYS}
    assert operator.permissions == AGENT | {Permission.ERASE}
    assert (agent.tenant, operator.tenant) == (operator.tenant, operator.tenant)
    assert operator.digest == bytes.fromhex(hash_token("o"))


@pytest.mark.parametrize("granted", ["read", "admin", "erase+admin", "", "ERASE"])
def test_an_unknown_permission_is_refused_naming_it_but_not_the_hash(granted: str) -> None:
    with pytest.raises(ValueError, match=r"entry 1 \(acme\): permission .* is not one of erase") as refused:
        parse_token_hashes(f"acme:{ZEROS}:{granted}")
    assert ZEROS not in str(refused.value)


def test_the_single_token_is_an_agents_token_of_the_unprefixed_tenant() -> None:
    [entry] = token_entries(Settings(api_token=SecretStr("s3cret"))) or []
    assert entry.tenant.name == "" and entry.permissions == AGENT
    assert token_entries(Settings()) is None


def test_token_entry_makes_what_the_parser_reads() -> None:
    assert token_entry("acme", "t") == f"acme:{hash_token('t')}"
    assert token_entry("acme", "t", frozenset({Permission.ERASE})) == f"acme:{hash_token('t')}:erase"
    [entry] = parse_token_hashes(token_entry("acme", "t", frozenset({Permission.ERASE})))
    assert Permission.ERASE in entry.permissions
    with pytest.raises(ValueError, match="tenant name"):
        token_entry("no/slash", "t")
