"""The server side of tenancy: every read is rewritten into its tenant's prefix on the way in, and the
prefix is stripped from the answer on the way out, so a tenant can neither name nor see another's data.

Threads: the client's `t` is the stored `<tenant>/t`; a list without a thread is narrowed to threads
starting with `<tenant>/`. Store: the client's namespace `(a, b)` is the stored `(<tenant>, a, b)`;
searches and listings always carry the tenant as their first label. Another tenant's thread or item is
simply absent: the answers are exactly those for data that does not exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar, assert_never

from graphledger.answers import ItemAnswer, SearchItemAnswer, StoreResult
from graphledger.tenancy import THREAD_SEPARATOR, scoped_thread
from graphledger_server.api.store_models import GetOp, ListNamespacesOp, SearchOp

StoreOp = GetOp | SearchOp | ListNamespacesOp
ItemT = TypeVar("ItemT", bound=ItemAnswer)


@dataclass(frozen=True)
class Tenant:
    """One tenant; `name` "" is the unprefixed tenant of a single-token or unauthenticated API."""

    name: str

    @property
    def thread_prefix(self) -> str | None:
        """What every stored thread id of this tenant starts with; None: no restriction."""
        return f"{self.name}{THREAD_SEPARATOR}" if self.name else None

    def thread(self, thread_id: str) -> str:
        return scoped_thread(self.name, thread_id)

    def unthread(self, stored: str) -> str:
        prefix = self.thread_prefix
        if prefix is None:
            return stored
        if not stored.startswith(prefix):  # the queries cannot return one; never hand it out
            raise RuntimeError("a read returned a thread outside its tenant")
        return stored[len(prefix) :]

    # -- store -----------------------------------------------------------------------------------

    def store_ops(self, ops: Sequence[StoreOp]) -> list[StoreOp]:
        """`ops` on the stored namespaces; a namespace pattern can never reach past the tenant label."""
        if not self.name:
            return list(ops)
        out: list[StoreOp] = []
        for op in ops:
            match op:
                case GetOp():
                    out.append(op.model_copy(update={"namespace": [self.name, *op.namespace]}))
                case SearchOp():
                    out.append(op.model_copy(update={"namespace_prefix": [self.name, *op.namespace_prefix]}))
                case ListNamespacesOp():
                    prefix = list(op.prefix or ())
                    # A suffix must match within the client's labels, never reach the tenant label: a
                    # wildcard prefix as long as the suffix makes the client's namespace at least as long.
                    prefix += ["*"] * (len(op.suffix or ()) - len(prefix))
                    depth = None if op.max_depth is None else op.max_depth + 1
                    out.append(op.model_copy(update={"prefix": [self.name, *prefix], "max_depth": depth}))
                case _:
                    assert_never(op)
        return out

    def store_results(self, ops: Sequence[StoreOp], results: list[StoreResult]) -> list[StoreResult]:
        """Answers as the client named things: the tenant label removed from every namespace."""
        if not self.name:
            return results
        out: list[StoreResult] = []
        for op, result in zip(ops, results, strict=True):
            match op:
                case GetOp():
                    assert result is None or isinstance(result, ItemAnswer)
                    out.append(None if result is None else self._item(result))
                case SearchOp():
                    assert isinstance(result, list)
                    out.append([self._item(item) for item in result if isinstance(item, SearchItemAnswer)])
                case ListNamespacesOp():
                    assert isinstance(result, list)
                    out.append([self._labels(labels) for labels in result if isinstance(labels, list)])
                case _:
                    assert_never(op)
        return out

    def _labels(self, labels: list[str]) -> list[str]:
        if not labels or labels[0] != self.name:
            raise RuntimeError("a store read returned a namespace outside its tenant")
        return labels[1:]

    def _item(self, item: ItemT) -> ItemT:
        return replace(item, namespace=self._labels(item.namespace))
