"""Runs a page's examples in order in the current directory: ``python _run_page.py BLOCKS.json PORT``.

Python blocks share one namespace (as a notebook does); bash blocks run with ``bash -euo
pipefail``; a block that only starts ``onnxsample serve ... --port 8080`` runs in the background
until the next one or the end, and every 8080 of the page is `PORT`. Prints each block's seconds;
exits 1 naming the first block that failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _wait_healthy(proc: subprocess.Popen, port: int, where: str, limit_s: float = 600) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{where}: the server exited with {proc.returncode} before it was up")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{where}: the server was not up after {limit_s:.0f} s")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    listing = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    port = int(sys.argv[2])
    namespace: dict = {"__name__": "__main__"}
    server: subprocess.Popen | None = None
    try:
        for block in listing:
            where, code = block["where"], block["code"].replace("8080", str(port))
            started = time.monotonic()
            print(f"::: {where} ({block['language']})", flush=True)
            if block["serves"]:
                _stop(server)
                server = subprocess.Popen(["bash", "-c", f"exec {code}"], start_new_session=True)
                _wait_healthy(server, port, where)
            elif block["language"] == "bash":
                done = subprocess.run(["bash", "-euo", "pipefail", "-c", code])
                if done.returncode:
                    raise SystemExit(f"{where}: the bash block exited with {done.returncode}")
            else:
                try:
                    exec(compile(code, where, "exec"), namespace)
                except BaseException as exc:
                    import traceback

                    traceback.print_exc()
                    raise SystemExit(f"{where}: the python block raised {exc!r}") from None
            print(f"::: {where} took {time.monotonic() - started:.1f} s", flush=True)
    finally:
        _stop(server)


if __name__ == "__main__":
    main()
