"""Gemma 2 (`gemma2`): the Llama graph with Gemma's changes, all of them spec features.

* RMSNorm weights multiply as 1 + w (added as the weights are read, in float32 as transformers
  adds them);
* embeddings times sqrt(hidden_size), in the activations' type (transformers: the embedding's);
* four norms per layer: ``input_layernorm`` before attention, ``post_attention_layernorm`` on the
  attention's output before the residual add, ``pre_feedforward_layernorm`` before the MLP and
  ``post_feedforward_layernorm`` on its output (HF's ``post_attention_layernorm`` is not Llama's
  pre-MLP norm here);
* a GeGLU MLP (``gelu_pytorch_tanh``: ONNX ``Gelu`` with ``approximate="tanh"``);
* the attention scale ``query_pre_attn_scalar ** -0.5`` and the scores' soft-cap
  ``attn_logit_softcapping`` (GroupQueryAttention's ``scale`` and ``softcap``);
* the logits' soft-cap ``final_logit_softcapping``: c * tanh(logits / c) after the LM head;
* sliding windows on the layers ``layer_types`` name (every other one, from the first, when a
  config has none), as GroupQueryAttention's ``local_window_size``.

GGUFs (llama.cpp's ``gemma2``): llama.cpp's converter adds the 1 to every norm weight already (not
added again here), drops the tied LM head, writes ``attn_logit_softcapping``,
``final_logit_softcapping`` and ``attention.sliding_window`` but no ``query_pre_attn_scalar``:
llama.cpp scales by head_size ** -0.5, embedding / heads for the 27B (46 layers), and slides every
other layer from the first; the reader does as llama.cpp does (``attention.scale`` and
``attention.sliding_window_pattern`` win where a file has them).
"""

from __future__ import annotations

from typing import Any

from onnxsample.errors import ExportError
from onnxsample.exporters.families._family import LLAMA_TENSORS, Family, TensorName

GEMMA_TENSORS = {
    **LLAMA_TENSORS,
    "ffn_norm": TensorName("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
    "post_attn_norm": TensorName("post_attention_layernorm.weight", "post_attention_norm.weight"),
    "post_ffn_norm": TensorName("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
}
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh"}


def windows_every(pattern: int, config: dict[str, Any], layers: int) -> tuple[int | None, ...]:
    """`layer_types`, or transformers' default: every layer but each `pattern`-th slides."""
    window = config.get("sliding_window")
    if not window:
        return ()
    types = config.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
    ]
    windows = tuple(int(window) if t == "sliding_attention" else None for t in types)
    return windows if any(w is not None for w in windows) else ()


def gemma_features(config: dict[str, Any]) -> dict[str, Any]:
    """What Gemma 2 and 3 change in the Llama graph (see the module)."""
    activation = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    head_dim = int(config.get("head_dim") or 256)
    return {
        "head_dim": head_dim,
        "embed_scale": float(config["hidden_size"]) ** 0.5,
        "post_norms": True,
        "activation": _ACTIVATIONS.get(activation, activation),
        "attn_scale": float(config.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        "attn_softcap": config.get("attn_logit_softcapping") or None,
        "final_softcap": config.get("final_logit_softcapping") or None,
        "tied": bool(config.get("tie_word_embeddings", True)),
    }


def gemma_gguf_features(pattern: int, big_layers: int, local_theta: float | None = None):
    """The GGUF features of llama.cpp's ``gemma2``/``gemma3``: every-`pattern`-th layer global,
    the 27B's (`big_layers` layers) attention scale, and (Gemma 3) the local layers' rope base."""

    def features(meta, read, fields: dict[str, Any]) -> dict[str, Any]:
        hidden, layers = fields["hidden_size"], fields["num_layers"]
        scalar = hidden // fields["num_heads"] if layers == big_layers else fields["head_dim"]
        found: dict[str, Any] = {
            "embed_scale": float(hidden) ** 0.5,
            "post_norms": True,
            "activation": "gelu_tanh",
            "attn_scale": float(meta("attention.scale") or float(scalar) ** -0.5),
            "attn_softcap": meta("attn_logit_softcapping") or None,
            "final_softcap": meta("final_logit_softcapping") or None,
        }
        window = meta("attention.sliding_window")
        if window:
            every = meta("attention.sliding_window_pattern")
            if isinstance(every, (list, tuple)):  # a flag per layer: sliding or not
                sliding = [bool(x) for x in every]
            else:
                n = int(every or pattern)
                sliding = [i % n < n - 1 for i in range(layers)]
            found["layer_windows"] = tuple(int(window) if s else None for s in sliding)
        if local_theta is not None:
            found["local_rope_theta"] = float(meta("rope.freq_base_swa") or local_theta)
        return found

    return features


def refuse_bidirectional(config: dict[str, Any], what: str) -> None:
    """Biases and EmbeddingGemma's bidirectional attention have no place in the graph."""
    if config.get("attention_bias"):
        raise ExportError(
            f"{what}: attention_bias is not supported by the gqa layout; use --layout optimum"
        )
    if config.get("use_bidirectional_attention"):
        raise ExportError(
            f"{what}: bidirectional attention (an encoder such as EmbeddingGemma) is not a "
            "decoder the gqa layout writes"
        )


FAMILY = Family(
    name="gemma2",
    gguf_unverified="transformers' GGUF loader takes its defaults for query_pre_attn_scalar (256) and the soft-caps (50, 30), not llama.cpp's scale or the file's soft-caps",
    hf_types=("gemma2",),
    gguf_architectures=("gemma2",),
    gguf_features=gemma_gguf_features(2, 46),
    tensors=GEMMA_TENSORS,
    windows=lambda config, layers: windows_every(2, config, layers),
    check_hf=refuse_bidirectional,
    features=gemma_features,
    norm_offset=1.0,
)
