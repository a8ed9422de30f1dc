"""End-to-end decode against the peers: same prompt, same machine, same run, engines alternated.

    python benchmarks/e2e.py                                   # the issue's matrix, 3 repeats
    python benchmarks/e2e.py --engines onnxsample,genai --batch 1 --threads 2 --repeats 5
    python benchmarks/e2e.py --new-tokens 16 --repeats 1       # a quick smoke run

Engines (each in its own worker process, see ``benchmarks/e2e_worker.py``, loaded once):
``onnxsample`` (composed model, IOBinding, sampling in the graph), ``onnxsample-gqa`` (the same
runtime on genai's builder model, composed like ``onnxsample run``'s; batch 1 only: the Generator runs
that layout one sequence at a time), ``optimum`` (the same export through
``ORTModelForCausalLM.generate``, sampling on the host), ``genai`` (onnxruntime-genai, its builder's
fp32 model, from ``.venv-genai``), ``transformers`` (``generate`` on torch CPU, fp32), ``llamacpp``
(llama-cpp-python on the original Q4_1 GGUF, from ``.venv-llamacpp``; skipped with the reason when
absent). An engine that cannot start is recorded as skipped, with its error, and the others go on.

For each thread count all workers are started, warmed up (one short request per batch size), then
every repetition runs every (batch, mode) configuration on every engine, the engine order rotating
from one repetition to the next. Results: the median and the min-max spread over the repetitions of
decode tokens/s (all sequences' tokens after the first / decode time), prefill tokens/s (batch ×
prompt tokens / time to first token), time to first token, and the worker's peak RSS (which includes
loading the model; VmHWM). The JSON goes to stdout and to ``benchmarks/results/e2e.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _machine import emit, load_average, machine, versions  # noqa: E402

ENGINES = ("onnxsample", "onnxsample-gqa", "optimum", "genai", "transformers", "llamacpp")
MODES = ("greedy", "sampled")
MESSAGE = (
    "Explain in a few short paragraphs how a refrigerator keeps food cold, "
    "and why its back feels warm."
)
SAMPLED_DOC = (
    "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repetition penalty 1.1 "
    "(genai has no min-p: it runs without it; llama.cpp applies the repetition penalty to the last "
    "64 tokens, the others to prompt + output)"
)
EOS_DOC = (
    "every sequence generates exactly the requested tokens: onnxsample biases the EOS id by -100 "
    "(logit_bias), transformers and optimum pass min_new_tokens, genai min_length, llama.cpp a "
    "logits processor that sets the EOS logit to -inf"
)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--{what} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"--{what} takes integers >= 1, got {text!r}")
    return values


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise SystemExit(
            f"--{what} takes a comma-separated subset of {','.join(allowed)}, got {text!r}"
        )
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated engines")
    p.add_argument("--batch", default="1,8", help="batch sizes")
    p.add_argument("--threads", default="1,2", help="intra-op threads (torch threads for torch)")
    p.add_argument("--modes", default="greedy,sampled", help="greedy and/or sampled")
    p.add_argument("--repeats", type=int, default=3, help="repetitions of each configuration")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per sequence")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens of each warm-up request")
    p.add_argument("--message", default=MESSAGE, help="the user message (chat template applied)")
    p.add_argument("--model", default=str(ROOT / "artifacts/smollm2-135m-instruct"))
    p.add_argument("--hf", default=str(ROOT / "artifacts/cache/smollm2-hf-export/hf"))
    p.add_argument("--genai-model", default=str(ROOT / "artifacts/cache/genai-smollm2-fp32"))
    p.add_argument("--genai-python", default=str(ROOT / ".venv-genai/bin/python"))
    p.add_argument("--llamacpp-python", default=str(ROOT / ".venv-llamacpp/bin/python"))
    p.add_argument("--gguf", default=None, help="default: the embedded model's GGUF")
    p.add_argument("--output", default=str(HERE / "results/e2e.json"), help="'' to write nothing")
    p.add_argument("--note", default="", help="a remark stored with the results")
    args = p.parse_args(argv)
    args.engines = _names(args.engines, ENGINES, "engines")
    args.batch = _ints(args.batch, "batch")
    args.threads = _ints(args.threads, "threads")
    args.modes = _names(args.modes, MODES, "modes")
    if args.repeats < 1 or args.new_tokens < 2 or args.warmup_tokens < 2:
        raise SystemExit("--repeats must be >= 1, --new-tokens and --warmup-tokens >= 2")
    return args


def prompt_ids(model: str, message: str) -> list[int]:
    """The embedded model's chat template applied to the message: what every engine is given."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    if tokenizer.convert_ids_to_tokens(2) != "<|im_end|>":
        raise SystemExit("this benchmark expects SmolLM2's tokenizer (EOS <|im_end|> = id 2)")
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True
    )
    return [int(i) for i in ids]


class Worker:
    """One engine's process; requests go in as JSON lines, results come back the same way."""

    def __init__(self, engine: str, python: str, threads: int, args: argparse.Namespace) -> None:
        self.engine, self.threads = engine, threads
        cmd = [python, str(HERE / "e2e_worker.py"), engine, "--threads", str(threads)]
        cmd += ["--model", args.model, "--hf", args.hf, "--genai", args.genai_model]
        cmd += ["--gguf", args.gguf, "--cache", str(ROOT / "artifacts/cache/bench-e2e")]
        env = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
        }
        env.update(OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, **env},
        )
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            return {"ready": False, "ok": False, "error": f"worker exited with status {code}"}
        return json.loads(line)

    def request(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"quit": true}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _python_for(engine: str, args: argparse.Namespace) -> tuple[str | None, str]:
    """The interpreter that runs `engine`, or None and why it is skipped."""
    if engine == "genai" and not Path(args.genai_python).is_file():
        return None, f"no {args.genai_python}: run `make genai-model` (builds .venv-genai)"
    has_model = Path(args.genai_model, "genai_config.json").is_file()
    if engine in ("genai", "onnxsample-gqa") and not has_model:
        return None, f"no genai model in {args.genai_model}: run `make genai-model`"
    if engine == "llamacpp":
        if not Path(args.llamacpp_python).is_file():
            return None, (
                f"llama-cpp-python is not installed ({args.llamacpp_python} missing; it is an "
                "optional extra that compiles llama.cpp: see docs/benchmarks.md)"
            )
        return args.llamacpp_python, ""
    if engine == "transformers" and not Path(args.hf, "config.json").is_file():
        return sys.executable, f"(no HF folder at {args.hf}: de-quantising the GGUF instead)"
    return (args.genai_python if engine == "genai" else sys.executable), ""


def _summary(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def aggregate(runs: list[dict]) -> list[dict]:
    """Median and spread per (engine, threads, batch, mode) over the successful repetitions."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        if run.get("ok") and not run.get("warmup"):
            key = (run["engine"], run["threads"], run["batch"], run["mode"])
            groups.setdefault(key, []).append(run)
    rows = []
    for (engine, threads, batch, mode), group in groups.items():
        rows.append(
            {
                "engine": engine,
                "threads": threads,
                "batch": batch,
                "mode": mode,
                "prompt_tokens": group[0]["prompt_tokens"],
                "tokens_per_sequence": sorted({t for r in group for t in r["tokens"]}),
                "decode_tokens_per_s": _summary([r["decode_tps"] for r in group]),
                "prefill_tokens_per_s": _summary([r["prefill_tps"] for r in group]),
                "ttft_ms": _summary([r["ttft_s"] * 1000 for r in group]),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in group),
            }
        )
    return rows


def _derive(run: dict) -> dict:
    decoded = sum(t - 1 for t in run["tokens"])
    run["decode_tps"] = decoded / run["decode_s"] if run["decode_s"] else 0.0
    run["prefill_tps"] = run["prompt_tokens"] * len(run["tokens"]) / run["ttft_s"]
    return run


def measure(args: argparse.Namespace, ids: list[int], log) -> tuple[list[dict], dict]:
    runs: list[dict] = []
    engines: dict[str, dict] = {}
    configs = [(b, m) for b in args.batch for m in args.modes]
    for threads in args.threads:
        workers: list[Worker] = []
        for engine in args.engines:
            python, reason = _python_for(engine, args)
            if python is None:
                engines[engine] = {"status": "skipped", "reason": reason}
                log(f"{engine}: skipped: {reason}")
                continue
            log(f"{engine}: loading (threads {threads}) {reason}".rstrip())
            worker = Worker(engine, python, threads, args)
            if not worker.info.get("ready"):
                engines[engine] = {"status": "skipped", "reason": worker.info.get("error")}
                log(f"{engine}: skipped: {worker.info.get('error')}")
                worker.close()
                continue
            entry = engines.setdefault(engine, {"status": "ok", "load": {}})
            entry["versions"] = worker.info.get("versions", {})
            entry["load"][str(threads)] = {
                k: worker.info.get(k) for k in ("load_s", "rss_mb", "peak_rss_mb")
            }
            if "use_io_binding" in worker.info:
                entry["use_io_binding"] = worker.info["use_io_binding"]
            workers.append(worker)
        try:
            unsupported: set[tuple[str, int]] = set()
            for worker in workers:  # warm-up: one short request per batch size
                for batch in args.batch:
                    req = _req(ids, args, batch, "sampled", args.warmup_tokens, 0)
                    result = worker.request(req)
                    if not result.get("ok"):
                        unsupported.add((worker.engine, batch))
                        engines[worker.engine].setdefault("unavailable", {})[str(batch)] = result[
                            "error"
                        ]
                        log(f"{worker.engine}: batch {batch} unavailable: {result.get('error')}")
            for rep in range(args.repeats):
                for c, (batch, mode) in enumerate(configs):
                    shift = (rep + c) % len(workers) if workers else 0
                    for worker in workers[shift:] + workers[:shift]:
                        if (worker.engine, batch) in unsupported:
                            continue
                        req = _req(ids, args, batch, mode, args.new_tokens, 1000 * rep)
                        result = worker.request(req)
                        run = {"engine": worker.engine, "threads": threads, "batch": batch}
                        run.update(mode=mode, repeat=rep, **result)
                        if result.get("ok"):
                            _derive(run)
                            log(
                                f"t{threads} b{batch} {mode:7s} rep {rep}: {worker.engine:12s} "
                                f"{run['decode_tps']:7.1f} tok/s decode, ttft "
                                f"{run['ttft_s'] * 1000:6.0f} ms"
                            )
                        runs.append(run)
        finally:
            for worker in workers:
                worker.close()
    return runs, engines


def _req(ids: list[int], args, batch: int, mode: str, new: int, seed: int) -> dict:
    return {
        "prompt_ids": ids,
        "message": args.message,
        "batch": batch,
        "mode": mode,
        "new_tokens": new,
        "seed": seed,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.gguf is None:
        args.gguf = _embedded_gguf()

    def log(msg: str) -> None:
        print(f"[e2e] {msg}", file=sys.stderr, flush=True)

    if not Path(args.model, "model.onnx").is_file():
        raise SystemExit(
            f"no export at {args.model}: run `make run` (or `.venv/bin/onnxsample export -o "
            "artifacts/smollm2-135m-instruct`) first"
        )
    ids = prompt_ids(args.model, args.message)
    if "onnxsample" in args.engines:  # compose here, not in a worker, whose peak RSS would show it
        from onnxsample import prepare

        prepare(args.model)
    load_before = load_average()
    began = time.time()
    runs, engines = measure(args, ids, log)
    report = {
        "benchmark": "e2e",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - began, 1),
        "machine": machine(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "versions": versions("onnxsample", "onnxruntime", "numpy"),
        "settings": {
            "message": args.message,
            "prompt_tokens": len(ids),
            "new_tokens": args.new_tokens,
            "batch": args.batch,
            "batch_composition": "the same prompt B times; sampled rows seeded seed+i where the "
            "engine has per-sequence seeds (onnxsample), one seed per batch otherwise",
            "threads": args.threads,
            "modes": args.modes,
            "sampled": SAMPLED_DOC,
            "eos": EOS_DOC,
            "repeats": args.repeats,
            "warmup_tokens": args.warmup_tokens,
            "order": "engines alternate within each repetition; the order rotates per repetition",
            "note": args.note,
        },
        "engines": engines,
        "results": aggregate(runs),
        "runs": runs,
    }
    emit(report, args.output, "e2e")
    return report


def _embedded_gguf() -> str:
    try:
        from onnxsample.exporters import embedded_gguf

        return str(embedded_gguf())
    except Exception:
        return ""


if __name__ == "__main__":
    main()
