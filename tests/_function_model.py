"""A model that calls one library function of the ``onnxsample`` domain (with the functions it
calls), checked in full."""

import onnx
from onnx import helper

from onnxsample.graphs._common import DOMAIN, DOMAIN_VERSION
from onnxsample.graphs.library import for_vocabulary, used_functions


def function_model(
    fn, inputs: list, outputs: list, constants: dict[str, int] | None = None, vocab: int = 0
) -> onnx.ModelProto:
    """`fn`(inputs, then `constants` as INT64[1] values) → outputs; inputs and outputs are
    value infos, the call's arguments named after them. With `vocab`, the functions are the ones
    a composed model of that vocabulary carries (``for_vocabulary``)."""
    constants = constants or {}
    nodes = [
        helper.make_node("Constant", [], [name], value_ints=[value])
        for name, value in constants.items()
    ]
    functions = used_functions(fn.to_function_proto())
    names = [i.name for i in inputs] + list(constants)
    nodes.append(helper.make_node(fn.name, names, [o.name for o in outputs], domain=DOMAIN))
    model = helper.make_model(
        helper.make_graph(nodes, "call", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
        functions=for_vocabulary(functions, vocab) if vocab else functions,
        ir_version=10,
    )
    onnx.checker.check_model(model, full_check=True)
    return model
