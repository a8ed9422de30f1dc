"""The command line's test helpers: a call of `onnxsample` in-process, and scratch input files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnxsample.cli import main


def write_gguf(path: Path, architecture: str, tensor: np.ndarray) -> Path:
    """A one-tensor GGUF file, for the exporter's error cases."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tensor("token_embd.weight", tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
        raise SystemExit(0)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def case_file(tmp: Path, name: str, content: bytes = b"hello") -> str:
    (tmp / name).write_bytes(content)
    return str(tmp / name)
