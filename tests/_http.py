"""Real `onnxsample serve` processes on 127.0.0.1 and plain HTTP to them, for the server tests."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent / "onnxsample"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def post(port: int, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else {}
    finally:
        conn.close()


def metric(text: str, name: str) -> float:
    """A sample's value in Prometheus text."""
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


@contextmanager
def served(model: Path, *args: str, startup_s: float = 120) -> Iterator[subprocess.Popen]:
    """`onnxsample serve MODEL --port P ARGS` in its own process, up when /health answers 200
    (the process gets ``.port``); stopped with SIGTERM, which must exit 0."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ONNXSAMPLE_API_KEY"}
    proc = subprocess.Popen(
        [str(BIN), "serve", str(model), "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    proc.port = port
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server stopped: {proc.stdout.read()}")
            try:
                if get(port, "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not come up")
            time.sleep(0.2)
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then the exit status must be 0 (once; later calls do nothing)."""
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert code == 0, proc.stdout.read()


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


CHAT = [{"role": "user", "content": "Tell me about the sea."}]


def chat(client, **kwargs):
    """One chat completion of the tiny model through the `openai` client."""
    return client.chat.completions.create(model="tiny", messages=CHAT, **kwargs)


def open_chat_page(driver, port: int):
    """The chat page of the tiny model's server at `port` in `driver`, once it names the model;
    returns the page's wait (60 s)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"http://127.0.0.1:{port}/")
    wait = WebDriverWait(driver, 60)
    wait.until(lambda d: d.find_element(By.ID, "model").text == "tiny")
    return wait


def ask_chat_page(driver, wait, question: str) -> str:
    """Send `question` from the chat page; the answer's text once its timings show."""
    from selenium.webdriver.common.by import By

    timings = len(driver.find_elements(By.CSS_SELECTOR, ".timings"))
    driver.find_element(By.ID, "input").send_keys(question)
    driver.find_element(By.ID, "send").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".timings")) > timings)
    return driver.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1].text


def metric_value(port: int, name: str) -> float:
    """One sample of the server's /metrics."""
    return metric(get(port, "/metrics")[1].decode(), name)


@contextmanager
def in_process(app) -> Iterator[tuple[int, threading.Thread]]:
    """`app` served by uvicorn on a thread of this process: (port, that thread), once it is up;
    stopped on exit."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the in-process server did not come up")
            time.sleep(0.05)
        yield port, thread
    finally:
        server.should_exit = True
        thread.join(30)
