"""A consistency token (`X-Graphledger-Consistency`): parsed from its header, and what it may name, offsets
of writes the log has acknowledged.

A client's token holds, per partition of graphledger's checkpoint and store topics, the offset of its
newest acknowledged write. The partition exists, and the offset is below the log's end as the read API
learns it after the read began (the write was acknowledged before, so the end is past it). A token
naming anything else could never be reached, and would only hold a wait slot until the read's
deadline: it is a 400 naming the part, checked for the parts the projection has not applied yet.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiokafka import TopicPartition

from graphledger.log.tail import LogTail
from graphledger.settings import Settings
from graphledger.wire import CONSISTENCY_HEADER, Token, parse_token
from graphledger_server.api.errors import ApiError
from graphledger_server.log.applied import AppliedOffsets


def token_of(header: str | None) -> Token:
    """The offsets a `X-Graphledger-Consistency` header names ({} without one); a 400 if malformed."""
    if header is None:
        return {}
    try:
        return parse_token(header)
    except ValueError as exc:
        raise ApiError(400, "invalid_consistency_token", f"{CONSISTENCY_HEADER}: {exc}") from None


async def unapplied_parts(
    token: Token, settings: Settings, offsets: AppliedOffsets, log: LogTail
) -> dict[TopicPartition, int]:
    """The parts of `token` the projection has not applied; a 400 for one naming a topic that is not
    graphledger's or a partition its topic lacks."""
    topics = (settings.checkpoint_topic, settings.store_topic)
    for topic, _ in token:
        if topic not in topics:
            raise _invalid(f"topic {topic[:80]!r} is not one of graphledger's ({', '.join(topics)})")
    pending = {TopicPartition(t, p): offset for (t, p), offset in token.items() if offsets.applied(t, p) <= offset}
    for tp in pending:
        count = await log.partition_count(tp.topic)
        if tp.partition >= count:
            raise _invalid(f"{tp.topic} has no partition {tp.partition} (it has {count})")
    return pending


def check_within_log(pending: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int]) -> None:
    """A 400 when a part of `pending` names an offset at or beyond its partition's end."""
    for tp, offset in sorted(pending.items()):
        if offset >= ends[tp]:
            raise _invalid(
                f"{tp.topic}:{tp.partition}:{offset} is beyond the log's end ({ends[tp]}); a token names offsets "
                "of acknowledged writes"
            )


def _invalid(why: str) -> ApiError:
    return ApiError(400, "invalid_consistency_token", f"{CONSISTENCY_HEADER}: {why}")
