"""The vector table's shape (`VectorIndex`): what pgvector cannot index is refused before any DDL."""

from __future__ import annotations

import pytest

from graphledger_server.opening.vector_index import VectorIndex


def test_vector_shapes_pgvector_cannot_index_are_refused_before_any_ddl() -> None:
    with pytest.raises(ValueError, match="at most 2000 dims"):
        VectorIndex(3072)
    assert VectorIndex(3072, vector_type="halfvec").dims == 3072
    with pytest.raises(ValueError, match="at least 2 \\* m"):
        VectorIndex(8, hnsw_m=40, hnsw_ef_construction=64)
    with pytest.raises(ValueError, match="must be one of"):
        VectorIndex(8, distance="hamming")  # type: ignore[arg-type]
