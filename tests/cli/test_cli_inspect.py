"""`onnxsample compose` and `onnxsample inspect` (with its Netron page)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import run_cli


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
        (["inspect", "{tmp}/model.gguf"], "is not a GGUF file"),  # named so, read as one
        (["inspect", "{tmp}/missing.gguf"], "no such model file"),
    ],
)
def test_compose_and_inspect_errors(argv, message, tiny_export, tmp_path, capsys):
    (tmp_path / "model.gguf").write_bytes(b"hello")
    argv = [
        a.replace("{export}", str(tiny_export.output)).replace("{tmp}", str(tmp_path)) for a in argv
    ]
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


def test_netron_on_a_taken_port_says_so(cli_composed, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("localhost", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, _, err = run_cli(capsys, "inspect", str(cli_composed), "--netron", "--port", port,
                               "--no-browser")  # fmt: skip
    assert code == 1 and f"Netron cannot serve on port {port}" in err, err
    assert "Traceback" not in err and "--port" in err


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


@pytest.mark.parametrize("option", [["--port", "8123"], ["--no-browser"]])
def test_netron_options_without_netron_are_refused(cli_composed, capsys, option):
    """They would change nothing: one line naming the option, exit 1, no summary."""
    code, out, err = run_cli(capsys, "inspect", str(cli_composed), *option)
    assert code == 1 and f"{option[0]} is for --netron: give --netron too" in err, err
    assert "sampler chain" not in out
