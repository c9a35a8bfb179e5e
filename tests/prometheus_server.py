"""A real Prometheus (Debian's `prometheus` binary) on a free loopback port, for the dashboard test:
scrapes the given `/metrics` endpoints every second, evaluates the given rule files, answers PromQL."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from graphledger_server.devstack.ports import free_port, wait_until

READY_TIMEOUT_S = 60.0


class PrometheusServer:
    """`with PrometheusServer(dir, {"projector": "http://.../metrics"}, [rules]) as prom: prom.query(...)`."""

    def __init__(self, workdir: Path, targets: dict[str, str], rule_files: list[Path]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {
                    "job_name": job,
                    "metrics_path": urlsplit(url).path,
                    "static_configs": [{"targets": [urlsplit(url).netloc]}],
                }
                for job, url in targets.items()
            ],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._process: subprocess.Popen[bytes] | None = None
        self._log = workdir / "prometheus.log"

    def __enter__(self) -> PrometheusServer:
        with open(self._log, "wb") as log:
            self._process = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={self.workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            wait_until(self._ready, READY_TIMEOUT_S, "Prometheus to be ready")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def _ready(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self._process.returncode}: {self.log_tail()}")
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def api(self, path: str, **params: Any) -> Any:
        """GET `/api/v1/<path>`; its `data`, after checking the status."""
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"/api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (or scalar as a one-element list)."""
        data = self.api("query", query=expr, time=at if at is not None else time.time())
        result = data["result"]
        return result if data["resultType"] in {"vector", "matrix"} else [{"metric": {}, "value": result}]
