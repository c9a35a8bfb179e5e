"""Where partitions' logs end now, from the broker: what a copy barrier's copy position is held against.

A writer publishes a `thread.copy.barrier` only once its copy's record is acknowledged, so an end learned
after the barrier was read lies beyond that record: a barrier naming a position at or past it names no
copy (`projection/parking.py`). An end too low would park a barrier whose copy is there, so it is learned
as the read API learns it (`LogTail.ends`): the high watermark a fetch sent now is answered with, by the
partition's current leader, fenced by its leader epoch (a deposed leader answers an error, never its stale
end); ListOffsets, which a broker may answer lower, only where that fetch is out of range.
"""

from __future__ import annotations

from aiokafka import TopicPartition

from graphledger.log.tail import LogTail

TP = tuple[str, int]


async def log_ends(tail: LogTail, partitions: set[TP], timeout_s: float) -> dict[TP, int]:
    """The end of each partition's log now. A partition its topic does not have ends at 0: nothing can lie
    there. Raises `LogUnavailableError` (retryable) when the broker does not tell within `timeout_s`."""
    ends: dict[TP, int] = {}
    asked: dict[TopicPartition, int] = {}
    for topic, partition in sorted(partitions):
        if partition < await tail.partition_count(topic):
            asked[TopicPartition(topic, partition)] = 0  # in the log (retention is infinite), or its end
        else:
            ends[(topic, partition)] = 0
    if asked:
        for tp, end in (await tail.ends(asked, timeout_s)).items():
            ends[(tp.topic, tp.partition)] = end
    return ends
