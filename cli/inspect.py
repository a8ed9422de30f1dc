"""`onnxsample inspect`: what an ONNX file (or a GGUF file) holds; `--netron` serves it to a
browser."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from onnxsample.cli._ui import human_bytes, out
from onnxsample.errors import OnnxSampleError


def inspect(
    file: Annotated[
        Path,
        typer.Argument(help="An .onnx file, an export folder or a .gguf file.", show_default=False),
    ],
    netron: Annotated[
        bool,
        typer.Option(
            "--netron", help="Serve the model with Netron on localhost and print the URL."
        ),
    ] = False,
    port: Annotated[
        int | None,
        typer.Option("--port", help="Port for --netron (default 8080).", min=1, max=65535),
    ] = None,
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="With --netron, do not open a browser.")
    ] = False,
) -> None:
    """Summarise a model: inputs and outputs, sampler chain and slots, op counts, size, metadata
    (a GGUF file: its model, tensor types, how it exports, its tokenizer)."""
    from onnxsample._gguf_file import is_gguf
    from onnxsample.composer.inspection import inspect_model

    given = [
        name for name, on in (("--port", port is not None), ("--no-browser", no_browser)) if on
    ]
    if given and not netron:  # they would change nothing
        raise OnnxSampleError(f"{given[0]} is for --netron: give --netron too")

    if is_gguf(file) or (file.suffix.lower() == ".gguf" and file.is_file()):  # as `export` reads
        render_gguf(file)
        path = file
    else:
        summary = inspect_model(file)
        render_summary(summary)
        path = summary.path
    if netron:  # Netron reads GGUF files too
        _serve(path, 8080 if port is None else port, browse=not no_browser)


def render_gguf(file: Path) -> None:
    """What a GGUF file holds, as `export` reads it: the model, its tensor types and whether
    the export keeps them as they are, the tokenizer and chat template the file carries."""
    from onnxsample.exporters import gguf
    from onnxsample.exporters._options import untransplantable
    from onnxsample.exporters._source import split_parts

    info = gguf.inspect_gguf(file)
    meta, arch = info.metadata, info.architecture
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    parts = split_parts(file) or (file,)  # a split file named by its first part: every part
    split = f", {len(parts)} parts" if len(parts) > 1 else ""
    head.add_row("file", f"{file} (GGUF{split})")
    head.add_row("size", human_bytes(sum(p.stat().st_size for p in parts)))
    context = meta.get(f"{arch}.context_length", "unknown")
    head.add_row(
        "model",
        f"{meta.get('general.name', file.stem)}: {arch}, {info.n_params / 1e6:.0f}M parameters, "
        f"context {context}",
    )
    head.add_row("tensors", ", ".join(f"{t} {n}" for t, n in info.tensor_types.most_common()))
    bad = untransplantable(info)
    refusal = _header_refusal(info, file.name)
    head.add_row(
        "export",
        f"refused: {refusal}"
        if refusal
        else "its own blocks, bit for bit (onnxsample export FILE)"
        if not bad
        else f"float32: {', '.join(bad)} cannot be transplanted (onnxsample export FILE)",
    )
    template = "a chat template" if meta.get("tokenizer.chat_template") else "no chat template"
    head.add_row(
        "tokenizer",
        f"{meta.get('tokenizer.ggml.model', 'none')} (pre-tokenizer "
        f"{meta.get('tokenizer.ggml.pre', 'default')}), {template}",
    )
    out.print(head)


def _header_refusal(info, name: str) -> str | None:
    """Why `export` refuses the model its header describes (an architecture it does not export,
    a damaged size), or None: the check export makes before it reads a weight."""
    from onnxsample.errors import ExportError
    from onnxsample.exporters.families import gguf_family

    try:
        gguf_family(info.architecture, name).gguf_spec(info.metadata, set(info.tensors), name)
    except ExportError as exc:
        return str(exc)
    return None


def render_summary(s, *, brief: bool = False) -> None:
    """Print a :class:`~onnxsample.composer.inspection.ModelSummary` (also used after `compose`)."""
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("file", str(s.path))
    size = human_bytes(s.size_bytes)
    if s.external_data:
        size += "  (external data: " + ", ".join(p.name for p in s.external_data) + ")"
    head.add_row("size", size)
    head.add_row(
        "versions",
        f"IR {s.ir_version}, opsets " + ", ".join(f"{d} {v}" for d, v in s.opsets.items()),
    )
    if s.composed:
        m = s.sampler
        kind = " (static: no control flow, CUDA-graph capturable)" if m.static else ""
        head.add_row("sampler chain", (str(m.chain) or "greedy only") + kind)
        gather = "the LM head" if m.gather == "lm_head" else "sampling"
        head.add_row(
            "slots",
            f"{m.max_slots} (top logprobs {m.top_logprobs}, logit bias entries {m.max_bias}, "
            f"prompt logprobs {'yes' if m.prompt_logprobs else 'no'}, draft tokens "
            f"{m.draft_tokens or 'none'}, gather before {gather}, KV layout {m.kv_layout})",
        )
        if s.chain_ops:
            head.add_row("chain ops", ", ".join(f"{op} {n}" for op, n in s.chain_ops.most_common()))
    else:
        head.add_row("sampler chain", "none (not a composed model)")
    nodes = sum(s.op_counts.values())
    head.add_row(
        "nodes", f"{nodes}: " + ", ".join(f"{op} {n}" for op, n in s.op_counts.most_common(8))
    )
    out.print(head)
    if brief:
        sampler_io = [v for v in s.inputs + s.outputs if v.name.startswith("sampler.")]
        out.print("sampler I/O: " + ", ".join(f"{v.name} {v.dtype}{v.shape}" for v in sampler_io))
        return
    for title, values in (("inputs", s.inputs), ("outputs", s.outputs)):
        rows = _collapse_kv(values)
        table = Table(title=title, title_justify="left", show_edge=False)
        table.add_column(
            "name", no_wrap=True, min_width=max((len(v.name) for v in rows), default=4)
        )
        table.add_column("dtype", no_wrap=True, min_width=7)
        table.add_column("shape", overflow="fold", ratio=1)
        table.add_column("meaning", overflow="fold", ratio=1)
        for v in rows:
            shape = Text("[" + ", ".join(map(str, v.shape)) + "]")
            table.add_row(Text(v.name), v.dtype, shape, Text(v.doc))
        out.print(table)
    if s.metadata:
        out.print("metadata: " + ", ".join(f"{k}={v}" for k, v in s.metadata.items()))


def _collapse_kv(values):
    """Show the KV cache as one row per kind instead of one per layer."""
    from onnxsample.composer.inspection import ValueSummary

    shown, cache = [], {}
    for v in values:
        parts = v.name.split(".")
        if parts[0] in ("past_key_values", "present") and len(parts) == 3 and parts[1].isdigit():
            key = (parts[0], parts[2])
            if key not in cache:
                cache[key] = [v, 0]
                shown.append(key)
            cache[key][1] += 1
        else:
            shown.append(v)
    rows = []
    for item in shown:
        if isinstance(item, tuple):
            v, n = cache[item]
            rows.append(
                ValueSummary(f"{item[0]}.0..{n - 1}.{item[1]}", v.dtype, v.shape, f"{n} layers")
            )
        else:
            rows.append(item)
    return rows


def _serve(path: Path, port: int, *, browse: bool) -> None:
    try:
        import netron
    except ImportError:
        raise OnnxSampleError(
            "--netron needs Netron's viewer: pip install 'onnxsample[viz]' (or: pip install netron)"
        ) from None

    try:
        address = netron.start(str(path), address=("localhost", port), browse=browse)
    except OSError as exc:  # the port is taken, or not ours to take
        raise OnnxSampleError(
            f"Netron cannot serve on port {port}: {exc.strerror or exc} (choose another: --port)"
        ) from None
    host, bound = address if isinstance(address, tuple) else ("localhost", port)
    out.print(
        f"Netron is serving {path.name} at http://{host}:{bound}  (Ctrl-C stops it)", soft_wrap=True
    )
    try:
        netron.wait()
    except KeyboardInterrupt:
        pass
    finally:
        netron.stop(address)
