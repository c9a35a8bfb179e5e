"""Run LangGraph's own test suite, at the installed LangGraph's version, on KafkaSaver (`make langgraph-suite`).

The suite comes from LangGraph's sdist on PyPI (its `tests/` ship in it), into `.langgraph-suite/`; it runs in
a virtualenv of its own (`.venv-langgraph-suite`: graphledger's client, the same LangGraph, the suite's test
dependencies), so its pytest plugins never reach `make test`. One dev stack serves every run. Each mode runs
the suite's test files that take a checkpointer fixture, with `fixtures.py` in place of the suite's
checkpointer fixtures:
- `memory`: the suite's own `InMemorySaver` (the reference: what LangGraph itself passes here);
- `kafka`: KafkaSaver as deployed (the one-writer rule refusing);
- `record`: KafkaSaver with `GRAPHLEDGER_WRITE_OWNERSHIP=record` (the rule only recording, as before it).
Services and Docker the suite's other fixtures want are off (`NO_DOCKER=true`: in-memory stores and caches).
A test's outcome on KafkaSaver is compared with its outcome on `InMemorySaver`; the run fails when a test
that passes there (every test, without a `memory` run) does not pass on `kafka`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

from graphledger_server.devstack.stack import DevStack

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".langgraph-suite"
VENV = ROOT / ".venv-langgraph-suite"
MODES = ("memory", "kafka", "record")
FIXTURES = ("sync_checkpointer", "async_checkpointer")
TEST_DEPENDENCIES = (
    "pytest",
    "pytest-mock",
    "pytest-asyncio",
    "pytest-timeout",
    "syrupy",
    "httpx",
    "redis",
    "pycryptodome",
    "langchain-core>=1.0.0",
    "langgraph-prebuilt",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "psycopg[binary]",
)
CHECKPOINTER_ID = re.compile(r"(?<=[\[-])(memory|kafka)(?=[\]-])")
OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}
"""A junit test case's outcome by the first of these elements it holds (none: passed)."""
IMPORT_LINE = "from tests.graphledger_fixtures import async_checkpointer, sync_checkpointer  # noqa: E402,F401,F811\n"


def suite(version: str) -> Path:
    """The suite's checkout at `version`, its checkpointer fixtures replaced by graphledger's."""
    tree = WORK / f"langgraph-{version}"
    if not tree.is_dir():
        WORK.mkdir(exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, "-d", str(WORK), f"langgraph=={version}"], check=True)
        with tarfile.open(WORK / f"langgraph-{version}.tar.gz") as sdist:
            if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
                sdist.extractall(WORK, filter="data")
            else:
                sdist.extractall(WORK)  # PyPI's sdist of LangGraph
    shutil.copyfile(Path(__file__).with_name("fixtures.py"), tree / "tests" / "graphledger_fixtures.py")
    conftest = tree / "tests" / "conftest.py"
    text = conftest.read_text()
    if IMPORT_LINE not in text:
        conftest.write_text(text + "\n" + IMPORT_LINE)
    return tree


def interpreter(version: str) -> Path:
    """The suite's virtualenv's python, made once."""
    python = VENV / "bin" / "python"
    stamp = VENV / f".installed-{version}"
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        install = [str(python), "-m", "pip", "install", "--quiet"]
        subprocess.run([*install, "-e", str(ROOT), f"langgraph=={version}", *TEST_DEPENDENCIES], check=True)
        stamp.touch()
    return python


def test_files(tree: Path) -> list[str]:
    """The suite's test files that take a checkpointer fixture."""
    files = sorted((tree / "tests").glob("test_*.py"))
    return [str(f.relative_to(tree)) for f in files if any(name in f.read_text() for name in FIXTURES)]


def run_mode(
    mode: str, python: Path, tree: Path, files: list[str], stack_env: dict[str, str], extra: list[str]
) -> Path:
    report = WORK / f"{mode}.xml"
    checkpointer = "memory" if mode == "memory" else "kafka"
    env = {**os.environ, **stack_env, "NO_DOCKER": "true", "GRAPHLEDGER_SUITE_CHECKPOINTER": checkpointer}
    env.pop("GRAPHLEDGER_WRITE_OWNERSHIP", None)
    if mode == "record":
        env["GRAPHLEDGER_WRITE_OWNERSHIP"] = "record"
    command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "120"]
    command += ["-o", "addopts=", f"--junitxml={report}", *files, *extra]
    print(f"== {mode}: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, cwd=tree, env=env, check=False)
    return report


def outcomes(report: Path) -> dict[str, str]:
    """Each test case's outcome in a junit report (passed, failed, error or skipped), by its name with the
    checkpointer parameter's id as `saver`, so that the modes' names match."""
    found: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        name = CHECKPOINTER_ID.sub("saver", f"{case.get('classname')}::{case.get('name')}")
        kinds = {child.tag for child in case}
        found[name] = next((outcome for tag, outcome in OUTCOMES.items() if tag in kinds), "passed")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after `--`), e.g. `-k time_travel`")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}: choose from {', '.join(MODES)}")
    version = importlib.metadata.version("langgraph")
    tree, python = suite(version), interpreter(version)
    files = test_files(tree)
    stack = DevStack()
    stack.start()
    try:
        env = stack.client_env()
        reports = {mode: outcomes(run_mode(mode, python, tree, files, env, args.pytest_args)) for mode in modes}
    finally:
        stack.stop()
    reference = reports.get("memory", {})
    print(f"\nLangGraph {version}'s suite, {len(files)} files")
    for mode, found in reports.items():
        counts = {k: sum(1 for v in found.values() if v == k) for k in ("passed", "failed", "error", "skipped")}
        print(f"  {mode:7} " + " ".join(f"{k} {n}" for k, n in counts.items()))
    worse: dict[str, list[str]] = {}
    for mode, found in reports.items():
        if mode == "memory":
            continue
        # Without a reference run, every test is taken as passing there.
        worse[mode] = sorted(t for t, o in found.items() if o != "passed" and reference.get(t, "passed") == "passed")
        for test in worse[mode]:
            print(f"  {mode}: {found[test]} {test} (passes on InMemorySaver)")
    return 1 if worse.get("kafka") else 0


if __name__ == "__main__":
    sys.exit(main())
