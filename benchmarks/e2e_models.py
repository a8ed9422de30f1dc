"""The end-to-end benchmark's engines and the models they run: which engine runs which export of the
embedded model, and making those exports and composed graphs before any worker starts (a worker's
peak RSS would otherwise include them)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from _harness.workload import compose_cached

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

Log = Callable[[str], None]


def export_variant(engine: str, cache: Path, log: Log) -> tuple[Path, dict]:
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
    from onnxsample.prepare import RUN_COMPOSE_OPTIONS

    source = Path(genai_model) / "model.onnx"
    return compose_cached(source, cache / "genai-composed.onnx", None, **RUN_COMPOSE_OPTIONS)


def prepare_models(args: argparse.Namespace, engines: dict, log: Log) -> dict[str, dict]:
    """Export and compose what the engines run, here rather than in the workers (whose peak RSS
    would show it). Returns engine -> {"model", "tokenizer", "scored"}; an engine whose model cannot
    be made is entered in `engines` as skipped. The reference export is always made."""
    cache = Path(args.cache)
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
    models: dict[str, dict] = {}
    for engine in args.engines:
        if engine in engines:
            continue
        try:
            models[engine] = _model_of(engine, args, cache, exported, reference)
        except Exception as exc:
            engines[engine] = {"status": "skipped", "reason": f"{type(exc).__name__}: {exc}"}
            log(f"{engine}: skipped: {exc}")
    models["__reference__"] = {"model": reference / "model.onnx", "tokenizer": reference}
    return models


def _model_of(
    engine: str,
    args: argparse.Namespace,
    cache: Path,
    exported: dict[str, tuple[Path, dict]],
    reference: Path,
) -> dict:
    """What `engine` runs ("model"), its tokenizer's folder, the ONNX file its quality is scored on
    here ("scored"; None: scored in its worker) and, for our exports, what the export did."""
    genai = Path(args.genai_model)
    if engine in VARIANTS:
        from onnxsample import prepare

        folder, info = exported[engine]
        model = prepare(folder)
        return {
            "model": model,
            "tokenizer": folder,
            "export": info,
            "scored": folder / "model.onnx",
        }
    if engine == GENAI_GRAPH and (genai / "genai_config.json").is_file():
        model = compose_genai_graph(args.genai_model, cache)
        return {"model": model, "tokenizer": reference, "scored": genai / "model.onnx"}
    if engine == "optimum" and "onnxsample" in exported:
        folder, info = exported["onnxsample"]
        return {
            "model": folder,
            "tokenizer": folder,
            "export": info,
            "scored": folder / "model.onnx",
        }
    if engine == "genai":
        return {"model": genai, "tokenizer": reference, "scored": genai / "model.onnx"}
    if engine in ("transformers", "llamacpp"):
        return {"model": None, "tokenizer": reference, "scored": None}
    if engine == GENAI_GRAPH:
        raise RuntimeError(f"no genai model in {args.genai_model}: run `make genai-model`")
    raise RuntimeError("the fp32 optimum export failed (see onnxsample)")  # optimum without it
