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
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from _harness.machine import RUNTIME_PACKAGES, emit, load_average, machine, versions
from _harness.measure import Stamps, closed_loop, latency, pct
from _harness.script import RESULTS, logger, parser
from _harness.workload import EMBEDDED_A4 as MODEL
from _harness.workload import MESSAGE, NEW_TOKENS, SAMPLED, closed_batch_graph, trip_message


def _composed() -> Path:
    """The embedded model composed as ``onnxsample run`` composes it."""
    import onnxsample as osx

    return osx.prepare(MODEL)


# ---- load -------------------------------------------------------------------------------------


def _stream_times(events) -> Stamps:
    """When each token of one request's event iterator arrived."""
    stamps = Stamps()
    for event in events:
        if event.token_id is not None:
            stamps.tick()
    return stamps


def run_engine_load(
    clients: int, threads: int, requests_per_client: int, chunk: int | None = None
) -> dict:
    import onnxsample as osx

    params = osx.SamplingParams(**SAMPLED, ignore_eos=True)
    options = {} if chunk is None else {"prefill_chunk": chunk}
    with osx.Engine(_composed(), threads=threads, **options) as engine:
        engine.submit(MESSAGE, params, max_new_tokens=4).result()  # warm-up

        def one(k: int, r: int) -> tuple[float, list[float], int]:
            p = dataclasses.replace(params, seed=1000 * k + r)
            stamps = _stream_times(engine.submit(trip_message(k, r), p, max_new_tokens=NEW_TOKENS))
            return stamps.ttft, stamps.gaps, stamps.count

        return {"threads": threads, **closed_loop(clients, requests_per_client, one)}


def run_closed_batch(clients: int, threads: int, batches: int) -> dict:
    """The previous release's closed batch: N prompts per generate(), one batch after another."""
    import onnxsample as osx

    gen = osx.Generator(closed_batch_graph(MODEL), threads=threads)
    bias = {int(i): -100.0 for i in gen.eos_ids}  # EOS ignored, as above
    params = [osx.SamplingParams(**SAMPLED, seed=k, logit_bias=bias) for k in range(clients)]
    list(gen.stream([MESSAGE], params[:1], max_new_tokens=4))  # warm-up
    ttft, gaps, tokens = [], [], 0
    start = time.perf_counter()
    for b in range(batches):
        began, last = time.perf_counter(), {}
        messages = [trip_message(k, b) for k in range(clients)]
        for event in gen.stream(messages, params, max_new_tokens=NEW_TOKENS):
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
        **latency(ttft, gaps),
    }


def load(args: argparse.Namespace) -> dict:
    """Each cell runs in a fresh process, the engine and the closed batch one after the other."""
    log = logger("load")
    rows = []
    for rep in range(args.repeats):
        for threads in args.threads:
            for clients in args.clients:
                per_client = max(1, args.requests // clients)
                row = {"repeat": rep}
                row["engine"] = _in_process("run_engine_load", clients, threads, per_client)
                if args.old_site:
                    row["closed_batch"] = _in_old_site(args.old_site, clients, threads, per_client)
                row["load_average"] = load_average()
                log(row)
                rows.append(row)
    keys = ("tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99")
    median = []
    for threads in args.threads:
        for clients in args.clients:
            cell = [
                r
                for r in rows
                if (r["engine"]["threads"], r["engine"]["clients"]) == (threads, clients)
            ]
            entry: dict = {"threads": threads, "clients": clients}
            for kind in ("engine", "closed_batch"):
                if kind in cell[0]:
                    entry[kind] = {k: statistics.median(r[kind][k] for r in cell) for k in keys}
            median.append(entry)
    return {"benchmark": "engine-load", "new_tokens": NEW_TOKENS, "rows": rows, "median": median}


def _in_old_site(site: str, clients: int, threads: int, batches: int) -> dict:
    """Run the closed batch with the previous release's package (PYTHONPATH=site)."""
    return _in_process("run_closed_batch", clients, threads, batches, site=site)


# ---- chunked prefill --------------------------------------------------------------------------


def chunked(args: argparse.Namespace) -> dict:
    """Two streams decode; a 2,000-token prompt arrives. Every gap between two tokens of a stream
    that overlaps the admission (from submission to the long prompt's first token) counts, the
    one that spans a whole unchunked prefill included. Each run is a fresh process, so that no
    run inherits another's memory (fresh pages are slow to fault in on a VM)."""
    log = logger("chunked")
    rows = []
    for rep in range(args.repeats):
        for chunk in args.chunks:
            row = _in_process("_chunked_once", chunk, args.threads[0])
            rows.append({"repeat": rep, **row, "load_average": load_average()})
            log(rows[-1])
    summary = {}
    for chunk in args.chunks:
        mine = [r for r in rows if r["chunk"] == chunk]
        summary[str(chunk)] = {
            k: statistics.median(r[k] for r in mine)
            for k in (
                "admission_s",
                "stream_tokens_during",
                "itl_ms_p50",
                "itl_ms_p99",
                "itl_ms_max",
            )
        }
    return {"benchmark": "engine-chunked-prefill", "streams": 2, "rows": rows, "median": summary}


def _in_process(function: str, *arguments, site: str | None = None) -> dict:
    """Run one of this module's functions in a fresh Python (with the package from `site`, if
    given) and return the JSON it prints."""
    here = str(Path(__file__).parent)
    call = ", ".join(repr(a) for a in arguments)
    code = (
        f"import json, sys; sys.path.insert(0, {here!r}); import engine as b;"
        f"print(json.dumps(b.{function}({call})))"
    )
    env = {**os.environ, "PYTHONPATH": site} if site else None
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=site or here,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _chunked_once(chunk: int, threads: int) -> dict:
    import onnxsample as osx

    long_prompt = " ".join(f"Item {i} is a small grey stone." for i in range(300))
    with osx.Engine(_composed(), threads=threads, prefill_chunk=chunk or None) as engine:
        tokens = engine.tokenizer.encode(long_prompt)[:2000]
        params = osx.SamplingParams(temperature=0.8, seed=1, ignore_eos=True)
        engine.submit(MESSAGE, params, max_new_tokens=4).result()  # warm-up
        streams = [engine.submit(MESSAGE, params, max_new_tokens=2000) for _ in range(2)]
        times: list[list[float]] = [[], []]
        finished = threading.Event()

        def watch(request, mine, finished=finished) -> None:
            after = 0
            for event in request:
                if event.token_id is not None:
                    mine.append(time.perf_counter())
                    after += finished.is_set()
                if after >= 2:  # one full gap after the admission ended
                    request.cancel()

        watchers = [
            threading.Thread(target=watch, args=(s, t)) for s, t in zip(streams, times, strict=True)
        ]
        for w in watchers:
            w.start()
        time.sleep(0.5)  # the streams' steady state first
        admitted = time.perf_counter()
        late = engine.submit(tokens, osx.SamplingParams(temperature=0), max_new_tokens=1)
        late.result()
        ended = time.perf_counter()
        finished.set()
        for w in watchers:
            w.join()
    spans = [
        (a, b) for mine in times for a, b in itertools.pairwise(mine) if b > admitted and a < ended
    ]
    during = [b - a for a, b in spans]
    worst = sorted(spans, key=lambda ab: ab[0] - ab[1])[:2]
    return {
        "chunk": chunk,
        "prompt_tokens": len(tokens),
        "admission_s": round(ended - admitted, 3),
        "stream_tokens_during": len(during),
        "itl_ms_p50": pct(during, 50),
        "itl_ms_p99": pct(during, 99),
        "itl_ms_max": pct(during, 100),
        "worst_gaps_s_after_submit": [[round(a - admitted, 3), round(b - a, 3)] for a, b in worst],
    }


# ---- prefix reuse -----------------------------------------------------------------------------


QUESTIONS = [
    "I want to learn to bake bread at home. Where should I start?",
    "What flour should I buy for a first loaf?",
    "How long should the dough rise?",
    "My loaf came out dense. What went wrong?",
    "Can I freeze the bread, and how?",
]


def prefix(args: argparse.Namespace) -> dict:
    import onnxsample as osx

    log = logger("prefix")
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
                    log(rows[-1])
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


def echo(args: argparse.Namespace) -> dict:
    """Prompt logprobs: a 500-token prefill asking for them vs not (same graph, no prefix reuse),
    and decode steps of a graph composed with them vs without (nothing asked). The variants
    alternate within each repetition, so machine noise hits both alike."""
    import onnxsample as osx

    paths = {"with": _composed(), "without": closed_batch_graph(MODEL)}
    engines = {
        k: osx.Engine(p, threads=args.threads[0], prefix_reuse=False) for k, p in paths.items()
    }
    prompt = " ".join(f"Sentence number {i} talks about rivers and hills." for i in range(50))
    ids = engines["with"].tokenizer.encode(prompt)[:500]
    asks = {
        "asked": osx.SamplingParams(temperature=0, prompt_logprobs=5),
        "not_asked": osx.SamplingParams(temperature=0),
    }
    sampled = osx.SamplingParams(temperature=0.8, seed=3, ignore_eos=True)
    prefill: dict[str, list[float]] = {k: [] for k in asks}
    step: dict[str, list[float]] = {k: [] for k in engines}
    for e in engines.values():
        e.submit(MESSAGE, sampled, max_new_tokens=8).result()  # warm-up
    for rep in range(args.repeats):
        order = list(asks) if rep % 2 == 0 else list(reversed(asks))
        for key in order:
            done = engines["with"].submit(ids, asks[key], max_new_tokens=1).result()
            prefill[key].append(done.timings.prefill_s)
        order = list(engines) if rep % 2 == 0 else list(reversed(engines))
        for key in order:
            done = engines[key].submit(MESSAGE, sampled, max_new_tokens=NEW_TOKENS).result()
            step[key].append(done.timings.decode_s / (len(done.token_ids) - 1))
    for e in engines.values():
        e.close()
    pre = {k: statistics.median(v) for k, v in prefill.items()}
    dec = {k: statistics.median(v) for k, v in step.items()}
    return {
        "benchmark": "engine-prompt-logprobs",
        "threads": args.threads[0],
        "repeats": args.repeats,
        "prompt_tokens": len(ids),
        "prefill_ms_asked": round(pre["asked"] * 1000, 1),
        "prefill_ms_not_asked": round(pre["not_asked"] * 1000, 1),
        "asked_cost_ratio": round(pre["asked"] / pre["not_asked"], 3),
        "decode_ms_per_step_graph_with": round(dec["with"] * 1000, 2),
        "decode_ms_per_step_graph_without": round(dec["without"] * 1000, 2),
        "not_asked_cost_ratio": round(dec["with"] / dec["without"], 3),
        "raw": {"prefill_s": prefill, "decode_s_per_step": step},
        "load": load_average(),
    }


def main() -> None:
    p = parser(__doc__)
    p.add_argument("what", choices=["load", "chunked", "prefix", "echo"])
    p.add_argument("--threads", type=int, nargs="+", default=[2])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--requests", type=int, default=16, help="requests per client count")
    p.add_argument("--chunks", type=int, nargs="+", default=[0, 64, 128, 256, 512])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--old-site", help="folder with the previous release's package")
    p.add_argument("--output", help="also write the JSON here")
    args = p.parse_args()
    if not (MODEL / "model.onnx").is_file():
        sys.exit(f"export the embedded model first: onnxsample export -o {MODEL}")
    report = {"load": load, "chunked": chunked, "prefix": prefix, "echo": echo}[args.what](args)
    report |= {
        "machine": machine(),
        "versions": versions(*RUNTIME_PACKAGES),
        "model": MODEL.name,
    }
    output = args.output or RESULTS / f"engine_{args.what}.json"
    emit(report, output, f"engine {args.what}")


if __name__ == "__main__":
    main()
