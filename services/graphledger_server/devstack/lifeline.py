"""Tie a dev-stack child process to the life of the `graphledger dev` process that started it.

`DevStack` stops its children in order on a clean exit. If the parent is killed outright (SIGKILL,
an OOM kill, a CI timeout), Linux's parent-death signal still sends each child SIGTERM, so no projector
or read API is left holding ports and consumer-group slots. The child arms it itself, at the very start
of the CLI, because `preexec_fn` is unsafe in a parent that runs threads (the KafkaSaver loop does).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_PID_ENV = "GRAPHLEDGER_DEV_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def arm_from_env() -> bool:
    """If started by `DevStack`, ask the kernel for SIGTERM when the parent dies; True when armed.

    Returns without arming off Linux or when the variable is absent. If the parent died before the
    signal was armed, the child sends itself SIGTERM at once (nothing is running yet, so it just ends).
    The kernel fires on the death of the parent *thread* that forked, so `DevStack` sets the variable
    only for children it starts from the main thread.
    """
    # Popped, so a process this child starts in turn does not arm itself against the wrong parent.
    parent = os.environ.pop(PARENT_PID_ENV, None)
    if not parent or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        return False
    if os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGTERM)
    return True
