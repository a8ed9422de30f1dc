"""`onnxsample run`: an export folder composed and sampled with llama.cpp's options and order, and a
GGUF file or Hugging Face folder exported on first use, as `export` would."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from _cli import case_file, run_cli
from _http import BIN


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


def test_seed_minus_one_is_a_random_seed_as_in_llama_cli(run_folder, capsys):
    """``--seed -1`` draws a seed per run, as llama-cli's ``-s -1``; --json says which."""
    argv = ["run", str(run_folder), "-p", "Hello", "-n", "2", "--no-chat", "--json", "-t", "1"]
    seeds = []
    for _ in range(2):
        code, out, err = run_cli(capsys, *argv, "--seed", "-1")
        assert code == 0, err
        seeds.append(json.loads(out)["seed"])
    assert seeds[0] != seeds[1] and all(0 <= s < 2**64 for s in seeds), seeds


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
        # llama.cpp's form too, and a token given twice gets the sum, as llama.cpp adds them
        (
            ["--logit-bias", "42+60", "--logit-bias", "42=60"],
            "logit_bias[42] must be in [-100, 100], got 120.0",
        ),
        (["--logprobs", "50"], "logprobs must be in [0, 20], got 50"),
        (["--provider", "tpu"], "provider must be one of auto, cpu, cuda, got 'tpu'"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be -1 (until the end) or at least 1"),
        (["-n", "-2"], "--max-new-tokens must be -1 (until the end) or at least 1, got -2"),
        (["-p", "word " * 700], "does not fit the model's context of 512 tokens"),
        (["--threads", "0"], "--threads"),
        (["--seed", "-2"], "seed must be an integer in [0, 2**64), got -2"),
        (["--provider", "cuda"], "onnxsample[gpu]"),
        (["--prefill-chunk", "-1"], "--prefill-chunk"),
        (["--regex", "a", "--choice", "b"], "one output constraint per run, got --regex, --choice"),
        (["--json-schema", "{nope"], "not valid JSON"),
        (["--json-schema", '{"type": "strin"}'], "invalid constraint: Invalid type: strin"),
        (["--grammar", "root ::= nowhere"], "nowhere"),
        (["--json-schema", "/no/such/schema.json"], "no such file: /no/such/schema.json"),
        (["--grammar", "missing.gbnf"], "no such file: missing.gbnf"),
        (["--regex", "a("], "invalid constraint"),
        (["--no-row-buckets"], "--no-row-buckets is for CUDA graphs"),
        (["--draft-tokens", "4"], "--draft-tokens needs --speculative ngram"),
        (["--ngram", "7"], "--ngram needs --speculative ngram"),  # it would change nothing
        (["--chat-template", "chatml"], "'chatml' is neither a file nor jinja text"),
        (["--chat-template", "{% for %}"], "the chat template does not parse"),
        (["--chat-template", "X{{ messages[0].content }}"], "--chat-template needs chat mode"),
        (["-p", "a", "-p", "b", "--stream"], "--stream prints one prompt's text as it is"),
        (["--json", "--stream"], "with --json or several prompts each answer is printed whole"),
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
        # a Lark regex whose end reads as a file name is still a grammar
        (["--grammar", r"start: /[a-z]\.json/"], lambda text: re.fullmatch(r"[a-z]\.json", text)),
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


def test_n_predict_minus_one_runs_to_the_end_of_the_context(run_folder, capsys):
    """llama-cli's -n -1: no limit but the end of the sequence or of the context (--max-len)."""
    code, out, err = run_cli(
        capsys, "run", str(run_folder), "-p", "hi", "-n", "-1", "--max-len", "24", "--no-chat",
        "--json", "--logit-bias", "0=-100", "--logit-bias", "2=-100", "--logit-bias", "4=-100",
    )  # fmt: skip
    assert code == 0, err
    done = json.loads(out)
    assert done["finish_reason"] == "length", done
    assert done["timings"]["prompt_tokens"] + len(done["token_ids"]) == 24, done


def test_run_needs_a_prompt(run_folder, capsys):
    code, _out, err = run_cli(capsys, "run", str(run_folder))
    assert code == 1 and "give at least one prompt" in err
    # a prompt given as the model's argument is said to be read as one
    code, _out, err = run_cli(capsys, "run", "Is the sky blue?", "--choice", "yes")
    assert code == 1 and "('Is the sky blue?' was read as the model)" in err, err


def test_an_error_before_any_text_leaves_stdout_empty(run_folder, capsys):
    """A constraint refused when the request is made, after the model loaded: no blank line."""
    code, out, err = run_cli(capsys, "run", str(run_folder), "-p", "Hi", "--regex", "a(")
    assert code == 1 and "invalid constraint" in err and out == "", (out, err)


@pytest.mark.parametrize(
    ("argv", "cut"),
    [
        (["-n", "1"], "--max-new-tokens"),
        (["--stop", ","], "a --stop string"),
    ],
)
def test_a_constrained_answer_cut_short_is_warned_of(argv, cut, run_folder, capsys):
    """-n or a stop string may end a constrained answer before its constraint does (as in
    llama.cpp and vLLM): the run says so on stderr."""
    code, _out, err = run_cli(
        capsys, "run", str(run_folder), "-p", "Q", "--no-chat", "--seed", "1", "--choice",
        "yes, it is", "--choice", "no, it is not", *argv,
    )  # fmt: skip
    assert code == 0, err
    assert f"warning: {cut} ended the answer, not its constraint: it may not match" in err


def test_a_constrained_answer_whole_at_the_token_limit_is_not_warned_of(run_folder, capsys):
    """-n 1 and choices of one token: the limit came where the answer was whole."""
    code, out, err = run_cli(
        capsys, "run", str(run_folder), "-p", "Q", "--no-chat", "--seed", "1", "--json",
        "--choice", "a", "--choice", "b", "-n", "1",
    )  # fmt: skip
    done = json.loads(out)
    assert code == 0 and done["finish_reason"] == "length" and len(done["token_ids"]) == 1, out
    assert done["text"] in ("a", "b") and "warning" not in err, err


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
    argv = [command, case_file(tmp_path, name, content)] + (
        ["-p", "hi"] if command == "run" else []
    )
    code, out, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("✓")]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0] and "Traceback" not in err + out
    assert not list((tmp_path / "cache").glob("exports/*/*/model.onnx"))


def test_an_error_after_streamed_text_is_on_a_line_of_its_own(run_folder, capsys):
    """A constraint that fails after some tokens: the streamed text's line ends before the
    error's."""
    code, out, err = run_cli(
        capsys, "run", str(run_folder), "-p", "Hi", "-n", "4", "--regex", "a{1000000}",
        "--no-chat", "--temperature", "0",
    )  # fmt: skip
    assert code == 1 and "\nerror: invalid constraint" in err, (out, err)
    assert out and out.endswith("\n"), out


@pytest.mark.parametrize("mode", [[], ["--no-stream"], ["--json"]])
def test_the_answer_is_printed_as_the_model_wrote_it(run_folder, capsys, mode):
    """stdout carries the text itself: an emoji code stays a code and a control character stays
    (a console rewrote `:smile:` as an emoji and dropped control characters)."""
    answer = ":smile:\x07"
    argv = ["run", str(run_folder), "-p", "Hi", "--no-chat", "-t", "1", "--choice", answer]
    code, out, err = run_cli(capsys, *argv, *mode)
    assert code == 0, err
    assert (json.loads(out)["text"] if mode == ["--json"] else out) == (
        answer if mode == ["--json"] else answer + "\n"
    )


@pytest.mark.parametrize(("how", "status"), [("SIGINT", 130), ("SIGTERM", 143), ("pipe", 141)])
def test_a_run_stopped_while_it_decodes_ends_cleanly(embedded_gqa_exports, how, status):
    """Ctrl-C, `kill` or a reader gone (`| head -c 1`) mid-answer: the engine is stopped before the
    process ends, with the shell's status (it aborted with 134: "terminate called without an
    active exception", the engine's thread still inside ONNX Runtime)."""
    folder = embedded_gqa_exports["gguf-a4"].output
    argv = [str(BIN), "run", str(folder), "-p", "1, 2, 3, 4, 5,", "--no-chat", "-n", "400",
            "--temperature", "0", "-t", "1"]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    try:
        assert proc.stdout.read(1), "no answer came"  # it decodes now
        if how == "pipe":
            proc.stdout.close()
        else:
            proc.send_signal(getattr(signal, how))
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == status, err
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err and "terminate called" not in err, err
    if how == "SIGINT":
        assert "interrupted" in err, err


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_a_prompt_from_a_file_or_stdin_is_that_text(
    run_folder, capsys, monkeypatch, tmp_path, source
):
    """`-f FILE` (`-`: stdin), as llama-cli's: the same answer as the text given with -p."""
    import io

    text = "Hello there\nfriend"  # saved by an editor: one newline more, which -f drops
    (tmp_path / "q.txt").write_text(text + "\n", encoding="utf-8")
    if source == "stdin":
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode() + b"\n")))
    base = ["run", str(run_folder), "--no-chat", "--json", "-n", "6", "--seed", "2", "-t", "1"]
    code, out, err = run_cli(
        capsys, *base, "-f", "-" if source == "stdin" else str(tmp_path / "q.txt")
    )
    assert code == 0, err
    code, given, err = run_cli(capsys, *base, "-p", text)
    assert json.loads(out)["token_ids"] == json.loads(given)["token_ids"]


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read the prompt file"), (b"ab\xff", "is not UTF-8 text (byte 2: 0xff)")],
)
def test_a_prompt_file_that_cannot_be_read_says_so(run_folder, capsys, tmp_path, content, message):
    path = tmp_path / "q.txt"
    if content is not None:
        path.write_bytes(content)
    code, _out, err = run_cli(capsys, "run", str(run_folder), "-f", str(path))
    assert code == 1 and message in err, err
