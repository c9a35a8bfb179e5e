"""The operations of the model-based test (`tests/acceptance/test_model_based.py`): a script generated
from a seed, the graph whose `aget_state` the agents call, and the wire form between test and agents.

The script is a function of the seed alone: which agent runs which operation on which thread, with
which arguments, and where the faults fall. What the agents then race is not: a seed replays the same
operations, not the same interleaving.

The generator picks its arguments from what it issued so far (its own belief of each thread, never the
saver's answers), so that operations meet: puts continue the newest checkpoint issued or fork from an
older one, repeat an id, or come before their writes; writes name existing, missing and future
checkpoints, special and regular channels, tasks that collide; blobs reuse versions; copies go onto
fresh and used threads, prunes and deletes hit threads that are being written, runs recur.
"""

from __future__ import annotations

import base64
import operator
import pickle
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from langgraph.constants import END, START
from langgraph.graph import StateGraph
from langgraph.types import Interrupt

WRITE_KINDS = ("put", "put_writes", "delete_thread", "copy_thread", "prune", "delete_for_runs", "erase", "turn")
EVERY_THREAD_KINDS = ("delete_for_runs", "erase", "list_all")
"""Operations that may touch any thread (runs of any thread, copies of the erased one, a list of all)."""
READ_KINDS = ("get_tuple", "list", "list_all", "get_state")
KINDS = WRITE_KINDS + READ_KINDS

WEIGHTS = {
    "put": 26,
    "put_writes": 20,
    "delete_thread": 1.5,
    "copy_thread": 2.5,
    "prune": 3,
    "delete_for_runs": 2,
    "erase": 0.4,
    "turn": 8,
    "get_tuple": 22,
    "list": 10,
    "list_all": 1.5,
    "get_state": 11,
}
"""Relative frequency of each operation."""

NAMESPACES = {"": 70, "inner": 15, "call:1": 15}
"""`inner` stands for a `checkpointer=True` subgraph, `call:1` for a subgraph call (prune drops it
whole once the root checkpoint it started from is saved and pruned away)."""
RUN_IDS = tuple(f"run-{i}" for i in range(6))
TASK_IDS = ("task-a", "task-b", "task-c")
TASK_PATHS = ("", "~__pregel_pull, reply", "~__pregel_pull, tool", "~__pregel_push, 0")
SPECIAL_CHANNELS = ("__error__", "__interrupt__", "__resume__", "__scheduled__")
REGULAR_CHANNELS = ("messages", "count", "note", "branch:to:reply", "branch:to:tool")
LIVE_THREADS = 5
TURN_THREADS = 2
"""Threads that only LangGraph runs write (`turn`), several agents at once, so the one-writer rule decides:
the script's own puts never go there (their made-up ids and channels are no run's). Reads, deletes, prunes,
deletes of runs and copies from them do."""
TURN_SHARE = 0.2
"""How often an operation that may name a turn thread does."""
"""Threads written at once; an erased thread is replaced by a fresh one (and still read)."""
FRESH_TARGET_DELAY = 60
"""Operations after a copy onto a fresh thread before the script uses that thread (`copy_onto_used_threads`
excluded), so that nothing else touches the target while the copy is in flight."""

FEATURES = {
    "prune_keep_latest": "prune with strategy keep_latest (else only delete)",
    "foreign_versions": "a put naming a channel version that is neither its parent's nor new (an older "
    "checkpoint's, whose blob row exists); LangGraph's own puts never do",
    "copy_onto_used_threads": "copy_thread onto a thread that has records, or that is written while the "
    "copy is in flight (else only onto a fresh thread, left alone for a while)",
    "runs_delete_after_copy": "delete_for_runs in a script that copies threads (else the first half of the "
    "script deletes runs and copies nothing, the second half copies and deletes no runs)",
    "copies_around_erasure": "copies from a thread erased before or while they are made, and erasing a "
    "thread again (else copies come from live threads, an erased thread is not erased again, and a thread "
    "copied from in the last operations is not erased; the script believes a thread erased with every "
    "thread it copied the erased one to)",
    "erase_copies_of_copies": "erasing a thread whose copies were copied on (else only threads whose copies "
    "have no copies of their own, as far as the script knows)",
    "writes_before_put": "writes of a checkpoint before its put (a checkpoint not put yet, or put again after "
    "a delete dropped it); else writes name existing, newest or never-put checkpoints, and a checkpoint is put "
    "again only if nothing was written to it",
    "reads_racing_own_writes": "an agent reading a thread while it writes the same thread (else the test "
    "sends an agent an operation only once its operations of the other kind on the same threads are done)",
}
"""Behaviours of the script besides the operation kinds, each of which can be excluded by name."""


# -- the graph whose state `get_state` reads -----------------------------------------------------


class ModelState(TypedDict, total=False):
    messages: Annotated[list[Any], operator.add]
    count: int
    note: Any
    flag: bool


def _reply(state: ModelState) -> dict[str, Any]:
    return {"messages": ["reply"]}


def _tool(state: ModelState) -> dict[str, Any]:
    return {"count": 1}


def build_graph(checkpointer: Any) -> Any:
    """Two nodes in a row: what `aget_state` makes of the checkpoints the script puts (their channels
    are this graph's)."""
    builder = StateGraph(ModelState)
    builder.add_node("reply", _reply)
    builder.add_node("tool", _tool)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", "tool")
    builder.add_edge("tool", END)
    return builder.compile(checkpointer=checkpointer)


# -- the wire between the test and the agents ----------------------------------------------------


def pack(value: Any) -> str:
    """Any picklable value as text for a JSON line (test and agents trust each other)."""
    return base64.b64encode(pickle.dumps(value)).decode()


def unpack(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))


# -- the script ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of the script."""

    index: int
    agent: int
    kind: str
    args: dict[str, Any]

    def threads(self) -> tuple[str, ...]:
        """The threads the operation names."""
        args = self.args
        if self.kind == "copy_thread":
            return (args["source"], args["target"])
        if self.kind == "prune":
            return tuple(args["threads"])
        return (args["thread"],) if "thread" in args else ()


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault of the projector, injected once the script's `at`-th operation was sent."""

    at: int
    kind: str
    """`freeze` (SIGSTOP for `seconds`, then SIGCONT), `kill` (SIGKILL, then a new one) or `restart`
    (SIGTERM, then a new one)."""
    seconds: float = 0.0


@dataclass
class _Thread:
    """What the generator issued on one thread."""

    ids: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    versions: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    checkpoint_versions: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """`(ns, checkpoint id)` -> the channel versions of its last put."""
    written: set[tuple[str, str]] = field(default_factory=set)
    """`(ns, checkpoint id)` the script wrote to."""
    erased: bool = False


@dataclass
class Script:
    seed: int
    ops: list[Op]
    faults: list[Fault]
    threads: list[str]
    """Every thread the script names, in the order it first named them."""


class Generator:
    """Generates the script of one seed (`script()`); `excluded` kinds are never generated."""

    def __init__(self, seed: int, agents: int, prefix: str, excluded: Sequence[str] = ()) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.agents = agents
        self.prefix = prefix
        self.excluded = frozenset(excluded)
        unknown = self.excluded - set(KINDS) - set(FEATURES)
        if unknown:
            raise ValueError(f"not an operation kind or a feature of the script: {sorted(unknown)}")
        self.threads: dict[str, _Thread] = {}
        self.live: list[str] = []
        self.pending: list[tuple[int, str]] = []
        """Fresh copy targets, with the operation index from which the script may use them."""
        self.copies: dict[str, list[str]] = {}
        """The threads each thread was copied to (while not erased)."""
        self.copied_from: dict[str, int] = {}
        """The last operation that copied from each thread."""
        self.index = 0
        self.count = 0
        self._ids: set[str] = set()
        self._n = 0
        for _ in range(LIVE_THREADS):
            self.live.append(self._new_thread())
        self.turn_threads = [self._new_thread() for _ in range(TURN_THREADS)]

    def script(self, count: int, faults_every: float) -> Script:
        self.count = count
        ops = [self._op(i) for i in range(count)]
        faults = self._faults(count, faults_every)
        return Script(self.seed, ops, faults, list(self.threads))

    # -- faults ----------------------------------------------------------------------------------

    def _faults(self, count: int, every: float) -> list[Fault]:
        """About one fault per `every` operations: mostly freezes of a few seconds, now and then a
        SIGKILL or a graceful restart (each costs a rebalance, ~20 s of no projection on tansu)."""
        rng, faults, at = self.rng, [], 0
        while True:
            at += max(1, int(rng.expovariate(1 / every)))
            if at >= count:
                return faults
            roll = rng.random()
            if roll < 0.8:
                faults.append(Fault(at, "freeze", round(rng.uniform(0.2, 5.0), 2)))
            elif roll < 0.9:
                faults.append(Fault(at, "kill"))
            else:
                faults.append(Fault(at, "restart"))

    # -- operations ------------------------------------------------------------------------------

    def _op(self, index: int) -> Op:
        self.index = index
        while self.pending and self.pending[0][0] <= index:
            _, thread = self.pending.pop(0)
            self.live[self.rng.randrange(len(self.live))] = thread
        kinds = [k for k in KINDS if k not in self.excluded]
        if "runs_delete_after_copy" in self.excluded:  # runs deleted in the first half, threads copied in the second
            kinds = [k for k in kinds if k != ("copy_thread" if index < self.count // 2 else "delete_for_runs")]
        kind = self.rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
        args = getattr(self, f"_{kind}")()
        return Op(index, self.rng.randrange(self.agents), kind, args)

    def _new_thread(self) -> str:
        name = f"{self.prefix}-{len(self.threads)}"
        self.threads[name] = _Thread()
        return name

    def _thread(self, turns: bool = False) -> str:
        """A live thread mostly; an erased one now and then (it must read as nothing for ever); `turns`: a
        turn thread now and then too."""
        if turns and "turn" not in self.excluded and self.rng.random() < TURN_SHARE:
            return self.rng.choice(self.turn_threads)
        erased = [t for t, s in self.threads.items() if s.erased]
        if erased and self.rng.random() < 0.05:
            return self.rng.choice(erased)
        return self.rng.choice(self.live)

    def _ns(self) -> str:
        return self.rng.choices(list(NAMESPACES), list(NAMESPACES.values()))[0]

    def _checkpoint_id(self, near: str | None = None) -> str:
        """A new checkpoint id: after every id so far, or (`near`) sorting right beside an older one."""
        while True:
            if near is None:
                self._n += 1
                n = self._n
            else:
                n = int(near[:8], 16)
            cid = f"{n:08x}-0000-6000-8000-{self.rng.getrandbits(48):012x}"
            if cid not in self._ids:
                self._ids.add(cid)
                return cid

    def _version(self, thread: _Thread, ns: str, channel: str) -> str:
        known = thread.versions[(ns, channel)]
        version = f"{len(known) + 1:032}.{self.rng.random():.16f}"
        known.append(version)
        return version

    def _value(self, channel: str) -> Any:
        rng = self.rng
        match channel:
            case "messages":
                return [f"m{rng.randrange(1000)}" for _ in range(rng.randint(1, 3))]
            case "count":
                return rng.randrange(-5, 1000)
            case "note":
                roll = rng.random()
                if roll < 0.4:
                    return f"note {rng.randrange(100)}"
                if roll < 0.8:
                    return {"k": rng.randrange(10), "tags": ["x", "y"][: rng.randint(0, 2)], "w": 0.5}
                return None
            case "flag":
                return rng.random() < 0.5
            case "__start__":
                return {"messages": [f"hi {rng.randrange(100)}"]}
            case _:  # branch:to:<node>
                return None

    def _put(self) -> dict[str, Any]:
        rng = self.rng
        name, ns = self._thread(), self._ns()
        thread = self.threads[name]
        ids = thread.ids[ns]
        roll = rng.random()
        repeatable = [i for i in ids if "writes_before_put" not in self.excluded or (ns, i) not in thread.written]
        if repeatable and roll < 0.07:
            cid = rng.choice(repeatable)  # the same checkpoint again
        elif ids and roll < 0.14:
            cid = self._checkpoint_id(near=rng.choice(ids))  # sorts before the newest: not the newest
        else:
            cid = self._checkpoint_id()
        older = [i for i in ids if i < cid]  # a parent is older than its child (uuid6 ids are time-ordered)
        roll = rng.random()
        if older and roll < 0.75:
            parent: str | None = max(older)
        elif older and roll < 0.87:
            parent = rng.choice(older)
        else:
            parent = None
        values: dict[str, Any] = {}
        versions: dict[str, str] = {}
        new_versions: dict[str, str] = {}
        channels = ["messages", "count", "__start__", "branch:to:reply"]
        channels += [c for c in ("note", "flag", "branch:to:tool") if rng.random() < 0.6]
        inherited = thread.checkpoint_versions.get((ns, parent), {}) if parent else {}
        for channel in channels:
            known = thread.versions[(ns, channel)]
            if "foreign_versions" not in self.excluded and known and rng.random() < 0.1:
                versions[channel] = rng.choice(known[-3:])  # an earlier checkpoint's version, maybe not the parent's
            elif channel in inherited and rng.random() < 0.5:
                versions[channel] = inherited[channel]  # unchanged since the parent
                if rng.random() < 0.08:
                    new_versions[channel] = versions[channel]  # a second blob for it: the first stays
            else:
                versions[channel] = new_versions[channel] = self._version(thread, ns, channel)
            if rng.random() < 0.9:
                values[channel] = self._value(channel)
        start = versions["__start__"]
        reply = versions["branch:to:reply"]
        checkpoint = {
            "v": 4,
            "id": cid,
            "ts": f"2026-01-01T00:{self._n % 60:02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d}+00:00",
            "channel_values": values,
            "channel_versions": versions,
            "versions_seen": {
                "__input__": {},
                "__start__": {"__start__": start},
                "reply": {"branch:to:reply": reply if rng.random() < 0.5 else "0"},
            },
            "updated_channels": sorted(new_versions) if rng.random() < 0.8 else None,
        }
        metadata: dict[str, Any] = {
            "source": rng.choice(["input", "loop", "update", "fork"]),
            "step": rng.randrange(-1, 20),
            "parents": {},
        }
        extra: dict[str, Any] = {}
        if rng.random() < 0.85:
            metadata["run_id"] = rng.choice(RUN_IDS)
        else:
            extra["run_id"] = rng.choice(RUN_IDS)  # from the config, as LangGraph passes it
        if ns == "call:1":
            roots = self.threads[name].ids[""]
            metadata["parents"] = {"": rng.choice(roots) if roots and rng.random() < 0.8 else self._checkpoint_id()}
        if rng.random() < 0.15:
            metadata["writes"] = {"reply": {"messages": ["dropped from the metadata"]}}
        if rng.random() < 0.2:
            metadata["tags"] = rng.sample(["a", "b", "c"], rng.randint(1, 3))
        if rng.random() < 0.1:
            extra["user_id"] = f"user-{rng.randrange(3)}"
        if cid not in ids:
            ids.append(cid)
        thread.checkpoint_versions[(ns, cid)] = versions
        return {
            "thread": name,
            "ns": ns,
            "parent": parent,
            "checkpoint": checkpoint,
            "metadata": metadata,
            "new_versions": new_versions,
            "extra": extra,
        }

    def _put_writes(self) -> dict[str, Any]:
        rng = self.rng
        name, ns = self._thread(), self._ns()
        ids = self.threads[name].ids[ns]
        roll = rng.random()
        if ids and roll < 0.6:
            cid = max(ids)
        elif ids and roll < 0.8:
            cid = rng.choice(ids)
        elif roll < 0.9 and "writes_before_put" not in self.excluded:
            cid = self._checkpoint_id()  # a checkpoint not put yet (writes can come first)
            ids.append(cid)
        else:
            cid = self._checkpoint_id()  # never put
        self.threads[name].written.add((ns, cid))
        writes: list[tuple[str, Any]] = []
        special = rng.random() < 0.3
        for _ in range(rng.randint(1, 3)):
            if special or rng.random() < 0.1:
                channel = rng.choice(SPECIAL_CHANNELS)
                value: Any = (
                    [Interrupt(value=f"q{rng.randrange(9)}", id=f"i{rng.randrange(3)}")]
                    if channel == "__interrupt__"
                    else f"{channel} {rng.randrange(100)}"
                )
            else:
                channel = rng.choice(REGULAR_CHANNELS)
                value = self._value(channel)
            writes.append((channel, value))
        return {
            "thread": name,
            "ns": ns,
            "checkpoint_id": cid,
            "writes": writes,
            "task_id": rng.choice(TASK_IDS),
            "task_path": rng.choice(TASK_PATHS),
        }

    def _get_tuple(self) -> dict[str, Any]:
        rng = self.rng
        name = self._thread(turns=True)
        ns = self._ns() if rng.random() < 0.3 else ""
        ids = self.threads[name].ids[ns]
        cid = rng.choice(ids) if ids and rng.random() < 0.15 else None
        return {"thread": name, "ns": ns, "checkpoint_id": cid}

    def _list(self) -> dict[str, Any]:
        rng = self.rng
        name = self._thread(turns=True)
        ns = rng.choice([None, None, "", "inner", "call:1"])
        filter_ = self._filter()
        ids = [cid for n, cids in self.threads[name].ids.items() if ns in (None, n) for cid in cids]
        before = rng.choice(ids) if ids and rng.random() < 0.15 else None
        limit = rng.choice([1, 2, 5]) if rng.random() < 0.3 else None
        return {"thread": name, "ns": ns, "filter": filter_, "before": before, "limit": limit}

    def _filter(self) -> dict[str, Any] | None:
        roll = self.rng.random()
        if roll < 0.6:
            return None
        if roll < 0.75:
            return {"run_id": self.rng.choice(RUN_IDS)}
        if roll < 0.85:
            return {"source": self.rng.choice(["loop", "input"]), "step": self.rng.randrange(5)}
        if roll < 0.95:
            return {"tags": [self.rng.choice(["a", "b", "c"])]}
        return {"user_id": "user-0"}

    def _list_all(self) -> dict[str, Any]:
        return {"filter": {"run_id": self.rng.choice(RUN_IDS)}}

    def _get_state(self) -> dict[str, Any]:
        return {"thread": self._thread(turns=True)}

    def _delete_thread(self) -> dict[str, Any]:
        return {"thread": self._thread(turns=True)}

    def _turn(self) -> dict[str, Any]:
        """A LangGraph run on a turn thread (`build_graph`, durability `sync`): it reads the thread's head
        and writes on it, racing the other agents' runs there; some runs are of a run id `delete_for_runs` names."""
        rng = self.rng
        run_id = rng.choice(RUN_IDS) if rng.random() < 0.3 else None
        return {"thread": rng.choice(self.turn_threads), "text": f"t{self.index}", "run_id": run_id}

    def _copy_thread(self) -> dict[str, Any]:
        rng = self.rng
        source = self._thread(turns=True) if "copies_around_erasure" not in self.excluded else rng.choice(self.live)
        self.copied_from[source] = self.index
        roll = rng.random()
        if "copy_onto_used_threads" in self.excluded:
            target = self._new_thread()
            self.pending.append((self.index + FRESH_TARGET_DELAY, target))
        elif roll < 0.45:
            target = self._new_thread()  # joins the live threads: later operations race the copy
            self.live[rng.randrange(len(self.live))] = target
        elif roll < 0.97:
            target = self._thread()
        else:
            target = source
        if source != target and not self.threads[source].erased:
            self.copies.setdefault(source, []).append(target)
        copied, into = self.threads[source], self.threads[target]
        for (ns, channel), versions in copied.versions.items():
            into.versions[(ns, channel)].extend(versions)
        for ns, ids in copied.ids.items():
            into.ids[ns].extend(i for i in ids if i not in into.ids[ns])
        for key, versions in copied.checkpoint_versions.items():
            into.checkpoint_versions.setdefault(key, versions)
        into.written |= copied.written
        return {"source": source, "target": target}

    def _prune(self) -> dict[str, Any]:
        threads = [self._thread(turns=True)]
        if self.rng.random() < 0.2:
            threads.append(self._thread())
        keep_latest = "prune_keep_latest" not in self.excluded and self.rng.random() >= 0.15
        return {"threads": threads, "strategy": "keep_latest" if keep_latest else "delete"}

    def _delete_for_runs(self) -> dict[str, Any]:
        return {"run_ids": self.rng.sample(RUN_IDS, self.rng.randint(1, 2))}

    def _erase(self) -> dict[str, Any]:
        erased = [t for t, s in self.threads.items() if s.erased]
        around = "copies_around_erasure" not in self.excluded
        if around and erased and self.rng.random() < 0.1:
            return {"thread": self.rng.choice(erased)}
        candidates = self.live
        if not around:  # not a thread copied from lately: its copy may race the erasure
            since = self.index - FRESH_TARGET_DELAY
            candidates = [t for t in candidates if self.copied_from.get(t, since) <= since] or candidates
        if "erase_copies_of_copies" in self.excluded:
            deep = [t for t in candidates if any(self.copies.get(c) for c in self.copies.get(t, ()))]
            candidates = [t for t in candidates if t not in deep] or candidates
        name = self.rng.choice(candidates)
        todo = [name]  # an erasure erases the threads copied from the erased one, transitively
        while todo:
            thread = todo.pop()
            if self.threads[thread].erased:
                continue
            self.threads[thread].erased = True
            if thread in self.live:
                self.live[self.live.index(thread)] = self._new_thread()
            self.pending = [(at, t) for at, t in self.pending if t != thread]
            todo.extend(self.copies.get(thread, ()))
        return {"thread": name}
