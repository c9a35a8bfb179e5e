"""A client's consistency token: the newest acknowledged offset per partition, per topic on demand."""

from __future__ import annotations

from graphledger.client.tokens import AckedOffsets


def test_the_token_keeps_the_newest_offset_per_partition() -> None:
    acked = AckedOffsets()
    acked.record([("cp", 0, 5), ("cp", 1, 7)])
    acked.record([("cp", 0, 3)])  # an older ack arriving late changes nothing
    acked.record([("store", 2, 9)])
    assert acked.token() == {("cp", 0): 5, ("cp", 1): 7, ("store", 2): 9}
    assert acked.token("store") == {("store", 2): 9}
