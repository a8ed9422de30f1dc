"""The penalty counts read and written in one buffer (``counts_in_place``): the composer records it
only where every reader of ``sampler.output_counts`` runs before the write, and an engine that
binds one buffer gives what two buffers give."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from onnxsample import Generator, SamplingParams
from onnxsample.composer import compose, composed_metadata
from onnxsample.composer._in_place import counts_in_place
from onnxsample.engine import _slots

S, V = 2, 16
COMPOSITIONS = {
    "branching": {},
    "static": {"static": True},
    "drafts": {"draft_tokens": 2},
    "prompt_logprobs": {"prompt_logprobs": True},
    "allowed_probs": {"allowed_tokens": True, "output_probs": True},
    "inline": {"inline": True},
}


@pytest.mark.parametrize("options", COMPOSITIONS.values(), ids=COMPOSITIONS.keys())
def test_every_composition_reads_its_counts_before_it_writes_them(
    tiny_gqa_export, tmp_path, options
):
    path = compose(
        tiny_gqa_export.output, None, tmp_path / "c.onnx", max_slots=4, max_bias=2, **options
    )
    assert composed_metadata(onnx.load(path, load_external_data=False)).counts_in_place


BRANCHING = {k: v for k, v in COMPOSITIONS.items() if k not in ("static", "inline")}


@pytest.mark.parametrize("options", BRANCHING.values(), ids=BRANCHING.keys())
def test_the_counts_gain_the_steps_tokens_once(tiny_gqa_export, tmp_path, options):
    """The branching composition adds the emitted tokens to all S rows itself, so its chain
    returns no counts of its own: ONNX Runtime would compute that unread output every step."""
    path = compose(
        tiny_gqa_export.output, None, tmp_path / "c.onnx", max_slots=4, max_bias=2, **options
    )
    model = onnx.load(path, load_external_data=False)
    chain = next(f for f in model.functions if f.name == "SamplerChain")
    assert "output_counts_out" not in chain.output
    assert "UpdateCounts" not in [n.op_type for n in chain.node]


def test_a_chain_without_penalties_keeps_no_counts(tiny_gqa_export, tmp_path):
    path = compose(tiny_gqa_export.output, "temperature,dist", tmp_path / "c.onnx", max_slots=4)
    assert not composed_metadata(onnx.load(path, load_external_data=False)).counts_in_place


C, C_OUT = "sampler.output_counts", "sampler.output_counts_out"
_SHAPES = {"seen": [S, 1], "negated": [S * V], "branched": [S, V]}


def _graph(extra: list, outputs: list[str], updates: str) -> ir.Model:
    """counts int32[S, V] -> ScatterElements(counts, ids, `updates`) = counts_out, beside `extra`
    nodes (which may read the counts) and `outputs` (more graph outputs, int32)."""
    one = helper.make_tensor("one", TensorProto.INT32, [S, 1], [1] * S)
    scatter = helper.make_node(
        "ScatterElements", [C, "ids", updates], [C_OUT], axis=1, reduction="add"
    )
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["one"], value=one), *extra, scatter],
        "g",
        [
            helper.make_tensor_value_info(C, TensorProto.INT32, [S, V]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [S, 1]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info(C_OUT, TensorProto.INT32, [S, V]),
            *(helper.make_tensor_value_info(o, TensorProto.INT32, _SHAPES[o]) for o in outputs),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return ir.serde.deserialize_model(model)


def _branch(reads: str, out: str) -> onnx.GraphProto:
    """A branch that returns Neg(`reads`), an outer value."""
    node = helper.make_node("Neg", [reads], [out])
    return helper.make_graph(
        [node], "b", [], [helper.make_tensor_value_info(out, TensorProto.INT32, [S, V])]
    )


_GATHER = helper.make_node("GatherElements", [C, "ids"], ["seen"], axis=1)
_VIEW = helper.make_node("Reshape", [C, "flat_shape"], ["flat"])
_FLAT_SHAPE = helper.make_node(
    "Constant", [], ["flat_shape"], value=helper.make_tensor("", 7, [1], [-1])
)
_IF = helper.make_node(
    "If", ["flag"], ["branched"], then_branch=_branch(C, "t"), else_branch=_branch(C, "e")
)
GRAPHS = {
    # (extra nodes, extra outputs, the scatter's updates): safe
    "the write alone": ([], [], "one", True),
    "a read that feeds the write": ([_GATHER], [], "seen", True),
    "a read after the write": ([_GATHER], ["seen"], "one", False),
    "a view read after the write": (
        [_FLAT_SHAPE, _VIEW, helper.make_node("Neg", ["flat"], ["negated"])],
        ["negated"],
        "one",
        False,
    ),
    "a branch that reads after the write": ([_IF], ["branched"], "one", False),
    "a branch that feeds the write": (
        [_IF, helper.make_node("GatherElements", ["branched", "ids"], ["picked"], axis=1)],
        [],
        "picked",
        True,
    ),
}


@pytest.mark.parametrize(
    ("extra", "outputs", "updates", "safe"), GRAPHS.values(), ids=GRAPHS.keys()
)
def test_one_buffer_only_where_every_read_comes_before_the_write(extra, outputs, updates, safe):
    model = _graph(extra, outputs, updates)
    onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)
    assert counts_in_place(model) is safe


@pytest.fixture(scope="module")
def composed(tiny_gqa_export, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("in-place")
    return {
        kind: compose(tiny_gqa_export.output, None, folder / f"{kind}.onnx", max_slots=4, **options)
        for kind, options in (("branching", {}), ("static", {"static": True}))
    }


@pytest.mark.parametrize("kind", ["branching", "static"])
def test_one_buffer_gives_what_two_buffers_give(composed, tiny_gqa_export, kind, monkeypatch):
    """Penalised sequences, batched: the same tokens and logprobs with the counts read and written
    in one buffer as in two that swap."""
    params = [
        SamplingParams(temperature=0, repetition_penalty=1.5, frequency_penalty=0.5),
        SamplingParams(temperature=0.9, presence_penalty=1.0, top_k=8, seed=3, logprobs=True),
        SamplingParams(temperature=0, frequency_penalty=2.0),
    ]
    prompts = ["the cat sat on the mat", "one two three", "a b a b a b"]

    made: list[bool] = []
    init = _slots.SlotState.__init__

    def recorded(self, meta, *args, two: bool = False, **kwargs):
        init(self, meta, *args, **kwargs)
        if two:
            self.in_place = False
            shape = (meta.max_slots, meta.vocab_size)
            self._spare = _slots.ortvalue(np.zeros(shape, np.int32), "cpu")
        made.append(self.in_place)

    def run(two: bool) -> list:
        monkeypatch.setattr(
            _slots.SlotState, "__init__", lambda *a, **k: recorded(*a, two=two, **k)
        )
        with Generator(composed[kind], tokenizer=tiny_gqa_export.output, threads=1) as gen:
            done = gen.generate(prompts, params, max_new_tokens=12, chat=False)
        return [(c.token_ids, c.logprobs) for c in done]

    one, two = run(False), run(True)
    assert made == [True, False]
    assert one == two
