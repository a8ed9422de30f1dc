"""The same function bodies from every process.

onnxscript gives an ``if`` statement that assigns several variables an ``If`` node whose outputs
come in the order of a Python ``set`` of the variables' names, which string hashing randomises
per process, and names each output after its variable with the next free counter (``out_6``,
``out_max_7``); so two processes wrote different files for the same composed model. Here each
such node's outputs are put in the order of their variables' names, with the counters handed out
in that order, as one process would have named them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import onnx

__all__ = ["in_name_order"]

_COUNTED = re.compile(r"^(?P<base>.*?)(?:_(?P<count>\d+))?$")


def in_name_order(function: onnx.FunctionProto) -> onnx.FunctionProto:
    """`function` (changed in place and returned) with every multi-output ``If`` in name order."""
    for node in list(_nodes(function.node)):
        if node.op_type == "If" and len(node.output) > 1:
            _reorder(function, node)
    return function


def _reorder(function: onnx.FunctionProto, node: onnx.NodeProto) -> None:
    parts = [_COUNTED.match(name) for name in node.output]
    bases = [m["base"] for m in parts]
    if len(set(bases)) != len(bases):
        return
    order = sorted(range(len(bases)), key=bases.__getitem__)
    counts = sorted((m["count"] for m in parts), key=lambda c: -1 if c is None else int(c))
    renamed = {
        node.output[i]: bases[i] + ("" if count is None else f"_{count}")
        for i, count in zip(order, counts, strict=True)
    }
    for branch in node.attribute:
        outputs = [branch.g.output[i] for i in order]
        del branch.g.output[:]
        branch.g.output.extend(outputs)
    _rename(function, renamed)
    outputs = [node.output[i] for i in order]
    del node.output[:]
    node.output.extend(outputs)
    # their value_info entries, in the places they held, in the outputs' order
    places = [i for i, info in enumerate(function.value_info) if info.name in outputs]
    copies = [
        onnx.ValueInfoProto.FromString(function.value_info[i].SerializeToString()) for i in places
    ]
    copies.sort(key=lambda info: outputs.index(info.name))
    for i, info in zip(places, copies, strict=True):
        function.value_info[i].CopyFrom(info)


def _rename(function: onnx.FunctionProto, renamed: dict[str, str]) -> None:
    """Every reference to a name in `renamed`, anywhere in `function`, renamed."""

    def swap(names) -> None:
        names[:] = [renamed.get(n, n) for n in names]

    for node in _nodes(function.node):
        swap(node.input)
        swap(node.output)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                for info in (*attr.g.input, *attr.g.output, *attr.g.value_info):
                    info.name = renamed.get(info.name, info.name)
    swap(function.output)
    for info in function.value_info:
        info.name = renamed.get(info.name, info.name)


def _nodes(nodes) -> Iterator[onnx.NodeProto]:
    """`nodes` and those of their subgraphs, each node before its subgraphs' nodes."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g.node)
