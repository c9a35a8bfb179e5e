"""Splicing the schema name into SQL templates: the one identifier that is not a `$n` parameter.

Every projection statement is a module constant with a `{schema}` placeholder; `render` replaces it
with a name that has been checked to be a plain identifier, so nothing else can reach the SQL text.
"""

from __future__ import annotations

import re

# The same rule as `Settings.postgres_schema`: migrations and tests may pass a name directly.
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema(schema: str) -> str:
    """The schema name, if it is a lower-case SQL identifier; ValueError naming it otherwise."""
    if not _IDENTIFIER.match(schema):
        raise ValueError(f"schema {schema!r} is not a lower-case SQL identifier")
    return schema


def render(template: str, schema: str) -> str:
    """`template` with `{schema}` replaced by the checked schema name (nothing else is substituted)."""
    return template.replace("{schema}", check_schema(schema))
