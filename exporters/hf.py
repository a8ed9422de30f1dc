"""Hugging Face model folders: check, load with transformers, and export with optimum.

optimum's ONNX exporter with `text-generation-with-past` writes the layout the composer expects:
`input_ids`, `attention_mask`, `position_ids`, `past_key_values.N.key/value` -> `logits`, `present.N.*`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

from onnxsample.errors import ExportError, first_line

__all__ = [
    "check_hf_folder",
    "check_model_type",
    "load_hf",
    "load_hf_config",
    "optimum_export",
    "quiet",
]

log = logging.getLogger(__name__)

TASK = "text-generation-with-past"
_NOISY_LOGGERS = ("optimum", "transformers", "torch", "torch.onnx")


def check_model_type(model_type: str, what: str) -> None:
    """Refuse model types that optimum cannot export as a decoder with a KV cache."""
    import optimum.exporters.onnx.model_configs  # noqa: F401  (registers the ONNX configs)
    from optimum.exporters.tasks import TasksManager

    try:
        tasks = TasksManager.get_supported_tasks_for_model_type(
            model_type, exporter="onnx", library_name="transformers"
        )
    except KeyError:
        tasks = {}
    if TASK not in tasks:
        raise ExportError(f"{what} cannot be exported as a text-generation model with a KV cache")


def check_hf_folder(path: Path) -> dict:
    """Read `config.json` and check that the folder holds weights; returns the config. Whether
    optimum can export the model type is :func:`check_model_type`'s question (it imports optimum,
    which takes seconds)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read {path / 'config.json'}: {exc}") from exc
    model_type = config.get("model_type")
    if not model_type:
        raise ExportError(f"{path / 'config.json'} has no model_type")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ExportError(f"{path} holds no weights (*.safetensors or *.bin)")
    return config


def approximate_params(path: Path) -> int:
    """A Hugging Face folder's parameter count from its weight files' bytes and its config's
    dtype (2 bytes a parameter unless it says float32)."""
    files = [p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file()]
    config = (
        json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    )
    dtype = config.get("torch_dtype") or config.get("dtype")
    return sum(p.stat().st_size for p in files) // (4 if dtype == "float32" else 2)


# What a tokenizer is read from: its fast form, SentencePiece's model, or byte-level BPE's pair.
_TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))


def _check_tokenizer_files(path: Path) -> None:
    """ExportError naming what is missing when `path` holds no tokenizer transformers can read
    (it says "Either model_file or model_proto must be specified", or less)."""
    if not any(all((path / name).is_file() for name in files) for files in _TOKENIZER_FILES):
        raise ExportError(
            f"{path} has no tokenizer: it needs tokenizer.json, tokenizer.model or "
            "vocab.json with merges.txt (copy them from the model's repository)"
        )


def load_hf(path: Path):
    """Load the fp32 model and its tokenizer from a local folder (never from a hub)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # transformers soft-caps attention scores (Gemma 2) in its eager attention only
    config = json.loads((path / "config.json").read_text())
    eager = {"attn_implementation": "eager"} if config.get("attn_logit_softcapping") else {}
    _check_tokenizer_files(path)
    try:
        with quiet():
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32, local_files_only=True, **eager
            )
    except Exception as exc:
        raise ExportError(f"transformers cannot load {path}: {exc}") from exc
    return model.eval(), tokenizer


def load_hf_config(path: Path):
    """(tokenizer, config, generation config) of a local folder, without loading its weights."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    _check_tokenizer_files(path)
    try:
        with quiet():
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ExportError(f"transformers cannot read {path}: {exc}") from exc
    try:
        generation = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:  # no generation_config.json: the model config's token ids
        generation = GenerationConfig.from_model_config(config)
    return tokenizer, config, generation


def optimum_export(hf_dir: Path, out_dir: Path, precision: str) -> None:
    """Export `hf_dir` to `out_dir/model.onnx` with optimum; tokenizer and configs are copied too."""
    from optimum.exporters.onnx import main_export

    with quiet():
        try:
            main_export(
                str(hf_dir),
                output=out_dir,
                task=TASK,
                device="cpu",
                dtype=precision,
                do_validation=False,
                local_files_only=True,
                library_name="transformers",
            )
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f"optimum could not export {hf_dir.name}: {first_line(exc)}") from exc
    if not (out_dir / "model.onnx").is_file():
        raise ExportError(f"optimum wrote no model.onnx for {hf_dir.name}")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Route the exporters' prints and warnings to our log instead of the user's terminal."""
    from transformers.utils import logging as hf_logging

    levels = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    hf_verbosity, hf_bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out):
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        hf_logging.set_verbosity(hf_verbosity)
        if hf_bars:
            hf_logging.enable_progress_bar()
        if out.getvalue().strip():
            log.debug("exporter output:\n%s", out.getvalue())
