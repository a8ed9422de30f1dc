"""The command line: help for newcomers, and one clear line with exit status 1 for every bad input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def _case_file(tmp: Path, name: str, content: bytes = b"hello") -> str:
    (tmp / name).write_bytes(content)
    return str(tmp / name)


# Each case: CLI arguments built from a scratch folder, and the message the one error line must hold.
ERROR_CASES = {
    "missing path": (lambda t: ["export", str(t / "nope")], "no such file or folder"),
    "hub model id": (
        lambda t: ["export", "HuggingFaceTB/SmolLM2-135M-Instruct"],
        "is not a local path: only local model folders and .gguf files are accepted",
    ),
    "folder without config.json": (lambda t: ["export", str(t)], "config.json is missing"),
    "neither folder nor gguf": (
        lambda t: ["export", _case_file(t, "model.txt")],
        "neither a model folder nor a .gguf file",
    ),
    "gguf with bad magic": (
        lambda t: ["export", _case_file(t, "model.gguf")],
        "is not a GGUF file",
    ),
    "truncated gguf": (
        lambda t: ["export", _case_file(t, "cut.gguf", b"GGUF\x03\x00")],
        "cannot read GGUF file",
    ),
    "unsupported gguf architecture": (
        lambda t: ["export", str(write_gguf(t / "a.gguf", "rwkv6", np.zeros(32, np.float32)))],
        "GGUF architecture 'rwkv6' is not supported; supported: ",
    ),
    "gguf architecture optimum cannot export": (
        lambda t: ["export", str(write_gguf(t / "m.gguf", "mamba", np.zeros(32, np.float32)))],
        "GGUF architecture 'mamba' cannot be exported as a text-generation model",
    ),
    "unsupported gguf tensor type": (
        lambda t: ["export", str(write_gguf(t / "i8.gguf", "llama", np.zeros(32, np.int8)))],
        "holds tensors of type I8, which cannot be de-quantised",
    ),
    "invalid precision": (
        lambda t: ["export", "--precision", "int3", "-o", str(t / "o")],
        "precision must be one of fp32, fp16, got 'int3'",
    ),
    "negative verify tokens": (lambda t: ["export", "--verify-tokens", "-2"], "--verify-tokens"),
    "output is a file": (
        lambda t: ["export", "-o", _case_file(t, "out")],
        "it is a file, not a folder",
    ),
    "output under a file": (
        lambda t: ["export", "-o", str(Path(_case_file(t, "f")) / "sub")],
        "is not a folder",
    ),
    "output holds other files": (
        lambda t: ["export", "-o", str(Path(_case_file(t, "x.txt")).parent)],
        "is not empty and holds no onnxsample export",
    ),
    "unknown option": (lambda t: ["export", "--bogus"], "No such option: --bogus"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_bad_input_gives_one_line_and_exit_1(case, tmp_path, capsys):
    make_args, message = ERROR_CASES[case]
    code, out, err = run_cli(capsys, *make_args(tmp_path))
    assert code == 1
    assert message in err
    assert "Traceback" not in err + out
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")


@pytest.mark.parametrize("argv", [["--help"], ["export", "--help"]])
def test_help(argv, capsys):
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    assert "Usage" in out
    if argv[0] == "export":
        for option in ("--output", "--precision", "--force", "--verify-tokens", "--keep-hf"):
            assert option in out


def test_console_script_reports_errors_without_traceback(tmp_path):
    exe = shutil.which("onnxsample", path=os.path.dirname(sys.executable))
    assert exe, "the onnxsample console script is not installed beside this Python"
    proc = subprocess.run(
        [exe, "export", str(tmp_path / "missing")], capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: no such file or folder")
    assert "Traceback" not in proc.stderr


def test_export_command_writes_summary(tiny_export, tiny_hf, capsys):
    code, out, err = run_cli(capsys, "export", str(tiny_hf), "-o", str(tiny_export.output))
    assert code == 0
    assert "reused" in out
    assert "greedy tokens match transformers" in out
    assert "Checking the source" in err
