"""Structured output: what the allowed-tokens mask costs when unused, what a JSON schema costs when
used, what drafting forced tokens gives, against llama.cpp's grammar sampling.

    python benchmarks/structured.py                         # threads 1 and 2, batch 1 and 4
    python benchmarks/structured.py --threads 2 --batch 1 --repeats 1   # quick

Workloads (one user message through the embedded SmolLM2's chat template, greedy):

- ``free``: an open question, unconstrained;
- ``json``: the same model asked for a person record, constrained by a JSON schema (names,
  an enum, a bounded array, an integer).

Three parts, in one run:

1. ``engine``: :class:`onnxsample.Engine` in this process on the embedded model as ``onnxsample
   run`` uses it (GQA export on the GGUF's own blocks at accuracy level 4, 8 slots): ``mask-off``
   composed without the mask, ``mask-on`` with it (the default), and on the ``--attention exact``
   export ``exact-off`` and ``exact-k8`` (speculative decoding: a constrained request drafts the
   tokens its grammar forces, verified under their own masks). Batch B is B copies of the request
   submitted together. Decode tokens/s (tokens after the first over the decode calls' time), TTFT,
   tokens per model call, and ``mask_cost`` (mask-on / mask-off on free text), ``json_vs_free``.
2. ``http``: ``onnxsample serve`` against llama-server (same GGUF, threads, 8 slots), the JSON
   schema sent as OpenAI's ``response_format`` to both (llama-server turns it into its grammar),
   1 and 8 streaming clients in a closed loop, the two servers' cells alternating: tokens/s,
   TTFT and inter-token latency (medians of the repetitions), and ``vs_llama_server``.
3. ``masks``: the host's time to fill the masks of 8 and 16 constrained sequences (llguidance over
   the 49,152-token vocabulary), per step.

Medians go to stdout and ``--output`` (``benchmarks/results/structured.json``) with the load
average of the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from _harness.machine import emit, load_average, machine, versions
from _harness.measure import closed_loop
from _harness.script import RESULTS, ints, logger, parser
from _harness.workload import EMBEDDED_A4_EXACT
from serve import LLAMA_SERVER, _start, _stream, _warm_up

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "role": {"enum": ["engineer", "manager", "designer", "scientist"]},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        "years_of_experience": {"type": "integer", "minimum": 0, "maximum": 60},
        "remote": {"type": "boolean"},
    },
    "required": ["name", "role", "languages", "years_of_experience", "remote"],
    "additionalProperties": False,
}
PROMPTS = {
    "free": "Describe a senior software engineer called Ada in a few sentences.",
    "json": "Describe a senior software engineer called Ada as a JSON record.",
}


def _parse() -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--threads", type=lambda t: ints(t, "--threads"), default=[1, 2])
    p.add_argument("--batch", type=lambda t: ints(t, "--batch"), default=[1, 8])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--http-requests", type=int, default=16, help="per cell of the http part")
    p.add_argument("--parts", default="engine,http,masks")
    p.add_argument("--output", default=str(RESULTS / "structured.json"))
    return p.parse_args()


class _Ours:
    def __init__(self, model: Path, threads: int, speculative: bool) -> None:
        from onnxsample import Engine

        spec = {"speculative": "ngram"} if speculative else {}
        self.engine = Engine(model, threads=threads, prefix_reuse=False, **spec)

    def run(self, ids: list[int], batch: int, new_tokens: int, schema: dict | None) -> dict:
        from onnxsample import Constraint, SamplingParams

        constraint = Constraint.json_schema(schema) if schema else None
        params = SamplingParams(temperature=0, constraint=constraint)
        before = self.engine.stats()
        start = time.perf_counter()
        requests = [
            self.engine.submit(ids, params, max_new_tokens=new_tokens) for _ in range(batch)
        ]
        done = [r.result(timeout=900) for r in requests]
        after = self.engine.stats()
        if schema:
            for c in done:
                if c.finish_reason == "eos":
                    json.loads(c.text)  # a whole answer always parses
        return {
            "tokens": [len(c.token_ids) for c in done],
            "ids": [c.token_ids for c in done],
            "ttft_s": min(c.timings.ttft_s for c in done),
            "calls": after.decode_steps - before.decode_steps,
            "wall_s": time.perf_counter() - start,
            "decode_s": after.decode_s - before.decode_s,
            "drafted": after.drafted_tokens - before.drafted_tokens,
            "accepted": after.accepted_tokens - before.accepted_tokens,
        }

    def close(self) -> None:
        self.engine.close()


def _summary(runs: list[dict]) -> dict:
    rates = [
        (sum(r["tokens"]) - len(r["tokens"])) / r["decode_s"] for r in runs if r["decode_s"] > 0
    ]
    decoded = sum(sum(r["tokens"]) - len(r["tokens"]) for r in runs)
    out = {
        "decode_tokens_per_s": round(statistics.median(rates), 1),
        "spread": [round(min(rates), 1), round(max(rates), 1)],
        "ttft_ms": round(statistics.median(r["ttft_s"] for r in runs) * 1000, 1),
        "tokens": runs[0]["tokens"][0],
        "tokens_per_call": round(decoded / max(sum(r["calls"] for r in runs), 1), 2),
    }
    drafted = sum(r.get("drafted", 0) for r in runs)
    if drafted:
        out["acceptance"] = round(sum(r["accepted"] for r in runs) / drafted, 3)
    return out


def _models() -> dict[str, Path]:
    from onnxsample import compose, prepare
    from onnxsample.exporters import export
    from onnxsample.prepare import RUN_COMPOSE_OPTIONS

    masked = prepare(None)
    options = {**RUN_COMPOSE_OPTIONS, "allowed_tokens": False}
    plain = compose(masked.parent, None, masked.with_name("composed-nomask.onnx"), **options)
    exact = prepare(export(None, EMBEDDED_A4_EXACT, attention="exact", verify_tokens=0).output)
    return {"mask-off": plain, "mask-on": masked, "exact": exact}


def _engine_part(args, log) -> dict:
    from onnxsample.text._prompt import prompt_tokens

    models = _models()
    results: dict = {}
    for threads in args.threads:
        loaded = {
            "mask-off": _Ours(models["mask-off"], threads, False),
            "mask-on": _Ours(models["mask-on"], threads, False),
            "exact-off": _Ours(models["exact"], threads, False),
            "exact-k8": _Ours(models["exact"], threads, True),
        }
        engine = loaded["mask-on"].engine
        ids = {
            w: prompt_tokens(
                engine.tokenizer, [{"role": "user", "content": text}], True, None, engine.vocab_size
            )
            for w, text in PROMPTS.items()
        }
        runs: dict = {}
        for rep in range(args.repeats):
            names = list(loaded)
            names = names[rep % len(names) :] + names[: rep % len(names)]
            for workload in PROMPTS:
                schema = SCHEMA if workload == "json" else None
                for batch in args.batch:
                    for name in names:
                        if name == "mask-off" and schema:
                            continue  # it cannot constrain
                        found = loaded[name].run(ids[workload], batch, args.new_tokens, schema)
                        runs.setdefault((workload, batch, name), []).append(found)
                        log(f"{threads} {workload} {batch} {name} {_summary([found])}")
        for engine in loaded.values():
            engine.close()
        table = results.setdefault(f"threads={threads}", {})
        for (workload, batch, name), found in runs.items():
            row = table.setdefault(workload, {}).setdefault(f"batch={batch}", {})
            row[name] = _summary(found)
            if name == "exact-k8":
                plain = runs[(workload, batch, "exact-off")][0]["ids"]
                row[name]["same_tokens"] = found[0]["ids"] == plain
        for row in table["free"].values():
            rate = {n: r["decode_tokens_per_s"] for n, r in row.items()}
            row["mask-on"]["mask_cost"] = round(rate["mask-on"] / rate["mask-off"], 3)
        for batch, row in table["json"].items():
            for name, r in row.items():
                free = table["free"][batch][name]
                r["json_vs_free"] = round(r["decode_tokens_per_s"] / free["decode_tokens_per_s"], 2)
                r["ttft_vs_free"] = round(r["ttft_ms"] / free["ttft_ms"], 2)
    return results


def _http_part(args, log) -> dict:
    """Both servers up at once, their cells alternating within each repetition (the load of a
    shared machine falls on both alike); medians of the repetitions."""
    threads = max(args.threads)
    engines = ["onnxsample", "llama-server"]
    results: dict = {"threads": threads}
    if not LLAMA_SERVER.is_file():
        results["skipped"] = {"llama-server": "not built: make llama-cpp"}
        engines.remove("llama-server")
    servers = {}
    try:
        for engine in engines:
            servers[engine] = _start(engine, threads, 1)
            _warm_up(servers[engine][1])
        runs: dict = {}
        for rep in range(args.repeats):
            order = engines[rep % len(engines) :] + engines[: rep % len(engines)]
            for workload, text in PROMPTS.items():
                body = {
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": args.new_tokens,
                    "temperature": 0,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                if workload == "json":
                    body["response_format"] = {
                        "type": "json_schema",
                        "json_schema": {"name": "person", "schema": SCHEMA},
                    }
                for clients in (1, 8):
                    per = max(1, args.http_requests // clients)
                    for engine in order:
                        port = servers[engine][1]
                        one = lambda k, r, b=body, p=port: _stream(p, b)  # noqa: E731
                        found = closed_loop(clients, per, one)
                        runs.setdefault((workload, clients, engine), []).append(found)
                        log(f"http {engine} {workload} {clients} {found}")
    finally:
        for proc, _port in servers.values():
            proc.terminate()
            proc.wait(30)
    for (workload, clients, engine), found in runs.items():
        cell = results.setdefault(workload, {}).setdefault(f"clients={clients}", {})
        cell[engine] = {
            key: statistics.median(r[key] for r in found)
            for key in found[0]
            if isinstance(found[0][key], (int, float)) and found[0][key] is not None
        }
    for workload, cells in results.items():
        if workload not in PROMPTS:
            continue
        for cell in cells.values():
            peer = cell.get("llama-server", {}).get("tokens_per_s")
            if peer and "onnxsample" in cell:
                cell["onnxsample"]["vs_llama_server"] = round(
                    cell["onnxsample"]["tokens_per_s"] / peer, 2
                )
    return results


def _mask_part() -> dict:
    import numpy as np

    from onnxsample import Constraint, prepare
    from onnxsample.engine._model_info import ModelInfo
    from onnxsample.text._grammar import GrammarVocabulary

    info = ModelInfo.read(prepare(None).parent)
    vocabulary = GrammarVocabulary(info.tokenizer, 49152, info.eos_ids)
    grammar = Constraint.json_schema(SCHEMA).grammar_text()
    prefix = info.tokenizer.encode('{"name": "Ada Love', add_special_tokens=False)
    out = {}
    for count in (8, 16):
        matchers = [vocabulary.matcher(grammar) for _ in range(count)]
        for i, m in enumerate(matchers):  # at different places in the document
            for token in prefix[: i % (len(prefix) + 1)]:
                m.consume(token)
        rows = np.ones((count, 49152), bool)
        times = []
        for _ in range(200):
            start = time.perf_counter()
            for m, row in zip(matchers, rows, strict=True):
                m.fill(row)
            times.append(time.perf_counter() - start)
        out[f"slots={count}"] = {
            "fill_us_per_step_p50": round(statistics.median(times) * 1e6, 1),
            "fill_us_per_step_p99": round(sorted(times)[int(len(times) * 0.99)] * 1e6, 1),
        }
    return out


def main() -> None:
    args = _parse()  # first: --help needs no onnxsample
    log = logger("structured")
    parts = args.parts.split(",")
    loads = [load_average()]
    results: dict = {}
    if "engine" in parts:
        results["engine"] = _engine_part(args, log)
        loads.append(load_average())
    if "http" in parts:
        results["http"] = _http_part(args, log)
        loads.append(load_average())
    if "masks" in parts:
        results["masks"] = _mask_part()
    emit(
        {
            "benchmark": "structured",
            "machine": machine(),
            "load_average": loads,
            "versions": versions("onnxsample", "onnxruntime", "llguidance"),
            "settings": {
                "new_tokens": args.new_tokens,
                "repeats": args.repeats,
                "schema": SCHEMA,
                "prompts": PROMPTS,
            },
            "results": results,
        },
        args.output,
        "structured",
    )


if __name__ == "__main__":
    main()
