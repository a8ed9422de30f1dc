"""End-to-end decode against the peers: same prompt, same machine, same run, engines alternated.

    python benchmarks/e2e.py                                   # the issue's matrix, 3 repeats
    python benchmarks/e2e.py --engines onnxsample-gguf-a4,llamacpp --batch 1 --threads 2
    python benchmarks/e2e.py --new-tokens 16 --repeats 1 --output /tmp/e2e.json   # a quick smoke run

Engines (each in its own worker process, see ``benchmarks/e2e_worker.py``, loaded once). Our runtime,
``onnxsample.Generator`` (composed model with ``onnxsample run``'s options: 8 slots, IOBinding,
sampling in the graph), on four exports of the embedded SmolLM2-135M-Instruct GGUF, made here on
first use into ``--cache`` (``export()`` reuses an up-to-date one; composing likewise):

- ``onnxsample``: optimum's layout, fp32 (attention as plain ops, the cache grown by concatenation);
- ``onnxsample-gqa-fp32``: our GroupQueryAttention layout, fp32 (one shared KV buffer);
- ``onnxsample-gguf-a0`` / ``onnxsample-gguf-a4``: the gqa layout with the GGUF's own Q4_1/Q8_0
  blocks transplanted (MatMulNBits), accuracy level 0 (float compute, exact) / 4 (int8 activations,
  like llama.cpp);
- ``onnxsample-genai-graph``: the same runtime on onnxruntime-genai's builder model (fp32 GQA), to
  separate the runtime from the graph (``onnxsample-gqa`` is accepted as its old name).

Peers: ``optimum`` (the fp32 optimum export through ``ORTModelForCausalLM.generate``, sampling on the
host), ``genai`` (onnxruntime-genai, its builder's fp32 model, from ``.venv-genai``),
``transformers`` (``generate`` on torch CPU, fp32), ``llamacpp`` (llama-cpp-python on the original
Q4_1 GGUF, from ``.venv-llamacpp``). An engine that cannot start (or whose model cannot be exported)
is recorded as skipped, with its error, and the others go on; a batch size an engine refuses is
recorded as unavailable.

For each thread count all workers are started, warmed up (one short request per batch size), then
every repetition runs every (batch, mode) configuration on every engine, the engine order rotating
from one repetition to the next. Results: the median and the min-max spread over the repetitions of
decode tokens/s (all sequences' tokens after the first / decode time), prefill tokens/s (batch ×
prompt tokens / time to first token), time to first token, and the worker's peak RSS (which includes
loading the model; VmHWM).

Quality, per engine: the mean log-probability its model gives the fp32 reference's greedy tokens
(``--quality-tokens``, 64) after the benchmark prompt, teacher forced; the reference is the fp32 gqa
export, decoded greedily by ONNX Runtime. ONNX models are scored here, before any worker starts (the
plain ``model.onnx`` of each export; genai's builder model for genai); transformers and llama.cpp
(a second ``Llama`` with ``logits_all=True``) score in their worker after their timed runs.
The JSON goes to stdout and to ``--output`` (``benchmarks/results/e2e.json``).
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

# Our exports of the embedded model: engine -> (folder under --cache, export() options).
VARIANTS: dict[str, tuple[str, dict]] = {
    "onnxsample": ("fp32-optimum", {"layout": "optimum", "precision": "fp32"}),
    "onnxsample-gqa-fp32": ("gqa-fp32", {"layout": "gqa", "precision": "fp32"}),
    "onnxsample-gguf-a0": ("gguf-a0", {"layout": "gqa", "precision": "gguf", "accuracy_level": 0}),
    "onnxsample-gguf-a4": ("gguf-a4", {"layout": "gqa", "precision": "gguf", "accuracy_level": 4}),
}
GENAI_GRAPH = "onnxsample-genai-graph"
ENGINES = (*VARIANTS, GENAI_GRAPH, "optimum", "genai", "transformers", "llamacpp")
ALIASES = {"onnxsample-gqa": GENAI_GRAPH}  # old names still accepted by --engines
RUNTIME = (*VARIANTS, GENAI_GRAPH)  # the engines that run onnxsample.Generator
REFERENCE = "onnxsample-gqa-fp32"  # its export gives the prompt's ids and the quality reference
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
QUALITY_DOC = (
    "mean log-probability (natural log, per token) that the engine's model assigns to the fp32 "
    "reference's greedy continuation of the benchmark prompt, teacher forced in one pass; higher "
    "is better, and delta_vs_fp32 is the difference to the reference model's own score"
)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--{what} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"--{what} takes integers >= 1, got {text!r}")
    return values


def _names(
    text: str, allowed: tuple[str, ...], what: str, aliases: dict[str, str] | None = None
) -> list[str]:
    aliases = aliases or {}
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in allowed and n not in aliases]
    if not names or bad:
        raise SystemExit(
            f"--{what} takes a comma-separated subset of {','.join(allowed)}, got {text!r}"
        )
    return list(dict.fromkeys(aliases.get(n, n) for n in names))


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
    p.add_argument(
        "--cache",
        default=str(ROOT / "artifacts/cache/bench-e2e"),
        help="where the exports (one folder per variant) and composed models are kept",
    )
    p.add_argument("--hf", default=str(ROOT / "artifacts/cache/smollm2-hf-export/hf"))
    p.add_argument("--genai-model", default=str(ROOT / "artifacts/cache/genai-smollm2-fp32"))
    p.add_argument("--genai-python", default=str(ROOT / ".venv-genai/bin/python"))
    p.add_argument("--llamacpp-python", default=str(ROOT / ".venv-llamacpp/bin/python"))
    p.add_argument("--gguf", default=None, help="default: the embedded model's GGUF")
    p.add_argument(
        "--quality-tokens",
        type=int,
        default=64,
        help="greedy fp32 tokens the quality score is computed on (0: no quality scores)",
    )
    p.add_argument("--output", default=str(HERE / "results/e2e.json"), help="'' to write nothing")
    p.add_argument("--note", default="", help="a remark stored with the results")
    args = p.parse_args(argv)
    args.engines = _names(args.engines, ENGINES, "engines", ALIASES)
    args.batch = _ints(args.batch, "batch")
    args.threads = _ints(args.threads, "threads")
    args.modes = _names(args.modes, MODES, "modes")
    if args.repeats < 1 or args.new_tokens < 2 or args.warmup_tokens < 2:
        raise SystemExit("--repeats must be >= 1, --new-tokens and --warmup-tokens >= 2")
    if args.quality_tokens < 0:
        raise SystemExit("--quality-tokens must be >= 0")
    return args


def prompt_ids(model: str | Path, message: str) -> list[int]:
    """The embedded model's chat template applied to the message: what every engine is given."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    if tokenizer.convert_ids_to_tokens(2) != "<|im_end|>":
        raise SystemExit("this benchmark expects SmolLM2's tokenizer (EOS <|im_end|> = id 2)")
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True
    )
    return [int(i) for i in ids]


# ---- models: exports, composed graphs ---------------------------------------------------------


def export_variant(engine: str, cache: Path, log) -> tuple[Path, dict]:
    """Export (or reuse) `engine`'s variant of the embedded model; (folder, what was done)."""
    from onnxsample.errors import ExportError
    from onnxsample.exporters import export

    name, options = VARIANTS[engine]
    folder = cache / name
    try:
        result = export(None, folder, verify_tokens=0, **options)
    except ExportError as exc:  # our own cache folder, holding an export of older code: redo it
        log(f"{engine}: re-exporting into {folder} ({str(exc).splitlines()[0]})")
        result = export(None, folder, verify_tokens=0, force=True, **options)
    m = result.manifest
    info = {
        "folder": str(folder),
        "layout": m.get("layout"),
        "precision": m.get("precision"),
        "accuracy_level": m.get("accuracy_level"),
        "reused": result.reused,
        "seconds": round(result.seconds, 1),
        "bytes": m.get("files", {}).get("bytes"),
    }
    return folder, info


def compose_genai_graph(genai_model: str, cache: Path) -> Path:
    """onnxruntime-genai's builder model composed with ``onnxsample run``'s options, kept in
    `cache` (recomposed only when the model or the composer changed, as prepare() decides)."""
    import onnxsample
    from onnxsample.prepare import RUN_COMPOSE_OPTIONS, _up_to_date

    out = cache / "genai-composed.onnx"
    source = Path(genai_model) / "model.onnx"
    if not _up_to_date(out, source):
        out.parent.mkdir(parents=True, exist_ok=True)
        onnxsample.compose(source, None, out, **RUN_COMPOSE_OPTIONS)
    return out


def prepare_models(args: argparse.Namespace, engines: dict, log) -> dict[str, dict]:
    """Export and compose what the engines run, here rather than in the workers (whose peak RSS
    would show it). Returns engine -> {"model", "tokenizer", "scored"}; an engine whose model cannot
    be made is entered in `engines` as skipped. The reference export is always made."""
    cache = Path(args.cache)
    models: dict[str, dict] = {}
    exported: dict[str, tuple[Path, dict]] = {}
    wanted = [REFERENCE] + [e for e in args.engines if e in VARIANTS and e != REFERENCE]
    if "optimum" in args.engines and "onnxsample" not in wanted:
        wanted.append("onnxsample")
    for engine in wanted:
        log(f"{engine}: exporting into {cache / VARIANTS[engine][0]} (reused when up to date)")
        try:
            exported[engine] = export_variant(engine, cache, log)
        except Exception as exc:
            if engine == REFERENCE:
                raise SystemExit(f"the reference export ({engine}) failed: {exc}") from exc
            engines[engine] = {"status": "skipped", "reason": f"export failed: {exc}"}
            log(f"{engine}: skipped: export failed: {exc}")
    reference = exported[REFERENCE][0]
    for engine in args.engines:
        if engine in engines:
            continue
        try:
            if engine in VARIANTS:
                from onnxsample import prepare

                folder, info = exported[engine]
                model = prepare(folder)
                models[engine] = {"model": model, "tokenizer": folder, "export": info}
                models[engine]["scored"] = folder / "model.onnx"
            elif engine == GENAI_GRAPH and Path(args.genai_model, "genai_config.json").is_file():
                model = compose_genai_graph(args.genai_model, cache)
                models[engine] = {"model": model, "tokenizer": reference}
                models[engine]["scored"] = Path(args.genai_model) / "model.onnx"
            elif engine == "optimum" and "onnxsample" in exported:
                folder, info = exported["onnxsample"]
                models[engine] = {"model": folder, "tokenizer": folder, "export": info}
                models[engine]["scored"] = folder / "model.onnx"
            elif engine == "genai":
                model = Path(args.genai_model)
                models[engine] = {"model": model, "tokenizer": reference}
                models[engine]["scored"] = model / "model.onnx"
            elif engine in ("transformers", "llamacpp"):
                models[engine] = {"model": None, "tokenizer": reference, "scored": None}
            elif engine == GENAI_GRAPH:
                raise RuntimeError(f"no genai model in {args.genai_model}: run `make genai-model`")
            else:  # optimum without the fp32 optimum export
                raise RuntimeError("the fp32 optimum export failed (see onnxsample)")
        except Exception as exc:
            engines[engine] = {"status": "skipped", "reason": f"{type(exc).__name__}: {exc}"}
            log(f"{engine}: skipped: {exc}")
    models["__reference__"] = {"model": reference / "model.onnx", "tokenizer": reference}
    return models


# ---- quality ----------------------------------------------------------------------------------


def reference_tokens(model: Path, ids: list[int], n: int, threads: int) -> list[int]:
    """The fp32 reference's `n` greedy tokens after the prompt (EOS not suppressed: the score
    is defined whatever the tokens are)."""
    from onnxsample.exporters._verify import ort_greedy

    return ort_greedy(model, ids, n, threads=threads)


def score_onnx(
    models: dict[str, dict], ids: list[int], tokens: list[int], threads: int, log
) -> dict[str, dict]:
    """engine -> {"mean_logprob", "scored_on"} (or a null score and the reason) for every engine
    whose model is an ONNX file scored here; each file is scored once."""
    from onnxsample.exporters._verify import mean_logprob

    def score(path: Path) -> float:
        if (path.parent / "genai_config.json").is_file():
            return genai_mean_logprob(path, ids, tokens, threads)
        return mean_logprob(path, ids, tokens, threads=threads)

    by_path: dict[str, dict] = {}
    scores = {}
    for engine, entry in models.items():
        path = entry.get("scored")
        if engine.startswith("__") or path is None:
            continue
        key = str(path)
        if key not in by_path:
            try:
                value = score(Path(path))
                by_path[key] = {"mean_logprob": round(value, 4), "scored_on": key}
            except Exception as exc:
                by_path[key] = {
                    "mean_logprob": None,
                    "scored_on": key,
                    "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                }
            log(f"quality: {engine}: {by_path[key]}")
        scores[engine] = dict(by_path[key])
    return scores


def genai_mean_logprob(path: Path, ids: list[int], tokens: list[int], threads: int) -> float:
    """``mean_logprob`` for onnxruntime-genai's builder model, whose past inputs leave the head size
    symbolic (``kv_cache_dim``): it is read from the ``genai_config.json`` beside the model."""
    import numpy as np
    import onnxruntime as ort

    from onnxsample.exporters._verify import _mean_logprob

    decoder = json.loads((path.parent / "genai_config.json").read_text())["model"]["decoder"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    seq = np.asarray([list(ids) + list(tokens[:-1])], dtype=np.int64)
    feed = {"input_ids": seq, "attention_mask": np.ones_like(seq)}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            heads = i.shape[1] if isinstance(i.shape[1], int) else decoder["num_key_value_heads"]
            size = i.shape[3] if isinstance(i.shape[3], int) else decoder["head_size"]
            feed[i.name] = np.zeros((1, heads, 0, size), dtype=np.float32)
    logits = session.run(["logits"], feed)[0][0, len(ids) - 1 :].astype(np.float64)
    return _mean_logprob(logits, tokens)


def _with_delta(score: dict, reference: float | None) -> dict:
    value = score.get("mean_logprob")
    if value is not None and reference is not None:
        score["delta_vs_fp32"] = round(value - reference, 4)
    return score


# ---- workers ----------------------------------------------------------------------------------


class Worker:
    """One engine's process; requests go in as JSON lines, results come back the same way."""

    def __init__(
        self, engine: str, python: str, threads: int, args: argparse.Namespace, model: dict
    ) -> None:
        self.engine, self.threads = engine, threads
        cmd = [python, str(HERE / "e2e_worker.py"), engine, "--threads", str(threads)]
        if model.get("model") is not None:
            cmd += ["--model", str(model["model"])]
        cmd += ["--tokenizer", str(model["tokenizer"]), "--hf", args.hf]
        cmd += ["--genai", args.genai_model, "--gguf", args.gguf]
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


def measure(
    args: argparse.Namespace,
    ids: list[int],
    log,
    models: dict[str, dict],
    engines: dict[str, dict],
    quality: dict[str, dict],
    tokens: list[int],
) -> list[dict]:
    """Run every configuration; fills `engines` (status, load, versions) and, from the workers of
    the first thread count after their timed runs, the `quality` scores no ONNX file gave."""
    runs: list[dict] = []
    configs = [(b, m) for b in args.batch for m in args.modes]
    for round_, threads in enumerate(args.threads):
        workers: list[Worker] = []
        for engine in args.engines:
            if engines.get(engine, {}).get("status") == "skipped":
                continue
            python, reason = _python_for(engine, args)
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
                                f"t{threads} b{batch} {mode:7s} rep {rep}: {worker.engine:22s} "
                                f"{run['decode_tps']:7.1f} tok/s decode, ttft "
                                f"{run['ttft_s'] * 1000:6.0f} ms"
                            )
                        else:
                            log(
                                f"t{threads} b{batch} {mode} rep {rep}: {worker.engine} failed: "
                                f"{result.get('error')}"
                            )
                        runs.append(run)
            if round_ == 0 and tokens:  # after the timed runs: they are not disturbed by it
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
        finally:
            for worker in workers:
                worker.close()
    return runs


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

    began = time.time()
    engines: dict[str, dict] = {}
    models = prepare_models(args, engines, log)
    reference = models["__reference__"]
    ids = prompt_ids(reference["tokenizer"], args.message)
    quality: dict[str, dict] = {}
    tokens: list[int] = []
    ref_score = None
    if args.quality_tokens:
        threads = max(args.threads)
        log(f"quality: {args.quality_tokens} greedy tokens of {reference['model']}")
        tokens = reference_tokens(reference["model"], ids, args.quality_tokens, threads)
        from onnxsample.exporters._verify import mean_logprob

        ref_score = round(mean_logprob(reference["model"], ids, tokens, threads=threads), 4)
        quality.update(score_onnx(models, ids, tokens, threads, log))
    prepared_s = round(time.time() - began, 1)
    load_before = load_average()
    began = time.time()
    runs = measure(args, ids, log, models, engines, quality, tokens)
    for engine in args.engines:
        entry = engines.setdefault(engine, {"status": "skipped", "reason": "not started"})
        if not args.quality_tokens:
            continue
        score = quality.get(engine)
        if score is None:
            why = entry.get("reason") if entry["status"] != "ok" else "not scored"
            score = {"mean_logprob": None, "reason": f"engine skipped: {why}"}
        entry["quality"] = _with_delta(score, ref_score)
    report = {
        "benchmark": "e2e",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - began, 1),
        "prepare_s": prepared_s,
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
        "quality": {
            "method": QUALITY_DOC,
            "reference": REFERENCE,
            "reference_model": str(reference["model"]),
            "tokens": tokens,
            "reference_logprob": ref_score,
        }
        if args.quality_tokens
        else None,
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
