"""Structured output: what the allowed-tokens mask costs when unused, what a JSON schema costs when
used, what drafting forced tokens gives, against llama.cpp's grammar sampling.

    python benchmarks/structured.py                         # threads 1 and 2, batch 1 and 4
    python benchmarks/structured.py --threads 2 --batch 1 --repeats 1   # quick

Workloads (one user message through the embedded SmolLM2's chat template, greedy):

- ``free``: an open question, unconstrained;
- ``json``: the same model asked for a person record, constrained by a JSON schema (names,
  an enum, a bounded array, an integer).

Our engines on the embedded model as ``onnxsample run`` uses it (GQA export on the GGUF's own
blocks at accuracy level 4, 8 slots): ``mask-off`` composed without the mask, ``mask-on`` with it
(the default), and on the ``--attention exact`` export ``exact-off`` and ``exact-k8`` (speculative
decoding: a constrained request drafts the tokens its grammar forces, verified under their own
masks). Batch B is B copies of the request submitted together. Peer: llama.cpp (llama-cpp-python,
the original Q4_1 GGUF, batch 1, from ``.venv-llamacpp``) with and without its grammar
(``LlamaGrammar.from_json_schema``) on the same token ids.

Per configuration: decode tokens/s (tokens after the first over the time of the decode calls),
tokens, and for speculation the drafts verified and kept. Engines alternate within each
repetition; medians go to stdout and ``--output`` (``benchmarks/results/structured.json``) with
the load average of the run and the ratios ``mask_cost`` (mask-on / mask-off, free text),
``json_vs_free`` and ``vs_llamacpp``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from _harness.machine import emit, load_average, machine, versions
from _harness.process import JsonLinesProcess
from _harness.script import BENCHMARKS, RESULTS, ROOT, ints, logger, parser

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
    p.add_argument("--batch", type=lambda t: ints(t, "--batch"), default=[1, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--llamacpp-python", default=str(ROOT / ".venv-llamacpp/bin/python"))
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
            "decode_s": after.decode_s - before.decode_s,
            "drafted": after.drafted_tokens - before.drafted_tokens,
            "accepted": after.accepted_tokens - before.accepted_tokens,
        }

    def close(self) -> None:
        self.engine.close()


class _LlamaCpp:
    """llama.cpp in its own interpreter (``benchmarks/e2e_worker.py llamacpp``)."""

    def __init__(self, python: str, threads: int) -> None:
        from onnxsample.exporters import embedded_gguf

        command = [python, str(BENCHMARKS / "e2e_worker.py"), "llamacpp", "--threads", str(threads)]
        self.worker = JsonLinesProcess([*command, "--gguf", str(embedded_gguf())])
        if not self.worker.info.get("ready"):
            raise RuntimeError(self.worker.info.get("error"))
        self.versions = self.worker.info.get("versions", {})

    def run(self, ids: list[int], batch: int, new_tokens: int, schema: dict | None) -> dict:
        request = {"prompt_ids": ids, "batch": 1, "mode": "greedy", "new_tokens": new_tokens}
        reply = self.worker.request(
            {**request, "seed": 0, "stop_at_eos": True, "json_schema": schema}
        )
        if not reply.get("ok"):
            raise RuntimeError(reply.get("error"))
        return {"tokens": reply["tokens"], "decode_s": reply["decode_s"]}

    def close(self) -> None:
        self.worker.close()


def _summary(runs: list[dict]) -> dict:
    rates = [
        (sum(r["tokens"]) - len(r["tokens"])) / r["decode_s"] for r in runs if r["decode_s"] > 0
    ]
    out = {
        "decode_tokens_per_s": round(statistics.median(rates), 1),
        "spread": [round(min(rates), 1), round(max(rates), 1)],
        "tokens": runs[0]["tokens"][0],
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
    exact = prepare(export(None, attention="exact", verify_tokens=0).output)
    return {"mask-off": plain, "mask-on": masked, "exact": exact}


def main() -> None:
    args = _parse()  # first: --help needs no onnxsample
    from onnxsample.text._prompt import prompt_tokens

    log = logger("structured")
    models = _models()
    loads = [load_average()]
    results: dict = {}
    peers: dict = {}
    for threads in args.threads:
        loaded: dict = {
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
        try:
            loaded["llamacpp"] = _LlamaCpp(args.llamacpp_python, threads)
            peers["llama_cpp_python"] = loaded["llamacpp"].versions.get("llama_cpp_python")
        except (OSError, RuntimeError) as exc:
            results.setdefault("skipped", {})["llamacpp"] = str(exc).splitlines()[0]
        runs: dict = {}
        for rep in range(args.repeats):
            names = list(loaded)
            names = names[rep % len(names) :] + names[: rep % len(names)]
            for workload in PROMPTS:
                schema = SCHEMA if workload == "json" else None
                for batch in args.batch:
                    for name in names:
                        if name == "llamacpp" and batch != 1:
                            continue
                        if name == "mask-off" and schema:
                            continue  # it cannot constrain
                        start = time.perf_counter()
                        found = loaded[name].run(ids[workload], batch, args.new_tokens, schema)
                        found["wall_s"] = time.perf_counter() - start
                        runs.setdefault((workload, batch, name), []).append(found)
                        log(f"{threads} {workload} {batch} {name} {_summary([found])}")
            loads.append(load_average())
        for engine in loaded.values():
            engine.close()
        table = results.setdefault(f"threads={threads}", {})
        for (workload, batch, name), found in runs.items():
            row = table.setdefault(workload, {}).setdefault(f"batch={batch}", {})
            row[name] = _summary(found)
            if name == "exact-k8":
                plain = runs[(workload, batch, "exact-off")][0]["ids"]
                row[name]["same_tokens"] = found[0]["ids"] == plain
        for workload, batches in table.items():
            for batch, row in batches.items():
                rate = {n: r["decode_tokens_per_s"] for n, r in row.items()}
                free = table["free"][batch]
                if workload == "free" and "mask-off" in rate:
                    row["mask-on"]["mask_cost"] = round(rate["mask-on"] / rate["mask-off"], 3)
                for name, r in row.items():
                    if workload == "json" and name in free:
                        base = free[name]["decode_tokens_per_s"]
                        r["json_vs_free"] = round(r["decode_tokens_per_s"] / base, 2)
                    if "llamacpp" in rate and name != "llamacpp":
                        r["vs_llamacpp"] = round(r["decode_tokens_per_s"] / rate["llamacpp"], 2)
    emit(
        {
            "benchmark": "structured",
            "machine": machine(),
            "load_average": loads,
            "versions": {**versions("onnxsample", "onnxruntime", "llguidance"), **peers},
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
