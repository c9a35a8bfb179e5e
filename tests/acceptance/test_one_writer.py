"""One writer per thread (invariant 10): agents as separate OS processes, each with its own saver, on one
`graphledger dev`. A superseded writer (LangGraph issue 8796: stopped inside a node while another process
took the thread over) and the second of two turns started at once are refused with a clear error before
LangGraph counts their run done; the thread never forks, and the projection, the read API and the
refusals list say so.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from agent_pods import AgentPod, started_pods
from graphledger_server.devstack.ports import wait_until
from graphledger_server.devstack.stack import DevStack
from one_writer_checks import listed, new_thread, ok, one_chain, refused

pytestmark = pytest.mark.slow

STARTS = int(os.environ.get("GRAPHLEDGER_CONCURRENT_STARTS", "10"))
"""Rounds of two turns started at once on one thread (`make soak`: 50)."""


@pytest.fixture(scope="module")
def stack() -> Iterator[DevStack]:
    with DevStack(partitions=2) as dev:
        yield dev


@pytest.fixture(scope="module")
def pods(stack: DevStack) -> Iterator[list[AgentPod]]:
    yield from started_pods(stack.client_env(), stack.log_dir)


def test_of_two_turns_started_at_once_on_one_thread_one_counts_and_the_other_is_refused(
    stack: DevStack, pods: list[AgentPod]
) -> None:
    a, b, c = pods
    thread = new_thread()
    ok(a.call("turn", thread=thread, text="m0"))
    said = ["m0"]
    for n in range(STARTS):
        # Both runs read the thread as it is, and only then write: the two writes race to the log.
        first = a.send("turn", thread=thread, text=f"a{n}", read_gate=f"a{n}")
        second = b.send("turn", thread=thread, text=f"b{n}", read_gate=f"b{n}")
        a.wait_for(lambda m, n=n: m.get("event") == "read" and m.get("gate") == f"a{n}", 60, "a's read")
        b.wait_for(lambda m, n=n: m.get("event") == "read" and m.get("gate") == f"b{n}", 60, "b's read")
        ok(a.call("gate_open", name=f"a{n}"))
        ok(b.call("gate_open", name=f"b{n}"))
        answers = {"a": a.answer(first), "b": b.answer(second)}
        winners = [name for name, answer in answers.items() if answer["ok"]]
        assert len(winners) == 1, answers
        refused(next(answer for answer in answers.values() if not answer["ok"]))
        said.append(f"{winners[0]}{n}")
        # The winner's turn is on the thread's one chain, the loser's not at all, from any process.
        messages = ok(c.call("state", thread=thread))["messages"]
        assert messages[::2] == said, (n, answers)
    one_chain(c, thread)
    wait_until(lambda: len(listed(stack, thread)["refused"]) >= STARTS, 60, "the projector to record the refusals")
    assert [f for f in listed(stack, thread)["forks"] if f["kind"] == "fork"] == []


def superseded_while_stopped(a: AgentPod, b: AgentPod, thread: str, gate: str) -> tuple[int, list[str]]:
    """LangGraph issue 8796: A's turn is stopped (SIGSTOP) inside its node; B runs the thread's pending task
    from its newest checkpoint and completes; A is continued. A's turn (its request id) and B's messages."""
    turn = a.send("turn", thread=thread, text=f"gate:{gate}")
    a.wait_for(lambda m: m.get("event") == "in_node" and m.get("gate") == gate, 60, "a inside its node")
    # Its input's checkpoint is written (durability "async" writes it beside the node): b resumes from it.
    wait_until(lambda: ok(b.call("state", thread=thread))["next"] == ["reply"], 60, "a's input checkpoint")
    a.process.send_signal(signal.SIGSTOP)
    try:
        ok(b.call("gate_open", name=gate))  # b's node passes the gate
        won = ok(b.call("continue", thread=thread))["messages"]
        assert won == [f"gate:{gate}", f"reply to gate:{gate}"]
    finally:
        a.process.send_signal(signal.SIGCONT)
    return turn, won


def test_a_writer_superseded_while_stopped_in_a_node_is_refused_and_none_of_its_late_writes_count(
    stack: DevStack, pods: list[AgentPod]
) -> None:
    a, b, c = pods
    thread = new_thread()
    turn, won = superseded_while_stopped(a, b, thread, "a")
    held = one_chain(c, thread)
    ok(a.call("gate_open", name="a"))
    refused(a.answer(turn))
    # Nothing of a's late writes counts: the thread is b's chain, read from the read API and from a.
    assert ok(c.call("state", thread=thread))["messages"] == won
    assert ok(a.call("state", thread=thread))["messages"] == won
    assert one_chain(c, thread) == held
    wait_until(lambda: bool(listed(stack, thread)["refused"]), 60, "the projector to record a's refusal")
    refusals = listed(stack, thread)["refused"]
    assert all(r["thread_id"] == thread for r in refusals)
    assert {r["event_type"] for r in refusals} <= {"checkpoint.put", "checkpoint.writes"}


def test_a_writer_that_does_not_read_the_log_learns_its_refusal_from_the_read_api(
    stack: DevStack, pods: list[AgentPod]
) -> None:
    """As a tenant's client (its partition holds other tenants' records): the 8796 scenario with writers that
    never fetch the log, so only the projection's verdict, asked of the read API, can stop the superseded one."""
    env = {**stack.client_env(), "GRAPHLEDGER_CLIENT_LOG_READS": "false"}
    a, b = (AgentPod(name, env, stack.log_dir) for name in ("blind-a", "blind-b"))
    try:
        thread = new_thread()
        turn, won = superseded_while_stopped(a, b, thread, "blind")
        ok(a.call("gate_open", name="blind"))
        refused(a.answer(turn))
        assert ok(pods[2].call("state", thread=thread))["messages"] == won
        one_chain(pods[2], thread)
    finally:
        a.close()
        b.close()
