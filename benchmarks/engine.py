"""The serving engine under load, and what its features cost: JSON, medians, the load average.

    python benchmarks/engine.py load      [--threads 1 2] [--clients 1 4 8 16] [--old-site DIR]
    python benchmarks/engine.py chunked   [--threads 2] [--chunks 0 64 128 256 512]
    python benchmarks/engine.py prefix    [--threads 2]
    python benchmarks/engine.py echo      [--threads 2]

``load``: closed-loop clients on the Python API. Each of N client threads sends requests one after
another (a ~50-token chat prompt, 128 new tokens, EOS ignored); we report the aggregate decode
tokens/s, time to first token (p50/p99) and inter-token latency (p50/p99). With ``--old-site`` (a
folder holding the previous release's package, see README) the same figures for the closed-batch
``Generator``: the N prompts go in one ``generate`` call and the next batch waits for it.

``chunked``: two streams decode while a 2,000-token prompt is admitted; their inter-token latency
(p50/p99/max) per prefill chunk size (0 = the whole prompt in one call).

``prefix``: a 5-turn chat, each turn's time to first token with and without prefix reuse.

``echo``: what prompt logprobs cost: a prefill that asks for them against one that does not (same
graph), and a graph composed with them against one without (nothing asked).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _machine import emit, load_average, machine, versions  # benchmarks/ is on the path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "artifacts" / "smollm2-135m-instruct-gqa-gguf-a4"
RESULTS = ROOT / "benchmarks" / "results"
MESSAGE = (
    "You are helping a friend plan a weekend trip to the mountains. Suggest a schedule for two "
    "days with hiking, food and rest, and explain briefly why each part fits."
)
NEW_TOKENS = 128


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


def _latency(ttft: list[float], gaps: list[float]) -> dict:
    return {
        "ttft_ms_p50": _pct(ttft, 50),
        "ttft_ms_p99": _pct(ttft, 99),
        "itl_ms_p50": _pct(gaps, 50),
        "itl_ms_p99": _pct(gaps, 99),
    }


def _composed(threads: int | None = None, **compose_options) -> Path:
    import onnxsample as osx

    if not compose_options:
        return osx.prepare(MODEL)
    name = "composed-" + "-".join(f"{k}{v}" for k, v in sorted(compose_options.items())) + ".onnx"
    target = MODEL / name
    if not target.is_file():
        osx.compose(MODEL, None, target, **compose_options)
    return target


# ---- load -------------------------------------------------------------------------------------


def _stream_times(events) -> tuple[float | None, list[float], int]:
    """(first token time, gaps between tokens, tokens) of one request's event iterator."""
    first, last, gaps, tokens = None, None, [], 0
    for event in events:
        if event.token_id is None:
            continue
        now = time.perf_counter()
        tokens += 1
        if first is None:
            first = now
        else:
            gaps.append(now - last)
        last = now
    return first, gaps, tokens


def run_engine_load(clients: int, threads: int, requests_per_client: int) -> dict:
    import onnxsample as osx

    params = osx.SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, ignore_eos=True)
    ttft, gaps, tokens = [], [], [0]
    lock = threading.Lock()
    with osx.Engine(_composed(), threads=threads) as engine:
        engine.submit(MESSAGE, params, max_new_tokens=4).result()  # warm-up

        def client(k: int) -> None:
            for r in range(requests_per_client):
                p = dataclasses.replace(params, seed=1000 * k + r)
                submitted = time.perf_counter()
                first, g, n = _stream_times(engine.submit(MESSAGE, p, max_new_tokens=NEW_TOKENS))
                with lock:
                    ttft.append(first - submitted)
                    gaps.extend(g)
                    tokens[0] += n

        start = time.perf_counter()
        workers = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - start
    return {
        "clients": clients,
        "threads": threads,
        "requests": clients * requests_per_client,
        "tokens": tokens[0],
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens[0] / wall, 1),
        **_latency(ttft, gaps),
    }


def run_closed_batch(clients: int, threads: int, batches: int) -> dict:
    """The previous release's closed batch: N prompts per generate(), one batch after another."""
    import onnxsample as osx

    path = MODEL / "composed-closed-batch.onnx"
    if not path.is_file():
        osx.compose(MODEL, None, path, max_slots=8, top_logprobs=20, max_bias=16)
    gen = osx.Generator(path, threads=threads)
    bias = {int(i): -100.0 for i in gen.eos_ids}  # EOS ignored, as above
    params = [
        osx.SamplingParams(
            temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=k, logit_bias=bias
        )
        for k in range(clients)
    ]
    list(gen.stream([MESSAGE], params[:1], max_new_tokens=4))  # warm-up
    ttft, gaps, tokens = [], [], 0
    start = time.perf_counter()
    for _ in range(batches):
        began, last = time.perf_counter(), {}
        for event in gen.stream([MESSAGE] * clients, params, max_new_tokens=NEW_TOKENS):
            if event.token_id is None:
                continue
            now = time.perf_counter()
            tokens += 1
            if event.index in last:
                gaps.append(now - last[event.index])
            else:
                ttft.append(now - began)
            last[event.index] = now
    wall = time.perf_counter() - start
    return {
        "clients": clients,
        "threads": threads,
        "requests": clients * batches,
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
        **_latency(ttft, gaps),
    }


def load(args) -> dict:
    rows = []
    for threads in args.threads:
        for clients in args.clients:
            per_client = max(1, args.requests // clients)
            row = {"engine": run_engine_load(clients, threads, per_client)}
            print(f"[load] engine {threads}t {clients}c: {row['engine']}", file=sys.stderr)
            if args.old_site:
                row["closed_batch"] = _in_old_site(args.old_site, clients, threads, per_client)
                print(
                    f"[load] closed {threads}t {clients}c: {row['closed_batch']}", file=sys.stderr
                )
            row["load_average"] = load_average()
            rows.append(row)
    return {"benchmark": "engine-load", "new_tokens": NEW_TOKENS, "rows": rows}


def _in_old_site(site: str, clients: int, threads: int, batches: int) -> dict:
    """Run the closed batch with the previous release's package (PYTHONPATH=site)."""
    env = {**os.environ, "PYTHONPATH": site}
    here = str(Path(__file__).parent)
    code = (
        f"import json, sys; sys.path.insert(0, {here!r}); import engine as b;"
        f"print(json.dumps(b.run_closed_batch({clients}, {threads}, {batches})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=site, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- chunked prefill --------------------------------------------------------------------------


def chunked(args) -> dict:
    import onnxsample as osx

    path = _composed()
    long_prompt = " ".join(f"Item {i} is a small grey stone." for i in range(300))
    rows = []
    for rep in range(args.repeats):
        for chunk in args.chunks:
            with osx.Engine(path, threads=args.threads[0], prefill_chunk=chunk or None) as engine:
                tokens = engine.tokenizer.encode(long_prompt)[:2000]
                params = osx.SamplingParams(temperature=0.8, seed=1, ignore_eos=True)
                engine.submit(MESSAGE, params, max_new_tokens=4).result()  # warm-up
                streams = [engine.submit(MESSAGE, params, max_new_tokens=400) for _ in range(2)]
                iterators = [iter(s) for s in streams]
                for it in iterators:
                    next(it)
                gaps: list[float] = []
                stop = threading.Event()

                def watch(it, stop=stop, gaps=gaps) -> None:
                    last = time.perf_counter()
                    for event in it:
                        now = time.perf_counter()
                        if stop.is_set():
                            break
                        if event.token_id is not None:
                            gaps.append(now - last)
                            last = now

                watchers = [threading.Thread(target=watch, args=(it,)) for it in iterators]
                for w in watchers:
                    w.start()
                time.sleep(0.3)  # the streams' steady state first
                admitted = time.perf_counter()
                late = engine.submit(tokens, osx.SamplingParams(temperature=0), max_new_tokens=1)
                done = late.result()
                window = time.perf_counter() - admitted
                stop.set()
                for s in streams:
                    s.cancel()
                for w in watchers:
                    w.join()
            # Gaps while the long prompt was being admitted: the last `window` seconds of them.
            during, acc = [], 0.0
            for g in reversed(gaps):
                if acc > window:
                    break
                during.append(g)
                acc += g
            rows.append(
                {
                    "repeat": rep,
                    "chunk": chunk,
                    "prompt_tokens": len(tokens),
                    "admission_s": round(window, 3),
                    "long_ttft_s": round(done.timings.ttft_s, 3),
                    "itl_ms_p50": _pct(during, 50),
                    "itl_ms_p99": _pct(during, 99),
                    "itl_ms_max": _pct(during, 100),
                    "load_average": load_average(),
                }
            )
            print(f"[chunked] {rows[-1]}", file=sys.stderr)
    summary = {}
    for chunk in args.chunks:
        mine = [r for r in rows if r["chunk"] == chunk]
        summary[str(chunk)] = {
            k: statistics.median(r[k] for r in mine)
            for k in ("admission_s", "long_ttft_s", "itl_ms_p50", "itl_ms_p99", "itl_ms_max")
        }
    return {"benchmark": "engine-chunked-prefill", "streams": 2, "rows": rows, "median": summary}


# ---- prefix reuse -----------------------------------------------------------------------------


QUESTIONS = [
    "I want to learn to bake bread at home. Where should I start?",
    "What flour should I buy for a first loaf?",
    "How long should the dough rise?",
    "My loaf came out dense. What went wrong?",
    "Can I freeze the bread, and how?",
]


def prefix(args) -> dict:
    import onnxsample as osx

    path = _composed()
    rows = []
    for rep in range(args.repeats):
        for reuse in (True, False):
            with osx.Engine(path, threads=args.threads[0], prefix_reuse=reuse) as engine:
                engine.submit(MESSAGE, max_new_tokens=2).result()
                chat: list[dict] = []
                for turn, question in enumerate(QUESTIONS):
                    chat.append({"role": "user", "content": question})
                    params = osx.SamplingParams(temperature=0.7, seed=turn)
                    done = engine.submit(chat, params, max_new_tokens=64).result()
                    chat.append({"role": "assistant", "content": done.text})
                    rows.append(
                        {
                            "repeat": rep,
                            "reuse": reuse,
                            "turn": turn + 1,
                            "prompt_tokens": len(done.prompt_token_ids),
                            "cached_tokens": done.timings.cached_tokens,
                            "ttft_ms": round(done.timings.ttft_s * 1000, 1),
                        }
                    )
                    print(f"[prefix] {rows[-1]}", file=sys.stderr)
    summary = {}
    for reuse in (True, False):
        for turn in range(1, len(QUESTIONS) + 1):
            mine = [r for r in rows if r["reuse"] == reuse and r["turn"] == turn]
            summary[f"{'reuse' if reuse else 'no-reuse'}-turn{turn}"] = {
                "ttft_ms": statistics.median(r["ttft_ms"] for r in mine),
                "prompt_tokens": mine[0]["prompt_tokens"],
                "cached_tokens": mine[0]["cached_tokens"],
            }
    return {
        "benchmark": "engine-prefix-reuse",
        "rows": rows,
        "median": summary,
        "load": load_average(),
    }


# ---- prompt logprobs --------------------------------------------------------------------------


def echo(args) -> dict:
    import onnxsample as osx

    with_echo = _composed()
    without = _composed(max_slots=8, top_logprobs=20, max_bias=16)
    prompt = " ".join(f"Sentence number {i} talks about rivers and hills." for i in range(50))
    asked, plain, decode = {}, {}, {"with": [], "without": []}
    for _ in range(args.repeats):
        with osx.Engine(with_echo, threads=args.threads[0]) as engine:
            ids = engine.tokenizer.encode(prompt)[:500]
            for key, params in (
                ("echo", osx.SamplingParams(temperature=0, prompt_logprobs=5)),
                ("plain", osx.SamplingParams(temperature=0)),
            ):
                engine.submit(ids, params, max_new_tokens=1).result()
                done = engine.submit(ids, params, max_new_tokens=1).result()
                asked.setdefault(key, []).append(done.timings.prefill_s)
        for key, path in (("with", with_echo), ("without", without)):
            with osx.Engine(path, threads=args.threads[0]) as engine:
                p = osx.SamplingParams(temperature=0.8, seed=3, ignore_eos=True)
                engine.submit(MESSAGE, p, max_new_tokens=4).result()
                done = engine.submit(MESSAGE, p, max_new_tokens=NEW_TOKENS).result()
                decode[key].append(done.timings.decode_tps)
                plain.setdefault(key, []).append(done.timings.prefill_s)
    med = {k: statistics.median(v) for k, v in asked.items()}
    return {
        "benchmark": "engine-prompt-logprobs",
        "prompt_tokens": 500,
        "prefill_ms_asked": round(med["echo"] * 1000, 1),
        "prefill_ms_not_asked": round(med["plain"] * 1000, 1),
        "asked_cost_ratio": round(med["echo"] / med["plain"], 3),
        "decode_tps_graph_with": round(statistics.median(decode["with"]), 1),
        "decode_tps_graph_without": round(statistics.median(decode["without"]), 1),
        "not_asked_ratio": round(
            statistics.median(decode["without"]) / statistics.median(decode["with"]), 3
        ),
        "raw": {"asked": asked, "decode_tps": decode, "chat_prefill_s": plain},
        "load": load_average(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["load", "chunked", "prefix", "echo"])
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--requests", type=int, default=16, help="requests per client count")
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 64, 128, 256, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--old-site", help="folder with the previous release's package")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args()
    if not (MODEL / "model.onnx").is_file():
        sys.exit(f"export the embedded model first: onnxsample export -o {MODEL}")
    report = {"load": load, "chunked": chunked, "prefix": prefix, "echo": echo}[args.what](args)
    report |= {
        "machine": machine(),
        "versions": versions("onnxsample", "onnxruntime", "numpy"),
        "model": MODEL.name,
    }
    output = args.output or RESULTS / f"engine_{args.what}.json"
    emit(report, output, f"engine {args.what}")


if __name__ == "__main__":
    main()
