"""The store's vector table: its shape as configured, as recorded in the schema, and its DDL.

`store_vectors` is created by `migrate` only when `GRAPHLEDGER_STORE_VECTOR_DIMS` is set, in
`langgraph-checkpoint-postgres`'s layout. The shape it was built with is recorded in
`graphledger_store_index`, and that record, not the settings, is what the projector and the read API
obey: a process started without the dims setting still serves the vectors a schema holds. Migrating
again with another shape fails instead of altering anything: changing the dims means re-embedding
every item (docs/operations.md, "Re-embedding when the embedder changes").

The DDL cannot take parameters, so its few variable parts (dims, type, operator class, index
parameters) come only from the validated fields of `VectorIndex`: ints and fixed literals, never text
from the environment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import asyncpg
from langgraph.store.postgres.base import VECTOR_MIGRATIONS

from graphledger.errors import VectorIndexMismatchError
from graphledger_server.sql import render

if TYPE_CHECKING:
    from graphledger.settings import Settings

VectorType = Literal["vector", "halfvec"]
Distance = Literal["cosine", "l2", "inner_product"]
IndexKind = Literal["hnsw", "flat"]

# pgvector's limits: a column holds at most 16,000 dims; an HNSW index covers 2,000 (vector) or
# 4,000 (halfvec); m in 2..100, ef_construction in 4..1000 and at least 2 * m.
MAX_DIMS = 16_000
MAX_HNSW_DIMS: dict[str, int] = {"vector": 2_000, "halfvec": 4_000}
HNSW_M_RANGE = range(2, 101)
HNSW_EF_CONSTRUCTION_RANGE = range(4, 1001)
COMPONENT_MAX: dict[str, float] = {"vector": 3.4028234663852886e38, "halfvec": 65_504.0}
"""The largest magnitude a component holds: IEEE single precision (vector), half precision (halfvec)."""

# langgraph-checkpoint-postgres vector migrations whose end state `create_vector_table` builds.
OFFICIAL_VECTOR_MIGRATIONS_MIRRORED = 3

_OPS_SUFFIX: dict[str, str] = {"cosine": "cosine_ops", "l2": "l2_ops", "inner_product": "ip_ops"}
DISTANCE_OPERATORS: dict[str, str] = {"cosine": "<=>", "l2": "<->", "inner_product": "<#>"}
"""pgvector's distance operator per distance: smaller is closer for each, so HNSW can order by it."""

_PLAIN_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True, slots=True)
class VectorIndex:
    """The shape of `store_vectors`: what the DDL builds and what every vector must match."""

    dims: int
    vector_type: VectorType = "vector"
    distance: Distance = "cosine"
    index: IndexKind = "hnsw"
    hnsw_m: int = 16
    hnsw_ef_construction: int = 64

    def __post_init__(self) -> None:
        # Checked here, not only in Settings: these values are spliced into DDL.
        for name, value in (("dims", self.dims), ("hnsw_m", self.hnsw_m), ("hnsw_ef_construction",
                            self.hnsw_ef_construction)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"store vector {name} must be an int, got {value!r}")
        if self.vector_type not in get_args(VectorType):
            raise ValueError(f"store vector type must be one of {get_args(VectorType)}, got {self.vector_type!r}")
        if self.distance not in get_args(Distance):
            raise ValueError(f"store distance must be one of {get_args(Distance)}, got {self.distance!r}")
        if self.index not in get_args(IndexKind):
            raise ValueError(f"store index must be one of {get_args(IndexKind)}, got {self.index!r}")
        if not 1 <= self.dims <= MAX_DIMS:
            raise ValueError(f"store vector dims must be in 1..{MAX_DIMS}, got {self.dims}")
        if self.index == "hnsw":
            limit = MAX_HNSW_DIMS[self.vector_type]
            if self.dims > limit:
                raise ValueError(
                    f"an HNSW index covers at most {limit} dims of {self.vector_type}, got {self.dims}: "
                    "use halfvec (up to 4000) or the flat index (exact search, no index)"
                )
            if self.hnsw_m not in HNSW_M_RANGE:
                raise ValueError(f"store HNSW m must be in 2..100, got {self.hnsw_m}")
            if self.hnsw_ef_construction not in HNSW_EF_CONSTRUCTION_RANGE:
                raise ValueError(f"store HNSW ef_construction must be in 4..1000, got {self.hnsw_ef_construction}")
            if self.hnsw_ef_construction < 2 * self.hnsw_m:
                raise ValueError(
                    f"store HNSW ef_construction ({self.hnsw_ef_construction}) must be at least 2 * m ({self.hnsw_m})"
                )

    @classmethod
    def from_settings(cls, settings: Settings) -> VectorIndex | None:
        """The shape `GRAPHLEDGER_STORE_*` asks for; None when no vector table is configured."""
        if settings.store_vector_dims is None:
            return None
        return cls(
            settings.store_vector_dims,
            settings.store_vector_type,
            settings.store_distance,
            settings.store_index,
            settings.store_hnsw_m,
            settings.store_hnsw_ef_construction,
        )

    @property
    def column_type(self) -> str:
        """`vector(256)` or `halfvec(256)`, as `store_vectors.embedding` is declared."""
        return f"{self.vector_type}({int(self.dims)})"

    @property
    def ops(self) -> str:
        """The operator class the HNSW index is built with, e.g. `vector_cosine_ops`."""
        return f"{self.vector_type}_{_OPS_SUFFIX[self.distance]}"

    @property
    def operator(self) -> str:
        return DISTANCE_OPERATORS[self.distance]

    def describe(self) -> str:
        index = (
            f"hnsw (m={self.hnsw_m}, ef_construction={self.hnsw_ef_construction})" if self.index == "hnsw" else "flat"
        )
        return f"{self.column_type}, {self.distance} distance, {index} index"


# -- SQL -------------------------------------------------------------------------------------------

LOAD_SQL = """
SELECT dims, vector_type, distance, index_kind, hnsw_m, hnsw_ef_construction
FROM {schema}.graphledger_store_index
"""

RECORD_SQL = """
INSERT INTO {schema}.graphledger_store_index
    (dims, vector_type, distance, index_kind, hnsw_m, hnsw_ef_construction)
VALUES ($1::int, $2::text, $3::text, $4::text, $5::int, $6::int)
"""

VECTORS_TABLE_EXISTS_SQL = "SELECT to_regclass('{schema}.store_vectors') IS NOT NULL"

# The schema pgvector is installed in (its types and operators live there), as a quoted identifier.
EXTENSION_SCHEMA_SQL = """
SELECT quote_ident(n.nspname) AS schema FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'vector'
"""

# VECTOR_MIGRATIONS[1], qualified, with the column type filled in: `{column_type}` is
# `VectorIndex.column_type` and `{ext}` the extension's schema.
CREATE_VECTORS_TABLE_SQL = """
CREATE TABLE {schema}.store_vectors (
    prefix text NOT NULL,
    key text NOT NULL,
    field_name text NOT NULL,
    embedding {ext}.{column_type},
    created_at TIMESTAMP WITH TIME ZONE DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (prefix, key, field_name),
    FOREIGN KEY (prefix, key) REFERENCES {schema}.store(prefix, key) ON DELETE CASCADE
)
"""

# VECTOR_MIGRATIONS[2] (not CONCURRENTLY: the table is new and empty, inside the migration's
# transaction). `{with}` is empty for pgvector's default parameters, which is what the official
# store writes without an `ann_index_config`, so the default index is the official one to the letter.
CREATE_HNSW_INDEX_SQL = """
CREATE INDEX store_vectors_embedding_idx ON {schema}.store_vectors USING hnsw (embedding {ext}.{ops}){with}
"""
PGVECTOR_HNSW_DEFAULTS = (16, 64)
"""pgvector's own m and ef_construction."""

FILL_VECTOR_MIGRATIONS_SQL = """
CREATE TABLE IF NOT EXISTS {schema}.vector_migrations (v INTEGER PRIMARY KEY);
INSERT INTO {schema}.vector_migrations (v) SELECT generate_series(0, {count} - 1) ON CONFLICT (v) DO NOTHING;
"""


def extension_schema(quoted: str | None) -> str:
    """pgvector's schema as SQL may name it; refuses anything but a plain identifier."""
    if quoted is None:
        raise RuntimeError("the pgvector extension is not installed in this database; run `graphledger migrate`")
    if not _PLAIN_IDENTIFIER.match(quoted):
        raise RuntimeError(f"pgvector is installed in schema {quoted}, which is not a plain lower-case identifier")
    return quoted


def index_from_row(row: Mapping[str, Any] | None) -> VectorIndex | None:
    if row is None:
        return None
    return VectorIndex(
        int(row["dims"]),
        row["vector_type"],
        row["distance"],
        row["index_kind"],
        int(row["hnsw_m"]),
        int(row["hnsw_ef_construction"]),
    )


async def load_vector_index(conn: asyncpg.Connection, schema: str) -> VectorIndex | None:
    """The shape of the schema's vector table, or None when it has none."""
    return index_from_row(await conn.fetchrow(render(LOAD_SQL, schema)))


async def load_extension_schema(conn: asyncpg.Connection) -> str:
    return extension_schema(await conn.fetchval(EXTENSION_SCHEMA_SQL))


def _mismatch(schema: str, built: VectorIndex, wanted: VectorIndex) -> str:
    if built.dims != wanted.dims:
        return (
            f"schema {schema!r} stores {built.dims}-dim vectors (store_vectors.embedding {built.column_type}), "
            f"but GRAPHLEDGER_STORE_VECTOR_DIMS={wanted.dims}. Dims cannot change in place: every stored item "
            f"would need new vectors from the new embedder. Keep GRAPHLEDGER_STORE_VECTOR_DIMS={built.dims}, or "
            "re-embed into a new schema (docs/operations.md: 'Re-embedding when the embedder changes')."
        )
    return (
        f"schema {schema!r} has a vector table built as {built.describe()}, but the settings ask for "
        f"{wanted.describe()}. graphledger does not alter it in place: set GRAPHLEDGER_STORE_* back to the "
        "built shape, or rebuild the projection into a new schema with the new settings."
    )


async def ensure_vector_index(conn: asyncpg.Connection, schema: str, wanted: VectorIndex | None) -> bool:
    """Create the vector table for `wanted` if the schema has none; check it otherwise.

    Runs inside `migrate`'s transaction, after the numbered migrations. Returns whether it created
    the table. Raises `VectorIndexMismatchError` when the schema's table has another shape.
    """
    if wanted is None:
        return False
    built = await load_vector_index(conn, schema)
    if built is not None:
        if built != wanted:
            raise VectorIndexMismatchError(_mismatch(schema, built, wanted))
        return False
    if await conn.fetchval(render(VECTORS_TABLE_EXISTS_SQL, schema)):
        raise VectorIndexMismatchError(
            f"schema {schema!r} has a store_vectors table graphledger did not create (the official store's "
            "setup()?); drop it, or migrate into a new schema"
        )
    if len(VECTOR_MIGRATIONS) != OFFICIAL_VECTOR_MIGRATIONS_MIRRORED:
        raise RuntimeError(
            f"langgraph-checkpoint-postgres has {len(VECTOR_MIGRATIONS)} vector migrations; graphledger's "
            f"vector table mirrors {OFFICIAL_VECTOR_MIGRATIONS_MIRRORED}. Add a graphledger migration first."
        )
    ext = await load_extension_schema(conn)
    await conn.execute(
        render(CREATE_VECTORS_TABLE_SQL, schema).replace("{ext}", ext).replace("{column_type}", wanted.column_type)
    )
    if wanted.index == "hnsw":
        params = (int(wanted.hnsw_m), int(wanted.hnsw_ef_construction))
        with_ = "" if params == PGVECTOR_HNSW_DEFAULTS else f" WITH (m = {params[0]}, ef_construction = {params[1]})"
        await conn.execute(
            render(CREATE_HNSW_INDEX_SQL, schema)
            .replace("{ext}", ext)
            .replace("{ops}", wanted.ops)
            .replace("{with}", with_)
        )
    await conn.execute(render(FILL_VECTOR_MIGRATIONS_SQL, schema).replace("{count}", str(len(VECTOR_MIGRATIONS))))
    await conn.execute(
        render(RECORD_SQL, schema),
        wanted.dims,
        wanted.vector_type,
        wanted.distance,
        wanted.index,
        wanted.hnsw_m,
        wanted.hnsw_ef_construction,
    )
    return True
