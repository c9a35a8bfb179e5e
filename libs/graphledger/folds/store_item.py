"""The fold of one store item's events into what a store `get` answers, as the store projection applies them.

The read API answers a get at the log's end from the projection's row and the item's records the
projector has not applied yet (`graphledger_server/api/reads/store_through.py`); this is the projection's
effect on one item (`projection/store.py`), written once in Python and checked against the SQL by the
projection contract suite:
- a put replaces value, `updated_at` (its time) and the TTL (`expires_at` = its time + `ttl_minutes`,
  none without); an item it creates takes `created_at` from the put (`created_ms`, else its time),
  an existing one keeps its own, expired or not;
- a delete removes the item;
- a refresh restarts a live item's TTL at its time, never shortening it;
- an expire removes the item only if it is still expired at the sweeper's decision time;
- a tenant's erasure removes every item of the tenant; a namespace's erasure needs the erasure's names
  (rows only the projection holds): it is `Underivable`, a result the reader matches.
Vectors are not part of a get. Times are the events' append times (`envelope.append_time_ms`), as the
projection takes them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, assert_never

from graphledger.answers import ItemAnswer
from graphledger.events.erasure import NamespaceErase, TenantErase
from graphledger.events.store import StoreDelete, StoreEvent, StoreExpire, StorePut, StoreRefresh
from graphledger.folds.thread import Underivable
from graphledger.jsonb import jsonb_value

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PREFIX_SEPARATOR = "."


@dataclass(frozen=True, slots=True)
class Item:
    """One row of `store` as a get needs it (timestamps as Postgres gives them back)."""

    prefix: str
    """The namespace's labels joined by "."."""
    key: str
    value: Any
    """As jsonb gives it back."""
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    ttl_minutes: float | None
    """What a refresh restarts the TTL with: `graphledger_ttl_minutes`, else the official `ttl_minutes`."""

    def visible(self, now: datetime) -> bool:
        """Whether a read at `now` returns it (one past its TTL is hidden until the sweeper deletes it)."""
        return self.expires_at is None or self.expires_at > now

    def answer(self) -> ItemAnswer:
        """The read API's item: its namespace as labels, timestamps in ISO 8601."""
        return ItemAnswer(
            self.prefix.split(PREFIX_SEPARATOR),
            self.key,
            self.value,
            self.created_at.isoformat(),
            self.updated_at.isoformat(),
            None if self.expires_at is None else self.expires_at.isoformat(),
        )


def at_ms(ms: int) -> datetime:
    """An event time as the projection stores it (`'epoch' + ms * interval '1 millisecond'`)."""
    return EPOCH + timedelta(milliseconds=ms)


def _minutes(ttl: float) -> timedelta:
    """`ttl * interval '1 minute'`: Postgres rounds the product to microseconds."""
    return timedelta(microseconds=round(ttl * 60_000_000))


def apply(item: Item | None, event: StoreEvent, ts_ms: int) -> Item | Underivable | None:
    """The item after the projection applies `event` (an event of its key, or a keyless erasure),
    produced at `ts_ms`; None: no row."""
    match event:
        case StorePut():
            at = at_ms(ts_ms)
            if item is not None:
                created = item.created_at
            else:
                created = at_ms(ts_ms if event.created_ms is None else event.created_ms)
            ttl = event.ttl_minutes
            return Item(
                PREFIX_SEPARATOR.join(event.namespace),
                event.item_key,
                jsonb_value(event.value_json),
                created,
                at,
                None if ttl is None else at + _minutes(ttl),
                ttl,
            )
        case StoreDelete():
            return None
        case StoreRefresh():
            at = at_ms(ts_ms)
            if item is None or item.expires_at is None or item.expires_at <= at or item.ttl_minutes is None:
                return item
            return replace(item, expires_at=max(item.expires_at, at + _minutes(item.ttl_minutes)))
        case StoreExpire():
            if item is not None and item.expires_at is not None and item.expires_at <= at_ms(event.at_ms):
                return None
            return item
        case TenantErase():
            if item is not None and (item.prefix == event.tenant or item.prefix.startswith(event.tenant + ".")):
                return None
            return item
        case NamespaceErase():
            return Underivable("a namespace's erasure names its namespaces only in the projection")
        case _:
            assert_never(event)
