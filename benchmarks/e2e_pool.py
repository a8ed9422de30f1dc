"""The end-to-end benchmark's workers: one process per engine (``e2e_worker.py``, with the engine's
own interpreter), started per thread count, warmed up, then every (batch, mode) configuration run on
every engine, the engine order rotating from one repetition to the next."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from _harness.process import JsonLinesProcess
from _harness.script import BENCHMARKS, ROOT
from e2e_models import GENAI_GRAPH
from e2e_results import derive

Log = Callable[[str], None]


class Worker(JsonLinesProcess):
    """One engine's process, loaded once; requests go in as JSON lines, results come back the
    same way."""

    def __init__(
        self, engine: str, python: str, threads: int, args: argparse.Namespace, model: dict
    ) -> None:
        self.engine, self.threads = engine, threads
        cmd = [python, str(BENCHMARKS / "e2e_worker.py"), engine, "--threads", str(threads)]
        if model.get("model") is not None:
            cmd += ["--model", str(model["model"])]
        cmd += ["--tokenizer", str(model["tokenizer"]), "--hf", args.hf]
        cmd += ["--genai", args.genai_model, "--gguf", args.gguf]
        env = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "OMP_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
        }
        super().__init__(cmd, env={**os.environ, **env}, cwd=ROOT)


def python_for(engine: str, args: argparse.Namespace) -> tuple[str | None, str]:
    """The interpreter that runs `engine`, or None and why it is skipped."""
    if engine == "genai" and not Path(args.genai_python).is_file():
        return None, f"no {args.genai_python}: run `make genai-model` (builds .venv-genai)"
    has_model = Path(args.genai_model, "genai_config.json").is_file()
    if engine in ("genai", GENAI_GRAPH) and not has_model:
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


def measure(
    args: argparse.Namespace,
    ids: list[int],
    log: Log,
    models: dict[str, dict],
    engines: dict[str, dict],
    quality: dict[str, dict],
    tokens: list[int],
) -> list[dict]:
    """Run every configuration; fills `engines` (status, load, versions) and, from the workers of
    the first thread count after their timed runs, the `quality` scores no ONNX file gave."""
    runs: list[dict] = []
    for round_, threads in enumerate(args.threads):
        workers = start_workers(args, threads, models, engines, log)
        try:
            unsupported = warm_up(workers, args, ids, engines, log)
            runs += timed_runs(workers, args, ids, unsupported, log)
            if round_ == 0 and tokens:  # after the timed runs: they are not disturbed by it
                score_in_workers(workers, ids, tokens, quality, log)
        finally:
            for worker in workers:
                worker.close()
    return runs


def start_workers(
    args: argparse.Namespace, threads: int, models: dict[str, dict], engines: dict, log: Log
) -> list[Worker]:
    """A loaded worker per engine that is not skipped; each enters its status, load time and
    memory, versions (and export) in `engines`."""
    workers: list[Worker] = []
    for engine in args.engines:
        if engines.get(engine, {}).get("status") == "skipped":
            continue
        python, reason = python_for(engine, args)
        if python is None:
            engines[engine] = {"status": "skipped", "reason": reason}
            log(f"{engine}: skipped: {reason}")
            continue
        log(f"{engine}: loading (threads {threads}) {reason}".rstrip())
        worker = Worker(engine, python, threads, args, models[engine])
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
        if "export" in models[engine]:
            entry["export"] = models[engine]["export"]
        if "use_io_binding" in worker.info:
            entry["use_io_binding"] = worker.info["use_io_binding"]
        workers.append(worker)
    return workers


def warm_up(
    workers: list[Worker], args: argparse.Namespace, ids: list[int], engines: dict, log: Log
) -> set[tuple[str, int]]:
    """One short request per worker and batch size; returns the (engine, batch) pairs refused,
    entered in `engines` as unavailable."""
    unsupported: set[tuple[str, int]] = set()
    for worker in workers:
        for batch in args.batch:
            result = worker.request(request(ids, args, batch, "sampled", args.warmup_tokens, 0))
            if not result.get("ok"):
                unsupported.add((worker.engine, batch))
                engines[worker.engine].setdefault("unavailable", {})[str(batch)] = result["error"]
                log(f"{worker.engine}: batch {batch} unavailable: {result.get('error')}")
    return unsupported


def timed_runs(
    workers: list[Worker],
    args: argparse.Namespace,
    ids: list[int],
    unsupported: set[tuple[str, int]],
    log: Log,
) -> list[dict]:
    """Every repetition of every (batch, mode) on every worker, the order rotating."""
    runs = []
    configs = [(b, m) for b in args.batch for m in args.modes]
    for rep in range(args.repeats):
        for c, (batch, mode) in enumerate(configs):
            shift = (rep + c) % len(workers) if workers else 0
            for worker in workers[shift:] + workers[:shift]:
                if (worker.engine, batch) in unsupported:
                    continue
                result = worker.request(
                    request(ids, args, batch, mode, args.new_tokens, 1000 * rep)
                )
                run = {"engine": worker.engine, "threads": worker.threads, "batch": batch}
                run.update(mode=mode, repeat=rep, **result)
                where = f"t{worker.threads} b{batch}"
                if result.get("ok"):
                    derive(run)
                    log(
                        f"{where} {mode:7s} rep {rep}: {worker.engine:22s} "
                        f"{run['decode_tps']:7.1f} tok/s decode, ttft "
                        f"{run['ttft_s'] * 1000:6.0f} ms"
                    )
                else:
                    log(f"{where} {mode} rep {rep}: {worker.engine} failed: {result.get('error')}")
                runs.append(run)
    return runs


def score_in_workers(
    workers: list[Worker], ids: list[int], tokens: list[int], quality: dict, log: Log
) -> None:
    """The quality of every engine no ONNX file scored, from its own worker (transformers,
    llama.cpp), entered in `quality`."""
    for worker in workers:
        if worker.engine in quality:
            continue
        result = worker.request({"score": {"prompt_ids": ids, "tokens": tokens}})
        if result.get("ok"):
            quality[worker.engine] = {
                "mean_logprob": round(result["mean_logprob"], 4),
                "scored_on": result.get("scored_on", "the engine's own model"),
            }
        else:
            quality[worker.engine] = {
                "mean_logprob": None,
                "reason": result.get("error", "no score"),
            }
        log(f"quality: {worker.engine}: {quality[worker.engine]}")


def request(
    ids: list[int], args: argparse.Namespace, batch: int, mode: str, new: int, seed: int
) -> dict:
    """One generation request of the worker protocol."""
    return {
        "prompt_ids": ids,
        "message": args.message,
        "batch": batch,
        "mode": mode,
        "new_tokens": new,
        "seed": seed,
    }
