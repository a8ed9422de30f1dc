"""`onnxsample serve --replicas 2` as clients meet it: a local Ray started by the command, two
replicas of the embedded model at half a CPU and one ORT thread each, the official `openai` client
through Ray Serve's proxy; and nothing of Ray left once the command stops."""

from __future__ import annotations

import collections
import concurrent.futures
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from _http import BIN, alive, descendants, free_port, get, metric, served, stop

pytest.importorskip("ray.serve", reason="the ray extra is not installed: pip install '.[ray]'")

ARGS = ("--threads", "1", "--served-model-name", "smol")
RAY = ("--replicas", "2", "--replica-cpus", "0.5", "--max-queue", "24")
QUESTIONS = [f"In one sentence, what is {thing}?" for thing in ("rain", "a river", "snow", "fog")]


@pytest.fixture(scope="module")
def model(embedded_exact_export):
    """The exact-attention export: its sequences get the same tokens alone and batched, so the
    replicas (each batching its share) answer as one process answering one request at a time."""
    return embedded_exact_export.output


@pytest.fixture(scope="module")
def replicas(model):
    """The command, its port, and every process it started (read once the replicas are up)."""
    with served(model, *ARGS, *RAY, startup_s=300) as proc:
        proc.started = descendants(proc.pid)
        yield proc


def _client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


def _ask(client: openai.OpenAI, i: int) -> tuple[str, str | None]:
    """(text, replica) of one streamed chat, its seed its own."""
    raw = client.chat.completions.with_raw_response.create(
        model="smol",
        messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
        max_tokens=16,
        temperature=0.9,
        top_p=0.95,
        seed=500 + i,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    return text, raw.headers.get("x-onnxsample-replica")


def test_32_streams_through_both_replicas_as_one_process_answers(replicas, model):
    client = _client(replicas.port)
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        spread = list(pool.map(lambda i: _ask(client, i), range(32)))
    assert all(text for text, _ in spread)
    assert len({name for _, name in spread}) == 2, "one replica served everything"
    with served(model, *ARGS) as single:
        alone = [_ask(_client(single.port), i)[0] for i in range(32)]
    assert [text for text, _ in spread] == alone


def test_health_models_metrics_and_page_through_the_proxy(replicas):
    assert get(replicas.port, "/health")[0] == 200
    status, body = get(replicas.port, "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "smol"
    status, body = get(replicas.port, "/metrics")
    assert status == 200 and b"onnxsample_slots_busy" in body
    status, body = get(replicas.port, "/")
    assert status == 200 and b"<html" in body.lower()


def _slots_busy_everywhere(port: int) -> dict[str, float]:
    """onnxsample_slots_busy per replica, asking until both have answered. Serve's router sends
    each request to the less busy of the two replicas, so a replica is asked only while neither
    holds more requests than the other."""
    seen: dict[str, float] = {}
    for _ in range(40):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode()
        seen[response.getheader("x-onnxsample-replica")] = metric(text, "onnxsample_slots_busy")
        conn.close()
        if len(seen) == 2:
            break
    return seen


def _long_stream(port: int) -> tuple[socket.socket, str]:
    """A long streamed completion left open once its first tokens came: (socket, replica)."""
    body = json.dumps({"model": "smol", "prompt": "Once upon a time", "max_tokens": 400,
                       "stream": True, "ignore_eos": True}).encode()  # fmt: skip
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    seen = b""
    while seen.count(b"data:") < 4:
        chunk = sock.recv(4096)
        assert chunk, f"the stream ended early: {seen!r}"
        seen += chunk
    head = seen.split(b"\r\n\r\n", 1)[0].decode().lower().splitlines()
    replica = next(line.split(":", 1)[1].strip() for line in head
                   if line.startswith("x-onnxsample-replica:"))  # fmt: skip
    return sock, replica


def test_a_client_that_goes_away_frees_its_replicas_slot(replicas):
    """Both replicas stream as many requests as each other (so /metrics reaches both); the
    clients of one go away and its slots free while the other's still stream."""
    streams: list[tuple[socket.socket, str]] = []
    while (
        len(held := collections.Counter(name for _, name in streams)) < 2
        or len(set(held.values())) > 1
    ):
        assert len(streams) < 8, f"Serve put every stream on one replica: {held}"
        streams.append(_long_stream(replicas.port))
    try:
        assert _slots_busy_everywhere(replicas.port) == {n: float(c) for n, c in held.items()}
        gone = min(held)
        for sock, name in streams:
            if name == gone:
                sock.close()
        deadline = time.monotonic() + 60
        while (busy := _slots_busy_everywhere(replicas.port)).get(gone, -1) != 0:
            assert time.monotonic() < deadline, f"{gone}'s slots stayed busy: {busy}"
            time.sleep(0.2)
    finally:
        for sock, _ in streams:
            sock.close()
    deadline = time.monotonic() + 60
    while sum((busy := _slots_busy_everywhere(replicas.port)).values()) > 0:
        assert time.monotonic() < deadline, f"a slot stayed busy: {busy}"
        time.sleep(0.2)


def test_a_client_that_gives_up_on_a_whole_answer_frees_its_slot(replicas):
    """Not streamed: Serve cancels the replica's handler when its client goes, and the request
    goes with it (it ran on to its 3,000 tokens for nobody, its slot taken for a minute and
    more)."""
    body = json.dumps({"model": "smol", "prompt": "Once upon a time", "max_tokens": 3000,
                       "ignore_eos": True}).encode()  # fmt: skip
    sock = socket.create_connection(("127.0.0.1", replicas.port), timeout=60)
    try:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 60
        while sum(_slots_busy_everywhere(replicas.port).values()) < 1:
            assert time.monotonic() < deadline, "the request never took a slot"
            time.sleep(0.2)
    finally:
        sock.close()
    deadline = time.monotonic() + 30
    while sum((busy := _slots_busy_everywhere(replicas.port)).values()) > 0:
        assert time.monotonic() < deadline, f"the slot stayed busy: {busy}"
        time.sleep(0.2)


def test_an_overload_burst_is_refused_at_once_not_left_hanging(replicas):
    """2 replicas x 8 slots, 24 waiting at the proxy: of 80 long requests at once, the rest are
    refused with 503 (Serve's queue) or 429 (a replica's), none time out."""
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{replicas.port}/v1", api_key="none", max_retries=0, timeout=300
    )

    def one(i: int) -> int:
        try:
            client.completions.create(model="smol", prompt="Count: 1, 2, 3,", max_tokens=48,
                                      seed=i, extra_body={"ignore_eos": True})  # fmt: skip
            return 200
        except openai.APIStatusError as exc:
            return exc.status_code

    with concurrent.futures.ThreadPoolExecutor(80) as pool:
        codes = list(pool.map(one, range(80)))
    refused = [c for c in codes if c in (429, 503)]
    assert codes.count(200) >= 16 and refused, codes
    assert set(codes) <= {200, 429, 503}, codes


def test_stopping_the_command_stops_every_ray_process_it_started(replicas):
    started = replicas.started
    assert any("raylet" in _cmdline(p) for p in started), "no raylet among the command's children"
    stop(replicas)
    deadline = time.monotonic() + 30
    while left := [p for p in started if alive(p)]:
        assert time.monotonic() < deadline, [_cmdline(p) for p in left]
        time.sleep(0.5)


def _in_session(leader: int) -> list[int]:
    """The processes running in `leader`'s session (Ray's daemons too, once orphaned)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split() if stat else []
        if fields and int(fields[3]) == leader and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize(
    ("sig", "phase"),
    [(signal.SIGINT, "ray"), (signal.SIGTERM, "ray"), (signal.SIGINT, "replicas"),
     (signal.SIGTERM, "replicas")],
    ids=["ctrl-c-ray", "sigterm-ray", "ctrl-c-replicas", "sigterm-replicas"],
)  # fmt: skip
def test_a_signal_while_ray_starts_stops_everything(model, sig, phase):
    """Ctrl-C in Ray's start was ignored (the command went on to serve), SIGTERM there left
    Ray's agents running, and while the replicas loaded either waited for them: each stops the
    command, and every process it started, at once."""
    command = [str(BIN), "serve", str(model), *ARGS, *RAY, "--port", str(free_port())]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in proc.stderr:  # the model is composed: Ray's start is next
            if line.startswith("starting 2 replicas"):
                break
        time.sleep(2)
        deadline = time.monotonic() + 120
        while phase == "replicas" and not any(
            "ServeReplica" in _cmdline(p) for p in _in_session(proc.pid)
        ):
            assert time.monotonic() < deadline and proc.poll() is None, "no replica started"
            time.sleep(0.1)
        proc.send_signal(sig)
        assert proc.wait(timeout=120) == 0
        said = proc.stderr.read()
        assert "Traceback" not in said, said
    finally:
        proc.kill()
        proc.stderr.close()
    deadline = time.monotonic() + 30
    while left := _in_session(proc.pid):
        assert time.monotonic() < deadline, [_cmdline(p) for p in left]
        time.sleep(0.5)


def test_joining_a_running_cluster_serves_and_leaves_it_running(model):
    """The README's cluster recipe on one node: `ray start --head`, then `--ray-address`."""
    ray = str(BIN.parent / "ray")
    gcs = free_port()
    head = [ray, "start", "--head", f"--port={gcs}", "--num-cpus=1", "--disable-usage-stats",
            "--include-dashboard=false"]  # fmt: skip
    subprocess.run(head, check=True, capture_output=True, timeout=300)
    try:
        address = ("--ray-address", f"127.0.0.1:{gcs}", "--replicas", "1", "--replica-cpus", "0.5")
        with served(model, *ARGS, *address, startup_s=300) as proc:
            status, body = get(proc.port, "/v1/models")
            assert status == 200 and json.loads(body)["data"][0]["id"] == "smol"
        env = {**os.environ, "RAY_AUTH_MODE": "token"}
        alive_after = subprocess.run([ray, "status", "--address", f"127.0.0.1:{gcs}"],
                                     capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert alive_after.returncode == 0 and "Active" in alive_after.stdout, alive_after.stderr
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=300)


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "2", "--min-replicas", "3", "--max-replicas", "2"], "min_replicas <= replicas"),
        (["--min-replicas", "1"], "both min_replicas and max_replicas"),
        (["--max-replicas", "2"], "both min_replicas and max_replicas"),
        (["--replicas", "2", "--target-ongoing-requests", "3"], "an autoscaling target"),
        # a replica's option without replicas, and one process's with them: refused, not ignored
        (["--replica-cpus", "2"], "--replica-cpus is for Ray Serve replicas: give --replicas"),
        (["--target-ongoing-requests", "3"], "--target-ongoing-requests is for Ray Serve"),
        (["--replicas", "2", "--shutdown-grace", "1"], "--shutdown-grace is for one server process"),
        (["--replicas", "2", "--max-queue", "0"], "waiting at Ray Serve's proxy: at least 1"),
        (["--replicas", "2", "--port", "{taken}"], "cannot listen on 127.0.0.1:"),
        (["--replicas", "2", "--max-len", "100000"], "max_len must be at most the model's context"),
    ],
    ids=["min-over-max", "min-without-max", "max-without-min", "target-without-autoscaling",
         "cpus-without-replicas", "target-without-replicas", "grace-with-replicas",
         "no-queue", "port-taken", "max-len-past-context"],
)  # fmt: skip
def test_bad_scaling_is_one_line_and_exit_1(model, args, message):
    """Refused before Ray starts (a taken port failed 15 s later in a traceback; a bad max_len in
    every replica, its cause left in Ray's logs)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = [str(taken.getsockname()[1]) if a == "{taken}" else a for a in args]
        done = subprocess.run([str(BIN), "serve", str(model), *args], capture_output=True,
                              text=True)  # fmt: skip
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr
    assert "starting" not in done.stderr, "Ray was started"


def test_without_the_ray_extra_replicas_name_the_extra(model):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from onnxsample.cli import main\n"
        f"main(['serve', {str(model)!r}, '--replicas', '2'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert "pip install 'onnxsample[ray]'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        ({"replicas": "2", "cpus": "0.5", "threads": "1"},
         {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.5}, "max_ongoing_requests": 8,
          "max_queued_requests": 256}),
        ({"replicas": "3", "max_queued": "16", "served_model_name": "smol"},
         {"num_replicas": 3, "max_queued_requests": 16}),
        ({"allowed_hosts": "Chat.example, api.example", "cuda_graph": "false",
          "allowed_origins": "http://App.example:5173"},
         {"num_replicas": 1}),
        ({"chat_template": "{{ messages[0].content }}"}, {"num_replicas": 1}),
    ],
    ids=["half-cpu", "queue-and-name", "hosts-and-flags", "chat-template"],
)  # fmt: skip
def test_app_builder_sets_the_deployment(model, args, expect):
    from onnxsample.serve.replicas import app_builder

    deployment = app_builder({"model": str(model / "composed.onnx"), **args})._bound_deployment
    for key, value in expect.items():
        assert getattr(deployment, key) == value, key
    options = deployment.init_args[0]
    assert Path(options.model).is_absolute() and options.served_model_name == args.get(
        "served_model_name", model.name
    )
    if "allowed_hosts" in args:  # typed as the fields are, not left as strings
        assert options.allowed_hosts == frozenset({"chat.example", "api.example"})
        assert options.cuda_graph is False
        assert options.allowed_origins == frozenset({"http://app.example:5173"})
    assert options.chat_template == args.get("chat_template")


def test_app_builder_autoscales_between_min_and_max(model):
    from onnxsample.serve.replicas import app_builder

    app = app_builder({"model": str(model / "composed.onnx"), "replicas": "2",
                       "min_replicas": "1", "max_replicas": "4", "target_ongoing_requests": "6"})  # fmt: skip
    scaling = app._bound_deployment._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.initial_replicas, scaling.max_replicas) == (1, 2, 4)
    assert scaling.target_ongoing_requests == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"replicas": "2"}, "needs model=PATH"),
        ({"model": "M", "replica": "2"}, "got replica"),
        ({"model": "M", "replicas": "two"}, "'two' is not int"),
        ({"model": "M", "cpus": "0"}, "replica cpus must be > 0"),
        ({"model": "M", "min_replicas": "1"}, "both min_replicas and max_replicas"),
        (
            {"model": "M", "speculative": "ngram", "draft_tokens": "9"},
            r"draft_tokens must be in \[1, 8\]",
        ),
        ({"model": "M", "speculative": "eagle"}, "speculative must be 'ngram'"),
        ({"model": "M", "cuda_graph": "maybe"}, "'maybe' is not true or false"),
        ({"model": "M", "cuda_graph": "true"}, "cuda_graph needs a static sampler chain"),
        ({"model": "M", "row_buckets": "false"}, "row_buckets=False needs cuda_graph"),
        ({"model": "M", "chat_template": "chatml"}, "neither a file nor jinja text"),
        ({"model": "M", "allowed_origins": "app.example"}, "'app.example' is not an origin"),
        ({"model": "M", "threads": "0"}, "threads must be an integer >= 1, got 0"),
        ({"model": "M", "max_len": "-5"}, "max_len must be None or an integer >= 2, got -5"),
        ({"model": "M", "max_len": "100000"}, r"at most the model's context \(8192 positions\)"),
        ({"model": "M", "prefill_chunk": "-1"}, "prefill_chunk must be None or an integer >= 1"),
    ],
    ids=[
        "no-model",
        "unknown-key",
        "not-a-number",
        "no-cpus",
        "half-autoscaling",
        "draft-tokens",
        "method",
        "not-a-bool",
        "cuda-graph-branching",
        "fixed-rows-uncaptured",
        "chat-template-name",
        "origin-without-scheme",
        "no-threads",
        "negative-max-len",
        "max-len-past-context",
        "negative-prefill-chunk",
    ],
)
def test_app_builder_refuses_bad_arguments(model, args, message):
    from onnxsample.errors import InvalidParameter
    from onnxsample.serve.replicas import app_builder

    args = {k: (str(model / "composed.onnx") if v == "M" else v) for k, v in args.items()}
    with pytest.raises(InvalidParameter, match=message):
        app_builder(args)
