"""Failpoints: crash the process at a named point, to test crash safety for real.

`RATCHET_FAILPOINT=round2:diagnose` makes the process kill itself with SIGKILL right after the stage `diagnose` of
round 2 has written its state (no cleanup, no finally blocks: exactly what `kill -9` does). Unset, it costs one
environment lookup per stage."""

from __future__ import annotations

import os
import signal


def failpoint(name: str) -> None:
    if os.environ.get("RATCHET_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
