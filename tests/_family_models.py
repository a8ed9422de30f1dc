"""Tiny random models of the gqa layout's families (as the tiny Llama of conftest.py), and GGUF
files written from them with llama.cpp's tensor names (the `gguf` package's own name map)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np


def export_logits(path: Path, ids: list[int]) -> np.ndarray:
    """The logits [T, V] of an exported model (model.onnx) for one prefill of `ids`, its
    past a buffer as long as the mask (what a GroupQueryAttention graph reads lengths from)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    seq = np.asarray([ids], np.int64)
    feed = {"input_ids": seq, "attention_mask": np.ones_like(seq)}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            dtype = np.float16 if "float16" in i.type else np.float32
            feed[i.name] = np.zeros((1, i.shape[1], len(ids), i.shape[3]), dtype)
    return session.run(["logits"], feed)[0][0]


# 12 tokens: longer than the windowed models' window of 8, so the prefill already slides.
PROMPT = [1, 504, 3458, 314, 260, 1000, 77, 9, 4300, 12, 881, 30]
STEPS = 32
WINDOW = 8
# The tiny Llama of conftest.py and every family's: SmolLM2's vocabulary, 2 layers, hidden 64,
# 4 heads over 2.
COMMON = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    initializer_range=0.1,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
# name: (transformers config class, its options beyond COMMON)
FAMILIES = {
    "qwen2": ("Qwen2Config", {}),
    "qwen2-window": (
        "Qwen2Config",
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "qwen3": ("Qwen3Config", {"head_dim": 32}),  # head_dim != hidden / heads
    "mistral": ("MistralConfig", {"sliding_window": WINDOW, "head_dim": 16}),
    # Phi-3.5-mini's shape of config: LongRoPE (the prompt and STEPS stay within the original 64
    # positions, so transformers turns with the short factors), a window, an untied LM head.
    "phi3": (
        "Phi3Config",
        {
            "sliding_window": WINDOW,
            "tie_word_embeddings": False,
            "original_max_position_embeddings": 64,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0],
            },
        },
    ),
    # Phi-4-mini's: partial rotary, LongRoPE, tied embeddings, no window. GroupQueryAttention
    # turns multiples of 16 values (Phi-4-mini: 96 of 128), so heads of 32 here, half of them
    # rotated (transformers derives head_dim from hidden / heads for Phi-3's LongRoPE factors).
    "phi4-mini": (
        "Phi3Config",
        {
            "hidden_size": 128,
            "partial_rotary_factor": 0.5,
            "original_max_position_embeddings": 64,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0],
            },
        },
    ),
    # Gemma 2: first layer sliding, second global; scale from query_pre_attn_scalar; soft-caps
    # small enough to matter for these random weights.
    "gemma2": (
        "Gemma2Config",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": WINDOW,
            "attn_logit_softcapping": 1.5,
            "final_logit_softcapping": 2.0,
        },
    ),
    # Gemma 3 text: local and global layers with their own rotary bases, linear scaling on the
    # global one, per-head Q/K norms.
    "gemma3": (
        "Gemma3TextConfig",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_local_base_freq": 100.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
    ),
}
# Gemma variants a llama.cpp GGUF can carry: its converter writes no query_pre_attn_scalar (llama.cpp
# scales by head_dim ** -0.5), no layer types (every 2nd / 6th layer global) and no local rope base
# (10000); the soft-caps, the window and Gemma 3's linear scaling it writes.
GGUF_FAMILIES = {
    "gemma2-gguf": (
        "Gemma2Config",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": WINDOW,
            "attn_logit_softcapping": 1.5,
            "final_logit_softcapping": 2.0,
        },
    ),
    "gemma3-gguf": (
        "Gemma3TextConfig",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "num_hidden_layers": 6,  # 5 sliding, the 6th global
            "sliding_window": WINDOW,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
    ),
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build(name: str, folder: Path, tokenizer_folder: Path, seed: int = 0) -> None:
    """A random model of the family; biases and per-head norms randomised too (they start as
    zeros and ones, which would hide a reader or a graph that drops them)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    config_class, options = {**FAMILIES, **GGUF_FAMILIES}[name]
    config = getattr(transformers, config_class)(**{**COMMON, **options})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith(".bias"):
                param.normal_(0.0, 0.5)
            elif config.model_type.startswith("gemma") and param_name.endswith("norm.weight"):
                param.normal_(0.0, 0.3)  # Gemma's norms multiply by 1 + w (w starts as zeros)
            elif param_name.endswith(("q_norm.weight", "k_norm.weight")):
                param.copy_(1 + 0.3 * torch.randn_like(param))
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=[2], pad_token_id=2)
    model.save_pretrained(folder)
    for file in _TOKENIZER_FILES:
        if (tokenizer_folder / file).is_file():
            shutil.copy2(tokenizer_folder / file, folder / file)


def cached(name: str, tiny_hf: Path, seed: int = 0) -> Path:
    """`name`'s tiny model built once beside the tiny Llama's cache folder (`tiny_hf`, whose name
    carries the torch/transformers/tokenizer versions), keyed by its config and seed."""
    options = {**FAMILIES, **GGUF_FAMILIES}[name]
    blob = json.dumps({"common": COMMON, "family": options, "seed": seed}, sort_keys=True)
    key = hashlib.sha256(f"{tiny_hf.parent.name}:{blob}".encode()).hexdigest()[:16]
    folder = tiny_hf.parent.parent / f"family-{name}-{key}" / "hf"
    if not (folder / "config.json").is_file():
        staging = folder.with_name("hf.partial")
        shutil.rmtree(staging, ignore_errors=True)
        build(name, staging, tiny_hf, seed)
        staging.rename(folder)
    return folder


def write_gguf(
    folder: Path,
    path: Path,
    arch: str,
    linear_types: dict[str, str],
    extra: dict[str, np.ndarray] | None = None,
) -> None:
    """`folder`'s model as a GGUF of architecture `arch`, tokenizer from the embedded SmolLM2.

    `linear_types` maps a projection's GGUF name part (``attn_q``, ``ffn_down``...) to its type
    (F32, Q8_0, Q4_0; F32 when absent); norms, biases and the embedding are F32; `extra` adds
    F32 tensors by name. The names come from gguf's map for the architecture, so they are
    llama.cpp's, not the exporter's; the metadata and the changes to tensors are those of
    llama.cpp's convert_hf_to_gguf.py for the architecture (Phi-3: no head size, rotated dimensions, window, LongRoPE factors as tensors;
    Gemma: 1 added to every norm weight, soft-caps, window, Gemma 3's linear scaling).
    """
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    from onnxsample.exporters import embedded_gguf

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    if arch != "phi3":  # llama.cpp's Phi-3 head size is embedding / heads
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_vocab_size(config.vocab_size)
    if arch == "phi3":
        _phi3_metadata(writer, config, head_dim)
    if arch.startswith("gemma"):
        writer.add_sliding_window(config.sliding_window)
        if arch == "gemma2":
            writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
        if arch == "gemma3" and config.rope_scaling:
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(config.rope_scaling["factor"])
    source = gguf.GGUFReader(str(embedded_gguf()))
    for name, field in source.fields.items():
        if name.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(name, field.contents(), field.types[0], sub)
    if arch.startswith("gemma") and "tokenizer.ggml.scores" not in source.fields:
        # transformers reads a Gemma GGUF's tokenizer as SentencePiece's (Unigram), whose scores
        # real Gemma files carry: zeros for SmolLM2's tokens (the tests feed token ids)
        tokens = len(source.fields["tokenizer.ggml.tokens"].data)
        writer.add_token_scores([0.0] * tokens)
    names = gguf.get_tensor_name_map(
        next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), config.num_hidden_layers
    )
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        data = tensor.numpy().astype(np.float32)
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            data = data + np.float32(1.0)  # llama.cpp stores Gemma's norms as 1 + w
        qtype = linear_types.get(name.split(".")[-2], "F32") if data.ndim == 2 else "F32"
        if name == "token_embd.weight" or qtype == "F32":
            writer.add_tensor(name, data)
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
    for name, data in (extra or {}).items():  # F32 tensors this model does not have
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _phi3_metadata(writer, config, head_dim: int) -> None:
    """What convert_hf_to_gguf.py's Phi3MiniModel writes beyond the common keys."""
    import math

    import gguf

    writer.add_rope_dimension_count(int(head_dim * (config.partial_rotary_factor or 1.0)))
    writer.add_sliding_window(config.sliding_window or 0)
    original = config.original_max_position_embeddings
    writer.add_rope_scaling_orig_ctx_len(original)
    scaling = config.rope_scaling
    if not scaling or scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        return
    scale = config.max_position_embeddings / original
    writer.add_rope_scaling_attn_factors(
        math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    )
    for kind, key in (
        (gguf.MODEL_TENSOR.ROPE_FACTORS_LONG, "long_factor"),
        (gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT, "short_factor"),
    ):
        writer.add_tensor(gguf.TENSOR_NAMES[kind] + ".weight", np.asarray(scaling[key], np.float32))
