"""What a dev stack's services logged at WARNING or above since a moment: attached to a failing test's
report (`conftest.py`), so a CI run that shows only its output still says what the services saw."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

LEVELS = frozenset({"WARNING", "ERROR", "CRITICAL"})
LINES_PER_SERVICE = 15


def warnings_since(log_dir: Path, since: float, per_service: int = LINES_PER_SERVICE) -> str:
    """The last `per_service` WARNING+ lines of each service log in `log_dir` stamped at or after `since`
    (epoch seconds), each file's count first; "" when there are none."""
    parts = []
    for path in sorted(log_dir.glob("*.log")):
        lines = [line for line in _read(path) if _warning_since(line, since)]
        if lines:
            shown = min(len(lines), per_service)
            parts.append(f"{path.name}: {len(lines)} lines at WARNING or above, the last {shown}:")
            parts.extend(lines[-per_service:])
    return "\n".join(parts)


def _read(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _warning_since(line: str, since: float) -> bool:
    try:
        entry = json.loads(line)
        return entry["level"] in LEVELS and datetime.fromisoformat(entry["time"]).timestamp() >= since
    except (ValueError, KeyError, TypeError):
        return False  # not one of the services' JSON lines (the broker's own output)
