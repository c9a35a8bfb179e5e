"""Every `graphledger` command and every bench that README.md and docs/*.md show, run as written against
`graphledger dev`, the way a newcomer runs them.

The stack is `.venv/bin/graphledger dev --env-file .env --operator-env-file .env.operator`, a process of
its own. Each command runs in `bash` in a second "terminal": an environment without any of the test's
`GRAPHLEDGER_*` variables, the venv's bin first on PATH (as after `. .venv/bin/activate`), the operator's
file loaded with `set -a; . ./.env.operator; set +a`, then the command as the docs write it. What an agent
writes first (a thread, a memory, a dead letter) goes through a client built from `.env` alone. A
placeholder (ID, DSN, NEW) becomes a value of the stack; a long command runs in a short variant (fewer
events, seconds instead of minutes), named where it runs. `test_the_docs_show_no_command_this_module_does_not_run`
reads the docs, so a command added to them without a run here fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver

from dev_process import clean_env, log_tail, read_env_file, settings_of, start_dev, stop, wait_ready
from graphledger import KafkaSaver, KafkaStore
from graphledger.embeddings import HashEmbedder
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import ThreadDelete
from graphledger.events.envelope import Envelope
from graphledger.settings import Settings
from graphledger_server.cli import build_parser
from graphledger_server.devstack.demo import INPUT, build_graph
from graphledger_server.devstack.ports import free_port, wait_until
from graphledger_server.sweeper.main import START_MESSAGE
from kafka_clients import raw_producer

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: `graphledger`, `python`
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_TIMEOUT_S = 120.0
BENCH_TIMEOUT_S = 540.0  # a short bench still starts a stack of its own and runs every section
WAIT_S = 60.0

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Terminal:
    """A shell beside the running `graphledger dev`, in its directory."""

    cwd: Path
    client: Settings
    """What `.env` gives an agent."""
    operator: Settings
    """What `.env.operator` gives an operator (and what the stack's services run with)."""

    def run(self, command: str, *, cwd: Path | None = None, timeout: float = COMMAND_TIMEOUT_S) -> Ran:
        """`command` in bash, after loading the operator's file."""
        result = subprocess.run(
            ["bash", "-c", f"set -a; . {shlex.quote(str(self.cwd / '.env.operator'))}; set +a\n{command}"],
            cwd=cwd or self.cwd,
            env=newcomer_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Ran(command, result.returncode, result.stdout, result.stderr)

    def start(self, command: str, log: Path) -> subprocess.Popen[bytes]:
        """`command` as a long-running process (bash `exec`s it), its output in `log`."""
        with open(log, "wb") as out:
            return subprocess.Popen(
                ["bash", "-c", f"set -a; . ./.env.operator; set +a\nexec {command}"],
                cwd=self.cwd,
                env=newcomer_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def db(self) -> psycopg.Connection:
        return psycopg.connect(self.operator.postgres_dsn, autocommit=True)


@dataclass(frozen=True)
class Ran:
    command: str
    status: int
    out: str
    err: str

    def ok(self) -> str:
        """The output of a command that must have succeeded."""
        assert self.status == 0, f"$ {self.command}\nexit {self.status}\nstdout:\n{self.out}\nstderr:\n{self.err}"
        return self.out


def newcomer_env() -> dict[str, str]:
    env = clean_env()
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def terminal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Terminal]:
    """`graphledger dev --env-file .env --operator-env-file .env.operator`, as the README starts it."""
    cwd = tmp_path_factory.mktemp("newcomer")
    log = cwd / "graphledger-dev.log"
    command = [str(BIN / "graphledger"), "dev", "--env-file", ".env", "--operator-env-file", ".env.operator"]
    process = start_dev(command, log, cwd=cwd, env=newcomer_env())
    try:
        wait_ready(process, cwd / ".env", log)
        client, operator = read_env_file(cwd / ".env"), read_env_file(cwd / ".env.operator")
        yield Terminal(cwd, settings_of(client), settings_of(operator))
    finally:
        stop(process)  # it stops its own children, in order


def _thread_written_by_an_agent(settings: Settings) -> str:
    thread = f"newcomer-{uuid.uuid4().hex[:8]}"
    with KafkaSaver(settings) as saver:
        build_graph().compile(checkpointer=saver).invoke(INPUT, {"configurable": {"thread_id": thread}})
    return thread


def _checkpoint_of(settings: Settings, thread: str) -> object:
    with KafkaSaver(settings) as saver:
        return saver.get_tuple({"configurable": {"thread_id": thread}})


# -- the schema, the topics, the services ---------------------------------------------------------------


def test_migrate_and_topics_ensure(terminal: Terminal) -> None:
    assert "is up to date" in terminal.run("graphledger migrate").ok()
    out = terminal.run("graphledger topics ensure").ok()
    assert f"topics: {terminal.operator.checkpoint_topic} exists, 4 partitions" in out
    # `python -m graphledger_server <command>` does the same.
    assert "is up to date" in terminal.run("python -m graphledger_server migrate").ok()


@pytest.mark.parametrize("service", ["projector", "api", "sweeper"])
def test_a_service_starts_beside_the_stacks_own_and_stops_on_sigterm(terminal: Terminal, service: str) -> None:
    """`graphledger projector` joins the stack's consumer group, `graphledger sweeper` stands by behind
    the stack's (one active replica), and `graphledger api` serves beside the stack's on a port of its own."""
    port = free_port()
    command = f"env GRAPHLEDGER_API_PORT={port} graphledger api" if service == "api" else f"graphledger {service}"
    log = terminal.cwd / f"{service}.log"
    process = terminal.start(command, log)

    def started() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"$ {command}\nexited with {process.returncode}:\n{log_tail(log)}")
        if service == "api":
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False
        return ("assigned " if service == "projector" else START_MESSAGE) in log.read_text()

    try:
        wait_until(started, WAIT_S, f"`{command}` to be up")
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT_S) == 0, log_tail(log)
    finally:
        stop(process)


# -- tokens, keys, forks ---------------------------------------------------------------------------------


def test_token_new_and_hash(terminal: Terminal) -> None:
    token, entry = terminal.run("graphledger token new acme").ok().splitlines()
    assert entry.startswith("acme:")
    assert (
        terminal.run(f'TOKEN={shlex.quote(token)}; echo -n "$TOKEN" | graphledger token hash acme').ok().strip()
        == entry
    )


def test_keys_new_kek_and_rotate(terminal: Terminal) -> None:
    """`keys rotate` rewraps the stored keys not wrapped by the first key-encryption key: none here, where the
    stack's services hold one. Rotating to a new one is docs/security.md's procedure, which rolls the
    services between its steps (a service meeting a key wrapped by one it does not hold stops)."""
    assert re.fullmatch(r"kek-\d+:\S{44}", terminal.run("graphledger keys new-kek").ok().strip())
    _thread_written_by_an_agent(terminal.client)  # a stored data key, wrapped by the stack's key
    assert terminal.run("graphledger keys rotate").ok().strip() == "keys rotate: rewrapped 0 keys"


def test_forks_list(terminal: Terminal) -> None:
    assert terminal.run("graphledger forks list").ok().strip() == "forks: none"


# -- dead letters ------------------------------------------------------------------------------------------


def test_dead_letters_listed_shown_fixed_and_replayed(terminal: Terminal) -> None:
    """docs/operations.md's session: a sealed put with vectors of the wrong size, fixed and replayed."""
    namespace = ("docs", uuid.uuid4().hex[:8])
    with KafkaStore(terminal.client, index={"dims": 3, "embed": HashEmbedder(3), "fields": ["text"]}) as store:
        store.put(namespace, "d1", {"text": "hello"})

    def dead_lettered() -> int | None:
        with terminal.db() as conn:
            row = conn.execute(
                f"SELECT id FROM {terminal.operator.postgres_schema}.graphledger_dead_letters "
                "WHERE reason LIKE 'store.put carries 3-dim vectors%' AND replayed_at IS NULL"
            ).fetchone()
        return None if row is None else row[0]

    wait_until(lambda: dead_lettered() is not None, WAIT_S, "the put to be dead-lettered")
    letter = dead_lettered()
    assert re.search(
        rf"^\s+{letter}\s.*store\.put carries 3-dim vectors", terminal.run("graphledger dlq list").ok(), re.M
    )
    shown = json.loads(terminal.run(f"graphledger dlq show {letter}").ok())
    assert shown["sealed"]["kind"] == "namespace" and shown["payload"]["value"] == {"$text": '{"text": "hello"}'}

    terminal.run(f"graphledger dlq show {letter} --payload > fix.json").ok()
    fix = json.loads((terminal.cwd / "fix.json").read_text())  # $EDITOR fix.json: vectors of the stack's size
    dims = terminal.operator.store_vector_dims
    assert dims is not None
    fix["vectors"] = [["text", HashEmbedder(dims).embed_query("hello")]]
    (terminal.cwd / "fix.json").write_text(json.dumps(fix))
    out = terminal.run(f"graphledger dlq replay {letter} --payload-file fix.json").ok()
    assert f"dlq: replayed {letter} to {terminal.operator.store_topic}:" in out

    with KafkaStore(terminal.client, index={"dims": dims, "embed": HashEmbedder(dims), "fields": ["text"]}) as store:
        assert [item.key for item in store.search(namespace, query="hello")] == ["d1"]
    again = terminal.run(f"graphledger dlq replay {letter}")
    assert again.status == 1 and "not publishing it twice" in again.err


# -- import, offsets, erasure, sealing a log, rebuilds ------------------------------------------------------


def test_import_from_postgres(terminal: Terminal) -> None:
    with terminal.db() as conn:
        conn.execute("CREATE DATABASE official")
    dsn = re.sub(r"/postgres\?", "/official?", terminal.operator.postgres_dsn)
    thread = f"imported-{uuid.uuid4().hex[:8]}"
    with PostgresSaver.from_conn_string(dsn) as official:
        official.setup()
        build_graph().compile(checkpointer=official).invoke(INPUT, {"configurable": {"thread_id": thread}})
    out = terminal.run(f"graphledger import --from-postgres {shlex.quote(dsn)}").ok()
    assert "import: published" in out and "(1 threads, 0 store items)" in out

    def imported() -> bool:
        return _checkpoint_of(terminal.client, thread) is not None

    wait_until(imported, WAIT_S, "the imported thread to be read back through the stack")


def test_offsets_reset(terminal: Terminal) -> None:
    """docs/operations-faults.md's command, first without `--yes` (it only says what it would change)."""
    command = "graphledger offsets reset --topic graphledger.checkpoints --partition 0 --to earliest"
    shown = terminal.run(command)
    assert shown.status == 2 and "would move graphledger.checkpoints:0" in shown.out, shown
    assert "moved graphledger.checkpoints:0" in terminal.run(f"{command} --yes").ok()


def test_erase_thread_namespace_and_tenant(terminal: Terminal) -> None:
    thread = _thread_written_by_an_agent(terminal.client)
    user = uuid.uuid4().hex[:8]
    with KafkaStore(terminal.client) as store:
        store.put(("users", user), "m1", {"text": "likes pizza"})
    assert "erased thread" in terminal.run(f"graphledger erase thread {thread}").ok()
    assert _checkpoint_of(terminal.client, thread) is None
    assert "erased namespace" in terminal.run(f"graphledger erase namespace users {user}").ok()
    with KafkaStore(terminal.client) as store:
        assert store.get(("users", user), "m1") is None
    assert terminal.run("graphledger erase tenant acme").ok().strip() == "erased tenant acme"


def test_encrypt_log(terminal: Terminal) -> None:
    out = terminal.run("graphledger encrypt-log --to-prefix sealed-copy").ok()
    assert "encrypt-log: done. Point GRAPHLEDGER_TOPIC_PREFIX at 'sealed-copy'" in out


def test_repartition(terminal: Terminal) -> None:
    """docs/operations.md's step 2 against the dev stack (its writers idle): the copy into new topics."""
    _thread_written_by_an_agent(terminal.client)
    out = terminal.run("graphledger repartition --to-prefix repartitioned --partitions 3").ok()
    assert "repartition: done. Project the topics of 'repartitioned' into a fresh schema" in out, out


def test_replay_run_list_and_drop_old(terminal: Terminal) -> None:
    _thread_written_by_an_agent(terminal.client)
    out = terminal.run("graphledger replay run").ok()
    old = re.search(r"replay: switched; the previous projection is '(\w+)'", out)
    assert old is not None, out
    assert f"{old.group(1)}\told" in terminal.run("graphledger replay list").ok()
    assert f"replay: dropped {old.group(1)}" in terminal.run("graphledger replay drop-old").ok()


# -- parked subjects: after the copies and the rebuild, since the record it forges stays in the log
# (`encrypt-log` and `repartition` refuse a log holding a version they do not read) -------------------------


def test_parked_listed_released_and_dropped(terminal: Terminal) -> None:
    """docs/operations.md's session: a record claiming envelope version 99, with an agent's thread's record
    key, parks that thread; `release` parks it again (no version reads 99), `drop` dead-letters it."""
    thread = f"parked-{uuid.uuid4().hex[:8]}"
    with KafkaSaver(terminal.client) as saver:
        build_graph().compile(checkpointer=saver).invoke(INPUT, {"configurable": {"thread_id": thread}})
        key = saver._runtime.record_key_of_thread(thread)
    newer = to_envelope(ThreadDelete(thread))
    forged = Envelope(newer.type, newer.event_id, newer.produced_ms, newer.payload, version=99)
    name = asyncio.run(_produce(terminal.operator, envelope.encode(forged), key, envelope.headers_for(forged)))

    def parked() -> bool:
        return name in terminal.run("graphledger parked list --json").ok()

    wait_until(parked, WAIT_S, "the thread to park")
    assert re.search(rf"^{re.escape(name)}\s.*\snewer_version\s+1\s+event version 99",
                     terminal.run("graphledger parked list").ok(), re.M)  # fmt: skip
    again = terminal.run(f"graphledger parked release {name}")
    assert again.status == 1 and f"parked again at {name} (newer_version" in again.err
    assert terminal.run(f"graphledger parked drop {name}").ok().strip() == (
        f"parked: drop {name}: 1 records: 0 applied, 1 dead-lettered"
    )
    assert terminal.run("graphledger parked list").ok().strip() == "parked: no subjects parked"


async def _produce(settings: Settings, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> str:
    """Publish a record to the checkpoint topic as any producer can; its position as `topic:partition@offset`."""
    producer = raw_producer(settings)
    await producer.start()
    try:
        sent = await producer.send_and_wait(settings.checkpoint_topic, value, key=key, headers=headers)
    finally:
        await producer.stop()
    return f"{settings.checkpoint_topic}:{sent.partition}@{sent.offset}"


# -- the benches: each starts a stack of its own, from the repository's root ----------------------------

BENCHES = {
    "python -m bench --no-store": "python -m bench --no-store --total 64 --backlog 200 --seconds 1 "
    "--conversation-turns 4 --run-seconds 0.2 --rounds 1 --drift-records 100 --rebuild-events 500 --pods-rounds 1",
    "python -m bench.store": "python -m bench.store --total 64 --recall-items 200",
    "python -m bench.soak --graph-rate 10 --store-rate 40": "python -m bench.soak --graph-rate 10 --store-rate 40 "
    "--minutes 0.2 --kill-every 6 --agents 2",
    "python -m bench.rebuild --events 100000": "python -m bench.rebuild --events 2000",
    "python -m bench.pods --ownership": "python -m bench.pods --ownership --rounds 1",
}
"""Each bench command the docs show, and its short variant as run here. `make bench` is `python -m bench`,
whose store rows are `python -m bench.store`; `make soak` is `python -m bench.soak`, then tests."""


IN_SOAK = {"python -m bench --no-store", "python -m bench.store", "python -m bench.pods --ownership"}
"""The benches whose short runs still take minutes (each starts a stack and both official sides): run by
`make soak` (GRAPHLEDGER_README_BENCHES=all), skipped by `make test`."""


@pytest.mark.timeout(BENCH_TIMEOUT_S + 60)
@pytest.mark.parametrize("documented", BENCHES)
def test_a_bench_runs_in_the_operators_shell(terminal: Terminal, documented: str) -> None:
    if documented in IN_SOAK and os.environ.get("GRAPHLEDGER_README_BENCHES") != "all":
        pytest.skip("minutes long: `make soak` runs it (GRAPHLEDGER_README_BENCHES=all)")
    ran = terminal.run(BENCHES[documented], cwd=ROOT, timeout=BENCH_TIMEOUT_S).ok()
    assert "\n|" in ran  # its table


# -- the docs -----------------------------------------------------------------------------------------------

RUN_BY = {
    ("dev", None): "terminal",
    ("migrate", None): "test_migrate_and_topics_ensure",
    ("topics", "ensure"): "test_migrate_and_topics_ensure",
    ("projector", None): "test_a_service_starts_beside_the_stacks_own_and_stops_on_sigterm",
    ("api", None): "test_a_service_starts_beside_the_stacks_own_and_stops_on_sigterm",
    ("sweeper", None): "test_a_service_starts_beside_the_stacks_own_and_stops_on_sigterm",
    ("token", "new"): "test_token_new_and_hash",
    ("token", "hash"): "test_token_new_and_hash",
    ("keys", "new-kek"): "test_keys_new_kek_and_rotate",
    ("keys", "rotate"): "test_keys_new_kek_and_rotate",
    ("forks", "list"): "test_forks_list",
    ("parked", "list"): "test_parked_listed_released_and_dropped",
    ("parked", "release"): "test_parked_listed_released_and_dropped",
    ("parked", "drop"): "test_parked_listed_released_and_dropped",
    ("dlq", "list"): "test_dead_letters_listed_shown_fixed_and_replayed",
    ("dlq", "show"): "test_dead_letters_listed_shown_fixed_and_replayed",
    ("dlq", "replay"): "test_dead_letters_listed_shown_fixed_and_replayed",
    ("import", None): "test_import_from_postgres",
    ("offsets", "reset"): "test_offsets_reset",
    ("erase", "thread"): "test_erase_thread_namespace_and_tenant",
    ("erase", "namespace"): "test_erase_thread_namespace_and_tenant",
    ("erase", "tenant"): "test_erase_thread_namespace_and_tenant",
    ("encrypt-log", None): "test_encrypt_log",
    ("repartition", None): "test_repartition",
    ("replay", "run"): "test_replay_run_list_and_drop_old",
    ("replay", "list"): "test_replay_run_list_and_drop_old",
    ("replay", "drop-old"): "test_replay_run_list_and_drop_old",
    ("bench", None): "test_a_bench_runs_in_the_operators_shell",
    ("bench.store", None): "test_a_bench_runs_in_the_operators_shell",
    ("bench.soak", None): "test_a_bench_runs_in_the_operators_shell",
    ("bench.rebuild", None): "test_a_bench_runs_in_the_operators_shell",
    ("bench.pods", None): "test_a_bench_runs_in_the_operators_shell",
}
"""Each command the docs show, by (command, subcommand), and the test (or fixture) here that runs it."""
MAKE_TARGETS = {"bench": "bench", "soak": "bench.soak"}
"""The bench module each documented `make` target runs."""


def documented_commands() -> set[tuple[str, str | None]]:
    """(command, subcommand) of every `graphledger ...` and `python -m bench...` the docs show; `make bench`
    and `make soak` stand for `python -m bench` and `python -m bench.soak`. A command that has subcommands
    counts only with one of them (`graphledger replay` alone is prose)."""
    commands = _subcommands(build_parser())
    found: set[tuple[str, str | None]] = set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for command, sub in re.findall(r"\bgraphledger ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", text):
            subs = set(_subcommands(commands[command])) if command in commands else set()
            if command in commands and (sub in subs or not subs):
                found.add((command, sub if subs else None))
        found |= {(module, None) for module in re.findall(r"python -m (bench(?:\.\w+)?)\b", text)}
        found |= {
            ("bench" if target == "bench" else "bench.soak", None)
            for target in re.findall(r"make (bench|soak)\b", text)
        }
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of `parser`, by name (argparse keeps them in a private action class)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_the_docs_show_no_command_this_module_does_not_run() -> None:
    missing = documented_commands() - RUN_BY.keys()
    assert not missing, f"the docs show commands no test here runs: {sorted(missing, key=str)}"
    assert all(name in globals() for name in RUN_BY.values())
