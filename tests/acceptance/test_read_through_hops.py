"""Turns that hop between agent processes keep succeeding while the projector is stopped (invariant 5:
the read API folds the unprojected records), and what they cost beside a turn that stays in its process.

Three agent processes on the dev stack: `load` runs the bench's chat load (`agent_process.py`,
`load_start`), `a` and `b` run the measured turns in rounds: a hop turn (a conversation whose turns
alternate between `a` and `b`, so each turn's process did not write the previous turn and its read goes
to the read API) on one of them, then a turn that stays (a conversation of that other process alone,
read from what it holds) on the other, so both processes run one turn a round and neither measures
waking up from idling. Conversations have ten turns, as the bench's; a conversation's first turn (its
process holds nothing of it) counts on neither side. The projector is stopped (SIGSTOP) for
`GRAPHLEDGER_READ_THROUGH_STOPPED_S` (20 s in `make test`, 300 in `make soak`); every turn succeeds and
sees every earlier turn of its conversation. The two sides' p50s are printed, not asserted: a timed
assertion fails on a noisy machine, and the bench's hop turn is where the cost is measured.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent_pods import AgentPod
from graphledger.settings import Settings
from graphledger_server.devstack.stack import DevStack

pytestmark = pytest.mark.slow

STOPPED_S = float(os.environ.get("GRAPHLEDGER_READ_THROUGH_STOPPED_S", "20"))
"""How long the projector stays stopped (`make soak`: five minutes)."""
LOAD_CONCURRENCY = int(os.environ.get("GRAPHLEDGER_READ_THROUGH_LOAD", "4"))
"""Chat load workers beside the measured turns."""
TURNS = 10
"""Turns per conversation, as the bench's."""
READ_THROUGH_MAX_BYTES = 2 * 1024 * 1024 * 1024
"""The read API's bound: five minutes of this load without the projector stay under it."""


@pytest.fixture(scope="module")
def stack() -> Iterator[DevStack]:
    base = Settings(consistency_timeout_s=10.0, api_read_through_max_bytes=READ_THROUGH_MAX_BYTES)
    with DevStack(partitions=4, base=base, log_level="WARNING") as dev:
        yield dev


class Conversation:
    """One conversation's thread and the turns it has had, on the pods it hops between."""

    def __init__(self, pods: list[AgentPod]) -> None:
        self.pods = pods
        self.thread = f"t-{uuid.uuid4().hex[:8]}"
        self.sent: list[str] = []

    def turn(self) -> float:
        """The next turn on its pod; the invoke's milliseconds. Fails the test unless it saw every turn."""
        pod = self.pods[len(self.sent) % len(self.pods)]
        text = f"{self.thread}-{len(self.sent)}"
        answer: dict[str, Any] = pod.call("turn", thread=self.thread, text=text)
        assert answer["ok"], (pod.name, answer)
        self.sent.append(text)
        assert answer["messages"] == [m for t in self.sent for m in (t, f"reply to {t}")], self.thread
        return float(answer["elapsed_ms"])


@pytest.mark.timeout(STOPPED_S + 240)  # the stack's start, the agents' and the stop beside the stopped time
def test_turns_hop_between_processes_while_the_projector_is_stopped(stack: DevStack) -> None:
    pods = {name: AgentPod(name, stack.client_env(), stack.log_dir) for name in ("a", "b", "load")}
    a, b, load = pods["a"], pods["b"], pods["load"]
    try:
        Conversation([a, b]).turn()  # each process has started its client
        Conversation([b]).turn()
        assert load.call("load_start", concurrency=LOAD_CONCURRENCY)["ok"]
        hops: list[float] = []
        stays: list[float] = []
        with stack.projector_frozen():
            deadline = time.monotonic() + STOPPED_S
            while time.monotonic() < deadline:
                hopping, staying = Conversation([a, b]), {a: Conversation([a]), b: Conversation([b])}
                for n in range(TURNS):
                    hop = hopping.turn()
                    if n:
                        hops.append(hop)
                    other = staying[b if n % 2 == 0 else a]  # the process the hop turn did not run on
                    first = not other.sent
                    stay = other.turn()
                    if not first:
                        stays.append(stay)
            loaded = load.call("load_stop")
        assert loaded["ok"] and not loaded["errors"], loaded
        hop_p50, stay_p50 = statistics.median(hops), statistics.median(stays)
        print(
            f"\nprojector stopped {STOPPED_S:.0f}s, chat load {LOAD_CONCURRENCY} workers ({loaded['turns']} turns): "
            f"hop turn p50 {hop_p50:.1f} ms ({len(hops)} turns), staying turn p50 {stay_p50:.1f} ms, "
            f"ratio {hop_p50 / stay_p50:.2f}"
        )
    finally:
        for pod in pods.values():
            pod.close()
