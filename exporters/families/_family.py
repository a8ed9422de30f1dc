"""A decoder family as the GroupQueryAttention exporter sees it: :class:`Family`.

A family names the config types and GGUF architectures it reads, the tensors of one layer under
our keys, HF names and llama.cpp names, and which graph variations its spec turns on. The readers
(:mod:`onnxsample.exporters._weights`) and the builder (:mod:`onnxsample.exporters.gqa`) are the
same for every family; the family modules beside this one hold the differences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from onnxsample.errors import ExportError
from onnxsample.exporters.families._spec import DecoderSpec, check_spec

__all__ = [
    "FUSED",
    "FUSED_PARTS",
    "LINEAR",
    "LLAMA_TENSORS",
    "QKV_BIAS_TENSORS",
    "QK_NORM_TENSORS",
    "Family",
    "TensorName",
    "longrope",
    "no_windows",
    "refuse_biases",
    "refuse_experts",
    "typed_windows",
    "uniform_window",
]


@dataclass(frozen=True)
class TensorName:
    """One per-layer tensor: its name under ``model.layers.{i}.`` (HF) and ``blk.{i}.`` (GGUF)."""

    hf: str
    gguf: str


# Our keys of a Llama layer; the linear ones are [N, K] matrices (quantisable), the rest vectors.
LINEAR = ("q", "k", "v", "o", "gate", "up", "down")
# Fused linear weights a family's unpack splits into LINEAR ones (Phi-3's), and their parts.
FUSED = ("qkv", "gate_up")
FUSED_PARTS: Mapping[str, tuple[str, ...]] = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}
LLAMA_TENSORS: Mapping[str, TensorName] = {
    "q": TensorName("self_attn.q_proj.weight", "attn_q.weight"),
    "k": TensorName("self_attn.k_proj.weight", "attn_k.weight"),
    "v": TensorName("self_attn.v_proj.weight", "attn_v.weight"),
    "o": TensorName("self_attn.o_proj.weight", "attn_output.weight"),
    "gate": TensorName("mlp.gate_proj.weight", "ffn_gate.weight"),
    "up": TensorName("mlp.up_proj.weight", "ffn_up.weight"),
    "down": TensorName("mlp.down_proj.weight", "ffn_down.weight"),
    "attn_norm": TensorName("input_layernorm.weight", "attn_norm.weight"),
    "ffn_norm": TensorName("post_attention_layernorm.weight", "ffn_norm.weight"),
}
QKV_BIAS_TENSORS: Mapping[str, TensorName] = {
    "q_bias": TensorName("self_attn.q_proj.bias", "attn_q.bias"),
    "k_bias": TensorName("self_attn.k_proj.bias", "attn_k.bias"),
    "v_bias": TensorName("self_attn.v_proj.bias", "attn_v.bias"),
}
QK_NORM_TENSORS: Mapping[str, TensorName] = {
    "q_norm": TensorName("self_attn.q_norm.weight", "attn_q_norm.weight"),
    "k_norm": TensorName("self_attn.k_norm.weight", "attn_k_norm.weight"),
}

WindowsFn = Callable[[dict[str, Any], int], tuple[int | None, ...]]
CheckFn = Callable[[dict[str, Any], str], None]
# A family's spec fields beyond the common ones, from its config (they may override those too).
FeaturesFn = Callable[[dict[str, Any]], dict[str, Any]]
# Turns a layer's tensors as read (fused ones included) into the builder's keys, in place.
UnpackFn = Callable[[dict[str, Any], DecoderSpec, str], None]
# A GGUF's spec fields beyond the common ones: from meta(key) (the architecture's metadata key,
# None when absent), read(name) (a float32 tensor of the file, None when absent) and the common
# fields; as llama.cpp reads that architecture. A tensor read counts as taken by the export (any
# other beyond the layers' is refused), so a family reads only what its spec applies.
GgufFeaturesFn = Callable[
    [Callable[[str], Any], Callable[[str], Any], dict[str, Any]], dict[str, Any]
]


def no_windows(config: dict[str, Any], layers: int) -> tuple[int | None, ...]:
    """Every layer attends to all earlier positions."""
    return ()


def uniform_window(config: dict[str, Any], layers: int) -> tuple[int | None, ...]:
    """`sliding_window`, where set, holds for every layer (Mistral)."""
    window = config.get("sliding_window")
    return (int(window),) * layers if window else ()


def typed_windows(config: dict[str, Any], layers: int) -> tuple[int | None, ...]:
    """`layer_types` say which layers slide, when `use_sliding_window` is on (Qwen2, Qwen3)."""
    window = config.get("sliding_window")
    if not config.get("use_sliding_window") or not window:
        return ()
    types = config.get("layer_types") or [
        "sliding_attention" if i >= int(config.get("max_window_layers", layers)) else "full"
        for i in range(layers)
    ]
    windows = tuple(int(window) if t == "sliding_attention" else None for t in types)
    return windows if any(w is not None for w in windows) else ()


def refuse_experts(metadata: Mapping[str, Any], what: str) -> None:
    """A GGUF mixture of experts (Mixtral's are `llama` files with `llama.expert_count`): the gqa
    graph has one MLP a layer, and transformers' GGUF loader reads such a file as a dense model,
    its experts left out, so neither layout may take it."""
    experts = metadata.get(f"{metadata.get('general.architecture')}.expert_count")
    if experts:
        raise ExportError(
            f"{what}: a mixture of experts ({experts} experts a layer) is not a model "
            "onnxsample exports"
        )


def refuse_biases(config: dict[str, Any], what: str) -> None:
    """Llama's and Qwen3's configs can switch biases on; the gqa layout has none of theirs."""
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ExportError(
            f"{what}: biased projections (attention_bias/mlp_bias) are not supported by the gqa "
            "layout; use --layout optimum"
        )


def _no_check(config: dict[str, Any], what: str) -> None:
    return None


def _no_features(config: dict[str, Any]) -> dict[str, Any]:
    return {}


def _no_gguf_features(meta, read, fields: dict[str, Any]) -> dict[str, Any]:
    return {}


def longrope(config: dict[str, Any], scaling: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """LongRoPE's scaling as transformers reads it, and the positions its short factors cover.

    transformers turns with the short factors while a sequence stays within
    `original_max_position_embeddings` and switches every position of a call to the long ones past
    it (the keys already cached keep their short rotation), which no fixed rotary cache can
    reproduce: the export takes the short factors and stops there (its context length). The
    factor of its attention factor is max / original positions where the config has both, else
    the scaling's own `factor`.
    """
    maximum = int(config.get("max_position_embeddings", 2048))
    original = config.get("original_max_position_embeddings")
    factor = maximum / int(original) if original else float(scaling.get("factor") or 1.0)
    original = int(original or maximum)
    normalised = {
        **scaling,
        "rope_type": "longrope",
        "factor": factor,
        "original_max_position_embeddings": original,
    }
    return normalised, min(original, maximum)


@dataclass(frozen=True)
class Family:
    """How one decoder family differs from Llama, for the readers and the graph builder."""

    name: str
    hf_types: tuple[str, ...]  # config.json model_type values
    gguf_architectures: tuple[str, ...]  # general.architecture values (llama.cpp's names)
    tensors: Mapping[str, TensorName] = field(default_factory=lambda: dict(LLAMA_TENSORS))
    qkv_bias: bool = False
    qk_norm: bool = False
    # llama.cpp permutes Q/K rows for its interleaved rotary (llama); NeoX-rotary families not.
    gguf_qk_permuted: bool = False
    windows: WindowsFn = no_windows
    check_hf: CheckFn = _no_check
    features: FeaturesFn = _no_features
    # Added to every RMSNorm weight as read (Gemma's norms multiply by 1 + w).
    norm_offset: float = 0.0
    unpack: UnpackFn | None = None
    gguf_features: GgufFeaturesFn = _no_gguf_features
    # Why transformers' GGUF loader is no reference for this family's GGUFs (it reads them unlike
    # llama.cpp): the verify step is skipped with this note. Empty: it is the reference.
    gguf_unverified: str = ""
    # llama.cpp architectures of this family whose GGUF files the gqa layout does not read.
    gguf_refused: tuple[str, ...] = ()

    def hf_spec(self, config: dict[str, Any], what: str) -> DecoderSpec:
        """The spec of an HF `config.json`; anything the gqa layout cannot express is an error."""
        self.check_hf(config, what)
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        fields = dict(
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // max(heads, 1)),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            max_positions=int(config.get("max_position_embeddings", 2048)),
            tied=bool(config.get("tie_word_embeddings", False)),
            rope_scaling=config.get("rope_scaling"),
            **self._features(self.windows(config, layers)),
        )
        fields.update(self.features(config))
        scaling = fields["rope_scaling"] or {}
        if scaling.get("rope_type", scaling.get("type")) == "longrope":
            fields["rope_scaling"], fields["max_positions"] = longrope(config, scaling)
        return _finish(fields, what)

    def gguf_spec(
        self,
        metadata: dict[str, Any],
        tensor_names: set[str],
        what: str,
        read: Callable[[str], Any] | None = None,
    ) -> DecoderSpec:
        """The spec of a GGUF header (llama.cpp's keys, prefixed with the architecture); `read`
        gives a float32 tensor of the file by name (Llama's and Phi-3's rope factors), None when
        absent."""
        arch = metadata.get("general.architecture")

        def get(key: str, default=None):
            value = metadata.get(f"{arch}.{key}", default)
            if value is None:
                raise ExportError(f"{what}: GGUF metadata {arch}.{key} is missing")
            return value

        refuse_experts(metadata, what)
        heads, hidden = int(get("attention.head_count")), int(get("embedding_length"))
        rope_scaling = None
        if metadata.get(f"{arch}.rope.scaling.type") not in (None, "none"):
            rope_scaling = {
                "rope_type": metadata[f"{arch}.rope.scaling.type"],
                "factor": metadata.get(f"{arch}.rope.scaling.factor"),
            }
        # llama.cpp's head size: key_length, else embedding / heads; rope.dimension_count below
        # it rotates part of each head (Phi-4-mini)
        head_dim = int(metadata.get(f"{arch}.attention.key_length") or hidden // max(heads, 1))
        rope_dims = metadata.get(f"{arch}.rope.dimension_count")
        fields = dict(
            vocab_size=int(metadata.get(f"{arch}.vocab_size") or 0),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=int(get("block_count")),
            num_heads=heads,
            num_kv_heads=int(metadata.get(f"{arch}.attention.head_count_kv") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
            rope_theta=float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
            max_positions=int(get("context_length")),
            tied="output.weight" not in tensor_names,
            rope_scaling=rope_scaling,
            rotary_dim=int(rope_dims) if rope_dims and int(rope_dims) < head_dim else None,
            **self._features(()),
        )
        fields.update(
            self.gguf_features(
                lambda key: metadata.get(f"{arch}.{key}"),
                read or (lambda name: None),
                dict(fields),
            )
        )
        return _finish(fields, what)

    def _features(self, windows: tuple[int | None, ...]) -> dict[str, Any]:
        return {
            "family": self.name,
            "qkv_bias": self.qkv_bias,
            "qk_norm": self.qk_norm,
            "layer_windows": windows,
        }


def _finish(fields: dict[str, Any], what: str) -> DecoderSpec:
    """The checked spec of `fields`, windows that never bind dropped."""
    # a window no shorter than the positions the export has never binds (Phi-4-mini's 262144)
    windows = tuple(
        None if w is not None and w >= fields["max_positions"] else w
        for w in fields["layer_windows"]
    )
    fields["layer_windows"] = windows if any(w is not None for w in windows) else ()
    spec = DecoderSpec(**fields)
    check_spec(spec, what)
    return spec
