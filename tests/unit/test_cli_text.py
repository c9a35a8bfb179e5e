"""What the `graphledger` command writes, checked without running it: log records one line each, and the
settings table of docs/settings.md as `make settings-doc` renders it from `Settings`. The command itself, run as a
subprocess, is `acceptance/test_cli.py`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from graphledger_server.cli import OneLineFormatter
from graphledger_server.commands.settings_doc import current_block, render_table

ROOT = Path(__file__).resolve().parents[2]


def test_log_records_are_one_line_each() -> None:
    formatter = OneLineFormatter("%(levelname)s %(name)s: %(message)s")
    try:
        raise ValueError("first line\nsecond line")
    except ValueError:
        record = logging.LogRecord("graphledger.x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    line = formatter.format(record)
    assert "\n" not in line
    assert line.startswith("ERROR graphledger.x: failed")
    assert "Traceback" in line and "second line" in line


def test_the_settings_table_is_current() -> None:
    doc = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert current_block(doc) == render_table(), "docs/settings.md's settings table is stale: run `make settings-doc`"
