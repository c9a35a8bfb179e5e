"""The one-writer rule's verdicts of a run's writes, asked of the read API by a client that does not read the
log (a tenant's: its partition holds other tenants' records).

Each protected write's verdict is asked once its record is acknowledged, in a task of its own that waits
out the read API or the projector being away (capped backoff), so writes never wait for them: the log
decides. A put's writer waits for its answer a short while (`PUT_WAIT_S`), so a run whose last put is
refused learns it from that put whenever the stack is up; every other refusal is on the run's mark, and its
next saver call raises it (`client/runtime.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from graphledger.answers import VerdictsAnswer
from graphledger.errors import GraphledgerError, ReadApiError
from graphledger.ownership import SUPERSEDED, THREAD_CHANGED, Counted, Refused, Verdict
from graphledger.retry import Backoff, retried
from graphledger.tasks import cancel_and_wait

log = logging.getLogger(__name__)

VERDICTS_PATH: Final = "/v1/checkpoints/verdicts"
PUT_WAIT_S: Final = 2.0
"""How long a put waits for its verdict before it returns and leaves the verdict to the run's next call."""
RETRY_INITIAL_S: Final = 0.2
RETRY_MAX_S: Final = 5.0

Call = Callable[[str, dict[str, Any]], Awaitable[Any]]


class AskedVerdicts:
    """The verdicts this client is asking of the read API, one task per write (on the runtime's loop)."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self._tasks: set[asyncio.Task[Verdict | None]] = set()
        self.unsupported = False
        """The read API answered 404: it predates the route, and nothing more is asked of it."""

    def ask(
        self, thread_id: str, partition: int, offset: int, decided: Callable[[Verdict | None], object]
    ) -> asyncio.Task[Verdict | None]:
        """Start asking the verdict of the record at `offset` of `thread_id`'s partition; `decided` is told
        it when it is known (None: the read API will not tell, an error it does not retry)."""
        task = asyncio.get_running_loop().create_task(
            self._asked(thread_id, partition, offset, decided), name=f"verdict of {thread_id!r} at {offset}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Stop asking: what is not known by now stays with the log."""
        for task in list(self._tasks):
            await cancel_and_wait(task)

    async def _asked(
        self, thread_id: str, partition: int, offset: int, decided: Callable[[Verdict | None], object]
    ) -> Verdict | None:
        body = {"thread_id": thread_id, "partition": partition, "offsets": [offset]}

        async def attempt() -> Verdict:
            answer = VerdictsAnswer.from_wire(await self._call(VERDICTS_PATH, body))
            refused = next((r for r in answer.refused if r.offset == offset), None)
            if refused is None:
                return Counted()
            cause = THREAD_CHANGED if refused.superseded_by is None else SUPERSEDED
            return Refused(refused.reason, cause, refused.superseded_by)

        verdict: Verdict | None
        try:
            verdict = await retried(attempt, Backoff(RETRY_INITIAL_S, RETRY_MAX_S), retry_if=_passing)
        except GraphledgerError as exc:
            if isinstance(exc, ReadApiError) and exc.status == 404:
                self.unsupported = True  # a read API older than the route: the log alone decides
            else:
                log.warning("the read API does not tell the verdict of %r at %d: %s", thread_id, offset, exc)
            verdict = None
        decided(verdict)
        return verdict


def _passing(exc: Exception) -> bool:
    """The read API or the projector away (a 503, unreachable): ask again."""
    return isinstance(exc, ReadApiError) and exc.retryable
