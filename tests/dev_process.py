"""`graphledger dev` as a user runs it: a process of its own that learns its settings only from the
environment (none of the test's `GRAPHLEDGER_*` variables), ready once the env file it writes appears."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from graphledger.settings import Settings
from graphledger_server.devstack.ports import wait_until

PREFIX = str(Settings.model_config.get("env_prefix", ""))
DEV_READY_TIMEOUT_S = 240.0  # a first start: initdb, tansu, migrations, three services, on 2 busy cores
STOP_TIMEOUT_S = 30.0


def clean_env() -> dict[str, str]:
    """This environment without graphledger settings: each process gets them only as documented."""
    return {key: value for key, value in os.environ.items() if not key.upper().startswith(PREFIX)}


def read_env_file(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of an env file `graphledger dev` wrote."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


def settings_of(env: dict[str, str]) -> Settings:
    """The settings a process given exactly these `GRAPHLEDGER_*` variables reads."""
    return Settings(**{key.removeprefix(PREFIX).lower(): value for key, value in env.items()})


def log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def start_dev(
    command: list[str], log: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`graphledger dev ...` (`command`) in a session of its own (a Ctrl-C elsewhere does not reach it), its
    output in `log`, with `env` (default: `clean_env()`)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=clean_env() if env is None else env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(process: subprocess.Popen[bytes], env_file: Path, log: Path) -> None:
    """Return once `graphledger dev` wrote `env_file`; fail with its log if it exits first."""
    wait_until(lambda: env_file.exists() or process.poll() is not None, DEV_READY_TIMEOUT_S, f"{env_file}")
    assert process.poll() is None, f"graphledger dev exited with status {process.returncode}:\n{log_tail(log)}"


def stop(process: subprocess.Popen[bytes], *, group: bool = False) -> None:
    """SIGTERM (to its process group when `group`), then SIGKILL what outlives the deadline."""
    if process.poll() is not None:
        return
    send = (lambda sig: os.killpg(process.pid, sig)) if group else process.send_signal
    send(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()
