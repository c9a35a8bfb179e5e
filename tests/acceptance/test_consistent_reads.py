"""Reads are consistent across agent processes (invariant 5): a thread's turns hop between separate
OS processes, each with its own saver, while the projection lags, stops, or moves between workers.

Every read reflects every write acknowledged to any process before it began, or fails retryably; a
thread's turns (and store gets) do not wait for the projector, in the process that wrote them or in
another (the read API folds the records the projection lacks); lists and searches wait for it. At the end each thread's
history is one parent chain holding every acknowledged turn once.
"""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agent_pods import AgentPod, started_pods
from graphledger.settings import Settings
from graphledger_server.devstack.stack import DevStack

pytestmark = pytest.mark.slow

CONSISTENCY_TIMEOUT_S = 4.0
"""The stack's read deadline: short, so that a read the projection cannot serve fails quickly."""
TURN_DEADLINE_S = 120.0
"""How long a turn is retried after retryable failures (a SIGKILLed projector's partitions stay with
the dead member ~20 s on tansu)."""


@pytest.fixture(scope="module")
def stack() -> Iterator[DevStack]:
    with DevStack(partitions=4, base=Settings(consistency_timeout_s=CONSISTENCY_TIMEOUT_S)) as dev:
        yield dev


@pytest.fixture(scope="module")
def pods(stack: DevStack) -> Iterator[list[AgentPod]]:
    yield from started_pods(stack.client_env(), stack.log_dir)


@pytest.fixture
def projector_running(stack: DevStack) -> Iterator[None]:
    """Whatever a test does to the projector, the next test starts with one running."""
    yield
    child = stack.children.get("projector")
    if child is None or not child.running:
        stack.start_projector()


def _thread() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _ok(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["ok"], answer
    return answer


def _retryable(answer: dict[str, Any]) -> None:
    assert not answer["ok"] and answer["retryable"], answer


def _until_ok(pod: AgentPod, op: str, deadline_s: float = TURN_DEADLINE_S, **fields: Any) -> dict[str, Any]:
    """`op` on `pod`, again after each retryable failure, until it succeeds."""
    deadline = time.monotonic() + deadline_s
    while True:
        answer = pod.call(op, **fields)
        if answer["ok"]:
            return answer
        _retryable(answer)
        assert time.monotonic() < deadline, f"{op} kept failing: {answer}"


def _conversation(*texts: str) -> list[str]:
    return [m for text in texts for m in (text, f"reply to {text}")]


def _assert_one_chain(pod: AgentPod, thread: str, turns: list[str]) -> None:
    """The thread's history is one parent chain (no dead branch) and its messages are `turns`, each once."""
    state = _until_ok(pod, "state", thread=thread)
    assert state["messages"] == _conversation(*turns)
    checkpoints = _until_ok(pod, "history", thread=thread)["checkpoints"]
    # Newest first: each checkpoint's parent is the next one; the oldest has none.
    for (_, parent), (older, _) in itertools.pairwise(checkpoints):
        assert parent == older, checkpoints
    assert checkpoints[-1][1] is None
    assert len(checkpoints) == 3 * len(turns)  # per turn: the input, the start node and the reply node


def test_a_thread_hops_while_the_projector_is_stopped(
    stack: DevStack, pods: list[AgentPod], projector_running: None
) -> None:
    a, b, _ = pods
    thread = _thread()
    _ok(a.call("turn", thread=thread, text="m1"))
    stack.kill_projector(signal.SIGTERM)
    # The writer continues its own thread without the projector...
    assert _ok(a.call("turn", thread=thread, text="m2"))["messages"] == _conversation("m1", "m2")
    # ... and so does another process: the read API folds m2's records, which the projection lacks.
    assert _ok(b.call("turn", thread=thread, text="m3"))["messages"] == _conversation("m1", "m2", "m3")
    assert _ok(a.call("turn", thread=thread, text="m4"))["messages"] == _conversation("m1", "m2", "m3", "m4")
    # A list of a thread waits for the projection of its records: retryable until a projector runs.
    _retryable(b.call("history", thread=thread))
    stack.start_projector(wait=False)
    _assert_one_chain(b, thread, ["m1", "m2", "m3", "m4"])


def test_a_thread_hops_across_a_postgres_outage(stack: DevStack, pods: list[AgentPod]) -> None:
    a, b, _ = pods
    thread = _thread()
    _ok(a.call("turn", thread=thread, text="m1"))
    _ok(a.call("turn", thread=thread, text="m2"))
    stack.stop_postgres()
    try:
        # Another process reads the thread through the read API: without Postgres it fails retryably,
        # unless the read API still holds a view of the thread it folded and every record since (then it
        # answers from the log); never without m2. The last writer continues its own.
        turns, writer = ["m1", "m2"], a
        hopped = b.call("turn", thread=thread, text="m3")
        if hopped["ok"]:
            turns, writer = [*turns, "m3"], b
            assert hopped["messages"] == _conversation(*turns)
        else:
            _retryable(hopped)
        text = f"m{len(turns) + 1}"
        assert _ok(writer.call("turn", thread=thread, text=text))["messages"] == _conversation(*turns, text)
        turns.append(text)
    finally:
        stack.start_postgres()
    text = f"m{len(turns) + 1}"
    assert _until_ok(b, "turn", thread=thread, text=text)["messages"] == _conversation(*turns, text)
    _assert_one_chain(a, thread, [*turns, text])


def test_threads_hop_across_a_projector_rebalance(stack: DevStack, pods: list[AgentPod]) -> None:
    threads = [_thread(), _thread()]
    turns: dict[str, list[str]] = {t: [] for t in threads}

    def hop(n: int) -> None:
        for thread in threads:
            text = f"m{n}"
            answer = _until_ok(pods[n % 2], "turn", thread=thread, text=text)
            turns[thread].append(text)
            assert answer["messages"] == _conversation(*turns[thread])

    hop(0)
    extra = subprocess.Popen(  # a second projector joins the group: the partitions are split between two
        [sys.executable, "-m", "graphledger_server", "projector"],
        env=stack.service_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for n in range(1, 5):
            hop(n)
    finally:
        extra.send_signal(signal.SIGTERM)  # it leaves: the partitions move back
        extra.wait(30)
    for n in range(5, 8):
        hop(n)
    for thread in threads:
        _assert_one_chain(pods[0], thread, turns[thread])


def test_resume_in_another_process_continues_from_the_interrupt(
    stack: DevStack, pods: list[AgentPod], projector_running: None
) -> None:
    a, b, _ = pods
    thread = _thread()
    stack.kill_projector(signal.SIGTERM)
    interrupted = _ok(a.call("turn", thread=thread, text="interrupt:color?"))
    assert interrupted["messages"] == ["interrupt:color?"]
    assert _ok(a.call("state", thread=thread))["next"] == ["reply"]  # its own interrupt, without the projector
    pending = b.send("resume", thread=thread, value="blue")
    stack.start_projector(wait=False)
    answer = b.answer(pending)
    if not answer["ok"]:
        _retryable(answer)
        answer = _until_ok(b, "resume", thread=thread, value="blue")
    assert answer["messages"] == ["interrupt:color?", "answer blue"]


def test_a_store_put_in_one_process_is_seen_by_the_next_read_in_another(
    stack: DevStack, pods: list[AgentPod], projector_running: None
) -> None:
    a, b, _ = pods
    namespace, key = ["users", uuid.uuid4().hex[:8]], "profile"
    _ok(a.call("store_put", namespace=namespace, key=key, value={"v": 0}))
    assert _ok(b.call("store_get", namespace=namespace, key=key))["value"] == {"v": 0}
    stack.kill_projector(signal.SIGTERM)
    _ok(a.call("store_put", namespace=namespace, key=key, value={"v": 1}))
    # Never the old value: a get folds the put the projection lacks; a search waits for it (retryably).
    assert _ok(b.call("store_get", namespace=namespace, key=key))["value"] == {"v": 1}
    _retryable(b.call("store_search", namespace=namespace))
    stack.start_projector(wait=False)
    assert _until_ok(b, "store_get", namespace=namespace, key=key)["value"] == {"v": 1}
    assert _until_ok(b, "store_search", namespace=namespace)["items"] == [[namespace, key, {"v": 1}]]


def test_turns_hop_at_random_while_the_projector_is_killed_and_restarted(
    stack: DevStack, pods: list[AgentPod], projector_running: None
) -> None:
    rng = random.Random(7)
    threads = [_thread() for _ in range(6)]
    turns: dict[str, list[str]] = {t: [] for t in threads}
    done = threading.Semaphore(0)

    def turn(thread: str, text: str) -> dict[str, Any]:
        """The turn on a random pod, and on another random one after each retryable failure."""
        deadline = time.monotonic() + TURN_DEADLINE_S
        while True:
            answer = rng.choice(pods).call("turn", thread=thread, text=text)
            if answer["ok"]:
                return answer
            _retryable(answer)
            assert time.monotonic() < deadline, answer

    def converse(thread: str) -> None:
        for n in range(6):
            text = f"{thread}-{n}"
            answer = turn(thread, text)
            turns[thread].append(text)
            # No read older than allowed: the turn saw every turn acknowledged before it.
            assert answer["messages"] == _conversation(*turns[thread]), thread
            done.release()

    def completed(count: int) -> None:
        for _ in range(count):
            assert done.acquire(timeout=TURN_DEADLINE_S), "the conversations stopped advancing"

    with ThreadPoolExecutor(len(threads)) as workers:
        running = [workers.submit(converse, t) for t in threads]
        completed(8)
        stack.kill_projector(signal.SIGKILL)
        completed(3)  # turns that continue their process's own writes need no projector
        stack.start_projector(wait=False)
        completed(8)
        stack.restart_projector(wait=False)
        for future in running:
            future.result()
    for thread in threads:
        _assert_one_chain(pods[0], thread, turns[thread])
