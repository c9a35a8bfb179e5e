"""examples/agent.py really runs against the dev stack: as a separate process, configured only through the
environment, like a pod. The example's manifests and environment file are checked in `unit/test_examples.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from graphledger.settings import Settings
from graphledger_server.devstack.stack import DevStack

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PREFIX = str(Settings.model_config.get("env_prefix", ""))
AGENT_TIMEOUT_S = 120


def test_the_example_agent_runs_against_the_stack(stack: DevStack) -> None:
    """Two runs of examples/agent.py on one thread: the second reads the first's turn back."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(PREFIX)}
    env.update(stack.client_env())
    thread = f"example-{uuid.uuid4().hex[:8]}"
    outputs = []
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, str(EXAMPLES / "agent.py"), "--thread-id", thread],
            env=env,
            capture_output=True,
            text=True,
            timeout=AGENT_TIMEOUT_S,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        outputs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    assert [out["turns"] for out in outputs] == [1, 2]
    assert all(out["thread_id"] == thread for out in outputs)
    assert outputs[0]["checkpoint_id"] != outputs[1]["checkpoint_id"]
