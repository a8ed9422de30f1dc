"""What a server exposes and how it ends: the Host check (DNS rebinding), the API key on every
route but the open ones, bodies and disconnects, and SIGTERM mid-stream."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest
from _http import BIN, CHAT, get, metric_value, served, stop

KEY = "sk-test-key"


def _request(port: int, method: str, path: str, headers: dict, body: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1", 200),
        ("localhost:8080", 200),
        ("[::1]:8080", 200),
        ("attacker.example", 400),  # a page whose own name resolves to 127.0.0.1
        ("attacker.example:8080", 400),
    ],
)
def test_the_host_header_must_be_this_servers(port, host, status):
    code, _, body = _request(port, "GET", "/v1/models", {"Host": host})
    assert code == status, body
    if status == 400:
        assert "Host header" in json.loads(body)["error"]["message"]


def test_allowed_host_widens_what_is_answered(models):
    with served(models["two"], "--threads", "1", "--allowed-host", "chat.example") as server:
        assert _request(server.port, "GET", "/health", {"Host": "chat.example"})[0] == 200
        assert _request(server.port, "GET", "/health", {"Host": "other.example"})[0] == 400


OPEN = [("GET", "/health"), ("GET", "/"), ("HEAD", "/"), ("GET", "/static/chat.js")]
KEYED = [
    ("GET", "/v1/models"),
    ("GET", "/models"),
    ("POST", "/chat/completions"),
    ("GET", "/metrics"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/apply-template"),
    ("POST", "/v1/completions"),
]


def test_the_api_key_covers_every_route_but_the_page_and_health(models):
    with served(models["two"], "--threads", "1", "--api-key", KEY) as server:
        for method, path in OPEN:
            assert _request(server.port, method, path, {})[0] == 200, path
        for method, path in KEYED:
            code, headers, body = _request(server.port, method, path, {}, b"{}")
            assert code == 401, (path, body)
            assert headers.get("www-authenticate") == "Bearer", path
        auth = {"Authorization": f"Bearer {KEY}"}
        assert _request(server.port, "GET", "/metrics", auth)[0] == 200


APP = "http://app.example:5173"
PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def test_cross_origin_pages_are_answered_only_from_allowed_origins(models, port):
    """A browser page from an --allowed-origin may call the server (its preflight needs no key,
    its request does, and every answer carries the CORS header); another origin's may not, nor
    any by default (the chat page is the server's own origin)."""
    auth = {"Authorization": f"Bearer {KEY}", "Origin": APP}
    with served(models["two"], "-t", "1", "--api-key", KEY, "--allowed-origin", APP) as server:
        code, headers, _ = _request(server.port, "OPTIONS", "/v1/chat/completions", PREFLIGHT)
        assert code == 200 and headers.get("access-control-allow-origin") == APP, headers
        assert "authorization" in headers.get("access-control-allow-headers", "").lower()
        code, headers, _ = _request(server.port, "GET", "/v1/models", auth)
        assert code == 200 and headers.get("access-control-allow-origin") == APP
        code, headers, _ = _request(server.port, "GET", "/v1/models", {"Origin": APP})
        assert code == 401 and headers.get("access-control-allow-origin") == APP  # readable
        other = {**PREFLIGHT, "Origin": "http://other.example"}
        code, headers, _ = _request(server.port, "OPTIONS", "/v1/chat/completions", other)
        assert code == 400 and "access-control-allow-origin" not in headers
    code, headers, _ = _request(port, "GET", "/v1/models", {"Origin": APP})
    assert code == 200 and "access-control-allow-origin" not in headers
    code, headers, _ = _request(port, "OPTIONS", "/v1/chat/completions", PREFLIGHT)
    assert "access-control-allow-origin" not in headers


def test_any_origin_with_a_star(models):
    with served(models["two"], "--threads", "1", "--allowed-origin", "*") as server:
        code, headers, _ = _request(server.port, "OPTIONS", "/v1/completions", PREFLIGHT)
        assert code == 200 and headers.get("access-control-allow-origin") == "*", headers


def test_listening_everywhere_without_a_key_is_said(models):
    with served(models["two"], "--threads", "1", "--host", "0.0.0.0") as server:
        assert get(server.port, "/health")[0] == 200
    said = server.stdout.read()
    assert "every interface" in said and "without --api-key" in said, said


def test_a_chunked_body_over_the_limit_is_413(port):
    def chunks():
        for _ in range(5):
            yield b" " * 2**20

    code, _, body = _request(
        port, "POST", "/v1/completions", {"Content-Type": "application/json"}, chunks()
    )
    assert code == 413 and "over" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("path", ["/tokenize", "/completion", "/infill", "/v1/completions"])
def test_a_client_gone_in_the_middle_of_its_body_logs_nothing(models, path):
    """llama-server's routes read the body themselves: starlette's ClientDisconnect was logged as
    an unexpected error, with two tracebacks."""
    with served(models["two"], "--threads", "1") as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            'Content-Length: 1000\r\n\r\n{"content":'.encode()
        )
        time.sleep(0.3)  # the body's first bytes read, the rest never to come
        sock.close()
        time.sleep(0.3)
        assert get(server.port, "/health")[0] == 200
    said = server.stdout.read()
    assert "Traceback" not in said and "ERROR" not in said, said


def test_a_client_gone_before_its_response_is_counted_and_logs_nothing(models):
    """Counted as cancelled, and its prompt and the tokens the engine wrote for it counted too
    (they were left out: a long answer cut by its client counted 0 tokens)."""
    with served(models["two"], "--threads", "1") as server:
        name = 'onnxsample_requests_total{finish_reason="cancelled"}'
        assert name not in get(server.port, "/metrics")[1].decode()
        body = json.dumps(
            {"prompt": "Once", "max_tokens": 450, "ignore_eos": True}  # not streamed
        ).encode()
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        itl = "onnxsample_inter_token_latency_seconds_count"  # counted as tokens come
        while metric_value(server.port, itl) < 8:
            time.sleep(0.05)
        sock.close()
        deadline = time.monotonic() + 30
        while name not in get(server.port, "/metrics")[1].decode():
            assert time.monotonic() < deadline, "the cancelled request was not counted"
            time.sleep(0.1)
        while metric_value(server.port, "onnxsample_generation_tokens_total") < 9:
            assert time.monotonic() < deadline, "the cancelled request's tokens were not counted"
            time.sleep(0.1)
        assert metric_value(server.port, "onnxsample_prompt_tokens_total") > 0
    said = server.stdout.read()
    assert "Traceback" not in said and "ERROR" not in said, said


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 480}),
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 480}),
        ("/completion", {"prompt": "Once upon a time", "n_predict": 480}),
    ],
)
def test_sigterm_ends_a_running_stream_with_an_error_chunk_and_done(models, path, body):
    """With --shutdown-grace 0 the server cuts at once what still runs: the client reads an
    error chunk (and [DONE] on the OpenAI routes), never a finish that would pass for a whole
    answer; the command exits 0 and logs no traceback."""
    with served(models["two"], "--threads", "1", "--shutdown-grace", "0") as server:
        body = {**body, "stream": True, "ignore_eos": True}
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        first = response.readline()
        assert first.startswith(b"data:")
        os.kill(server.pid, signal.SIGTERM)
        rest = response.read().decode()
        conn.close()
        events = [line[5:].strip() for line in rest.splitlines() if line.startswith("data:")]
        if path.startswith("/v1/"):
            assert events.pop() == "[DONE]", rest[-500:]
        error = json.loads(events[-1])["error"]
        assert error["code"] == "unavailable" and "shutting down" in error["message"]
        assert error["type"] == "service_unavailable"
        before = [json.loads(e) for e in events[:-1]]
        assert not [e for e in before if e.get("stop") or any(
            c.get("finish_reason") for c in e.get("choices", []))], before[-2:]  # fmt: skip
        assert server.wait(60) == 0
    said = server.stdout.read()
    assert "Traceback" not in said, said


def test_open_streams_run_for_the_whole_shutdown_grace(embedded_gqa_exports):
    """--shutdown-grace 2: a stream keeps its tokens coming for 2 s after SIGTERM, then ends with
    the error chunk (it used to be cut a second early)."""
    model = embedded_gqa_exports["gguf-a4"].output
    with served(model, "--threads", "1", "--shutdown-grace", "2", startup_s=300) as server:
        body = {"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True}
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request(
            "POST", "/v1/completions", json.dumps({**body, "stream": True}),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        response = conn.getresponse()
        assert response.readline().startswith(b"data:")
        os.kill(server.pid, signal.SIGTERM)
        signalled, tokens = time.monotonic(), []
        while line := response.readline():
            if line.startswith(b"data:") and b'"error"' in line:
                cut = time.monotonic() - signalled
                break
            if line.startswith(b"data:"):
                tokens.append(time.monotonic() - signalled)
        else:
            pytest.fail("the stream ended without the shutdown's error chunk")
        conn.close()
        assert cut >= 2.0 and tokens and tokens[-1] > 1.5, (cut, tokens[-3:])
        assert server.wait(60) == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_sigterm_answers_a_running_request_503_as_its_stream_would_end(models, path):
    """A whole answer the stopping server cut is a 503 with the error its stream would end with."""
    body = {"/v1/chat/completions": {"messages": CHAT}, "/v1/completions": {"prompt": "Once"}}[path]
    with served(models["two"], "--threads", "1", "--shutdown-grace", "0") as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = {**body, "max_tokens": 480, "ignore_eos": True}
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        deadline = time.monotonic() + 60
        while metric_value(server.port, "onnxsample_slots_busy") < 1:
            assert time.monotonic() < deadline, "the request never took a slot"
            time.sleep(0.05)
        os.kill(server.pid, signal.SIGTERM)
        response = conn.getresponse()
        error = json.loads(response.read())["error"]
        conn.close()
        assert response.status == 503, error
        assert error["code"] == "unavailable" and error["type"] == "service_unavailable", error
        assert "shutting down" in error["message"]
        assert server.wait(60) == 0


def test_port_0_announces_the_port_the_system_chose(models):
    """``--port 0`` listens where the system says, and the start line names that port."""
    proc = subprocess.Popen(
        [str(BIN), "serve", str(models["two"]), "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = (proc.stdout.readline() for _ in range(50))  # progress lines first
        line = next((line for line in lines if line.startswith("serving ")), "")
        found = re.search(r"at http://localhost:(\d+)", line)
        assert found and int(found.group(1)) > 0, line
        port, deadline = int(found.group(1)), time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if get(port, "/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        assert get(port, "/health")[0] == 200
    finally:
        stop(proc)
