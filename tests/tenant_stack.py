"""A dev stack of its own with two tenants' tokens, the chat graph their agents run, and a tenant's thread
to forge records against: for the tests of what one tenant's producer can do to another's data
(`acceptance/test_erasure.py`, `acceptance/test_parked_subjects.py`)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from operator import add
from typing import Annotated, Any, TypedDict

import asyncpg
import httpx
from aiokafka import AIOKafkaProducer
from langgraph.graph import START, StateGraph
from pydantic import SecretStr

from graphledger import KafkaSaver
from graphledger.settings import Settings
from graphledger.tenancy import hash_token, scoped_thread
from graphledger_server.devstack.stack import CLIENT_FIELDS, DevStack, settings_to_env
from kafka_clients import raw_producer

TENANTS = ("acme", "beta")
COMMAND_TIMEOUT_S = 180


class Chat(TypedDict):
    messages: Annotated[list[str], add]
    notes: Annotated[list[str], add]


def chat_graph(saver: KafkaSaver) -> Any:
    """Two nodes in one step, so each step has pending writes of a task another one is waiting for."""
    builder = StateGraph(Chat)
    builder.add_node("reply", lambda s: {"messages": [f"reply to {s['messages'][-1]}"]})
    builder.add_node("note", lambda s: {"notes": [f"note on {s['messages'][-1]}"]})
    builder.add_edge(START, "reply")
    builder.add_edge(START, "note")
    return builder.compile(checkpointer=saver)


@dataclass
class TenantStack:
    dev: DevStack
    tokens: dict[str, str]

    def client(self, tenant: str, **overrides: Any) -> Settings:
        return self.dev.settings.model_copy(
            update={"api_token": SecretStr(self.tokens[tenant]), "key_encryption_keys": None, **overrides}
        )

    def agent_env(self, tenant: str, **overrides: str) -> dict[str, str]:
        """An agent pod's environment: the client's settings only (no key-encryption key)."""
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRAPHLEDGER_")}
        env.update(settings_to_env(self.client(tenant), CLIENT_FIELDS))
        env.update({f"GRAPHLEDGER_{k.upper()}": v for k, v in overrides.items()})
        return env

    def graphledger(self, *args: str) -> str:
        """The CLI as an operator runs it; its stdout, or the test fails with its stderr."""
        done = self.run_graphledger(*args)
        assert done.returncode == 0, f"graphledger {' '.join(args)}: {done.stderr}"
        return done.stdout

    def run_graphledger(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRAPHLEDGER_")}
        env.update(self.dev.service_env())
        return subprocess.run(
            [sys.executable, "-m", "graphledger_server", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )

    def post(self, path: str, body: Any, tenant: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[tenant]}"}
        return httpx.post(f"{self.dev.settings.api_url}{path}", json=body, headers=headers, timeout=30)


@contextmanager
def tenant_stack(**settings: Any) -> Iterator[TenantStack]:
    """A dev stack of two partitions whose read API knows a token of each of `TENANTS`."""
    tokens = {tenant: secrets.token_urlsafe(24) for tenant in TENANTS}
    hashes = ",".join(f"{tenant}:{hash_token(token)}" for tenant, token in tokens.items())
    base = Settings(api_token_hashes=SecretStr(hashes), **settings)  # type: ignore[call-arg]
    with DevStack(partitions=2, base=base) as dev:
        yield TenantStack(dev, tokens)


@dataclass
class Victim:
    """acme's thread after one turn, with what a test forging records against it needs."""

    thread: str
    stored: str
    config: dict[str, Any]
    record_key: bytes
    pool: asyncpg.Pool
    producer: AIOKafkaProducer


@asynccontextmanager
async def victim_thread(stack: TenantStack, name: str) -> AsyncIterator[Victim]:
    thread = f"{name}-{uuid.uuid4().hex[:8]}"
    settings = stack.dev.settings
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=1, max_size=1)
    producer = raw_producer(settings)
    await producer.start()
    config: dict[str, Any] = {"configurable": {"thread_id": thread}}
    try:
        async with KafkaSaver(stack.client("acme")) as saver:
            await chat_graph(saver).ainvoke({"messages": ["mine"]}, config)
            record_key = saver._runtime.record_key_of_thread(thread)
        assert record_key is not None
        yield Victim(thread, scoped_thread("acme", thread), config, record_key, pool, producer)
    finally:
        await producer.stop()
        await pool.close()
