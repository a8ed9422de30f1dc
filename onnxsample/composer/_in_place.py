"""Whether a composed graph may write its penalty counts over the ones it reads.

``sampler.output_counts_out`` is ``sampler.output_counts`` [S, V] plus the tokens emitted this
step, added by one ``ScatterElements`` (``AddTokens``). ONNX Runtime's ``ScatterElements`` copies
its input into its output first, unless the two are one buffer: bound to two buffers, a step copies
all S rows of the counts (8 MB for 8 slots of a 262k vocabulary, about 2 ms on a CPU core), bound
to one, it adds the step's tokens where they lie.

One buffer is safe when nothing reads the counts after they are written. ONNX Runtime runs a
graph's nodes in a topological order, so the condition is structural: every node that reads the
input's memory (directly, through a view — ``Reshape``, ``Squeeze``, … share their input's buffer
— or from inside an ``If`` branch) is an ancestor of the node that writes the output. It is
checked on the inlined graph, as ONNX Runtime runs it, and recorded in the metadata
(``counts_in_place``): an engine binds one buffer only where the composer found it safe.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxsample.composer._splice import COUNTS, COUNTS_OUT

__all__ = ["counts_in_place"]

# ONNX Runtime's CPU and CUDA kernels of these ops may return their input's buffer as the output.
_VIEWS = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})


def _owners(graph: ir.Graph) -> dict[ir.Node, ir.Node]:
    """Every node of `graph` and of its subgraphs (any depth) -> the node of `graph` holding it."""
    owner: dict[ir.Node, ir.Node] = {}
    for top in graph:
        owner[top] = top
        for attr in top.attributes.values():
            for sub in _graphs(attr):
                for node in sub.all_nodes():
                    owner[node] = top
    return owner


def _graphs(attr: ir.Attr) -> list[ir.Graph]:
    if attr.type == ir.AttributeType.GRAPH:
        return [attr.as_graph()]
    if attr.type == ir.AttributeType.GRAPHS:
        return list(attr.as_graphs())
    return []


def _readers(source: ir.Value, graph: ir.Graph, owner: dict[ir.Node, ir.Node]) -> set[ir.Node]:
    """The nodes of `graph` that read `source`'s buffer, directly or through views."""
    readers: set[ir.Node] = set()
    frontier = [source]
    while frontier:
        value = frontier.pop()
        for node, _ in value.uses():
            top = owner.get(node, node)
            readers.add(top)
            if node is top and node.op_type in _VIEWS and node.domain in ("", "ai.onnx"):
                frontier.extend(node.outputs)
    return readers


def _ancestors(node: ir.Node, owner: dict[ir.Node, ir.Node]) -> set[ir.Node]:
    """The nodes `node` waits for: the producers of its inputs and of the outer values its
    subgraphs read, transitively."""
    inner: dict[ir.Node, list[ir.Node]] = {}
    for n, top in owner.items():
        inner.setdefault(top, []).append(n)
    seen: set[ir.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        for member in inner.get(current, [current]):
            for value in member.inputs:
                producer = value.producer() if value is not None else None
                top = owner.get(producer) if producer is not None else None
                if top is not None and top is not current and top not in seen:
                    seen.add(top)
                    stack.append(top)
    return seen


def counts_in_place(model: ir.Model) -> bool:
    """Whether `model` may be run with ``sampler.output_counts`` and ``sampler.output_counts_out``
    bound to one buffer: every reader of the counts runs before their writer (module docs)."""
    if not any(v.name == COUNTS for v in model.graph.inputs):
        return False
    flat = model.clone()
    ir.passes.common.InlinePass()(flat)
    graph = flat.graph
    source = next(v for v in graph.inputs if v.name == COUNTS)
    sink = next((v for v in graph.outputs if v.name == COUNTS_OUT), None)
    writer = sink.producer() if sink is not None else None
    if writer is None or writer.graph is not graph:
        return False
    owner = _owners(graph)
    before = _ancestors(writer, owner)
    return all(r is writer or r in before for r in _readers(source, graph, owner))
