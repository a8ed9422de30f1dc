"""`export --attention exact`: a token's logits are the same bits in a one-token step and inside a
multi-token call (verification, echo, prefill chunks), which GroupQueryAttention on the CPU does not
give; the export itself (parity with transformers, manifest, metadata, refusals)."""

from __future__ import annotations

from collections import Counter

import gguf
import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxsample.composer._lm_head import find_lm_head
from onnxsample.composer._model_facts import ATTENTION_KEY, exact_positions, shared_kv
from onnxsample.composer.loading import check_model
from onnxsample.errors import ExportError
from onnxsample.exporters import export
from onnxsample.exporters._gguf_quant import from_gguf
from onnxsample.exporters._options import export_name
from onnxsample.exporters._verify import ort_greedy
from onnxsample.exporters.families import DecoderSpec
from onnxsample.exporters.gqa import build_gqa_model

PROMPT = [1, 504, 3458, 314, 260, 1000, 77, 9]
BUFFER = 32  # positions of the test's KV buffers


def _spec(heads: int, kv_heads: int, intermediate: int = 48) -> DecoderSpec:
    return DecoderSpec(
        vocab_size=96,
        hidden_size=16 * heads,
        intermediate_size=intermediate,
        num_layers=2,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_positions=64,
        tied=False,
    )


def _weights(spec: DecoderSpec, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, d, f = spec.hidden_size, spec.head_dim, spec.intermediate_size
    shapes = {"embed": (spec.vocab_size, h), "norm": (h,), "lm_head": (spec.vocab_size, h)}
    for i in range(spec.num_layers):
        p = f"layers.{i}"
        shapes |= {
            f"{p}.q": (spec.num_heads * d, h),
            f"{p}.k": (spec.num_kv_heads * d, h),
            f"{p}.v": (spec.num_kv_heads * d, h),
            f"{p}.o": (h, spec.num_heads * d),
            f"{p}.gate": (f, h),
            f"{p}.up": (f, h),
            f"{p}.down": (h, f),
            f"{p}.attn_norm": (h,),
            f"{p}.ffn_norm": (h,),
        }
    return {
        k: (1 + 0.1 * rng.standard_normal(s) if len(s) == 1 else 0.3 * rng.standard_normal(s))
        for k, s in shapes.items()
    }


class _Steps:
    """A session over one KV buffer per layer: a prefill, then calls of any number of tokens."""

    def __init__(self, model: ir.Model, tmp_path, name: str) -> None:
        import onnxruntime as ort

        path = tmp_path / f"{name}.onnx"
        ir.save(model, path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.pasts = [i for i in self.session.get_inputs() if i.name.startswith("past")]

    def logits(self, prefix: list[int], tokens: list[int]) -> np.ndarray:
        """Logits [len(tokens), V] of `tokens` fed in one call after `prefix` (its own prefill)."""
        _, cache = self._run(prefix, 0, self._empty())
        logits, _ = self._run(tokens, len(prefix), cache)
        return logits[0]

    def batch_logits(self, prefix: list[int], tokens: list[int]) -> np.ndarray:
        """Logits [len(tokens), V]: one call in which row r (prefilled with `prefix`) computes
        ``tokens[r]``."""
        _, cache = self._run(prefix, 0, self._empty())
        rows = len(tokens)
        feed = {
            "input_ids": np.asarray(tokens, np.int64)[:, None],
            "attention_mask": np.ones((rows, len(prefix) + 1), np.int64),
            **{k: np.repeat(v, rows, axis=0) for k, v in cache.items()},
        }
        return self.session.run(["logits"], feed)[0][:, 0]

    def _empty(self) -> dict:
        return {
            i.name: np.zeros((1, i.shape[1], BUFFER, i.shape[3]), np.float32) for i in self.pasts
        }

    def _run(self, ids: list[int], held: int, cache: dict) -> tuple[np.ndarray, dict]:
        feed = {
            "input_ids": np.asarray([ids], np.int64),
            "attention_mask": np.ones((1, held + len(ids)), np.int64),
            **cache,
        }
        names = [o.name for o in self.session.get_outputs()]
        out = dict(zip(names, self.session.run(None, feed), strict=True))
        return out["logits"], {
            i.name: out[i.name.replace("past_key_values.", "present.")] for i in self.pasts
        }


HEADS = [(4, 2), (6, 2), (2, 2)]  # query heads per KV head: 2, 3, and 1 (a zero row is added)


def _blocks(weights: dict[str, np.ndarray], qtype: str) -> dict:
    """Every matrix as the GGUF blocks gguf's quantiser writes, transplanted as an export keeps
    them (MatMulNBits at 4 bits: M = 1 takes another kernel than M >= 2)."""
    kind = gguf.GGMLQuantizationType[qtype]
    return {
        k: from_gguf(gguf.quants.quantize(w.astype(np.float32), kind), qtype, w.shape[1])
        if w.ndim == 2 and k != "embed"
        else w
        for k, w in weights.items()
    }


# (GGUF type of the matrices or None for float, MatMulNBits accuracy level)
WEIGHTS = [(None, 0), ("Q4_1", 0), ("Q4_1", 4), ("Q4_0", 4)]


@pytest.mark.parametrize(("qtype", "level"), WEIGHTS)
def test_quantised_layers_get_the_same_bits_in_any_call(qtype, level, tmp_path):
    """The same with the GGUF's 4-bit blocks (minimums' correction, a 4-bit LM head), alone and
    in a batch of two rows, at accuracy levels 0 and 4 (int8 activations)."""
    spec = _spec(4, 2, intermediate=64)
    weights = _weights(spec) if qtype is None else _blocks(_weights(spec), qtype)
    model = build_gqa_model(spec, weights, accuracy_level=level, attention="exact")
    steps = _Steps(model, tmp_path, "exact")
    prefix, tokens = [5, 17, 3, 44, 8, 60, 21], [9, 33, 70, 2, 11]
    alone = steps.logits(prefix, tokens[:1])[0]
    np.testing.assert_array_equal(steps.logits(prefix, tokens[:2])[0], alone)
    np.testing.assert_array_equal(steps.logits(prefix, tokens)[0], alone)
    np.testing.assert_array_equal(steps.logits(prefix[:3], prefix[3:] + tokens[:1])[-1], alone)
    np.testing.assert_array_equal(steps.batch_logits(prefix, [tokens[0], tokens[1]])[0], alone)


@pytest.mark.parametrize(("heads", "kv_heads"), HEADS)
def test_a_token_gets_the_same_bits_in_any_call(heads, kv_heads, tmp_path):
    """The token after the prefix: alone, first of 2, first of 5, and the last of a prefill."""
    spec = _spec(heads, kv_heads)
    model = build_gqa_model(spec, _weights(spec), attention="exact")
    steps = _Steps(model, tmp_path, "exact")
    check_model(tmp_path / "exact.onnx")
    prefix, tokens = [5, 17, 3, 44, 8, 60, 21], [9, 33, 70, 2, 11]
    alone = steps.logits(prefix, tokens[:1])[0]
    np.testing.assert_array_equal(steps.logits(prefix, tokens[:2])[0], alone)
    np.testing.assert_array_equal(steps.logits(prefix, tokens)[0], alone)
    np.testing.assert_array_equal(steps.logits(prefix[:3], prefix[3:] + tokens[:1])[-1], alone)
    # ... and it is the attention GroupQueryAttention computes, up to float rounding
    gqa = _Steps(build_gqa_model(spec, _weights(spec)), tmp_path, "gqa")
    np.testing.assert_allclose(gqa.logits(prefix, tokens)[0], alone, rtol=1e-4, atol=1e-4)


def test_why_groupqueryattention_is_not_exact(tmp_path):
    """ONNX Runtime's CPU GroupQueryAttention weights the values with one GEMM of M = positions:
    MLAS takes a kernel of its own for M = 1 (multiply, then add) and the FMA kernel for M >= 2.
    So calls of 2 and 5 tokens agree with each other to the bit and a one-token step does not.
    If this starts failing, ONNX Runtime changed: GroupQueryAttention may have become exact."""
    spec = _spec(4, 2)
    steps = _Steps(build_gqa_model(spec, _weights(spec)), tmp_path, "gqa")
    prefix, tokens = [5, 17, 3, 44, 8, 60, 21, 40, 41, 42, 43, 12], [9, 33, 70, 2, 11]
    alone = steps.logits(prefix, tokens[:1])[0]
    two, five = steps.logits(prefix, tokens[:2]), steps.logits(prefix, tokens)
    np.testing.assert_array_equal(two, five[:2])
    assert not np.array_equal(five[0], alone)
    np.testing.assert_allclose(five[0], alone, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_exact(tiny_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp("exact") / "export"
    return export(tiny_hf, out, layout="gqa", precision="fp32", attention="exact", verify_tokens=16)


def test_the_export_matches_transformers_and_says_what_it_is(tiny_exact, tiny_gqa_export):
    manifest = tiny_exact.manifest
    assert manifest["attention"] == "exact"
    assert manifest["verify"]["ok"], manifest["verify"]  # 16 greedy tokens as transformers'
    ops = Counter(n.op_type for n in onnx.load(str(tiny_exact.model_path)).graph.node)
    assert ops["GroupQueryAttention"] == 0 and ops["ScatterElements"] == 2 * 2
    model = ir.load(tiny_exact.model_path)
    assert model.metadata_props[ATTENTION_KEY] == "exact"
    assert exact_positions(model) and shared_kv(model)
    reference = ort_greedy(tiny_gqa_export.model_path, PROMPT, 24)
    assert ort_greedy(tiny_exact.model_path, PROMPT, 24) == reference


def test_the_folder_name_says_exact():
    assert export_name("m", "gqa", "gguf", 4, attention="exact") == "m-gqa-gguf-a4-exact"
    assert export_name("m", "gqa", "gguf", 4) == "m-gqa-gguf-a4"


def test_exact_attention_is_for_the_gqa_layout(tiny_hf, tmp_path):
    with pytest.raises(ExportError, match="use --layout gqa"):
        export(tiny_hf, tmp_path / "o", layout="optimum", attention="exact")


def test_the_composer_finds_the_lm_head_before_the_dropped_position():
    """The head computes the zero position too; the Slice after it is looked through only in an
    exact-attention graph (where B = 1 whenever it drops a row, so flat row indices hold)."""
    spec = _spec(4, 2, intermediate=64)
    model = build_gqa_model(spec, _blocks(_weights(spec), "Q4_0"), attention="exact")
    logits = next(v for v in model.graph.outputs if v.name == "logits")
    assert logits.producer().op_type == "Slice"
    head = find_lm_head(logits, exact_positions(model))
    assert head is not None and head.op_type == "MatMulNBits" and head.name == "lm_head/MatMulNBits"
    assert find_lm_head(logits) is None
