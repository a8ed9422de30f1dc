"""GGUF files made by llama.cpp's own tools from tiny random Hugging Face models of every family the
project exports, each with that family's real tokenizer: the oracle fixtures for GGUF exports.

Files our own code writes (tests/_family_models.py) can only agree with our reader. These are made
the way people make the GGUFs they download: llama.cpp's ``convert_hf_to_gguf.py`` turns the HF
folder into F32, F16 and BF16 files, and ``llama-quantize`` turns the F32 file into the usual mixes
(Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0; and for two families Q3_K_M, Q2_K, IQ4_XS, IQ4_NL, Q4_1,
Q5_1 and IQ3_S, the other types we transplant; IQ3_XXS, IQ2 and IQ1 need an importance matrix,
which llama-quantize refuses to go without). Every weight's input dimension is a multiple of 256 (hidden
256, intermediate 512, heads x head_dim 256 or 512), so the K-quant mixes are real K-quants and not
llama-quantize's Q5_0/Q8_0 fallback for rows it cannot split into super-blocks.

The tokenizers are the real ones, rebuilt offline by ``_llama_cpp_vocab.py``.

The configurations follow the real models where llama.cpp reads them the same way (tied embeddings
where the family ties them, Qwen2's q/k/v biases, Qwen3's and Gemma's head_dim, Gemma 2's soft-caps
and alternating window, Gemma 3's local rope base, linear scaling of its global layers and 6-layer
pattern (llama.cpp fixes every 6th layer global, so 6 layers give 5 local and 1 global), Phi-3.5's
LongRoPE, Llama 3.2's llama3 rope scaling), and leave out what llama.cpp would not run the same way:
no window for Mistral (v0.3 has none; llama.cpp's llama ignores it) nor a narrow one for Phi-3
(llama.cpp disables Phi-3's window), query_pre_attn_scalar = head_dim (what llama.cpp scales by).

Everything is built once under ``$ONNXSAMPLE_CACHE/gguf-fixtures/<family>-<key>/`` (default
~/.cache/onnxsample), keyed by this recipe, the llama.cpp, torch, transformers, tokenizers and
sentencepiece versions, the family's configuration and the seed; each folder and file is built
under a temporary name and renamed when complete, under a lock, so an interrupted build leaves
nothing half written and parallel workers build once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _llama_cpp
from _llama_cpp import LlamaCpp
from _llama_cpp_vocab import VOCABS, read_vocab, vocab_source, write_tokenizer

RECIPE = 4  # bump when a change here changes what is built
SEED = 0
FAMILIES = ("llama", "llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")
FLOATS = ("F32", "F16", "BF16")  # convert_hf_to_gguf.py --outtype f32 / f16 / bf16
MIXES = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")  # llama-quantize, from the F32 file
# The rest of the weight types we transplant, as llama-quantize writes them (from the F32 file) for
# MORE_FAMILIES (a SentencePiece and a BPE vocabulary): mix -> the type it stands for.
MORE_MIXES = {"Q3_K_M": "Q3_K", "Q2_K": "Q2_K", "IQ4_XS": "IQ4_XS", "IQ4_NL": "IQ4_NL",
              "Q4_1": "Q4_1", "Q5_1": "Q5_1", "IQ3_S": "IQ3_S"}  # fmt: skip
MORE_FAMILIES = ("llama", "qwen2")
WINDOW = 8  # Gemma's sliding window: shorter than a test prompt, so it slides

# A turn in the family's chat markup: its special tokens parsed, the text around them split.
CHAT = {
    "llama": "<s> Hello</s> after the end",
    "llama3": "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "mistral": "[INST] Hello [/INST] Hi there</s>",
    "qwen2": "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "qwen3": "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "phi3": "<|user|>\nHello<|end|>\n<|assistant|>\nHi</s> after",
    "gemma2": "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "gemma3": "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
}
# What llama.cpp's converter writes as general.architecture per family.
ARCHITECTURES = {
    "llama": "llama",
    "llama3": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
}


# Every family: 2 layers, hidden 256, MLP 512, 4 query heads of 64 over 2 KV heads, but where
# CONFIGS says otherwise (Qwen3 and Gemma: heads of 128; Gemma 3: 6 layers, 1 KV head).
COMMON: dict[str, Any] = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    initializer_range=0.15,
    rms_norm_eps=1e-5,
)
_PHI3_FACTORS = {  # LongRoPE factors, one per rotated pair (head_dim / 2)
    "short_factor": [round(1.0 + 0.02 * i, 4) for i in range(32)],
    "long_factor": [round(2 ** (6 * i / 31), 4) for i in range(32)],
}
# family: (transformers config class, options beyond COMMON): the real family's shape.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # Llama 2: untied, rope base 10000.
    "llama": (
        "LlamaConfig",
        dict(
            vocab_size=32000,
            max_position_embeddings=4096,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # Llama 3.2 1B: tied, rope base 500000, llama3 rope scaling (the converter writes rope_freqs).
    "llama3": (
        "LlamaConfig",
        dict(
            vocab_size=128256,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            tie_word_embeddings=True,
            bos_token_id=128000,
            eos_token_id=128001,
        ),
    ),
    # Mistral 7B v0.3: untied, rope base 1e6, no sliding window.
    "mistral": (
        "MistralConfig",
        dict(
            vocab_size=32768,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            sliding_window=None,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # Qwen2 0.5B/1.5B: tied, q/k/v biases, rope base 1e6.
    "qwen2": (
        "Qwen2Config",
        dict(
            vocab_size=151936,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            use_sliding_window=False,
            tie_word_embeddings=True,
            bos_token_id=151643,
            eos_token_id=151643,
        ),
    ),
    # Qwen3 0.6B: tied, head_dim 128 (heads x head_dim = 512 != hidden), q/k norms.
    "qwen3": (
        "Qwen3Config",
        dict(
            vocab_size=151936,
            head_dim=128,
            max_position_embeddings=40960,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            bos_token_id=151643,
            eos_token_id=151643,
        ),
    ),
    # Phi-3.5-mini: fused qkv and gate/up, untied, LongRoPE over an original context of 4096
    # (llama.cpp and transformers both turn with the short factors below it), a window as wide as
    # the context (llama.cpp disables Phi-3's window).
    "phi3": (
        "Phi3Config",
        dict(
            vocab_size=32064,
            head_dim=None,  # Phi3Config derives it: hidden / heads = 64
            max_position_embeddings=131072,
            original_max_position_embeddings=4096,
            rope_theta=10000.0,
            rope_scaling={"type": "longrope", **_PHI3_FACTORS},
            sliding_window=262144,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=32000,
            pad_token_id=32000,
        ),
    ),
    # Gemma 2: tied, head_dim 128, first layer local (window of WINDOW), second global, soft-caps
    # small enough to matter for these weights.
    "gemma2": (
        "Gemma2Config",
        dict(
            vocab_size=262144,
            head_dim=128,
            query_pre_attn_scalar=128,
            max_position_embeddings=8192,
            rope_theta=10000.0,
            rms_norm_eps=1e-6,
            sliding_window=WINDOW,
            attn_logit_softcapping=10.0,
            final_logit_softcapping=10.0,
            tie_word_embeddings=True,
            bos_token_id=2,
            eos_token_id=1,
            pad_token_id=0,
        ),
    ),
    # Gemma 3 (270M's one KV head): 6 layers, 5 local (rope base 10000) then 1 global (rope base
    # 1e6, linear scaling 8 as the 4B and larger), q/k norms.
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            vocab_size=262144,
            num_hidden_layers=6,
            num_key_value_heads=1,
            head_dim=128,
            query_pre_attn_scalar=128,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            rms_norm_eps=1e-6,
            sliding_window=WINDOW,
            tie_word_embeddings=True,
            bos_token_id=2,
            eos_token_id=1,
            pad_token_id=0,
        ),
    ),
}


def cache_root() -> Path:
    """``$ONNXSAMPLE_CACHE`` or ~/.cache/onnxsample (where llama.cpp is built), /gguf-fixtures."""
    return _llama_cpp.folder().parent / "gguf-fixtures"


def missing(family: str, llama: LlamaCpp) -> str | None:
    """Why `family`'s fixtures cannot be built here (a source not installed), or None."""
    try:
        path = vocab_source(family, llama)
    except (ImportError, FileNotFoundError) as e:
        return str(e)
    return None if path.is_file() else f"{path} is missing"


def expected_tokens(family: str, llama: LlamaCpp) -> list[str]:
    """The token strings a conversion of `family` must carry: its source's, padded as the
    converter pads a vocabulary shorter than the model's (``[PAD<id>]``)."""
    tokens = read_vocab(vocab_source(family, llama)).tokens
    size = CONFIGS[family][1]["vocab_size"]
    return tokens + [f"[PAD{i}]" for i in range(len(tokens), size)]


# ---------------------------------------------------------------------------------------------
# Building and caching


def _versions() -> dict[str, str]:
    names = ("torch", "transformers", "tokenizers", "sentencepiece")
    return {"llama.cpp": _llama_cpp.VERSION, **{n: importlib.metadata.version(n) for n in names}}


def key(family: str, llama: LlamaCpp, seed: int = SEED) -> str:
    """The cache key of `family`'s fixtures: recipe, tool versions, configuration, vocabulary
    source (name and size) and seed."""
    source = vocab_source(family, llama)
    blob = json.dumps(
        {
            "recipe": RECIPE,
            "versions": _versions(),
            "common": COMMON,
            "config": CONFIGS[family],
            "vocab": [VOCABS[family].source, source.stat().st_size],
            "seed": seed,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def folder(family: str, llama: LlamaCpp, seed: int = SEED) -> Path:
    return cache_root() / f"{family}-{key(family, llama, seed)}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside `path` (held by one build at a time, across processes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _randomise(model: Any, gemma: bool) -> None:
    """Biases and norms random too (they start as zeros and ones, which would hide a reader or a
    graph that drops them); Gemma's norms multiply by 1 + w, the others' by w.

    Gemma scales its (tied) embedding by sqrt(hidden) and normalises each layer's output before
    adding it: with post-norms near 1 the embedding dominates the last hidden state, the model
    predicts its input token and greedy decoding repeats one token. Post-norms near 10 (trained
    Gemmas have large ones too) let the layers steer.
    """
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
            elif name.endswith("norm.weight"):
                centre = 1.0
                if gemma:
                    centre = 9.0 if ".post_" in name else 0.0
                param.copy_(centre + 0.3 * torch.randn_like(param))


def build_model(family: str, out: Path, seed: int = SEED) -> None:
    """`family`'s tiny random model (float32 safetensors) into `out`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    config_class, options = CONFIGS[family]
    settings = {**COMMON, **options}
    if settings.get("head_dim") is None:
        settings.pop("head_dim")
    config = getattr(transformers, config_class)(**settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomise(model, config.model_type.startswith("gemma"))
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=getattr(config, "pad_token_id", None),
    )
    model.save_pretrained(out, safe_serialization=True)


def hf_folder(family: str, llama: LlamaCpp, seed: int = SEED) -> Path:
    """`family`'s tiny HF folder (config, float32 weights, real tokenizer files), built once."""
    path = folder(family, llama, seed) / "hf"
    if (path / "config.json").is_file():
        return path
    with _locked(path):
        if (path / "config.json").is_file():
            return path
        staging = path.with_name("hf.partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        build_model(family, staging, seed)
        write_tokenizer(family, staging, llama)
        staging.rename(path)
    return path


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 1800) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if out.returncode != 0:
        tail = (out.stdout + out.stderr)[-4000:]
        raise RuntimeError(f"{' '.join(cmd[:3])}... failed ({out.returncode}):\n{tail}")


def gguf(family: str, mix: str, llama: LlamaCpp, seed: int = SEED) -> Path:
    """`family`'s GGUF of `mix`: F32 or F16 from convert_hf_to_gguf.py, a quantised mix
    (:data:`MIXES`, :data:`MORE_MIXES`) from llama-quantize on the F32 file. Built once."""
    known = FLOATS + MIXES + tuple(MORE_MIXES)
    if mix not in known:
        raise ValueError(f"mix {mix!r}: one of {known}")
    path = folder(family, llama, seed) / f"{family}-{mix}.gguf"
    if path.is_file():
        return path
    source = hf_folder(family, llama, seed) if mix in FLOATS else gguf(family, "F32", llama, seed)
    with _locked(path):
        if path.is_file():
            return path
        staging = path.with_name(path.name + ".partial")
        staging.unlink(missing_ok=True)
        if mix in FLOATS:
            cmd = [sys.executable, str(llama.src / "convert_hf_to_gguf.py"), str(source)]
            cmd += ["--outfile", str(staging), "--outtype", mix.lower()]
            cmd += ["--model-name", f"tiny-{family}"]
            _run(cmd, env=llama.converter_env())
        else:
            threads = str(min(4, os.cpu_count() or 1))
            _run([str(llama.tool("llama-quantize")), str(source), str(staging), mix, threads])
        staging.rename(path)
    return path


def split_gguf(family: str, llama: LlamaCpp, seed: int = SEED) -> Path:
    """`family`'s F16 GGUF written by convert_hf_to_gguf.py in parts of at most 10 tensors
    (``<family>-F16-split-00001-of-0000N.gguf``, as llama.cpp splits large files); the first part.
    Built once."""
    root = folder(family, llama, seed)
    first = f"{family}-F16-split-00001-of-*.gguf"
    if found := sorted(root.glob(first)):
        return found[0]
    staging = root / "split.partial"
    with _locked(staging):
        if found := sorted(root.glob(first)):
            return found[0]
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        cmd = [
            sys.executable,
            str(llama.src / "convert_hf_to_gguf.py"),
            str(hf_folder(family, llama)),
        ]
        cmd += ["--outfile", str(staging / f"{family}-F16-split.gguf"), "--outtype", "f16"]
        cmd += ["--model-name", f"tiny-{family}", "--split-max-tensors", "10"]
        _run(cmd, env=llama.converter_env())
        parts = sorted(staging.glob("*.gguf"))
        for part in parts[1:] + parts[:1]:  # the first part last: it names a complete set
            part.rename(root / part.name)
        shutil.rmtree(staging)
    return sorted(root.glob(first))[0]


def build_all(llama: LlamaCpp, families: tuple[str, ...] = FAMILIES) -> dict[str, list[Path]]:
    """Every fixture of `families` (what a fresh machine builds on first use)."""
    return {f: [gguf(f, m, llama) for m in FLOATS + MIXES] for f in families}
