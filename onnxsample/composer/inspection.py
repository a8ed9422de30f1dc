"""What an ONNX file holds, read without loading its weights: the summary `onnxsample inspect` shows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from onnxsample.composer.loading import check_external_data, read_proto
from onnxsample.graphs.chain import CHAIN_FUNCTION, DOMAIN
from onnxsample.metadata import FALLBACK_MODEL, ComposedMetadata, composed_metadata

__all__ = ["ModelSummary", "ValueSummary", "inspect_model"]

_ELEM = {v: k.lower() for k, v in onnx.TensorProto.DataType.items()}


@dataclass
class ValueSummary:
    name: str
    dtype: str
    shape: list[int | str]
    doc: str = ""


@dataclass
class ModelSummary:
    """Inputs, outputs, sampler chain, op counts, size and metadata of one ONNX file."""

    path: Path
    size_bytes: int
    external_data: list[Path]
    ir_version: int
    opsets: dict[str, int]
    inputs: list[ValueSummary]
    outputs: list[ValueSummary]
    op_counts: Counter
    functions: list[str]
    chain_ops: Counter
    metadata: dict[str, str] = field(default_factory=dict)
    sampler: ComposedMetadata | None = None

    @property
    def composed(self) -> bool:
        return self.sampler is not None


def _values(values) -> list[ValueSummary]:
    out = []
    for v in values:
        t = v.type.tensor_type
        shape = [d.dim_param or d.dim_value for d in t.shape.dim] if t.HasField("shape") else []
        out.append(ValueSummary(v.name, _ELEM.get(t.elem_type, "?"), shape, v.doc_string))
    return out


def _chain_ops(model: onnx.ModelProto) -> Counter:
    """Op types inside the sampler chain, its functions and the branches of its ``If`` expanded
    (what Netron shows inside the node)."""
    functions = {(f.domain, f.name): f for f in model.functions}
    counts: Counter = Counter()

    def visit(nodes) -> None:
        for node in nodes:
            key = (node.domain, node.op_type)
            if key in functions:
                visit(functions[key].node)
            else:
                counts[node.op_type] += 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g.node)

    if (DOMAIN, CHAIN_FUNCTION) in functions:
        visit(functions[(DOMAIN, CHAIN_FUNCTION)].node)
    return counts


def inspect_model(path: str | Path) -> ModelSummary:
    """Summarise `path` (an ``.onnx`` file, or an export folder's model) without reading weights."""
    path = Path(path)
    if path.is_dir():
        composed = path / "composed.onnx"
        path = composed if composed.is_file() else path / "model.onnx"
    model = read_proto(path, weights=False)
    external = check_external_data(model, path.parent)
    return ModelSummary(
        path=path,
        size_bytes=path.stat().st_size + sum(p.stat().st_size for p in external),
        external_data=external,
        ir_version=model.ir_version,
        opsets={o.domain or "ai.onnx": o.version for o in model.opset_import},
        inputs=_values(model.graph.input),
        outputs=_values(model.graph.output),
        op_counts=Counter(
            f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in model.graph.node
        ),
        functions=[f"{f.domain}.{f.name}" for f in model.functions],
        chain_ops=_chain_ops(model),
        metadata={p.key: _shown(p.key, p.value) for p in model.metadata_props},
        sampler=composed_metadata(model),
    )


def _shown(key: str, value: str) -> str:
    """A metadata value as a summary shows it: the fallback chain's encoded model by its size."""
    if key == FALLBACK_MODEL:
        return f"<the branching chain for one slot, {len(value):,} characters>"
    return value
