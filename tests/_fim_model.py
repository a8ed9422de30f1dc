"""A GGUF with fill-in-the-middle tokens, made by llama.cpp's own converter, for llama-server's
``/infill``: the qwen2 fixture's tiny model (tests/_llama_cpp_models.py) with the 22 tokens
Qwen2.5 adds after Qwen2's vocabulary, at Qwen2.5's ids and with its ``special`` flags (the FIM
tokens among them: ``<|fim_prefix|>``, ``<|fim_suffix|>``, ``<|fim_middle|>``, ``<|fim_pad|>``,
``<|repo_name|>``, ``<|file_sep|>``). The converter writes them into the vocabulary and llama.cpp
finds the FIM ones by their texts, as it does in Qwen2.5-Coder's files. Built once beside the
qwen2 fixtures, Q8_0."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import _llama_cpp_models as models
from _llama_cpp import LlamaCpp

# Qwen2.5's added tokens after Qwen2's three, from id 151646: (text, special)
QWEN25_ADDED = [
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]  # fmt: skip
FIRST_ID = 151646


def _add_tokens(folder: Path) -> None:
    """Qwen2.5's added tokens into `folder`'s tokenizer.json and tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text("utf-8"))
    for i, (text, special) in enumerate(QWEN25_ADDED, FIRST_ID):
        token = AddedToken(text, normalized=False, special=special)
        added = tokenizer.add_special_tokens([token]) if special else tokenizer.add_tokens([token])
        assert added == 1 and tokenizer.token_to_id(text) == i, text
        config["added_tokens_decoder"][str(i)] = {
            "content": text, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special,
        }  # fmt: skip
    tokenizer.save(str(folder / "tokenizer.json"))
    config_path.write_text(json.dumps(config, indent=2) + "\n", "utf-8")


def fim_gguf(llama: LlamaCpp) -> Path:
    """The Q8_0 GGUF of the qwen2 fixture with Qwen2.5's FIM tokens, built once."""
    recipe = hashlib.sha256(json.dumps(QWEN25_ADDED).encode()).hexdigest()[:8]
    path = models.folder("qwen2", llama) / f"qwen2-fim-{recipe}-Q8_0.gguf"
    if path.is_file():
        return path
    source = models.hf_folder("qwen2", llama)
    with models._locked(path):
        if path.is_file():
            return path
        hf = path.with_name(path.stem + ".hf.partial")
        staging = path.with_name(path.name + ".partial")
        shutil.rmtree(hf, ignore_errors=True)
        shutil.copytree(source, hf)
        _add_tokens(hf)
        cmd = [sys.executable, str(llama.src / "convert_hf_to_gguf.py"), str(hf)]
        cmd += ["--outfile", str(staging), "--outtype", "q8_0", "--model-name", "tiny-qwen2-fim"]
        models._run(cmd, env=llama.converter_env())
        staging.rename(path)
        shutil.rmtree(hf)
    return path
