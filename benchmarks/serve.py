"""`onnxsample serve` against llama-server over HTTP, same GGUF, threads and slots: JSON.

    python benchmarks/serve.py [--threads 2] [--concurrency 1 4 8 16] [--requests 32]
    python benchmarks/serve.py --engines onnxsample replicas --concurrency 1 8 16 \
        --output benchmarks/results/serve_replicas.json     # one process vs 2 Ray Serve replicas

Closed-loop clients (threads, stdlib HTTP) stream OpenAI chat completions of a ~50-token prompt,
128 new tokens, EOS ignored; greedy and sampled (temperature 0.8, top-k 40, top-p 0.95, min-p
0.05). Per cell: aggregate completion tok/s, TTFT p50/p99, ITL p50/p99. The servers take turns, each
started fresh per mode. llama-server comes from `make llama-cpp`; without it that engine is skipped
with the reason. ``onnxsample-spec`` is `onnxsample serve --speculative ngram` (a request decoding
alone drafts every step: its n-gram draft, else its last token). ``python-api`` streams the same
requests through ``onnxsample.Engine`` in-process: what HTTP + JSON per token add. ``replicas`` is
`onnxsample serve --replicas N` (the ray extra) with the threads split between the replicas.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _harness.machine import emit, load_average, machine, versions
from _harness.measure import Stamps, closed_loop, pct
from _harness.script import RESULTS, ROOT, logger, parser
from _harness.workload import EMBEDDED_A4 as MODEL
from _harness.workload import NEW_TOKENS, SAMPLED, trip_message

sys.path.insert(0, str(ROOT / "tests"))  # _llama_cpp.py: where `make llama-cpp` builds llama.cpp
import _llama_cpp

LLAMA_SERVER = _llama_cpp.folder() / "build" / "bin" / "llama-server"
SLOTS = 8
ENGINES = ("onnxsample", "onnxsample-spec", "llama-server", "replicas", "python-api")
MODES = {"greedy": {"temperature": 0.0}, "sampled": SAMPLED}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(port: int, proc: subprocess.Popen, path: str = "/health") -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server stopped with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the server did not come up")


def _start(
    engine: str, threads: int, replicas: int, chunk: int | None = None
) -> tuple[subprocess.Popen, int]:
    """One server on a free port: `threads` in all (split between the replicas); `chunk` is our
    servers' --prefill-chunk (None: their default)."""
    port = _port()
    if engine in ("onnxsample", "onnxsample-spec", "replicas"):
        argv = [str(Path(sys.executable).parent / "onnxsample"), "serve", str(MODEL)]
        argv += ["--port", str(port), "--max-queue", "1024"]
        if chunk is not None:
            argv += ["--prefill-chunk", str(chunk)]
        if engine == "onnxsample-spec":
            argv += ["--speculative", "ngram"]
        if engine != "replicas":
            argv += ["--threads", str(threads)]
        else:
            each = max(1, threads // replicas)
            argv += ["--replicas", str(replicas), "--threads", str(each)]
            argv += ["--replica-cpus", str(each)]
    else:
        from onnxsample.exporters import embedded_gguf

        argv = [str(LLAMA_SERVER), "-m", str(embedded_gguf()), "--port", str(port)]
        argv += [
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-np",
            str(SLOTS),
            "-c",
            str(SLOTS * 1024),
        ]
        argv += ["--log-disable"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(port, proc)
    return proc, port


def _stream(port: int, body: dict) -> tuple[float, list[float], int]:
    """(TTFT, gaps between content chunks, completion tokens) of one streamed chat request."""
    data = json.dumps(body).encode()
    stamps = Stamps()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", data, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:200]!r}")
    tokens = None
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                stamps.tick()
    conn.close()
    return stamps.ttft, stamps.gaps, stamps.count if tokens is None else tokens


def _model(port: int) -> str:
    """The name the server answers to (its first model)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/v1/models")
    return json.loads(conn.getresponse().read())["data"][0]["id"]


def _load(port: int, mode: str, clients: int, requests: int) -> dict:
    model = _model(port)

    def one(k: int, r: int) -> tuple[float, list[float], int]:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": trip_message(k, r)}],
            "max_tokens": NEW_TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "seed": 1000 * k + r,
            **MODES[mode],
        }
        return _stream(port, body)

    return closed_loop(clients, max(1, requests // clients), one)


def _python_api(threads: int, mode: str, repeats: int) -> dict:
    """One client through the Python API: the same chat, streamed from `Engine` in this process."""
    import onnxsample as osx

    ttft, gaps = [], []
    params = {k: v for k, v in MODES[mode].items()}
    with osx.Engine(osx.prepare(MODEL), threads=threads) as engine:
        for r in range(repeats + 1):
            chat = [{"role": "user", "content": trip_message(0, r)}]
            p = osx.SamplingParams(**params, seed=r, ignore_eos=True)
            stamps = Stamps()
            for event in engine.submit(chat, p, max_new_tokens=NEW_TOKENS):
                if event.text:
                    stamps.tick()
            if r:  # the first request warms up
                ttft.append(stamps.ttft)
                gaps.extend(stamps.gaps)
    return {
        "clients": 1,
        "ttft_ms_p50": pct(ttft, 50),
        "itl_ms_p50": pct(gaps, 50),
        "itl_ms_p99": pct(gaps, 99),
    }


def _warm_up(port: int) -> None:
    """A few short requests at once, so every replica has served its first."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": True}
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: _stream(port, body), range(4)))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--requests", type=int, default=32, help="requests per cell")
    p.add_argument(
        "--engines",
        nargs="+",
        choices=ENGINES,
        default=["onnxsample", "llama-server", "python-api"],
        help="replicas: onnxsample serve --replicas on Ray Serve, the threads split between them",
    )
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help="our servers' --prefill-chunk (default: theirs)",
    )
    p.add_argument("--output", default=str(RESULTS / "serve.json"))
    args = p.parse_args()
    log = logger("serve")
    engines = [e for e in args.engines if e != "python-api"]
    skipped = {}
    if "llama-server" in engines and not LLAMA_SERVER.is_file():
        skipped["llama-server"] = f"not built: make llama-cpp ({LLAMA_SERVER})"
        engines.remove("llama-server")
    rows = []
    for mode in MODES:
        for engine in engines:
            proc, port = _start(engine, args.threads, args.replicas, args.prefill_chunk)
            try:
                _warm_up(port)
                for clients in args.concurrency:
                    row = {
                        "engine": engine,
                        "mode": mode,
                        **_load(port, mode, clients, args.requests),
                    }
                    row["load_average"] = load_average()
                    log(row)
                    rows.append(row)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
        if "python-api" in args.engines:
            api = {"engine": "python-api", "mode": mode, **_python_api(args.threads, mode, 5)}
            log(api)
            rows.append(api)
    report = {
        "benchmark": "serve",
        "threads": args.threads,
        "replicas": args.replicas if "replicas" in engines else None,
        "slots": SLOTS,
        "prefill_chunk": args.prefill_chunk,
        "new_tokens": NEW_TOKENS,
        "rows": rows,
        "skipped": skipped,
        "machine": machine(),
        "versions": versions("onnxsample", "onnxruntime", "fastapi", "uvicorn", "ray"),
        "environment": {"cpu_count": os.cpu_count()},
    }
    emit(report, args.output, "serve")


if __name__ == "__main__":
    main()
