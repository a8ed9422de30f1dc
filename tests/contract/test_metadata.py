"""The composed model's metadata: one typed object, written and read in one place."""

from __future__ import annotations

import pytest

from onnxsample.chain import SamplerChain
from onnxsample.errors import InvalidParameter, ModelError
from onnxsample.metadata import ComposedMetadata, composed_metadata


@pytest.mark.parametrize(
    "meta",
    [
        ComposedMetadata(SamplerChain.full(), 8, 49152, top_logprobs=20, max_bias=16),
        ComposedMetadata(SamplerChain.greedy(), 1, 32, kv_layout="gqa", kv_head_size=64),
        ComposedMetadata(SamplerChain.greedy(), 2, 32, kv_layout="gqa", exact_positions=True),
        ComposedMetadata(
            SamplerChain("temperature,dist"),
            4,
            100,
            prompt_logprobs=True,
            output_probs=True,
            output_candidates=5,
            gather="lm_head",
            inline=True,
            versions={"onnx": "1.23.2"},
        ),
    ],
)
def test_round_trip_through_the_props(meta):
    props = meta.to_props()
    assert all(k.startswith("onnxsample.") and isinstance(v, str) for k, v in props.items())
    assert ComposedMetadata.from_props(props) == meta


@pytest.mark.parametrize(
    "props, expected",
    [
        ({}, None),
        ({"producer": "x"}, None),
        ({"onnxsample.chain": "dist"}, None),  # no slot count: not one of ours
    ],
)
def test_other_models_have_none(props, expected):
    assert ComposedMetadata.from_props(props) is expected


_BASE = {"onnxsample.chain": "dist", "onnxsample.max_slots": "2", "onnxsample.vocab_size": "3"}


@pytest.mark.parametrize(
    "props, message",
    [
        ({"onnxsample.chain": "dist", "onnxsample.max_slots": "x"}, "unreadable"),
        ({"onnxsample.chain": "dist", "onnxsample.max_slots": "2"}, "unreadable"),  # no vocab
        ({"onnxsample.chain": "bogus", "onnxsample.max_slots": "2"}, "unknown sampler"),
        (
            {
                "onnxsample.chain": "",
                "onnxsample.max_slots": "2",
                "onnxsample.vocab_size": "3",
                "onnxsample.kv_layout": "paged",
            },
            "kv_layout",
        ),
        # values no composer writes: refused, not read as a graph of -3 slots or a False
        ({**_BASE, "onnxsample.max_slots": "-3"}, "max_slots is -3"),
        ({**_BASE, "onnxsample.vocab_size": "0"}, "vocab_size is 0"),
        ({**_BASE, "onnxsample.draft_tokens": "-5"}, "draft_tokens is -5"),
        ({**_BASE, "onnxsample.static": "yes"}, "static is 'yes', not true or false"),
    ],
)
def test_damaged_metadata_is_a_clear_error(props, message):
    with pytest.raises(ModelError, match=message):
        ComposedMetadata.from_props(props)


def test_metadata_of_what_is_no_model_is_a_typed_error():
    with pytest.raises(InvalidParameter, match="got NoneType"):
        composed_metadata(None)


def test_unknown_keys_are_ignored():
    props = ComposedMetadata(SamplerChain("dist"), 2, 3).to_props()
    props["onnxsample.future_field"] = "1"
    assert ComposedMetadata.from_props(props) == ComposedMetadata(SamplerChain("dist"), 2, 3)


def test_a_plain_model_has_no_metadata(tiny_export):
    assert composed_metadata(tiny_export.model_path) is None


def test_props_are_read_without_parsing_the_graph(tiny_export, tmp_path):
    """read_props walks the protobuf wire format; it agrees with onnx on real models."""
    import onnx

    from onnxsample.composer import compose
    from onnxsample.metadata import read_props

    composed = compose(tiny_export.output, None, tmp_path / "c.onnx", max_slots=2)
    for path in (tiny_export.model_path, composed):
        model = onnx.load(str(path), load_external_data=False)
        assert read_props(path) == {p.key: p.value for p in model.metadata_props}
    assert composed_metadata(composed) == composed_metadata(onnx.load(str(composed)))


def _read_graph(path):
    from onnxsample.composer.loading import read_proto

    return read_proto(path, weights=False)


@pytest.mark.parametrize(
    "content",
    [b"", b"\x08", b"not a model at all", b"\x3a\xff\xff\xff\x0f", b"\x0f\x00"],
    ids=["empty", "cut-varint", "text", "length-past-end", "wire-type-7"],
)
@pytest.mark.parametrize("reader", ["metadata", "graph"])
def test_a_damaged_file_is_a_clear_error(tmp_path, content, reader):
    """Both readers that walk the wire format (the metadata alone; the graph without its
    weights) name a damaged file."""
    from onnxsample.metadata import read_props

    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        (read_props if reader == "metadata" else _read_graph)(path)
