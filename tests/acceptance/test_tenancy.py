"""Tenancy and auth end to end: two tenants' real KafkaSaver / KafkaStore clients write through the broker
and the projector of the session's dev stack, and read through a read API process that holds only
their tokens' hashes. Neither tenant can read, list, search, list the namespaces of, or tell apart
from nothing, the other's data; the server enforces it, whatever thread ids or namespaces a client sends.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import ormsgpack
import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from pydantic import SecretStr
from typing_extensions import TypedDict

from graphledger import KafkaSaver, KafkaStore
from graphledger.errors import ReadApiError
from graphledger.settings import Settings
from graphledger.tenancy import hash_token
from graphledger.wire import MSGPACK
from graphledger_server.devstack.ports import free_port, wait_until
from graphledger_server.devstack.stack import settings_to_env

TENANTS = ("acme", "globex")


@dataclass
class TenantApi:
    url: str
    tokens: dict[str, str]
    """Each tenant's agent token."""
    operator: str
    """acme's operator token, granted erasure."""
    base: Settings

    def settings(self, tenant: str | None) -> Settings:
        token = SecretStr(self.tokens[tenant]) if tenant else None
        return self.base.model_copy(update={"api_url": self.url, "api_token": token})

    def post(self, path: str, body: Any, token: str | None) -> httpx.Response:
        headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.post(f"{self.url}{path}", content=ormsgpack.packb(body), headers=headers, timeout=30)


@pytest.fixture(scope="module")
def tenant_api(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenantApi]:
    """A second read API process on the stack's projection, knowing two tenants by their tokens' hashes."""
    tokens = {tenant: secrets.token_urlsafe(24) for tenant in TENANTS}
    operator = secrets.token_urlsafe(24)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRAPHLEDGER_")}
    env.update(settings_to_env(stack.settings))
    env.pop("GRAPHLEDGER_METRICS_PORT", None)
    env.pop("GRAPHLEDGER_API_TOKEN", None)
    env["GRAPHLEDGER_API_PORT"] = str(port)
    entries = [f"{t}:{hash_token(tok)}" for t, tok in tokens.items()] + [f"acme:{hash_token(operator)}:erase"]
    env["GRAPHLEDGER_API_TOKEN_HASHES"] = ",".join(entries)
    log_path = tmp_path_factory.mktemp("tenant-api") / "api.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "graphledger_server", "api"], env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the tenant API exited {process.returncode}: {log_path.read_text()[-2000:]}")
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 60, "the tenant read API")
        yield TenantApi(url, tokens, operator, stack.settings)
    finally:
        process.terminate()
        process.wait(30)


class State(TypedDict):
    said: list[str]


def _graph(saver: KafkaSaver, word: str) -> Any:
    def speak(state: State) -> dict[str, list[str]]:
        return {"said": [*state.get("said", []), word]}

    builder = StateGraph(State)
    builder.add_node("speak", speak)
    builder.add_edge(START, "speak")
    builder.add_edge("speak", END)
    return builder.compile(checkpointer=saver)


def test_no_or_wrong_token_is_401_and_whoami_names_the_tenant(tenant_api: TenantApi) -> None:
    for token in (None, "wrong", tenant_api.tokens["acme"] + "x"):
        response = tenant_api.post("/v1/checkpoints/get", {"thread_id": "t"}, token)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert ormsgpack.unpackb(response.content)["error"] == "unauthorized"
    for tenant in TENANTS:
        headers = {"Authorization": f"Bearer {tenant_api.tokens[tenant]}"}
        assert httpx.get(f"{tenant_api.url}/v1/whoami", headers=headers).json() == {"tenant": tenant}
    assert httpx.get(f"{tenant_api.url}/v1/whoami").status_code == 401
    with pytest.raises(ReadApiError) as refused, KafkaSaver(tenant_api.settings(None).model_copy(
        update={"api_token": SecretStr("not-a-token")}
    )):  # fmt: skip
        pass
    assert refused.value.status == 401


def test_checkpoints_of_one_tenant_are_invisible_to_the_other(tenant_api: TenantApi) -> None:
    run = uuid.uuid4().hex[:8]
    shared, own = f"shared-{run}", {t: f"{t}-only-{run}" for t in TENANTS}
    with KafkaSaver(tenant_api.settings("acme")) as acme, KafkaSaver(tenant_api.settings("globex")) as globex:
        savers = {"acme": acme, "globex": globex}
        for tenant, saver in savers.items():
            graph = _graph(saver, f"{tenant} speaking")
            for thread in (shared, own[tenant]):
                graph.invoke({"said": []}, {"configurable": {"thread_id": thread}})
        for tenant, saver in savers.items():
            other = "globex" if tenant == "acme" else "acme"
            graph = _graph(saver, "unused")
            # The same thread id names each tenant's own thread.
            assert graph.get_state({"configurable": {"thread_id": shared}}).values == {"said": [f"{tenant} speaking"]}
            found = saver.get_tuple({"configurable": {"thread_id": shared}})
            assert found is not None and found.config["configurable"]["thread_id"] == shared
            # The other's thread reads as a thread that never existed, however it is named.
            for name in (own[other], f"{other}/{own[other]}", f"../{other}/{own[other]}"):
                assert saver.get_tuple({"configurable": {"thread_id": name}}) is None
                assert list(saver.list({"configurable": {"thread_id": name}})) == []
            # Lists without a thread, with a filter, and delta history stay in the tenant.
            threads = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
            assert {shared, own[tenant]} <= threads and own[other] not in threads
            assert all(not t.startswith(f"{x}/") for t in threads for x in TENANTS)
            everything = list(saver.list(None, filter={"step": 1}))
            assert everything and all(t.config["configurable"]["thread_id"] != own[other] for t in everything)
            parents = [t.parent_config for t in saver.list({"configurable": {"thread_id": shared}})]
            assert any(p is not None and p["configurable"]["thread_id"] == shared for p in parents)
            history = saver.get_delta_channel_history(
                config={"configurable": {"thread_id": own[other], "checkpoint_ns": "", "checkpoint_id": "x"}},
                channels=["said"],
            )
            assert all(not entry["writes"] for entry in history.values())


def test_an_other_tenants_thread_answers_exactly_like_a_missing_one(tenant_api: TenantApi) -> None:
    secret = f"secret-{uuid.uuid4().hex[:8]}"
    with KafkaSaver(tenant_api.settings("globex")) as globex:
        _graph(globex, "globex only").invoke({"said": []}, {"configurable": {"thread_id": secret}})
        assert globex.get_tuple({"configurable": {"thread_id": secret}}) is not None  # waits for the projection
    token = tenant_api.tokens["acme"]
    for path, extra in (
        ("/v1/checkpoints/get", {}),
        ("/v1/checkpoints/list", {}),
        ("/v1/checkpoints/delta-history", {"channels": ["said"]}),
    ):
        theirs = tenant_api.post(path, {"thread_id": secret, **extra}, token)
        nobodys = tenant_api.post(path, {"thread_id": f"never-{uuid.uuid4().hex}", **extra}, token)
        assert theirs.status_code == nobodys.status_code == 200
        # Where the asked-for thread's records would be (its key's partition) follows from the name asked,
        # not from any tenant's data; everything else must be byte for byte the same.
        assert _without_log_position(theirs.content) == _without_log_position(nobodys.content)


def _without_log_position(content: bytes) -> Any:
    answer = ormsgpack.unpackb(content)
    if isinstance(answer, dict):
        answer.pop("log_partition", None)
        answer.pop("log_end", None)
    return answer


def test_store_of_one_tenant_is_invisible_to_the_other(tenant_api: TenantApi) -> None:
    root = f"r{uuid.uuid4().hex[:8]}"
    with KafkaStore(tenant_api.settings("acme")) as acme, KafkaStore(tenant_api.settings("globex")) as globex:
        stores = {"acme": acme, "globex": globex}
        for tenant, store in stores.items():
            store.put((root, "docs"), "k", {"owner": tenant})
            store.put((root, tenant, "private"), "p", {"owner": tenant})
        for tenant, store in stores.items():
            other = "globex" if tenant == "acme" else "acme"
            item = store.get((root, "docs"), "k")
            assert item is not None and item.value == {"owner": tenant} and item.namespace == (root, "docs")
            assert store.get((root, other, "private"), "p") is None
            assert store.get((other, root, other, "private"), "p") is None  # naming the stored path
            found = store.search((root,))
            assert {(i.namespace, i.value["owner"]) for i in found} == {
                ((root, "docs"), tenant),
                ((root, tenant, "private"), tenant),
            }
            assert [i.key for i in store.search(())] and all(i.value["owner"] == tenant for i in store.search(()))
            assert store.search((other,)) == [] and store.search((root,), filter={"owner": other}) == []
            # Namespaces: listed without the tenant label, never the other's, whatever the pattern.
            mine = store.list_namespaces(prefix=(root,))
            assert sorted(mine) == sorted([(root, "docs"), (root, tenant, "private")])
            assert all(ns[0] not in TENANTS for ns in store.list_namespaces())
            assert store.list_namespaces(prefix=(other,)) == []
            assert store.list_namespaces(prefix=("*", root)) == []
            assert store.list_namespaces(prefix=(root, other)) == []
            assert store.list_namespaces(suffix=(tenant, root, "docs")) == []  # cannot reach the tenant label
            assert store.list_namespaces(suffix=("*", root, "docs")) == []
            assert store.list_namespaces(suffix=(root, "docs")) == [(root, "docs")]
            assert store.list_namespaces(prefix=(root,), max_depth=1) == [(root,)]


def test_a_tenants_reads_refresh_the_ttl_of_its_own_items_and_no_one_elses(tenant_api: TenantApi) -> None:
    """Refresh-on-read under a tenant token restarts the TTL of the tenant's item; the same namespace
    and key of another tenant, or of no tenant, keep their expiry."""
    root = f"r{uuid.uuid4().hex[:8]}"
    namespace = (root, "memories")
    stored = {"acme": f"acme.{root}.memories", "globex": f"globex.{root}.memories", "": f"{root}.memories"}
    ttl: Any = {"default_ttl": 60, "refresh_on_read": True}
    settings = {"acme": tenant_api.settings("acme"), "globex": tenant_api.settings("globex"), "": tenant_api.base}
    base = tenant_api.base

    def expiries() -> dict[str, Any]:
        with psycopg.connect(base.postgres_dsn) as conn:
            rows = conn.execute(
                f"SELECT prefix, expires_at FROM {base.postgres_schema}.store WHERE key = 'k' AND prefix = ANY(%s)",
                [list(stored.values())],
            ).fetchall()
        by_prefix = dict(rows)
        return {owner: by_prefix.get(prefix) for owner, prefix in stored.items()}

    stores = {owner: KafkaStore(s, ttl=ttl) for owner, s in settings.items()}
    try:
        for owner, store in stores.items():
            store.put(namespace, "k", {"owner": owner})
            assert store.get(namespace, "k", refresh_ttl=False) is not None
        # A read answers from the log before the projection applies (read-through): wait for the rows.
        wait_until(lambda: all(expiries().values()), 60, "the projection to apply the three puts")
        before = expiries()
        item = stores["acme"].get(namespace, "k")  # refreshes
        assert item is not None and item.value == {"owner": "acme"}
        # A read answers with the refresh at once (read-through); the projection applies it in its time.
        wait_until(lambda: expiries()["acme"] > before["acme"], 60, "the projection to apply acme's refresh")
        after = expiries()
    finally:
        for store in stores.values():
            store.close()
    assert after["globex"] == before["globex"] and after[""] == before[""]


def test_only_a_token_granted_erase_erases(tenant_api: TenantApi) -> None:
    """An agent's token reads its tenant but gets a 403 from /v1/erase (through the client too) and
    nothing is erased; acme's operator token, whose entry ends in `:erase`, erases the thread."""
    thread = f"kept-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": thread}}
    with KafkaSaver(tenant_api.settings("acme")) as saver:
        _graph(saver, "precious").invoke({"said": []}, config)
        refused = tenant_api.post("/v1/erase", {"thread_id": thread}, tenant_api.tokens["acme"])
        assert refused.status_code == 403, refused.content
        body = ormsgpack.unpackb(refused.content)
        assert body["error"] == "permission_denied" and ":erase" in body["message"]
        with pytest.raises(ReadApiError) as refused_client:
            saver.erase_thread(thread)
        assert refused_client.value.status == 403 and refused_client.value.code == "permission_denied"
        assert saver.get_tuple(config) is not None
    erased = tenant_api.post("/v1/erase", {"thread_id": thread}, tenant_api.operator)
    assert erased.status_code == 200, erased.content
    assert [e["kind"] for e in ormsgpack.unpackb(erased.content)["erased"]] == ["thread"]
    with KafkaSaver(tenant_api.settings("acme")) as saver:
        assert saver.get_tuple(config) is None


def graphledger_token(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graphledger_server", "token", *args], input=stdin, capture_output=True, text=True
    )


def test_token_commands_print_an_agents_or_an_operators_entry() -> None:
    for args, suffix in (((), ""), (("--erase",), ":erase")):
        hashed = graphledger_token("hash", "acme", *args, stdin="s3cret\n")
        assert hashed.returncode == 0 and hashed.stdout == f"acme:{hash_token('s3cret')}{suffix}\n"
        made = graphledger_token("new", "acme", *args)
        token, entry = made.stdout.splitlines()
        assert len(token) >= 40 and entry == f"acme:{hash_token(token)}{suffix}"
    assert graphledger_token("hash", "acme", stdin="").returncode == 2
    assert graphledger_token("new", "no/slash").returncode == 2


def test_a_tenant_client_that_opts_in_reads_the_threads_it_holds_without_the_read_api(tenant_api: TenantApi) -> None:
    """`client_log_reads` is off by default with a tenant token (its READ would show it other tenants'
    sealed records' sizes and times); a client granted READ that sets it answers its own thread's next
    turns from what it holds, as a client without a tenant does."""
    thread = f"held-{uuid.uuid4().hex[:8]}"
    opted_in = tenant_api.settings("acme").model_copy(update={"client_log_reads": True})
    with KafkaSaver(opted_in) as saver, KafkaSaver(tenant_api.settings("acme")) as default:
        for one, name in ((saver, thread), (default, f"{thread}-default")):
            graph = _graph(one, "acme speaking")
            for _ in range(3):
                graph.invoke({"said": []}, {"configurable": {"thread_id": name}})
        assert saver._runtime.thread_reads is not None and default._runtime.thread_reads is not None
        assert saver._runtime.thread_reads.answered["held"] == 2  # every turn's read but the first
        assert default._runtime.thread_reads.answered["held"] == 0


def test_the_key_filter_is_refused_to_a_tenants_token(tenant_api: TenantApi) -> None:
    """The key filters prove threads of the unnamed tenant new; a tenant's client proves nothing with them,
    and is told so."""
    refused = tenant_api.post("/v1/checkpoints/key-filter", {"partition": 0}, tenant_api.tokens["acme"])
    assert refused.status_code == 403 and "unnamed tenant" in refused.text, refused.text
