"""`graphledger dev` (what `make run` starts) and the `DevStack` behind it, end to end.

Every check runs the real thing: embedded Postgres, tansu, and the services as child processes. The
command tests run `graphledger dev` as a subprocess and then check, by pid, that nothing it started
outlives it.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dev_process import clean_env, read_env_file, wait_ready
from graphledger_server.devstack.demo import run_demo
from graphledger_server.devstack.ports import wait_until
from graphledger_server.devstack.stack import WORKER_NICE, DevStack

DEV_TIMEOUT_S = 240  # whole `graphledger dev --demo --exit-after-demo` run, initdb included
SWEEPER_ACTIVE_S = 90.0
CLIENT_VARIABLES = {
    "GRAPHLEDGER_KAFKA_BOOTSTRAP_SERVERS",
    "GRAPHLEDGER_KAFKA_IDEMPOTENCE",
    "GRAPHLEDGER_TOPIC_PREFIX",
    "GRAPHLEDGER_API_URL",
}
OPERATOR_VARIABLES = {
    "GRAPHLEDGER_POSTGRES_DSN",
    "GRAPHLEDGER_POSTGRES_SCHEMA",
    "GRAPHLEDGER_KEY_ENCRYPTION_KEYS",
    "GRAPHLEDGER_TOPIC_PARTITIONS",
    "GRAPHLEDGER_TOPIC_REPLICATION_FACTOR",
    "GRAPHLEDGER_STORE_VECTOR_DIMS",
}
PROCESS_NAMES = {"postgres", "broker", "projector", "read API", "sweeper"}
_PID_LINE = re.compile(r"^  (postgres|broker|projector|read API|sweeper)\s+pid (\d+)", re.MULTILINE)


def dev_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "graphledger_server", "dev", *args]


def printed_pids(output: str) -> dict[str, int]:
    """The pid of each process `graphledger dev` reported starting."""
    return {name: int(pid) for name, pid in _PID_LINE.findall(output)}


def alive(pid: int) -> bool:
    """Running and not a zombie (an exited child nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_make_run_entry_point_runs_the_demo_and_leaves_nothing_behind(tmp_path: Path) -> None:
    env_file, operator_file = tmp_path / "client.env", tmp_path / "operator.env"
    result = subprocess.run(
        dev_command(
            "--demo", "--exit-after-demo", "--env-file", str(env_file), "--operator-env-file", str(operator_file)
        ),
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=DEV_TIMEOUT_S,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    out = result.stdout

    # The demo ran the seed graph twice (sync and async) and read back its 4 checkpoints each time.
    assert "demo: OK" in out
    assert out.count("get_state_history  4 checkpoints") == 2
    for step in ("step  2", "step  1", "step  0", "step -1"):
        assert out.count(step) == 2
    assert out.count("values={'foo': 'b', 'bar': ['a', 'b']}") >= 4  # get_state and newest checkpoint, twice
    assert "then node_b wrote {'foo': 'b', 'bar': ['b']}" in out

    # Then the memory store example (the demo compared every search with InMemoryStore's): the memories put
    # in thread 1 found from thread 2 by meaning, the unindexed one last without a score, then by filter.
    assert "KafkaStore(index={'dims': 384, 'embed': OnnxEmbedder(), 'fields': ['food_preference', '$']})" in out
    recalled = out.split("store.search(namespace, query=..., limit=3) found, best first:\n", 1)[1].splitlines()[:3]
    assert re.fullmatch(r"\s+0\.\d{3}  \{'food_preference': 'I like pizza'\}", recalled[0]), recalled
    assert "'food_preference': 'I love Italian cuisine'" in recalled[1] and "0." in recalled[1], recalled
    assert re.fullmatch(r"\s+-  \{'system_info': 'Last updated: 2024-01-01'\}", recalled[2]), recalled
    filtered = out.split("store.search(namespace, filter={'context': 'Discussing dinner plans'}):\n", 1)[1]
    found = filtered.splitlines()[0].strip()
    assert found.startswith("-  {") and "'food_preference': 'I love Italian cuisine'" in found, filtered
    # The memory with a TTL: read back at once, then gone.
    assert "get right away  → {'food_preference': 'Today I feel like sushi'}" in out
    assert re.search(r"get after \d+\.\d s → None: expired", out)

    # The env file holds what a client needs, pointing at the stack that ran.
    client = read_env_file(env_file)
    assert CLIENT_VARIABLES <= client.keys()
    assert client["GRAPHLEDGER_KAFKA_IDEMPOTENCE"] == "false"
    assert client["GRAPHLEDGER_KAFKA_BOOTSTRAP_SERVERS"] in out
    assert client["GRAPHLEDGER_API_URL"].startswith("http://127.0.0.1:")
    # The operator's file: what the services ran with, the client's variables among them.
    operator = read_env_file(operator_file)
    assert client.items() <= operator.items()
    assert OPERATOR_VARIABLES <= operator.keys()
    assert operator["GRAPHLEDGER_POSTGRES_DSN"] in out
    assert operator_file.stat().st_mode & 0o077 == 0  # it holds the key-encryption key

    # Every process it started is gone, and its temporary work dir with them.
    pids = printed_pids(out)
    assert pids.keys() == PROCESS_NAMES
    assert [name for name, pid in pids.items() if alive(pid)] == []
    work_dir = re.search(r"work dir (\S+), deleted on exit", out)
    assert work_dir is not None
    assert not Path(work_dir.group(1)).exists()


def _interruptible() -> None:
    """In the child before exec: SIGINT at its default and not blocked, as a job a terminal starts has it.
    A disposition to ignore it survives exec, and the pytest worker running this test may carry one."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_stop_signal_stops_every_child_and_keeps_the_data_dir(tmp_path: Path, how: str) -> None:
    """SIGTERM to `graphledger dev`, or Ctrl-C (SIGINT to its whole process group, as a terminal sends it)."""
    env_file = tmp_path / "client.env"
    data_dir = tmp_path / "data"
    stdout_path, stderr_path = tmp_path / "dev.out", tmp_path / "dev.err"
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            dev_command("--data-dir", str(data_dir), "--env-file", str(env_file)),
            env=clean_env(),
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # its own process group, like a shell job, so Ctrl-C reaches only it
            preexec_fn=_interruptible,
        )
    try:
        wait_ready(process, env_file, stderr_path)
        pids = printed_pids(stdout_path.read_text())
        assert pids.keys() == PROCESS_NAMES
        assert all(alive(pid) for pid in pids.values())
        # The env file is written only once the stack is ready: the read API answers right away.
        api_url = read_env_file(env_file)["GRAPHLEDGER_API_URL"]
        assert httpx.get(f"{api_url}/readyz", timeout=5).status_code == 200

        if how == "sigterm":
            process.send_signal(signal.SIGTERM)
        else:
            os.killpg(process.pid, signal.SIGINT)
        assert process.wait(DEV_TIMEOUT_S) == 0, stderr_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert [name for name, pid in pids.items() if alive(pid)] == []
    # Every child stopped on SIGTERM by itself: none had to be killed after the deadline.
    assert "killing it" not in stderr_path.read_text()
    assert (data_dir / "pg" / "PG_VERSION").exists()
    assert (data_dir / "logs" / "projector.log").exists()


def test_stack_fixture_serves_a_client(stack: DevStack) -> None:
    env = stack.client_env()
    assert CLIENT_VARIABLES <= env.keys()
    assert env["GRAPHLEDGER_KAFKA_BOOTSTRAP_SERVERS"] == stack.settings.kafka_bootstrap_servers
    out = io.StringIO()
    assert run_demo(env, out) == 0, out.getvalue()


def test_projector_survives_kill_and_restart(stack: DevStack) -> None:
    before = stack.pids()["projector"]
    assert stack.kill_projector() == -signal.SIGKILL
    assert "projector" not in stack.pids()

    stack.restart_projector()
    after = stack.pids()["projector"]
    assert after != before
    # The new worker picks up where the killed one left off: a fresh round trip still reads back.
    out = io.StringIO()
    assert run_demo(stack.client_env(), out) == 0, out.getvalue()


def _thread_nices(pid: int) -> set[int]:
    """The nice value of every thread of `pid` (field 19 of /proc/<pid>/task/<tid>/stat)."""
    nices = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        nices.add(int(stat[stat.rindex(")") + 2 :].split()[16]))
    return nices


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_workers_run_below_the_request_path(stack: DevStack) -> None:
    ours = os.nice(0)  # the stack's processes start at the test runner's priority
    pids = stack.pids()
    worker = min(ours + WORKER_NICE, 19)
    assert _thread_nices(pids["projector"]) == {worker}, "every projector thread, those started later too"
    assert _thread_nices(pids["sweeper"]) == {worker}
    assert _thread_nices(pids["api"]) == {ours}


def test_the_dev_stacks_sweeper_becomes_the_active_replica(stack: DevStack) -> None:
    log = stack.log_dir / "sweeper.log"
    wait_until(
        lambda: "active (holding the advisory lock)" in log.read_text(), SWEEPER_ACTIVE_S, "the sweeper to be active"
    )
    assert "sweeper" not in stack.exited()
