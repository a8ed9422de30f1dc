"""The command line: help for newcomers, and one clear line with exit status 1 for every bad input."""

from __future__ import annotations

import hashlib
import json
import os
import re
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
        "cut.gguf is truncated: the header ends before its metadata does (the file has 6 bytes)",
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
        "precision must be one of auto, fp32, fp16, int8, int4, gguf, got 'int3'",
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
    "invalid reasoning format": (
        lambda t: ["serve", "--reasoning-format", "deepseek-legacy"],
        "reasoning_format must be one of none, auto, deepseek, got 'deepseek-legacy'",
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


def test_export_command_writes_summary(tiny_gqa_export, tiny_hf, capsys):
    code, out, err = run_cli(capsys, "export", str(tiny_hf), "-o", str(tiny_gqa_export.output))
    assert code == 0
    assert "reused" in out
    assert "gqa layout, fp32" in out
    assert "greedy tokens match transformers" in out
    assert "Checking the source" in err


# ---- compose and inspect ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cli_composed(tiny_export, tmp_path_factory) -> Path:
    from onnxsample.composer import compose

    return compose(tiny_export.output, None, tmp_path_factory.mktemp("cli") / "c.onnx", max_slots=2)


def test_compose_command_writes_and_summarises(tiny_export, tmp_path, capsys):
    target = tmp_path / "out.onnx"
    code, out, err = run_cli(
        capsys,
        "compose",
        str(tiny_export.output),
        "-o",
        str(target),
        "--chain",
        "top_k,temperature,dist",
        "--max-slots",
        "3",
        "--top-logprobs",
        "2",
    )
    assert code == 0, err
    assert target.is_file()
    assert "temperature,top_k,dist" in out  # canonical order, whatever order was typed
    assert "sampler.top_logprobs" in out
    assert "Splicing the sampler chain" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compose", "/nonexistent/model.onnx"], "no such model file or folder"),
        (["compose", "{export}", "--chain", "top_k,nucleus"], "nucleus"),
        (
            ["compose", "{export}", "--gather", "middle"],
            "gather must be one of auto, lm_head, logits",
        ),
        (
            ["compose", "{export}", "--top-logprobs", "50"],
            "top_logprobs must be in [0, 20], got 50",
        ),
        (["compose", "{export}", "-o", "{export}/model.onnx"], "would overwrite its source"),
        (["inspect", "/nonexistent.onnx"], "no such model file"),
    ],
)
def test_compose_and_inspect_errors(argv, message, tiny_export, capsys):
    argv = [a.replace("{export}", str(tiny_export.output)) for a in argv]
    code, _out, err = run_cli(capsys, *argv)
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_inspect_shows_chain_slots_and_io(cli_composed, capsys):
    code, out, _ = run_cli(capsys, "inspect", str(cli_composed))
    assert code == 0
    for text in (
        "sampler chain",
        "penalties,temperature,top_k,top_p,min_p,typical_p,dist",
        "sampler.row_index",
        "sampler.next_token",
        "TopK",
        "past_key_values.0..1.key",
        "2 layers",
        "IR ",
    ):
        assert text in out, text


def test_inspect_describes_a_gguf_file_as_export_reads_it(capsys):
    """A GGUF is a model source, as `run` and `export` take it: its model, tensor types, whether
    the export keeps its blocks, and the tokenizer and chat template it carries."""
    from onnxsample.exporters import embedded_gguf

    code, out, err = run_cli(capsys, "inspect", str(embedded_gguf()))
    assert code == 0, err
    text = " ".join(out.split())
    for part in (
        "llama, 135M parameters, context 8192",
        "Q4_1 210, F32 61, Q8_0 1",
        "its own blocks, bit for bit",
        "gpt2 (pre-tokenizer smollm), a chat template",
    ):
        assert part in text, (part, out)


def test_inspect_plain_export(tiny_export, capsys):
    code, out, _ = run_cli(capsys, "inspect", str(tiny_export.model_path))
    assert code == 0
    assert "none (not a composed model)" in out
    assert "logits" in out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture
def netron_server(cli_composed):
    """`onnxsample inspect --netron` in a subprocess; yields its URL, stops it afterwards."""
    import signal
    import time
    import urllib.request

    exe = shutil.which("onnxsample", path=os.path.dirname(sys.executable))
    port = _free_port()
    proc = subprocess.Popen(
        [exe, "inspect", str(cli_composed), "--netron", "--port", str(port), "--no-browser"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as in a terminal: a run started in the background inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    url = f"http://localhost:{port}/"
    try:
        for _ in range(300):  # the server is up when it answers; give up after about a minute
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"netron exited early: {proc.stdout.read()}")
                time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            output = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            output = proc.communicate()[0]
        assert f"Netron is serving c.onnx at {url.rstrip('/')}" in output, output
        assert proc.returncode == 0, f"Ctrl-C did not stop it ({proc.returncode}): {output}"


def test_netron_serves_the_model(netron_server):
    import urllib.request

    with urllib.request.urlopen(netron_server, timeout=10) as response:
        page = response.read().decode("utf-8", "replace")
    assert response.status == 200
    assert "netron" in page.lower()


def test_netron_page_renders_the_chain_in_headless_chromium(netron_server, chromium, tmp_path):
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium
    driver.get(netron_server)
    driver.add_cookie({"name": "consent", "value": "1"})  # skip Netron's cookie banner
    driver.get(netron_server)
    WebDriverWait(driver, 120).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#canvas g.node"))
    assert "SamplerChain" in driver.page_source
    shot = tmp_path / "netron.png"
    driver.save_screenshot(str(shot))
    colours = len(set(Image.open(shot).convert("L").getdata()))
    assert colours > 8, "the page rendered blank"


# ---- run ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def run_folder(tiny_export, tmp_path_factory) -> Path:
    """A copy of the tiny export that `run` may compose into (composed.onnx beside model.onnx)."""
    target = tmp_path_factory.mktemp("run") / "tiny"
    shutil.copytree(tiny_export.output, target)
    return target


def test_run_composes_an_export_folder_and_prints_json(run_folder, capsys):
    code, out, err = run_cli(
        capsys,
        "run",
        str(run_folder),
        "-p",
        "Hello",
        "-p",
        "Bonjour",
        "--seed",
        "7",
        "-n",
        "5",
        "--no-chat",
        "--json",
        "--logprobs",
        "2",
        "--threads",
        "1",
    )
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert [line["index"] for line in lines] == [0, 1]
    for line in lines:
        assert {"text", "token_ids", "finish_reason", "logprobs", "top_logprobs", "timings"} <= set(
            line
        )
        assert line["finish_reason"] in ("length", "eos", "stop") and line["seed"] == 7
        assert len(line["top_logprobs"][0]) == 2
    assert (run_folder / "composed.onnx").is_file()
    assert "prompt " in err and "tok/s" in err and "first token" in err


@pytest.mark.parametrize("order", ["--temperature-last", "--temperature-first", None])
def test_run_samples_with_llama_cpps_defaults_and_order(order, run_folder, capsys):
    """Temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, as llama.cpp, with the temperature
    first unless --temperature-last (llama.cpp's order, which a CUDA graph's static chain leaves
    to the host): the tokens the library gives for those parameters."""
    from onnxsample import Generator, SamplingParams

    argv = ["run", str(run_folder), "-p", "Hello", "--seed", "11", "-n", "12", "--no-chat"]
    code, out, err = run_cli(capsys, *argv, "--json", "--threads", "1", *filter(None, [order]))
    assert code == 0, err
    last = order == "--temperature-last"
    params = SamplingParams(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, temperature_last=last, seed=11
    )
    with Generator(run_folder / "composed.onnx", threads=1) as gen:
        [done] = gen.generate("Hello", params, max_new_tokens=12, chat=False)
    assert json.loads(out)["token_ids"] == done.token_ids


def test_run_takes_llama_cpps_option_names(run_folder, capsys):
    """llama-cli's names for the same options (--temp, --n-predict, -c / --ctx-size, -t,
    --repeat-penalty) give what ours give."""
    base = ["run", str(run_folder), "-p", "Hello", "--seed", "5", "--no-chat", "--json"]
    ours = ["--temperature", "0.7", "-n", "6", "--max-len", "64", "--threads", "1",
            "--repetition-penalty", "1.2"]  # fmt: skip
    theirs = ["--temp", "0.7", "--n-predict", "6", "-c", "64", "-t", "1", "--repeat-penalty", "1.2"]
    answers = []
    for names in (ours, theirs, [*theirs[:4], "--ctx-size", "64", *theirs[6:]]):
        code, out, err = run_cli(capsys, *base, *names)
        assert code == 0, err
        answers.append(json.loads(out)["token_ids"])
    assert answers[0] == answers[1] == answers[2] and len(answers[0]) <= 6


def test_run_streams_one_prompt(run_folder, capsys):
    code, out, err = run_cli(
        capsys, "run", str(run_folder), "-p", "Hi", "-n", "6", "--temperature", "0", "--no-chat"
    )
    assert code == 0, err
    assert out.strip()
    assert "decode " in err


@pytest.mark.parametrize("given", ["file", "text"])
def test_run_renders_chats_with_a_given_template(run_folder, tmp_path, given, capsys):
    """`run --chat-template` (a file or its text) in place of the model's own."""
    from onnxsample.text import Tokenizer

    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<answer>"
    (tmp_path / "chat.jinja").write_text(template)
    value = str(tmp_path / "chat.jinja") if given == "file" else template
    want = Tokenizer.from_folder(run_folder).encode("<user>Hello<answer>", add_special_tokens=False)
    code, out, err = run_cli(
        capsys, "run", str(run_folder), "-p", "Hello", "--chat-template", value, "-n", "1",
        "--json", "--temperature", "0",
    )  # fmt: skip
    assert code == 0, err
    [line] = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert line["timings"]["prompt_tokens"] == len(want)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        (["--temperature", "-0.5"], "temperature must be"),
        (["--min-p", "2"], "min_p must be in [0, 1], got 2"),
        (["--presence-penalty", "3"], "presence_penalty must be in [-2, 2], got 3"),
        (["--repetition-penalty", "0"], "repetition_penalty must be"),
        (["--logit-bias", "42"], "--logit-bias takes ID=VALUE"),
        (["--logit-bias", "42=500"], "logit_bias"),
        (["--logprobs", "50"], "logprobs must be in [0, 20], got 50"),
        (["--provider", "tpu"], "provider must be one of auto, cpu, cuda, got 'tpu'"),
        (["--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1, got 0"),
        (["-p", "word " * 700], "does not fit the model's context of 512 tokens"),
        (["--threads", "0"], "--threads"),
        (["--seed", "-1"], "seed must be an integer in [0, 2**64), got -1"),
        (["--provider", "cuda"], "onnxsample[gpu]"),
        (["--prefill-chunk", "-1"], "--prefill-chunk"),
        (["--regex", "a", "--choice", "b"], "one output constraint per run, got --regex, --choice"),
        (["--json-schema", "{nope"], "not valid JSON"),
        (["--json-schema", '{"type": "strin"}'], "invalid constraint: Invalid type: strin"),
        (["--grammar", "root ::= nowhere"], "nowhere"),
        (["--regex", "a("], "invalid constraint"),
        (["--no-row-buckets"], "--no-row-buckets is for CUDA graphs"),
        (["--chat-template", "chatml"], "'chatml' is neither a file nor jinja text"),
        (["--chat-template", "{% for %}"], "the chat template does not parse"),
    ],
)
def test_run_errors(argv, message, run_folder, capsys):
    if "-p" not in argv:
        argv = [*argv, "-p", "Hello"]
    code, _out, err = run_cli(capsys, "run", str(run_folder), "--no-chat", *argv)
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("✓")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


@pytest.mark.parametrize(
    ("argv", "check"),
    [
        (["--choice", "yes", "--choice", "no"], lambda text: text in ("yes", "no")),
        (["--regex", "[0-9]{2}:[0-9]{2}"], lambda text: re.fullmatch("[0-9]{2}:[0-9]{2}", text)),
        (["--json-schema", "SCHEMA_FILE"], lambda text: json.loads(text)["answer"] in ("a", "b")),
        (["--json-schema", "SCHEMA_TEXT"], lambda text: json.loads(text)["answer"] in ("a", "b")),
        (["--grammar", 'root ::= "v" [0-9]'], lambda text: re.fullmatch("v[0-9]", text)),
    ],
)
def test_run_constrains_the_answer(argv, check, run_folder, tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"answer": {"enum": ["a", "b"]}},
                "required": ["answer"],
                "additionalProperties": False,
            }
        )
    )
    long_text = json.dumps({**json.loads(schema.read_text()), "description": "x" * 400})
    argv = [{"SCHEMA_FILE": str(schema), "SCHEMA_TEXT": long_text}.get(a, a) for a in argv]
    code, out, err = run_cli(
        capsys, "run", str(run_folder), "-p", "Q", "--no-chat", "--json", "--seed", "1", *argv
    )
    assert code == 0, err
    [line] = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert line["finish_reason"] == "eos" and check(line["text"]), line["text"]


def test_run_needs_a_prompt(run_folder, capsys):
    code, _out, err = run_cli(capsys, "run", str(run_folder))
    assert code == 1 and "give at least one prompt" in err


# ---- run and serve take what `export` takes ----------------------------------------------------


def _greedy_json(capsys, model: str) -> dict:
    code, out, err = run_cli(
        capsys, "run", model, "-p", "The capital of France is", "-n", "6", "--temperature", "0",
        "--no-chat", "--json", "--threads", "1",
    )  # fmt: skip
    assert code == 0, err
    [line] = [json.loads(line) for line in out.splitlines() if line.strip()]
    return line


@pytest.mark.integration
def test_run_exports_a_gguf_file_on_first_use_as_export_does(
    llama_cpp, tmp_path, monkeypatch, capsys
):
    """`onnxsample run FILE.gguf`, as `llama-cli -m FILE.gguf`: exported once into the user cache
    with `export`'s defaults (the same greedy tokens as `export FILE` and `run FOLDER`), reused
    while the file is unchanged, made again when another file takes its path."""
    import _llama_cpp_models as fixtures

    monkeypatch.setenv("ONNXSAMPLE_CACHE", str(tmp_path / "cache"))
    file = tmp_path / "tiny.gguf"
    shutil.copyfile(fixtures.gguf("llama3", "Q4_K_M", llama_cpp), file)
    first = _greedy_json(capsys, str(file))
    [cached] = (tmp_path / "cache" / "exports").glob("*/tiny/model.onnx")
    made = cached.stat().st_mtime_ns

    code, _out, err = run_cli(capsys, "export", str(file), "-o", str(tmp_path / "exported"))
    assert code == 0, err
    assert _greedy_json(capsys, str(tmp_path / "exported"))["token_ids"] == first["token_ids"]
    assert _greedy_json(capsys, str(file))["token_ids"] == first["token_ids"]
    assert cached.stat().st_mtime_ns == made, "an unchanged file was exported again"

    shutil.copyfile(fixtures.gguf("llama3", "Q8_0", llama_cpp), file)
    _greedy_json(capsys, str(file))
    manifest = json.loads((cached.parent / "onnxsample.json").read_text())
    assert cached.stat().st_mtime_ns != made
    assert manifest["source"]["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()


@pytest.mark.integration
def test_run_exports_a_hugging_face_folder_on_first_use(tiny_hf, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ONNXSAMPLE_CACHE", str(tmp_path))
    line = _greedy_json(capsys, str(tiny_hf))
    assert line["token_ids"] and line["finish_reason"] in ("length", "eos")
    [cached] = (tmp_path / "exports").glob(f"*/{tiny_hf.name}/composed.onnx")
    assert json.loads((cached.parent / "onnxsample.json").read_text())["layout"] == "gqa"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("model.txt", b"hello", "is not an .onnx file, a .gguf file or an export folder"),
        ("model.gguf", b"hello", "is not a GGUF file"),
        ("cut.gguf", b"GGUF\x03\x00", "cut.gguf is truncated: the header ends before its"),
    ],
)
@pytest.mark.parametrize("command", ["run", "serve"])
def test_run_and_serve_refuse_a_bad_file_in_one_line(
    command, name, content, message, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ONNXSAMPLE_CACHE", str(tmp_path / "cache"))
    argv = [command, _case_file(tmp_path, name, content)] + (
        ["-p", "hi"] if command == "run" else []
    )
    code, out, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("✓")]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0] and "Traceback" not in err + out
    assert not list((tmp_path / "cache").glob("exports/*/*/model.onnx"))
