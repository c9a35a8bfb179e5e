"""How many vector rows an index search asks for per item of the page, from the table statistics."""

from __future__ import annotations

import pytest

from graphledger_server.api.reads.store_reader import INDEX_CANDIDATES_PER_ITEM, _per_item


@pytest.mark.parametrize(
    ("statistics", "expected"),
    [
        (None, INDEX_CANDIDATES_PER_ITEM),  # no row: unknown
        ({"vectors": -1.0, "items": -1.0}, INDEX_CANDIDATES_PER_ITEM),  # never analyzed
        ({"vectors": 0.0, "items": 0.0}, INDEX_CANDIDATES_PER_ITEM),  # empty
        ({"vectors": 9000.0, "items": 9000.0}, 2),  # one embedded field
        ({"vectors": 100.0, "items": 5000.0}, 2),  # most items not indexed
        ({"vectors": 27000.0, "items": 9000.0}, 6),  # three fields
        ({"vectors": 9001.0, "items": 9000.0}, 4),  # a few items with two
    ],
)
def test_twice_the_vector_rows_of_an_average_item(statistics: dict[str, float] | None, expected: int) -> None:
    assert _per_item(statistics) == expected
