"""A child process that speaks JSON lines, from both ends: :class:`JsonLinesProcess` starts one and
talks to it, :func:`protocol_stdout` and :func:`sender` are the child's side.

The child writes one line once it has loaded (``{"ready": true, ...}`` or ``{"ready": false,
"error"}``), then one reply per request line; ``{"quit": true}`` ends it. Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TextIO


class JsonLinesProcess:
    """One child process; requests go in as JSON lines, replies come back the same way.
    :attr:`info` is its first line (whether it is ready)."""

    def __init__(
        self, argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None
    ) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=cwd, env=env
        )
        self.info = self.read()

    def read(self) -> dict:
        """The next line, or a failed reply when the process has exited."""
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            return {"ready": False, "ok": False, "error": f"worker exited with status {code}"}
        return json.loads(line)

    def request(self, req: dict) -> dict:
        """Send one request and wait for its reply."""
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        """Ask the process to quit; kill it if it does not within 30 s."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"quit": true}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def protocol_stdout() -> TextIO:
    """The child's side: the real stdout, kept for the protocol; from now on whatever the process
    (its libraries included) prints to stdout goes to stderr."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return reply


def sender(reply: TextIO) -> Callable[[dict], None]:
    """A function that writes one JSON line to `reply` and flushes it."""

    def send(obj: dict) -> None:
        reply.write(json.dumps(obj) + "\n")
        reply.flush()

    return send
