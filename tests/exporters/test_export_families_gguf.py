"""GGUF Qwen2, Qwen3, Phi-3 (LongRoPE and a window; Phi-4-mini's partial rotary), Gemma 2 and
Gemma 3 through the gqa layout: files written from the tiny random models with llama.cpp's tensor
names and its converter's changes (no Q/K row permutation for these NeoX-rotary families, F32
biases and per-head norms, Phi-3's fused attn_qkv and gate/up ffn_up, Gemma's 1 + w norms), read
back to what transformers computes from the HF folder, and the GGUF's own Q8_0/Q4_0 blocks
transplanted exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _family_models import PROMPT, STEPS, build, write_gguf
from _family_models import export_logits as _logits

from onnxsample.errors import ExportError
from onnxsample.exporters import export
from onnxsample.exporters._verify import ort_greedy

# (tiny model, GGUF architecture); Gemma's are the variants llama.cpp's metadata can carry
CASES = [
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
    ("phi3", "phi3"),
    ("phi4-mini", "phi3"),
    ("gemma2-gguf", "gemma2"),
    ("gemma3-gguf", "gemma3"),
]
pytestmark = pytest.mark.slow  # transformers converts the 49k-token GGUF tokenizer per export
# transformers reads these GGUFs unlike llama.cpp (Phi-3's rope factors, Gemma's attention scale)
UNVERIFIED = ("phi3", "gemma2", "gemma3")
QUANTISED = {
    "attn_qkv": "Q8_0",
    "attn_q": "Q8_0",
    "attn_k": "Q8_0",
    "attn_v": "Q8_0",
    "attn_output": "Q8_0",
}
QUANTISED |= {"ffn_gate": "Q4_0", "ffn_up": "Q4_0", "ffn_down": "Q4_0"}


@pytest.fixture(scope="module", params=CASES, ids=[name for name, _ in CASES])
def hf_and_ggufs(request, tiny_hf, tmp_path_factory):
    """(architecture, HF folder, an all-F32 GGUF of it, a Q8_0/Q4_0 GGUF of it)."""
    name, arch = request.param
    root = tmp_path_factory.mktemp(f"gguf-{name}")
    build(name, root / "hf", tiny_hf)
    write_gguf(root / "hf", root / "f32.gguf", arch, {})
    write_gguf(root / "hf", root / "quantised.gguf", arch, QUANTISED)
    return arch, root / "hf", root / "f32.gguf", root / "quantised.gguf"


def test_an_f32_gguf_computes_what_transformers_computes(hf_and_ggufs, tmp_path):
    """Tensor names, orientation and (no) Q/K permutation: logits as transformers' from the HF
    folder, and the same greedy tokens as the HF folder's export."""
    import torch
    from transformers import AutoModelForCausalLM

    arch, folder, f32, _ = hf_and_ggufs
    # transformers' GGUF loader is no reference for UNVERIFIED: the verify step says it skipped
    # (it cannot load Qwen3's head_dim either; that one is skipped by verify_tokens=0)
    result = export(f32, tmp_path / "gguf", verify_tokens=8 if arch in UNVERIFIED else 0)
    assert (result.manifest["layout"], result.manifest["precision"]) == ("gqa", "gguf")
    if arch in UNVERIFIED:
        assert result.verify["note"].startswith("skipped (transformers' GGUF loader"), result.verify
    assert result.manifest["model"]["architecture"] == arch
    hf_config = json.loads((folder / "config.json").read_text())
    head_dim = (
        hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"]
    )
    kv_heads = hf_config["num_key_value_heads"]
    assert result.manifest["io"]["kv_cache"]["shape"][1:] == [
        kv_heads,
        "past_sequence_length",
        head_dim,
    ]
    config = json.loads((result.output / "config.json").read_text())
    assert config.get("head_dim", head_dim) == head_dim
    # Gemma: eager attention, the one transformers soft-caps the scores in
    eager = {"attn_implementation": "eager"} if arch.startswith("gemma") else {}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **eager).eval()
    with torch.no_grad():
        reference = model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
    np.testing.assert_allclose(_logits(result.model_path, PROMPT), reference, atol=1e-4)
    from_hf = export(folder, tmp_path / "hf", verify_tokens=0)
    assert ort_greedy(result.model_path, PROMPT, STEPS) == ort_greedy(
        from_hf.model_path, PROMPT, STEPS
    )


def test_gguf_blocks_give_the_fp32_exports_tokens(hf_and_ggufs, tmp_path):
    """precision gguf (the file's Q8_0/Q4_0 blocks, accuracy level 0) against precision fp32 of
    the same file (its blocks de-quantised): the same greedy tokens, logits within float error."""
    _, _, _, quantised = hf_and_ggufs
    blocks = export(quantised, tmp_path / "blocks", accuracy_level=0, verify_tokens=0)
    assert blocks.manifest["precision"] == "gguf"  # auto: every tensor is transplantable
    floats = export(quantised, tmp_path / "floats", precision="fp32", verify_tokens=0)
    assert ort_greedy(blocks.model_path, PROMPT, STEPS) == ort_greedy(
        floats.model_path, PROMPT, STEPS
    )
    np.testing.assert_allclose(
        _logits(blocks.model_path, PROMPT), _logits(floats.model_path, PROMPT), atol=1e-3
    )


@pytest.mark.parametrize(
    ("name", "extra", "message"),
    [
        # Llama 3.1+'s frequency factors: one per rotary frequency (8 here), and positive
        ("llama", {"rope_freqs.weight": np.full(4, 2.0, np.float32)}, "must hold 8 positive"),
        ("llama", {"rope_freqs.weight": np.zeros(8, np.float32)}, "must hold 8 positive"),
        # llama.cpp's Qwen2 has no frequency factors (it refuses a file with them), nor sinks
        ("qwen2", {"rope_freqs.weight": np.ones(8, np.float32)}, "has no place for: rope_freqs"),
        ("qwen2", {"blk.0.attn_sinks.weight": np.zeros(4, np.float32)}, "has no place for: blk.0"),
    ],
    ids=["short-rope-factors", "zero-rope-factors", "rope-factors-on-qwen2", "attention-sinks"],
)
def test_tensors_the_graph_cannot_use_are_refused(name, extra, message, tiny_hf, tmp_path):
    """A tensor llama.cpp computes with is never left out: it is used, or the export says why not."""
    folder = tiny_hf  # the tiny Llama (its GGUF's Q/K rows unpermuted: it is never run)
    if name != "llama":
        folder = tmp_path / "hf"
        build(name, folder, tiny_hf)
    write_gguf(folder, tmp_path / "extra.gguf", name, {}, extra=extra)
    with pytest.raises(ExportError, match=f"extra.gguf.*{message}"):
        export(tmp_path / "extra.gguf", tmp_path / "out", verify_tokens=0)
    assert not (tmp_path / "out").exists()


def _gemma_metadata(arch: str, layers: int, hidden: int, heads: int, head_dim: int) -> dict:
    keys = {
        "attention.head_count": heads,
        "attention.head_count_kv": max(heads // 2, 1),
        "embedding_length": hidden,
        "feed_forward_length": 4 * hidden,
        "block_count": layers,
        "attention.key_length": head_dim,
        "attention.layer_norm_rms_epsilon": 1e-6,
        "context_length": 8192,
        "attention.sliding_window": 4096,
    }
    return {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in keys.items()}}


def test_gemma_gguf_headers_read_as_llama_cpp_reads_them():
    """Sizes the tiny models do not reach: llama.cpp scales the 27B's attention by embedding /
    heads (Gemma 2: 46 layers, 4608 / 32 = 144, not its head size 128), the others by head size;
    Gemma 2 slides every other layer, Gemma 3 all but every 6th, whose local base is 10000."""
    from onnxsample.exporters.families import gemma2, gemma3

    names = {"token_embd.weight"}
    big = gemma2.FAMILY.gguf_spec(_gemma_metadata("gemma2", 46, 4608, 32, 128), names, "27b")
    assert big.scale == pytest.approx(144**-0.5)
    assert big.layer_windows == (4096, None) * 23 and big.tied
    small = gemma2.FAMILY.gguf_spec(_gemma_metadata("gemma2", 26, 2304, 8, 256), names, "2b")
    assert small.scale == pytest.approx(256**-0.5)
    one_b = gemma3.FAMILY.gguf_spec(_gemma_metadata("gemma3", 26, 1152, 4, 256), names, "1b")
    assert one_b.layer_windows == ((4096,) * 5 + (None,)) * 4 + (4096, 4096)
    assert one_b.local_rope_theta == 10000.0 and one_b.scale == pytest.approx(256**-0.5)
    assert one_b.attn_softcap is None and one_b.final_softcap is None


@pytest.mark.parametrize("layout", ["gqa", "optimum"])
def test_a_reranker_is_refused_as_one(layout, tiny_hf, tmp_path):
    """Qwen3-Reranker's files are a generator's tensors and a head that scores the text
    (``cls.output.weight``): refused by either layout (transformers' GGUF loader skips the head, so
    the optimum layout's export would be a generator without it)."""
    folder = tmp_path / "hf"
    build("qwen3", folder, tiny_hf)
    head = {"cls.output.weight": np.zeros((1, 64), np.float32)}
    write_gguf(folder, tmp_path / "rerank.gguf", "qwen3", {}, extra=head)
    refused = r"rerank is a reranker or classifier \(its cls.output.weight scores a text"
    with pytest.raises(ExportError, match=refused):
        export(tmp_path / "rerank.gguf", tmp_path / "out", layout=layout, verify_tokens=0)
    assert not (tmp_path / "out").exists()


def test_a_mixture_of_experts_is_refused_by_name():
    """Mixtral's GGUFs are llama.cpp `llama` files with `llama.expert_count`: said as such by
    either layout (the gqa graph has one MLP a layer; transformers' GGUF loader would read the file
    as a dense model, its experts left out), not as the one MLP's tensors missing."""
    from collections import Counter

    from onnxsample.exporters.families import llama
    from onnxsample.exporters.gguf import GGUFInfo, check_architecture

    metadata = {"general.architecture": "llama", "llama.expert_count": 8}
    refused = r"mixtral.gguf: a mixture of experts \(8 experts a layer\) is not a model"
    with pytest.raises(ExportError, match=refused):
        llama.FAMILY.gguf_spec(metadata, {"token_embd.weight"}, "mixtral.gguf")
    info = GGUFInfo("llama", Counter(), 0, metadata=metadata)
    for optimum in (True, False):
        with pytest.raises(ExportError, match=refused):
            check_architecture(info, optimum=optimum, what="mixtral.gguf")
