"""The gqa layout for Qwen2, Qwen3, Mistral, Phi-3 (LongRoPE, partial rotary), Gemma 2 and Gemma 3:
tiny random models of each, built from their transformers configs, exported by default to our
GroupQueryAttention graph and held to transformers' greedy tokens and logits (fp32), to the fp32
export (int4), and to GroupQueryAttention (exact). Gemma's references use eager attention (the one
transformers soft-caps the scores in)."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from _family_models import FAMILIES, PROMPT, STEPS, WINDOW, build
from _family_models import export_logits as _logits

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
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **_eager(name))
    model.eval()
    result = export(folder, folder.parent / "gqa", verify_tokens=16)  # layout and precision auto
    return name, folder, model, result


def _eager(name: str) -> dict:
    return {"attn_implementation": "eager"} if name.startswith("gemma") else {}


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
    # and Gemma 3; Gemma's post-attention and post-MLP norms
    head_norms = 2 * layers if name in ("qwen3", "gemma3") else 0
    post_norms = 2 * layers if name.startswith("gemma") else 0
    assert ops["SimplifiedLayerNormalization"] == 1 + head_norms + post_norms
    attentions = [n for n in graph.node if n.op_type == "GroupQueryAttention"]

    def attribute(node, key):
        return next(
            (onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == key), None
        )

    windows = [attribute(n, "local_window_size") for n in attentions]
    expected = {
        "qwen2-window": [None, WINDOW],
        "mistral": [WINDOW] * layers,
        "phi3": [WINDOW] * layers,
        "gemma2": [WINDOW, None],
        "gemma3": [WINDOW, None],
    }
    assert windows == expected.get(name, [None] * layers)
    # Gemma: the scale of query_pre_attn_scalar, Gemma 2's soft-caps, GeGLU, scaled embeddings
    gemma = name.startswith("gemma")
    scales = {round(attribute(n, "scale"), 6) for n in attentions}
    head_dim = {"qwen3": 32, "phi4-mini": 32}.get(name, 16)
    assert scales == {round((24 if gemma else head_dim) ** -0.5, 6)}
    assert [attribute(n, "softcap") for n in attentions] == [1.5 if name == "gemma2" else None] * 2
    assert ops["Tanh"] == (1 if name == "gemma2" else 0)  # the logits' soft-cap
    assert ops["Gelu"] == (layers if gemma else 0) and ops["Sigmoid"] == (0 if gemma else layers)
    assert any(n.name == "embed_scaled" for n in graph.node) == gemma
    # the cos caches: as wide as the rotated values / 2; Gemma 3's local layers have their own
    caches = [i for i in graph.initializer if i.name.endswith("cos_cache")]
    assert len(caches) == (2 if name == "gemma3" else 1)
    assert caches[0].dims[1] == (8 if name == "phi4-mini" else head_dim // 2)


def test_the_window_matters_to_the_reference(family):
    """The windowed models' prompt is longer than the window: without it, logits would differ,
    so the parity tests above do test the window (the others' logits stay as they are)."""

    name, folder, model, _ = family
    config = json.loads((folder / "config.json").read_text())
    if name.startswith("gemma"):  # layer types also choose Gemma 3's rotary: a window past all
        unwindowed = {**config, "sliding_window": 4096}
    else:
        unwindowed = {**config, "sliding_window": None, "use_sliding_window": False}
        unwindowed.pop("layer_types", None)
    full = _variant(folder, unwindowed, name)
    gap = np.abs(_torch_logits(full, PROMPT) - _torch_logits(model, PROMPT)).max()
    if name in ("mistral", "qwen2-window", "phi3", "gemma2", "gemma3"):
        assert gap > 1e-2
    else:
        assert gap == 0


def _variant(folder: Path, config: dict, name: str):
    """transformers' model of `folder`'s weights under another config."""
    import torch
    from transformers import AutoModelForCausalLM

    other = folder.parent / f"variant-{len(list(folder.parent.glob('variant-*')))}"
    shutil.copytree(folder, other)
    (other / "config.json").write_text(json.dumps(config))
    return AutoModelForCausalLM.from_pretrained(other, dtype=torch.float32, **_eager(name)).eval()


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("phi3", {"rope_scaling": None}),  # LongRoPE's short factors and attention factor
        ("phi4-mini", {"rope_scaling": None, "partial_rotary_factor": 1.0}),  # and partial rotary
        ("gemma2", {"attn_logit_softcapping": None}),
        ("gemma2", {"final_logit_softcapping": None}),
        ("gemma2", {"query_pre_attn_scalar": 16}),
        ("gemma3", {"rope_local_base_freq": 10000.0}),  # the local layers' own rotary base
        ("gemma3", {"rope_scaling": None}),  # linear scaling of the global layers
    ],
)
def test_the_family_features_matter_to_the_reference(name, change, tiny_hf, tmp_path):
    """Each feature the parity tests hold the export to changes transformers' logits here, so a
    graph without it could not pass them."""
    folder = tmp_path / "hf"
    build(name, folder, tiny_hf)
    config = json.loads((folder / "config.json").read_text())
    model = _variant(folder, config, name)
    changed = _variant(folder, {**config, **change}, name)
    gap = np.abs(_torch_logits(changed, PROMPT) - _torch_logits(model, PROMPT)).max()
    assert gap > 1e-2


def test_longrope_exports_stop_at_the_original_context(family):
    """LongRoPE's short factors hold within original_max_position_embeddings: the export's
    context, in the manifest the engine reads."""
    name, _, _, result = family
    context = result.manifest["model"]["max_position_embeddings"]
    assert context == (64 if name in ("phi3", "phi4-mini") else 512)


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
    ref = _uncapped(family, _logits(result.model_path, PROMPT))
    got = _uncapped(family, _logits(other.model_path, PROMPT))
    assert np.abs(got - ref).max() < tolerance * np.abs(ref).max()


def _uncapped(family, logits: np.ndarray) -> np.ndarray:
    """Logits before Gemma 2's final soft-cap c * tanh(x / c), where the tolerances above hold
    (the cap squeezes the largest logit towards c, not the quantisation error of the others)."""
    _, folder, _, _ = family
    cap = json.loads((folder / "config.json").read_text()).get("final_logit_softcapping")
    if not cap:
        return logits
    return cap * np.arctanh(np.clip(logits.astype(np.float64) / cap, -1 + 1e-7, 1 - 1e-7))


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
        (
            "phi4-mini",
            {"partial_rotary_factor": 0.75, "rope_scaling": None},
            "partial rotary over 24 of 32",
        ),
        ("gemma2", {"hidden_activation": "gelu"}, "MLP activation 'gelu'"),
        ("gemma3", {"use_bidirectional_attention": True}, "bidirectional attention"),
    ],
)
def test_what_the_gqa_layout_cannot_express_is_refused(name, change, message, tiny_hf, tmp_path):
    folder = tmp_path / "hf"
    build(name, folder, tiny_hf)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ExportError, match=message):
        export(folder, tmp_path / "out", layout="gqa", verify_tokens=0)


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("mistral", "sliding-window attention"),
        ("phi4-mini", "partial rotary \\(16 of 32 values per head\\)"),
        ("gemma2", "sliding-window attention .*attention soft-capping"),
    ],
)
def test_cuda_exports_say_what_is_checked_on_the_cpu_only(name, what, tiny_hf, tmp_path, caplog):
    """--device cuda writes windows, partial rotary and soft-caps as the CPU export does (their
    numbers are held to transformers above, on the CPU kernel), with a warning saying so; their
    placement on the CUDA provider is tests/cuda_sim/test_families.py's."""
    folder = tmp_path / "hf"
    build(name, folder, tiny_hf)
    with caplog.at_level("WARNING"):
        result = export(folder, tmp_path / "out", device="cuda", verify_tokens=0)
    assert (result.manifest["layout"], result.manifest["precision"]) == ("gqa", "fp16")
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert re.search(rf"{what}.* checked against transformers on ONNX Runtime's CPU", warned), (
        warned
    )
    assert "simulated CUDA device" in warned


def test_the_engine_runs_the_composed_export(family, tmp_path):
    """compose (the row gather moved before the LM head where it can be) and the engine's greedy
    decoding: the
    export's own greedy tokens, so the families need nothing of the runtime that Llama does not."""
    import onnx as onnx_

    from onnxsample import SamplingParams, compose
    from onnxsample.composer import composed_metadata
    from onnxsample.engine.generator import Generator

    name, _, _, result = family
    # Gemma 2's logits are soft-capped after the LM head: the composer gathers their rows
    gather = "logits" if name == "gemma2" else "lm_head"
    path = compose(result.output, None, tmp_path / "c.onnx", max_slots=2, gather="auto")
    meta = composed_metadata(onnx_.load(str(path), load_external_data=False))
    assert (meta.gather, meta.kv_layout) == (gather, "gqa")
    with Generator(path, tokenizer=result.output, threads=1) as generator:
        [done] = generator.generate(
            PROMPT, SamplingParams(temperature=0), max_new_tokens=16, chat=False
        )
    reference = ort_greedy(result.model_path, PROMPT, 16)
    assert done.token_ids and done.token_ids == reference[: len(done.token_ids)]


def test_phi35_shaped_configs_read_as_transformers_does():
    """Phi-3.5/Phi-4-mini's config: the context stops at the original positions, cos and sin
    carry sqrt(1 + ln(32) / ln(4096)), and a window past the context (262144) is no window, so
    it needs no sliding-window kernel (nor the CUDA refusal)."""
    from onnxsample.exporters.families import hf_family

    config = {
        "model_type": "phi3",
        "vocab_size": 200064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "partial_rotary_factor": 0.75,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "sliding_window": 262144,
        "tie_word_embeddings": True,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48},
    }
    spec = hf_family("phi3", "phi-4-mini").hf_spec(config, "phi-4-mini")
    assert (spec.head_dim, spec.rotary_dims, spec.max_positions) == (128, 96, 4096)
    assert spec.layer_windows == () and spec.tied
    cos, _ = spec.rotary_caches()
    assert cos.shape == (4096, 48)
    assert abs(cos[0, 0] - np.sqrt(1 + np.log(32) / np.log(4096))) < 1e-6
    windowed = hf_family("phi3", "phi-3").hf_spec({**config, "sliding_window": 2047}, "phi-3")
    assert windowed.layer_windows == (2047,) * 32


def test_speculation_and_prefix_reuse_on_the_family(family, tmp_path):
    """Each family's export composed with draft verification: n-gram speculation gives plain
    greedy decoding's tokens, and the same prompt again reuses the cached prefix."""
    from onnxsample import Engine, SamplingParams, compose

    _, _, _, result = family
    path = compose(result.output, None, tmp_path / "spec.onnx", max_slots=2, draft_tokens=4)
    prompt = "one two three four one two three four one two three four one two"
    greedy = SamplingParams(temperature=0)
    options = {"tokenizer": result.output, "threads": 1}
    with Engine(path, **options) as plain, Engine(path, speculative="ngram", **options) as fast:
        base = plain.submit(prompt, greedy, max_new_tokens=24, chat=False).result(120)
        first = fast.submit(prompt, greedy, max_new_tokens=24, chat=False).result(120)
        again = fast.submit(prompt, greedy, max_new_tokens=24, chat=False).result(120)
    assert first.token_ids == base.token_ids and again.token_ids == base.token_ids
    assert first.timings.draft_tokens > 0
    assert again.timings.cached_tokens > 0
