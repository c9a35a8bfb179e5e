"""What every room's SQL shares: the schema name spliced into templates, and advisory-lock keys.

Every statement is a module constant with a `{schema}` placeholder; `render` replaces it with a name
that has been checked to be a plain identifier, so nothing else can reach the SQL text. Values always
travel as `$n` parameters.
"""

from __future__ import annotations

import hashlib
import re

# The same rule as `Settings.postgres_schema`: migrations and tests may pass a name directly.
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

XACT_LOCK_SQL = "SELECT pg_advisory_xact_lock($1::bigint)"
"""Take the advisory lock `$1` (a `lock_key`) until the transaction ends."""


def check_schema(schema: str) -> str:
    """The schema name, if it is a lower-case SQL identifier; ValueError naming it otherwise."""
    if not _IDENTIFIER.match(schema):
        raise ValueError(f"schema {schema!r} is not a lower-case SQL identifier")
    return schema


def render(template: str, schema: str) -> str:
    """`template` with `{schema}` replaced by the checked schema name (nothing else is substituted)."""
    return template.replace("{schema}", check_schema(schema))


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory-lock key for a name (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
