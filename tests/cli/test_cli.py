"""The command line: help for newcomers, one clear line with exit status 1 for every bad input, and
`export`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _cli import case_file, run_cli, write_gguf

# Each case: CLI arguments built from a scratch folder, and the message the one error line must hold.
ERROR_CASES = {
    "missing path": (lambda t: ["export", str(t / "nope")], "no such file or folder"),
    "hub model id": (
        lambda t: ["export", "HuggingFaceTB/SmolLM2-135M-Instruct"],
        "is not a local path: only local model folders and .gguf files are accepted",
    ),
    "folder without config.json": (lambda t: ["export", str(t)], "config.json is missing"),
    "neither folder nor gguf": (
        lambda t: ["export", case_file(t, "model.txt")],
        "neither a model folder nor a .gguf file",
    ),
    "gguf with bad magic": (
        lambda t: ["export", case_file(t, "model.gguf")],
        "is not a GGUF file",
    ),
    "gguf of another version": (
        lambda t: [
            "export",
            case_file(t, "v9.gguf", b"GGUF" + (9).to_bytes(4, "little") + bytes(16)),
        ],
        "v9.gguf is GGUF version 9, which this exporter does not read (versions 2, 3)",
    ),
    "gguf version 1": (
        lambda t: [
            "export",
            case_file(t, "v1.gguf", b"GGUF" + (1).to_bytes(4, "little") + bytes(16)),
        ],
        "v1.gguf is GGUF version 1, which this exporter does not read (versions 2, 3)",
    ),
    "big-endian gguf": (  # version 3 in big-endian order is read as 3, as gguf reads it
        lambda t: ["export", case_file(t, "be.gguf", b"GGUF" + (3).to_bytes(4, "big"))],
        "be.gguf is truncated",
    ),
    "folder named .gguf": (
        lambda t: ["export", str(_folder(t / "x.gguf"))],
        "is not a Hugging Face model folder (a folder, not a .gguf file): config.json is missing",
    ),
    "truncated gguf": (
        lambda t: ["export", case_file(t, "cut.gguf", b"GGUF\x03\x00")],
        "cut.gguf is truncated: the header ends before its metadata does (the file has 6 bytes)",
    ),
    "unsupported gguf architecture": (
        lambda t: ["export", str(write_gguf(t / "a.gguf", "rwkv6", np.zeros(32, np.float32)))],
        # what an export takes: neither mamba nor a mixture of experts, which are refused
        "GGUF architecture 'rwkv6' is not supported; supported: bloom, falcon, gemma2, gemma3, "
        "gpt2, llama, mistral, nemotron, phi3, qwen2, qwen3, stablelm\n",
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
        "precision must be one of auto, fp32, fp16, int8, int4, gguf, got 'int3'",
    ),
    "keep-hf where no folder is made": (
        lambda t: ["export", "--keep-hf", "-o", str(t / "o")],  # the embedded GGUF, gqa layout
        "this export makes none (the gqa layout reads it)",
    ),
    "invalid layout": (
        lambda t: ["export", "--layout", "paged", "-o", str(t / "o")],
        "layout must be one of auto, gqa, optimum, got 'paged'",
    ),
    "invalid accuracy level": (
        lambda t: ["export", "--accuracy-level", "2", "-o", str(t / "o")],
        "accuracy_level must be 0 or 4, got 2",
    ),
    "invalid attention": (
        lambda t: ["export", "--attention", "flash", "-o", str(t / "o")],
        "attention must be one of gqa, exact, got 'flash'",
    ),
    "exact attention on the gpu": (
        lambda t: ["export", "--attention", "exact", "--device", "cuda", "-o", str(t / "o")],
        "--attention exact is for the CPU",
    ),
    "max-len below 2": (lambda t: ["run", "-p", "hi", "--max-len", "1"], "--max-len"),
    "run of a folder with no model": (
        lambda t: ["run", str(_folder(t / "x.gguf")), "-p", "hi"],
        "is a folder with neither a model.onnx (an export) nor a config.json",
    ),
    "negative verify tokens": (lambda t: ["export", "--verify-tokens", "-2"], "--verify-tokens"),
    "output is a file": (
        lambda t: ["export", "-o", case_file(t, "out")],
        "it is a file, not a folder",
    ),
    "output under a file": (
        lambda t: ["export", "-o", str(Path(case_file(t, "f")) / "sub")],
        "is not a folder",
    ),
    "output holds other files": (
        lambda t: ["export", "-o", str(Path(case_file(t, "x.txt")).parent)],
        "is not empty and holds no onnxsample export",
    ),
    "unknown option": (lambda t: ["export", "--bogus"], "No such option: --bogus"),
    "invalid reasoning format": (
        lambda t: ["serve", "--reasoning-format", "deepseek-legacy"],
        "reasoning_format must be one of none, auto, deepseek, got 'deepseek-legacy'",
    ),
    "an origin with a path": (
        lambda t: ["serve", "--allowed-origin", "http://app.example/chat"],
        "the allowed origin 'http://app.example/chat' is not an origin such as",
    ),
    "candidates with drafts": (
        lambda t: ["serve", "--candidates", "64", "--speculative", "ngram"],
        "--candidates composes the candidates instead of draft verification",
    ),
    "unknown speculative method": (
        lambda t: ["serve", "--speculative", "foo"],
        "--speculative must be ngram, got 'foo'",
    ),
    "final distribution with drafts": (
        lambda t: ["serve", "--output-probs", "--speculative", "ngram"],
        "--output-probs composes the final distribution instead of draft verification",
    ),
}


@pytest.mark.parametrize(
    ("provider", "cuda_graph", "refused"),
    [("cuda", None, True), ("cuda", True, True), ("cuda", False, False), ("cpu", None, False)],
)
def test_the_final_distribution_is_a_branching_chains(provider, cuda_graph, refused):
    """`serve --output-probs` reads the branching chain's distribution: a CUDA graph's static
    chain (the default on the GPU) is refused by name before anything is prepared."""
    from onnxsample.cli._options import preparation
    from onnxsample.errors import InvalidParameter

    spec = {"speculative": None, "cuda_graph": cuda_graph}
    if refused:
        with pytest.raises(InvalidParameter, match="add --no-cuda-graph, or drop --output-probs"):
            preparation(provider, spec, probs=True)
    else:
        assert preparation(provider, spec, probs=True)["probs"] is True


def test_serve_on_a_port_in_use_is_one_line_before_anything_is_prepared(tmp_path, capsys):
    """No banner, no model prepared, no uvicorn log: the port is taken at once, or refused."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run_cli(capsys, "serve", str(tmp_path / "none.gguf"), "--port", str(port))
    assert code == 1 and "Traceback" not in err + out
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use "
                     "(--host, --port)"]  # fmt: skip


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


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


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_export_stopped_midway_leaves_nothing(
    signum, status, tiny_hf, tmp_path, monkeypatch, capsys
):
    """`timeout`, `docker stop` (SIGTERM) or Ctrl-C while the model is written: the command ends
    with the shell's status for the signal, and its staging folder goes with it."""
    from onnxsample.exporters import _export

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the signal's handler raises here

    monkeypatch.setattr(_export, "_export_gqa", stopped)
    # Python's Ctrl-C handler, which a process started in the background (as by CI) goes without
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, _out, err = run_cli(capsys, "export", str(tiny_hf), "-o", str(tmp_path / "out"))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == status, err
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())  # no out, no .out.*.partial


def _cut_gguf(tmp: Path, keep: int) -> Path:
    """A one-tensor GGUF (its header 128 bytes, its tensor data 256) cut after `keep` bytes (< 0:
    that many before its end)."""
    whole = write_gguf(tmp / "whole.gguf", "llama", np.zeros(64, np.float32)).read_bytes()
    (tmp / "whole.gguf").unlink()
    (tmp / "cut.gguf").write_bytes(whole[:keep])
    return tmp / "cut.gguf"


@pytest.mark.parametrize(
    ("keep", "message"),
    [
        (4, "the header ends before its metadata does (the file has 4 bytes)"),
        (30, "the header ends before its metadata does (the file has 30 bytes)"),
        (80, "the header ends before its tensor table does (the file has 80 bytes)"),
        (128, "its tensor data ends at byte 384 but the file has 128 bytes"),
        (-1, "its tensor data ends at byte 384 but the file has 383 bytes"),
    ],
)
@pytest.mark.parametrize("command", ["export", "run"])
def test_a_truncated_gguf_is_the_first_and_only_line(
    command, keep, message, tmp_path, monkeypatch, capsys
):
    """What was cut off and where, not numpy's reason; the error is stderr's first line (no empty
    line before it from the stages' display), and no export folder is left behind."""
    monkeypatch.setenv("ONNXSAMPLE_CACHE", str(tmp_path / "cache"))
    file = str(_cut_gguf(tmp_path, keep))
    argv = (
        ["export", file, "-o", str(tmp_path / "out")]
        if command == "export"
        else ["run", file, "-p", "hi"]
    )
    code, out, err = run_cli(capsys, *argv)
    assert code == 1 and out == ""
    assert err.splitlines() == [f"error: cut.gguf is truncated: {message}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def _with_value(tmp: Path, key: str, value: int) -> Path:
    """The embedded SmolLM2 GGUF with the uint32 metadata value `key` set to `value` (a damaged
    header: the file is whole)."""
    from onnxsample.exporters import embedded_gguf

    data = bytearray(embedded_gguf().read_bytes())
    name = key.encode()
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    assert int.from_bytes(data[at : at + 4], "little") == 4  # GGUF's uint32
    data[at + 4 : at + 8] = value.to_bytes(4, "little")
    (tmp / "damaged.gguf").write_bytes(data)
    return tmp / "damaged.gguf"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("llama.attention.head_count", "the number of attention heads is 0"),
        ("llama.context_length", "the context length is 0"),
        ("llama.embedding_length", "the hidden size is 0"),
    ],
)
@pytest.mark.parametrize("command", ["export", "run"])
def test_a_header_with_a_size_of_0_is_one_line(
    command, key, message, tmp_path, monkeypatch, capsys
):
    """A size no model has is refused before anything is written (a division by 0 came out as a
    traceback, and a context of 0 exported and failed at the first call)."""
    monkeypatch.setenv("ONNXSAMPLE_CACHE", str(tmp_path / "cache"))
    file = str(_with_value(tmp_path, key, 0))
    argv = ["export", file, "-o", str(tmp_path / "out")] if command == "export" else ["run", file]
    code, out, err = run_cli(capsys, *argv, *([] if command == "export" else ["-p", "hi"]))
    assert code == 1 and out == ""
    [line] = err.splitlines()
    assert line.startswith("error: ") and message in line and "damaged" in line, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged.gguf"]


def test_inspect_says_export_refuses_a_damaged_header(tmp_path, capsys):
    """inspect shows what the file holds, and says the export is refused, and why (it promised
    an export of its own blocks)."""
    code, out, err = run_cli(
        capsys, "inspect", str(_with_value(tmp_path, "llama.attention.head_count", 0))
    )
    assert code == 0, err
    assert "refused" in out and "the number of attention heads is 0" in " ".join(out.split())


@pytest.mark.parametrize("argv", [["--help"], ["export", "--help"]])
def test_help(argv, capsys):
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    assert "Usage" in out
    if argv[0] == "export":
        for option in (
            "--output",
            "--layout",
            "--precision",
            "--accuracy-level",
            "--force",
            "--verify-tokens",
            "--keep-hf",
        ):
            assert option in out


_VERIFIED = {"tokens": 8, "reference_logprob": -0.355, "onnx_logprob": -0.419, "lossy": ""}


@pytest.mark.parametrize(
    ("verify", "line"),
    [
        (
            {**_VERIFIED, "ok": True, "matched": 8, "onnx_logprob": -0.355},
            "greedy tokens match transformers (8/8); mean logprob of the reference's tokens: "
            "the export -0.355, transformers -0.355",
        ),
        (  # the default GGUF export: what was compared, why it parts, and the score that matters
            {
                **_VERIFIED,
                "ok": False,
                "matched": 0,
                "reference_gap": 0.082,
                "lossy": "int8 activations",
            },
            "expected with int8 activations: greedy tokens agree with transformers' fp32 reference "
            "for 0 of 8, then part where its token is 0.08 above the export's in logprob; mean "
            "logprob of the reference's tokens: the export -0.419, transformers -0.355",
        ),
        (
            {**_VERIFIED, "ok": False, "matched": 3, "reference_gap": 4.5},
            "MISMATCH: greedy tokens agree with transformers' fp32 reference for 3 of 8, then part "
            "where its token is 4.50 above the export's in logprob; mean logprob of the "
            "reference's tokens: the export -0.419, transformers -0.355",
        ),
    ],
)
def test_the_verify_line_says_what_was_compared(verify, line):
    """A new user reads "0/8 match" as a failure: an expected difference says it is expected,
    against what, and where the tokens part."""
    from rich.text import Text

    from onnxsample.cli.export import _verify_text

    assert Text.from_markup(_verify_text(verify)).plain == line


def test_console_script_reports_errors_without_traceback(tmp_path):
    exe = shutil.which("onnxsample", path=os.path.dirname(sys.executable))
    assert exe, "the onnxsample console script is not installed beside this Python"
    proc = subprocess.run(
        [exe, "export", str(tmp_path / "missing")], capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: no such file or folder")
    assert "Traceback" not in proc.stderr


def test_an_int8_export_logs_nothing_unless_asked(tiny_hf, tmp_path):
    """ONNX Runtime's quantiser configures the root logger when imported; without --verbose the
    export prints its progress and summary only, none of the quantiser's lines."""
    exe = shutil.which("onnxsample", path=os.path.dirname(sys.executable))
    cmd = [exe, "export", str(tiny_hf), "-o", str(tmp_path / "q"), "--precision", "int8"]
    proc = subprocess.run([*cmd, "--verify-tokens", "0"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "[INFO]" not in proc.stderr and "quantizer" not in proc.stderr, proc.stderr[-800:]


def test_export_command_writes_summary(tiny_gqa_export, tiny_hf, capsys):
    code, out, err = run_cli(capsys, "export", str(tiny_hf), "-o", str(tiny_gqa_export.output))
    assert code == 0
    assert "reused" in out
    assert "gqa layout, fp32" in out
    assert "greedy tokens match transformers" in out
    assert "Checking the source" in err


def test_a_reused_export_says_its_verify_step_did_not_run(tiny_hf, tmp_path, capsys):
    """Asked for a verify step, an export made without one is reused as it is: the summary says
    how to get the step."""
    target = str(tmp_path / "out")
    assert run_cli(capsys, "export", str(tiny_hf), "-o", target, "--verify-tokens", "0")[0] == 0
    code, out, _err = run_cli(capsys, "export", str(tiny_hf), "-o", target)
    text = " ".join(out.split())  # the table wraps its lines
    assert code == 0 and "reused" in text
    assert "not run" in text and "--force exports again with its verify step" in text, out
