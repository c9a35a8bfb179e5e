"""Agent pods as separate OS processes (`agent_process.py`), driven over their stdin and stdout."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

AGENT = Path(__file__).with_name("agent_process.py")
CALL_TIMEOUT_S = 120.0


class AgentPod:
    """One agent process; `call` sends a command and waits for its answer."""

    def __init__(self, name: str, env: Mapping[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"agent-{name}.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, str(AGENT)],
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self._ids = itertools.count(1)
        self._sending = threading.Lock()
        self._messages: list[dict[str, Any]] = []
        self._arrived = threading.Condition()
        threading.Thread(target=self._read, name=f"agent-{name}", daemon=True).start()
        self.wait_for(lambda m: m.get("event") == "ready", 60, "the agent to start")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._arrived:
                self._messages.append(json.loads(line))
                self._arrived.notify_all()
        with self._arrived:
            self._arrived.notify_all()

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout_s: float, what: str) -> dict[str, Any]:
        """The first message matching `match`, waiting up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while True:
                for message in self._messages:
                    if match(message):
                        self._messages.remove(message)
                        return message
                remaining = deadline - time.monotonic()
                if self.process.poll() is not None or remaining <= 0:
                    raise TimeoutError(f"agent {self.name}: no {what} within {timeout_s}s; see {self.log_path}")
                self._arrived.wait(remaining)

    def send(self, op: str, **fields: Any) -> int:
        assert self.process.stdin is not None
        with self._sending:  # test threads share a pod
            command_id = next(self._ids)
            self.process.stdin.write(json.dumps({"id": command_id, "op": op, **fields}) + "\n")
            self.process.stdin.flush()
        return command_id

    def answer(self, command_id: int, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        return self.wait_for(lambda m: m.get("id") == command_id, timeout_s, f"answer to command {command_id}")

    def call(self, op: str, timeout_s: float = CALL_TIMEOUT_S, **fields: Any) -> dict[str, Any]:
        return self.answer(self.send(op, **fields), timeout_s)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def started_pods(
    env: Mapping[str, str], log_dir: Path, names: tuple[str, ...] = ("a", "b", "c")
) -> Iterator[list[AgentPod]]:
    """A module fixture's pods: one agent process per name, closed when the fixture ends."""
    started = [AgentPod(name, env, log_dir) for name in names]
    yield started
    for pod in started:
        pod.close()
