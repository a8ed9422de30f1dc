"""The gqa layout for Qwen2, Qwen3 and Mistral: tiny random models of each, built from their
transformers configs, exported by default to our GroupQueryAttention graph and held to transformers'
greedy tokens and logits (fp32), to the fp32 export (int4), and to GroupQueryAttention (exact)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from _family_models import FAMILIES, PROMPT, STEPS, WINDOW, build

from onnxsample.errors import ExportError
from onnxsample.exporters import export
from onnxsample.exporters._verify import ort_greedy


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tiny_hf, tmp_path_factory):
    """(name, HF folder, transformers model, its default export: fp32 gqa)."""
    import torch
    from transformers import AutoModelForCausalLM

    name = request.param
    folder = tmp_path_factory.mktemp(name) / "hf"
    build(name, folder, tiny_hf)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    result = export(folder, folder.parent / "gqa", verify_tokens=16)  # layout and precision auto
    return name, folder, model, result


def _logits(path: Path, ids: list[int]) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    seq = np.asarray([ids], np.int64)
    feed = {"input_ids": seq, "attention_mask": np.ones_like(seq)}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            dtype = np.float16 if "float16" in i.type else np.float32
            feed[i.name] = np.zeros((1, i.shape[1], len(ids), i.shape[3]), dtype)
    return session.run(["logits"], feed)[0][0]


def _torch_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].numpy()


def test_the_default_export_is_the_gqa_layout(family):
    _, _, _, result = family
    assert (result.manifest["layout"], result.manifest["precision"]) == ("gqa", "fp32")
    assert result.verify["ok"] is True, result.verify


def test_greedy_tokens_match_transformers_generate(family):
    import torch

    _, _, model, result = family
    with torch.no_grad():
        out = model.generate(
            torch.tensor([PROMPT]),
            attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
            do_sample=False,
            max_new_tokens=STEPS,
            eos_token_id=None,
            pad_token_id=2,
        )
    reference = out[0, len(PROMPT) :].tolist()
    assert len(reference) == STEPS
    assert ort_greedy(result.model_path, PROMPT, STEPS) == reference


def test_logits_match_transformers(family):
    _, _, model, result = family
    got = _logits(result.model_path, PROMPT)
    np.testing.assert_allclose(got, _torch_logits(model, PROMPT), atol=1e-4)


def test_the_graph_has_the_family_variations(family):
    name, _, _, result = family
    graph = onnx.load(str(result.model_path), load_external_data=False).graph
    ops = Counter(node.op_type for node in graph.node)
    layers = 2
    assert ops["GroupQueryAttention"] == layers
    bias_adds = [n for n in graph.node if n.op_type == "Add" and n.name.endswith("/qkv_bias")]
    assert len(bias_adds) == (layers if name.startswith("qwen2") else 0)
    # the final norm and one per layer (SimplifiedLayerNormalization); q and k norms in Qwen3
    assert ops["SimplifiedLayerNormalization"] == 1 + (2 * layers if name == "qwen3" else 0)
    windows = [
        next((a.i for a in n.attribute if a.name == "local_window_size"), None)
        for n in graph.node
        if n.op_type == "GroupQueryAttention"
    ]
    expected = {"qwen2-window": [None, WINDOW], "mistral": [WINDOW] * layers}
    assert windows == expected.get(name, [None] * layers)


def test_the_window_matters_to_the_reference(family):
    """The windowed models' prompt is longer than the window: without it, logits would differ,
    so the parity tests above do test the window (the others' logits stay as they are)."""
    import torch
    from transformers import AutoModelForCausalLM

    name, folder, model, _ = family
    config = json.loads((folder / "config.json").read_text())
    unwindowed = {**config, "sliding_window": None, "use_sliding_window": False}
    unwindowed.pop("layer_types", None)
    plain = folder.parent / "unwindowed"
    shutil.copytree(folder, plain)
    (plain / "config.json").write_text(json.dumps(unwindowed))
    full = AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()
    gap = np.abs(_torch_logits(full, PROMPT) - _torch_logits(model, PROMPT)).max()
    if name in ("mistral", "qwen2-window"):
        assert gap > 1e-2
    else:
        assert gap == 0


@pytest.mark.parametrize(
    ("precision", "tolerance"), [("fp16", 2e-2), ("int8", 0.05), ("int4", 0.6)]
)
def test_other_precisions_stay_close_to_fp32(family, precision, tolerance, tmp_path):
    """fp16 activations and ORT's block quantiser: the tolerances of the Llama tests (relative
    to the largest logit)."""
    _, folder, _, result = family
    other = export(
        folder, tmp_path / precision, precision=precision, accuracy_level=0, verify_tokens=0
    )
    assert (other.manifest["layout"], other.manifest["precision"]) == ("gqa", precision)
    if precision != "fp16":
        ops = Counter(n.op_type for n in onnx.load(str(other.model_path)).graph.node)
        assert ops["MatMulNBits"] == 4 * 2 + 1  # qkv, o, gate_up, down per layer; the LM head
    ref = _logits(result.model_path, PROMPT)
    got = _logits(other.model_path, PROMPT)
    assert np.abs(got - ref).max() < tolerance * np.abs(ref).max()


def test_exact_attention_gives_the_gqa_tokens(family, tmp_path):
    """--attention exact handles biases, per-head norms and sliding windows the same way."""
    _, folder, _, result = family
    exact = export(folder, tmp_path / "exact", attention="exact", verify_tokens=16)
    assert exact.manifest["attention"] == "exact" and exact.verify["ok"], exact.verify
    assert ort_greedy(exact.model_path, PROMPT, STEPS) == ort_greedy(
        result.model_path, PROMPT, STEPS
    )
    np.testing.assert_allclose(
        _logits(exact.model_path, PROMPT), _logits(result.model_path, PROMPT), atol=1e-4
    )


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("qwen3", {"attention_bias": True}, "biased projections"),
        ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling 'yarn'"),
        ("qwen3", {"head_dim": 24}, "head_dim 24"),
    ],
)
def test_what_the_gqa_layout_cannot_express_is_refused(name, change, message, tiny_hf, tmp_path):
    folder = tmp_path / "hf"
    build(name, folder, tiny_hf)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ExportError, match=message):
        export(folder, tmp_path / "out", layout="gqa", verify_tokens=0)


def test_sliding_windows_are_refused_on_cuda(tiny_hf, tmp_path):
    """The CPU kernel's window is held to transformers' above; CUDA's is not checked anywhere."""
    folder = tmp_path / "hf"
    build("mistral", folder, tiny_hf)
    with pytest.raises(ExportError, match=r"sliding-window attention.*drop --device cuda"):
        export(folder, tmp_path / "out", device="cuda", verify_tokens=0)
    assert not (tmp_path / "out").exists()


def test_the_engine_runs_the_composed_export(family, tmp_path):
    """compose (the row gather moved before the LM head) and the engine's greedy decoding: the
    export's own greedy tokens, so the families need nothing of the runtime that Llama does not."""
    import onnx as onnx_

    from onnxsample import SamplingParams, compose
    from onnxsample.composer import composed_metadata
    from onnxsample.engine.generator import Generator

    _, _, _, result = family
    path = compose(result.output, None, tmp_path / "c.onnx", max_slots=2, gather="lm_head")
    meta = composed_metadata(onnx_.load(str(path), load_external_data=False))
    assert (meta.gather, meta.kv_layout) == ("lm_head", "gqa")
    with Generator(path, tokenizer=result.output, threads=1) as generator:
        [done] = generator.generate(
            PROMPT, SamplingParams(temperature=0), max_new_tokens=16, chat=False
        )
    reference = ort_greedy(result.model_path, PROMPT, 16)
    assert done.token_ids and done.token_ids == reference[: len(done.token_ids)]
