"""LangGraph's Agent Server on graphledger: examples/agent-server run as its README says, then driven
through langgraph-sdk, each answer checked against graphledger directly.

Three processes, as a user runs them: `graphledger dev --env-file` (the dev stack), `langgraph dev`
from the agent-server extra's own virtual environment (`make agent-server-env`) in a copy of the
example project, and this test. The checks read graphledger with a `KafkaSaver` and a `KafkaStore`
of their own and read the projection's rows in Postgres. Each of them follows a read through the
server, which waited for the projection of the server's own writes (read your writes), so whatever
the server wrote is in the projection by then.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg
import httpx
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from dev_process import clean_env, log_tail, read_env_file, settings_of, start_dev, stop, wait_ready
from graphledger import KafkaSaver, KafkaStore, Settings
from graphledger_server.devstack.ports import free_port, wait_until
from graphledger_server.sql import render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent-server"
LANGGRAPH_CLI = ROOT / ".venv-agent-server" / "bin" / "langgraph"
GRAPH = "agent"  # the graph's name in langgraph.json
SERVER_READY_TIMEOUT_S = 60.0
SDK_TIMEOUT_S = 60.0

pytestmark = pytest.mark.slow

CHECKPOINT_ROWS_SQL = """
SELECT checkpoint_id, metadata->>'run_id' AS run_id FROM {schema}.checkpoints
WHERE thread_id = $1::text AND checkpoint_ns = '' ORDER BY checkpoint_id DESC
"""
WRITE_CHANNELS_SQL = """
SELECT channel FROM {schema}.checkpoint_writes
WHERE thread_id = $1::text AND checkpoint_ns = '' AND checkpoint_id = $2::text ORDER BY task_id, idx
"""
STORE_ROWS_SQL = "SELECT key, value FROM {schema}.store WHERE prefix = $1::text ORDER BY key"


@dataclass(frozen=True)
class Ledger:
    """graphledger as the test reads it: the client settings from the env file, and the projection."""

    settings: Settings
    dsn: str
    schema: str


@dataclass(frozen=True)
class Direct:
    """A saver and a store of the test's own, and a Postgres connection to the projection."""

    saver: KafkaSaver
    store: KafkaStore
    pg: asyncpg.Connection
    schema: str

    async def checkpoint_rows(self, thread_id: str) -> list[tuple[str, str | None]]:
        await self._checkpoints_projected()
        rows = await self.pg.fetch(render(CHECKPOINT_ROWS_SQL, self.schema), thread_id)
        return [(row["checkpoint_id"], row["run_id"]) for row in rows]

    async def write_channels(self, thread_id: str, checkpoint_id: str) -> list[str]:
        await self._checkpoints_projected()
        rows = await self.pg.fetch(render(WRITE_CHANNELS_SQL, self.schema), thread_id, checkpoint_id)
        return [row["channel"] for row in rows]

    async def store_rows(self, namespace: tuple[str, ...]) -> dict[str, Any]:
        await self.store.asearch(namespace, limit=1)  # a search waits for the projection of the whole topic
        rows = await self.pg.fetch(render(STORE_ROWS_SQL, self.schema), ".".join(namespace))
        return {row["key"]: json.loads(row["value"]) for row in rows}

    async def _checkpoints_projected(self) -> None:
        """Until the projection holds every write acknowledged so far: a list across threads waits for it,
        where a read of one thread may answer from the log without it (read-through)."""
        async for _ in self.saver.alist(None, limit=1):
            break


# -- processes ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of examples/agent-server: the server writes its own state (.langgraph_api/) into it."""
    target = tmp_path_factory.mktemp("agent-server") / "project"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns(".env", ".langgraph_api", "__pycache__"))
    return target


@pytest.fixture(scope="module")
def ledger(project: Path) -> Iterator[Ledger]:
    """`graphledger dev --env-file <project>/.env`, ready once the env file appears."""
    env_file = project / ".env"
    out_path = project.parent / "graphledger-dev.out"
    process = start_dev([sys.executable, "-m", "graphledger_server", "dev", "--env-file", str(env_file)], out_path)
    try:
        wait_ready(process, env_file, out_path)
        # What the stack printed about itself: the projection's DSN and schema.
        postgres = re.search(r"^  postgres\s+pid \d+\s+(\S+) \(schema (\w+)\)$", out_path.read_text(), re.MULTILINE)
        assert postgres is not None, log_tail(out_path)
        client_env = read_env_file(env_file)
        yield Ledger(settings_of(client_env), dsn=postgres.group(1), schema=postgres.group(2))
    finally:
        stop(process, group=False)  # it stops its own children, in order


@pytest.fixture(scope="module")
def langgraph_cli() -> Path:
    """The Agent Server's `langgraph` command, from its own virtual environment."""
    if not LANGGRAPH_CLI.exists():
        pytest.fail(f"{LANGGRAPH_CLI} is missing: `make agent-server-env` creates it (`make test` does)")
    return LANGGRAPH_CLI


@pytest.fixture(scope="module")
def server(langgraph_cli: Path, project: Path, ledger: Ledger) -> Iterator[tuple[str, Path]]:
    """`langgraph dev` on a free port, in the project copy: its URL and log."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = project.parent / "langgraph-dev.log"
    env = clean_env()  # the GRAPHLEDGER_* variables come from .env, through langgraph.json
    env.update(LANGGRAPH_NO_VERSION_CHECK="true", LANGGRAPH_CLI_NO_ANALYTICS="1", LOG_COLOR="false")
    command = [str(langgraph_cli), "dev", "--port", str(port), "--no-browser", "--no-reload"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            cwd=project,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def healthy() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"langgraph dev exited with {process.returncode}:\n{log_tail(log_path)}")
            try:
                return httpx.get(f"{url}/ok", timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, SERVER_READY_TIMEOUT_S, f"langgraph dev to answer {url}/ok")
        yield url, log_path
    finally:
        stop(process, group=True)


@pytest.fixture(scope="module")
def example_persistence(project: Path) -> ModuleType:
    """The example's persistence.py, for the store's index (so the test embeds as the server does)."""
    spec = importlib.util.spec_from_file_location("agent_server_persistence", project / "persistence.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
async def client(server: tuple[str, Path]) -> AsyncIterator[LangGraphClient]:
    sdk = get_client(url=server[0], api_key=None, timeout=SDK_TIMEOUT_S)
    try:
        yield sdk
    finally:
        await sdk.aclose()


@pytest.fixture(scope="module")
async def direct(ledger: Ledger, example_persistence: ModuleType) -> AsyncIterator[Direct]:
    pg = await asyncpg.connect(ledger.dsn)
    try:
        async with (
            KafkaSaver(ledger.settings) as saver,
            KafkaStore(ledger.settings, index=example_persistence.MEMORY_INDEX) as store,
        ):
            yield Direct(saver, store, pg, ledger.schema)
    finally:
        await pg.close()


# -- helpers -----------------------------------------------------------------------------------------


def thread_config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


async def run(client: LangGraphClient, thread_id: str, **kwargs: Any) -> str:
    """One run of the graph on the thread, to its end; its run id."""
    created = await client.runs.create(thread_id, GRAPH, **kwargs)
    await client.runs.join(thread_id, created["run_id"])
    finished = await client.runs.get(thread_id, created["run_id"])
    assert finished["status"] == "success", finished
    return created["run_id"]


async def history_ids(client: LangGraphClient, thread_id: str) -> list[str]:
    return [state["checkpoint"]["checkpoint_id"] for state in await client.threads.get_history(thread_id, limit=100)]


async def saver_ids(saver: KafkaSaver, thread_id: str) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(thread_config(thread_id))]


# -- tests -------------------------------------------------------------------------------------------


def test_the_server_runs_on_graphledger_with_every_feature(server: tuple[str, Path]) -> None:
    """The server loaded both factories and found every optional saver method (it warns per missing one)."""
    log = server[1].read_text(errors="replace")
    assert "Using custom checkpointer: KafkaSaver" in log
    assert "kind=\"<class 'graphledger.client.store.KafkaStore'>\"" in log
    assert "Custom checkpointer missing" not in log
    assert "Custom checkpointer does not implement" not in log


async def test_two_runs_state_and_history_are_graphledgers(client: LangGraphClient, direct: Direct) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    first = await run(client, thread_id, input={"turns": ["hello"]})
    second = await run(client, thread_id, input={"turns": ["again"]})

    state = await client.threads.get_state(thread_id)
    history = await history_ids(client, thread_id)
    assert state["values"] == {"turns": ["hello", "noted: hello", "again", "noted: again"]}
    assert state["metadata"]["run_id"] == second

    newest = await direct.saver.aget_tuple(thread_config(thread_id))
    assert newest is not None
    assert newest.config["configurable"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert newest.checkpoint["channel_values"]["turns"] == state["values"]["turns"]
    assert await saver_ids(direct.saver, thread_id) == history
    # Each run wrote its input, its start and its one step: three checkpoints, tagged with the run id.
    rows = await direct.checkpoint_rows(thread_id)
    assert [checkpoint_id for checkpoint_id, _ in rows] == history
    assert [run_id for _, run_id in rows] == [second] * 3 + [first] * 3

    # The graph's own memories (runtime.store) went through KafkaStore too.
    namespace = ("memories", thread_id)
    memories = await client.store.search_items(list(namespace))
    assert {item["key"]: item["value"] for item in memories["items"]} == {
        "turn-1": {"text": "hello"},
        "turn-3": {"text": "again"},
    }
    assert {item.key: item.value for item in await direct.store.asearch(namespace)} == await direct.store_rows(
        namespace
    )
    assert await direct.store_rows(namespace) == {"turn-1": {"text": "hello"}, "turn-3": {"text": "again"}}


async def test_copying_a_thread_copies_its_checkpoints(client: LangGraphClient, direct: Direct) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    await run(client, thread_id, input={"turns": ["copy me"]})
    source = await history_ids(client, thread_id)

    copy_id = (await client.threads.copy(thread_id))["thread_id"]
    assert copy_id != thread_id
    assert await history_ids(client, copy_id) == source  # acopy_thread keeps the checkpoint ids
    assert (await client.threads.get_state(copy_id))["values"] == {"turns": ["copy me", "noted: copy me"]}

    assert await saver_ids(direct.saver, copy_id) == source
    copied = await direct.saver.aget_tuple(thread_config(copy_id))
    assert copied is not None and copied.checkpoint["channel_values"]["turns"] == ["copy me", "noted: copy me"]
    assert await direct.checkpoint_rows(copy_id) == await direct.checkpoint_rows(thread_id)


async def test_deleting_a_run_deletes_its_checkpoints(client: LangGraphClient, direct: Direct) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    first = await run(client, thread_id, input={"turns": ["keep"]})
    first_ids = await history_ids(client, thread_id)
    second = await run(client, thread_id, input={"turns": ["drop"]})
    assert len(await history_ids(client, thread_id)) == 6

    await client.runs.delete(thread_id, second)  # through adelete_for_runs
    state = await client.threads.get_state(thread_id)
    assert state["values"] == {"turns": ["keep", "noted: keep"]}
    assert await history_ids(client, thread_id) == first_ids

    assert await saver_ids(direct.saver, thread_id) == first_ids
    newest = await direct.saver.aget_tuple(thread_config(thread_id))
    assert newest is not None and newest.metadata["run_id"] == first
    assert await direct.checkpoint_rows(thread_id) == [(checkpoint_id, first) for checkpoint_id in first_ids]


async def test_an_interrupt_waits_in_graphledger_and_resumes(client: LangGraphClient, direct: Direct) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    await run(client, thread_id, input={"turns": ["review: the plan"]})

    waiting = await client.threads.get_state(thread_id)
    assert waiting["next"] == ["review"]
    [asked] = waiting["interrupts"]
    assert asked["value"] == {"question": "confirm 'review: the plan'?"}
    assert (await client.threads.get(thread_id))["status"] == "interrupted"  # the server's runtime says so

    # The interrupt is a pending write of the newest checkpoint, in graphledger.
    paused = await direct.saver.aget_tuple(thread_config(thread_id))
    assert paused is not None
    checkpoint_id = paused.config["configurable"]["checkpoint_id"]
    assert checkpoint_id == waiting["checkpoint"]["checkpoint_id"]
    [(_, _, interrupts)] = [write for write in paused.pending_writes if write[1] == "__interrupt__"]
    assert [(i.id, i.value) for i in interrupts] == [(asked["id"], asked["value"])]
    assert "__interrupt__" in await direct.write_channels(thread_id, checkpoint_id)

    await run(client, thread_id, command={"resume": "yes"})
    resumed = await client.threads.get_state(thread_id)
    assert resumed["next"] == []
    assert resumed["values"]["turns"][-1] == "reviewed: yes"
    assert (await client.threads.get(thread_id))["status"] == "idle"

    final = await direct.saver.aget_tuple(thread_config(thread_id))
    assert final is not None
    assert final.checkpoint["channel_values"]["turns"] == resumed["values"]["turns"]
    assert final.parent_config is not None
    assert final.parent_config["configurable"]["checkpoint_id"] == checkpoint_id
    assert [checkpoint_id for checkpoint_id, _ in await direct.checkpoint_rows(thread_id)][:2] == [
        final.config["configurable"]["checkpoint_id"],
        checkpoint_id,
    ]


async def test_store_put_search_and_delete_through_the_sdk(client: LangGraphClient, direct: Direct) -> None:
    namespace = ("notes", uuid.uuid4().hex[:12])
    await client.store.put_item(list(namespace), "tea", {"text": "alice likes green tea"})
    await client.store.put_item(list(namespace), "chess", {"text": "alice plays chess"})

    found = (await client.store.search_items(list(namespace), query="green tea"))["items"]
    assert [item["key"] for item in found] == ["tea", "chess"]
    ours = await direct.store.asearch(namespace, query="green tea")
    assert [(item.key, item.value) for item in ours] == [(item["key"], item["value"]) for item in found]
    assert [item.score for item in ours] == pytest.approx([item["score"] for item in found])
    assert await direct.store_rows(namespace) == {
        "chess": {"text": "alice plays chess"},
        "tea": {"text": "alice likes green tea"},
    }

    await client.store.delete_item(list(namespace), "tea")
    assert await client.store.get_item(list(namespace), "tea") is None
    assert [item["key"] for item in (await client.store.search_items(list(namespace)))["items"]] == ["chess"]
    assert await direct.store.aget(namespace, "tea") is None
    assert await direct.store_rows(namespace) == {"chess": {"text": "alice plays chess"}}
