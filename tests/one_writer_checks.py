"""What the one-writer acceptance tests check of a pod's answers and of `graphledger forks list`."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import uuid
from typing import Any

from agent_pods import AgentPod
from graphledger_server.devstack.stack import DevStack

REFUSED = "ThreadWriteRefusedError"
WHAT_TO_DO = "read the thread again and retry the turn from its head"


def new_thread() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def ok(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["ok"], answer
    return answer


def refused(answer: dict[str, Any]) -> None:
    assert not answer["ok"] and REFUSED in answer["error"] and WHAT_TO_DO in answer["error"], answer
    assert not answer["retryable"], answer  # not for that run: a new turn reads the thread again


def chain(pod: AgentPod, thread: str) -> list[tuple[str, str | None]]:
    """The thread's (checkpoint id, parent id) pairs, newest first."""
    return [tuple(pair) for pair in ok(pod.call("history", thread=thread))["checkpoints"]]


def one_chain(pod: AgentPod, thread: str) -> list[str]:
    """The thread's checkpoint ids, newest first, after checking each one's parent is the next one."""
    history = chain(pod, thread)
    for (_, parent), (older, _) in itertools.pairwise(history):
        assert parent == older, history
    return [checkpoint for checkpoint, _ in history]


def listed(stack: DevStack, thread: str) -> dict[str, list[dict[str, Any]]]:
    """`graphledger forks list --json` of one thread: its `forks` (branches among them) and `refused`."""
    done = subprocess.run(
        [sys.executable, "-m", "graphledger_server", "forks", "list", "--json", "--thread", thread],
        env=stack.service_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, list[dict[str, Any]]] = json.loads(done.stdout)
    return answer
