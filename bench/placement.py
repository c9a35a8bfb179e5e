"""Where the bench's processes run: the agent process on a core of its own, the stack on the others.

The bench process is the agent pod: it runs LangGraph and every saver measured (KafkaSaver and its I/O
thread, the official savers' psycopg connections, `InMemorySaver`). The stack is everything the savers
talk to: Postgres (the official savers' too: it is the same embedded server), the broker, projector,
read API and sweeper. Pinned apart, the agent's CPU per turn and turns per second are its own, as on
a pod, and not what the projector or Postgres took from it.

Linux affinity belongs to a thread: `os.sched_setaffinity(0, ...)` moves only the calling thread, and
a new thread or child process starts with the affinity of the thread that made it. So the bench moves
every thread of its process (`to_stack` before the stack starts, so the stack's processes inherit the
stack's cores; `to_agent` once it runs), spawns later stack processes with the calling thread on the
stack's cores (`spawning`), and `pin` sets every thread of every stack process and its descendants by
id: the postmaster is detached from the bench by `pg_ctl`, and its backends fork from it.

With fewer than two usable cores nothing is pinned, and `describe` says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil


def _cores(cores: Iterable[int]) -> str:
    ordered = sorted(cores)
    return ("core " if len(ordered) == 1 else "cores ") + ", ".join(map(str, ordered))


def _set_threads(pid: int, cores: frozenset[int]) -> None:
    """Every thread of process `pid` onto `cores` (a thread or process gone meanwhile is skipped)."""
    try:
        tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except FileNotFoundError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, FileNotFoundError):
            pass


def _tree(pids: Iterable[int]) -> dict[int, psutil.Process]:
    """The processes `pids` and all their descendants, by pid (those that have exited left out)."""
    tree: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for process in (root, *root.children(recursive=True)):
                tree[process.pid] = process
        except psutil.NoSuchProcess:
            continue
    return tree


def cpu_seconds(pids: Iterable[int]) -> float:
    """User and system CPU seconds of the processes `pids` and their descendants, those running now (a
    process that exited takes its seconds with it: Postgres backends of closed connections)."""
    total = 0.0
    for process in _tree(pids).values():
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _thread_affinities(pid: int) -> list[frozenset[int]]:
    affinities = []
    try:
        tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except FileNotFoundError:
        return affinities
    for tid in tids:
        try:
            affinities.append(frozenset(os.sched_getaffinity(tid)))
        except (ProcessLookupError, FileNotFoundError):
            pass
    return affinities


@dataclass(frozen=True, slots=True)
class Placement:
    usable: frozenset[int]
    """The cores this process may run on when the bench starts."""
    agent: frozenset[int]
    stack: frozenset[int]

    @classmethod
    def plan(cls) -> Placement:
        """The agent on the highest usable core, the stack on the rest; all on all below two cores.

        The highest core, because Linux tends to serve interrupts and housekeeping on core 0.
        """
        usable = frozenset(os.sched_getaffinity(0))
        if len(usable) < 2:
            return cls(usable, usable, usable)
        agent = max(usable)
        return cls(usable, frozenset({agent}), usable - {agent})

    @property
    def pinned(self) -> bool:
        return self.agent != self.stack

    def to_stack(self) -> None:
        """Every thread of this process onto the stack's cores: what it spawns now inherits them."""
        if self.pinned:
            _set_threads(os.getpid(), self.stack)

    def to_agent(self) -> None:
        """Every thread of this process onto the agent's core."""
        if self.pinned:
            _set_threads(os.getpid(), self.agent)

    @contextmanager
    def spawning(self) -> Iterator[None]:
        """The calling thread on the stack's cores meanwhile, so a stack process started here (a
        projector restarted) inherits them; back on the agent's core after."""
        if not self.pinned:
            yield
            return
        os.sched_setaffinity(0, self.stack)
        try:
            yield
        finally:
            os.sched_setaffinity(0, self.agent)

    def pin(self, stack_pids: Iterable[int]) -> None:
        """Every thread of the stack's processes and their descendants onto the stack's cores."""
        if self.pinned:
            for pid in _tree(stack_pids):
                _set_threads(pid, self.stack)

    def describe(self, stack_pids: Mapping[str, int]) -> str:
        """Which cores each side runs on, read back from the kernel (not from the plan)."""
        total = os.cpu_count() or len(self.usable)
        head = f"{total} cores ({len(self.usable)} usable: {_cores(self.usable).removeprefix('core ')})"
        if not self.pinned:
            return f"{head}; not pinned (fewer than two usable cores): the agent and the stack share them"
        agent_threads = _thread_affinities(os.getpid())
        stack = {pid: threads for pid in _tree(stack_pids.values()) if (threads := _thread_affinities(pid))}
        stack_threads = [a for threads in stack.values() for a in threads]
        strays = sum(a != self.agent for a in agent_threads) + sum(a != self.stack for a in stack_threads)
        postgres = len(_tree([stack_pids["postgres"]])) if "postgres" in stack_pids else 0
        names = ", ".join(f"postgres ({postgres} processes)" if n == "postgres" else n for n in stack_pids)
        line = (
            f"{head}; agent process (the bench, running LangGraph and every saver; threads: {len(agent_threads)}) "
            f"on {_cores(self.agent)}; stack ({names}; processes: {len(stack)}, threads: {len(stack_threads)}) "
            f"on {_cores(self.stack)}"
        )
        return line + (f"; {strays} threads NOT where planned" if strays else "")
