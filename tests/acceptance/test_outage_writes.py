"""Keys are off the write path (docs/security.md): through an outage of the read API and Postgres, with
Kafka up, an agent pod that was running keeps writing, new threads and new store subjects included,
with keys past their TTL (1 s here), and keeps running the turns of the threads it holds and of new
threads, which it proves new from the log with the key filters it fetched before. A thread whose turns
move between two pods that both read it before keeps moving: each pod folds the other's records onto what
it holds (docs/agent-pods.md). A turn on a thread another process wrote and this one never read fails at
its first read, retryably. A pod started during the outage says what it
cannot do. Once the outage ends, every acknowledged write is in the projection.

`GRAPHLEDGER_OUTAGE_S` sets the outage's length, `GRAPHLEDGER_OUTAGE_PACE_S` the pause between the
agent's rounds of writes (`make soak` runs ten minutes, a round a second). A pod can start at least
half of `client_fresh_keys` new subjects through an outage (docs/security.md): the agent starts that
many, then goes on with the turns of the thread it holds.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from agent_pods import AgentPod
from graphledger import KafkaSaver, KafkaStore
from graphledger.settings import Settings
from graphledger_server.devstack.ports import wait_until
from graphledger_server.devstack.stack import DevStack

pytestmark = pytest.mark.slow

OUTAGE_S = float(os.environ.get("GRAPHLEDGER_OUTAGE_S", "6"))
PACE_S = float(os.environ.get("GRAPHLEDGER_OUTAGE_PACE_S", "0"))
WAIT_S = 120.0
WARM_THREADS = 24
"""New threads the pod turns before the outage: each proof fetches its partition's key filter, and 24 miss
one of the two partitions with probability 2 ** -23."""


@pytest.fixture(scope="module")
def stack() -> Iterator[DevStack]:
    with DevStack(partitions=2, base=Settings(consistency_timeout_s=5.0, api_pool_timeout_s=2.0)) as dev:
        yield dev


def _ok(answer: dict[str, object], *pods: AgentPod) -> dict[str, object]:
    """The answer, which must be ok (else the failure and how `pods` answered their reads)."""
    assert answer["ok"], (answer, [pod.call("reads") for pod in pods])
    return answer


FRESH_KEYS = int(os.environ.get("GRAPHLEDGER_CLIENT_FRESH_KEYS", "512"))  # more for a longer outage
NEW_SUBJECTS = FRESH_KEYS // 2 - 2
"""New subjects the agent starts through the outage: what its pool surely holds (half of it; two went to
the subjects written before)."""


def _pod(stack: DevStack, name: str) -> AgentPod:
    env = {**stack.client_env(), "GRAPHLEDGER_KEY_CACHE_TTL_S": "1", "GRAPHLEDGER_CLIENT_FRESH_KEYS": str(FRESH_KEYS)}
    return AgentPod(name, env, stack.log_dir)


def test_agents_keep_writing_through_an_outage_of_the_read_api_and_postgres(stack: DevStack) -> None:
    held = f"held-{uuid.uuid4().hex[:6]}"
    elsewhere = f"elsewhere-{uuid.uuid4().hex[:6]}"
    with KafkaSaver(stack.settings) as other:  # another process's thread, which the pod does not hold
        other.put(
            {"configurable": {"thread_id": elsewhere, "checkpoint_ns": ""}},
            empty_checkpoint(),
            {"source": "input", "step": -1},
            {},
        )
    moved = f"moved-{uuid.uuid4().hex[:6]}"
    pod, second = _pod(stack, "before"), _pod(stack, "second")
    try:
        _ok(pod.call("turn", thread=held, text="before the outage"))
        for n in range(4):  # both pods read the moved thread, and seal it with its own key from then on
            _ok((pod, second)[n % 2].call("turn", thread=moved, text=f"moved {n}"))
        moves = 4
        _ok(pod.call("store_put", namespace=["outage", "before"], key="k", value={"n": -1}))  # the store started
        for _ in range(WARM_THREADS):  # copies of both partitions' key filters, all but surely
            _ok(pod.call("turn", thread=f"warm-{uuid.uuid4().hex[:6]}", text="hello"))
        turns, puts, memories = 1, [], []
        stack.stop_api()
        stack.stop_postgres()
        try:
            # A new thread's turn proves the thread new from the log: no read API, no projection.
            _ok(pod.call("turn", thread=f"new-turn-{uuid.uuid4().hex[:6]}", text="hello"))
            deadline = time.monotonic() + OUTAGE_S
            while time.monotonic() < deadline:  # the outage's length, not a wait for anything
                _ok(pod.call("turn", thread=held, text=f"turn {turns}"))
                turns += 1
                _ok((pod, second)[moves % 2].call("turn", thread=moved, text=f"moved {moves}"), pod, second)
                moves += 1
                if len(puts) + len(memories) + 2 <= NEW_SUBJECTS:
                    fresh = f"new-{uuid.uuid4().hex[:6]}"
                    _ok(pod.call("put", thread=fresh, text=f"first write of {fresh}"))
                    puts.append(fresh)
                    namespace = ["outage", uuid.uuid4().hex[:6]]
                    _ok(pod.call("store_put", namespace=namespace, key="k", value={"n": len(memories)}))
                    memories.append(namespace)
                time.sleep(PACE_S)  # the agent's rate of new subjects, not a wait for anything
            # A thread another process wrote needs the projection: its turn fails at its first read.
            refused = pod.call("turn", thread=elsewhere, text="hello")
            assert not refused["ok"] and refused["retryable"], refused
            # A pod started during the outage has no keys: it says so, and its writes fail retryably.
            late = _pod(stack, "during")
            try:
                failed = late.call("put", thread=f"late-{uuid.uuid4().hex[:6]}", text="x")
                assert not failed["ok"] and failed["retryable"], failed
                assert "no keys from the read API at start" in late.log_path.read_text()
            finally:
                late.close()
        finally:
            stack.start_postgres()
            stack.start_api()

        # Everything acknowledged during the outage is projected and readable from another process.
        with KafkaSaver(stack.settings) as reader, KafkaStore(stack.settings) as store:

            def projected() -> bool:
                try:
                    found = reader.get_tuple({"configurable": {"thread_id": held}})
                except Exception:  # retryable while the projector catches up
                    return False
                return found is not None and len(found.checkpoint["channel_values"]["messages"]) == 2 * turns

            wait_until(projected, WAIT_S, "the held thread's turns to be projected", poll_s=0.2)
            found = reader.get_tuple({"configurable": {"thread_id": moved}})
            assert found is not None and len(found.checkpoint["channel_values"]["messages"]) == 2 * moves
            for thread in puts:
                found = reader.get_tuple({"configurable": {"thread_id": thread}})
                assert found is not None and found.checkpoint["channel_values"] == {"note": f"first write of {thread}"}
            for n, namespace in enumerate(memories):
                item = store.get(tuple(namespace), "k")
                assert item is not None and item.value == {"n": n}
        assert turns > 2 and puts and memories
    finally:
        pod.close()
        second.close()
