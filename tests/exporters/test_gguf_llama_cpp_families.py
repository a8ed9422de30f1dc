"""Every family and mix as llama.cpp's own tools write them, held to llama.cpp on the same file.

The files (tests/_llama_cpp_models.py): tiny random models of every family we export, with their
real tokenizers, converted by llama.cpp's convert_hf_to_gguf.py and quantised by llama-quantize to
F16, Q8_0, Q6_K, Q5_K_M, Q4_K_M and Q4_0, and for Llama 2 and Qwen2 also to Q3_K_M, Q2_K,
IQ4_XS, IQ4_NL, Q4_1 and Q5_1 (the other types we transplant), and for Llama 3 and Phi-3 to BF16.
For each file:

- every tensor we transplant de-quantises to `gguf.quants.dequantize`'s numbers, bit for bit;
- `onnxsample export FILE` (every option default) keeps the file's own blocks, within the size
  bound of its mix (:data:`SIZE`), and decodes as llama-server: the teacher-forced comparison of
  test_gguf_llama_cpp.py and _llama_cpp.py (likely tokens' logprobs within its TOL, llama.cpp's
  greedy token wherever its top two are apart, the same greedy tokens until the first near-tie).

For each family, the export's tokenizer gives llama.cpp's ids on the hard strings of
tests/_hard_texts.py and the family's chat markup, with BOS and without (the tokenizer comes from
the metadata, which every mix of a family shares: test_llama_cpp_models.py checks that).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import _llama_cpp_models as models
import gguf
import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from _exports import export_cached
from _hard_texts import HARD, hard_corpus
from _http import get, post, served
from _llama_cpp import (
    FLAT_TOL,
    TOL,
    LlamaServer,
    compare_with_llama_cpp,
    same_answer_until_a_near_tie,
)

from onnxsample.exporters import export
from onnxsample.exporters._gguf_quant import QuantizedWeight, from_gguf
from onnxsample.exporters._gguf_reader import FastGGUFReader
from onnxsample.exporters._gqa_graph import ExternalData
from onnxsample.exporters._weights import read_gguf
from onnxsample.exporters.gguf import inspect_gguf
from onnxsample.exporters.gqa import build_gqa_model, write_gqa
from onnxsample.text import Tokenizer

pytestmark = pytest.mark.slow
MIXES = ("F16", *models.MIXES)
CASES = [(f, m) for f in models.FAMILIES for m in MIXES]
CASES += [(f, m) for f in models.MORE_FAMILIES for m in models.MORE_MIXES]
CASES += [("llama3", "BF16"), ("phi3", "BF16")]  # bfloat16 values, stored as bfloat16
# The weights' bytes on disk over the GGUF's tensor bytes, at most, as measured: 5- and 6-bit codes
# as bit planes and fp16 scales as fp16, rebuilt when the session loads (exporters/_store.py); K-quant
# scales (d * sc) and minimums float32 (exact: fp16 would round them); F16 weights as fp16, BF16
# ones as bfloat16, and a tied float LM head over its embedding's table. The rotary tables (positions x rotary dims, float32: 33
# MB for Llama 3's 131k positions, most of a tiny model, a few percent of a real one) are left out:
# the GGUF has none.
SIZE = {
    "F16": 1.01,
    "BF16": 1.01,
    "Q8_0": 1.01,
    "Q6_K": 1.23,
    "Q5_K_M": 1.26,
    "Q4_K_M": 1.28,
    "Q4_0": 1.23,
}
# The other types cost more: Q2_K and Q3_K take 4-bit codes in blocks of 16 with float32 scales
# (and Q2_K's minimums), IQ4_NL and IQ4_XS 8-bit codes (a 16-value table); Llama's 32k vocabulary
# makes them most of its file, Qwen2's Q6_K embedding most of its.
SIZE |= {"Q3_K_M": 1.42, "Q2_K": 1.78, "IQ4_XS": 1.61, "IQ4_NL": 1.52, "Q4_1": 1.22, "Q5_1": 1.22}
ROWS = 4096


def _export(path: Path, mix: str):
    return export_cached(path, path.with_name(f"onnx-{mix}"), verify_tokens=0)


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{m}" for f, m in CASES])
def made(request, llama_cpp):
    """(family, mix, the file llama.cpp's tools made, our default export of it)."""
    family, mix = request.param
    path = models.gguf(family, mix, llama_cpp)
    return family, mix, path, _export(path, mix)


def test_every_tensor_dequantizes_as_gguf(made):
    """Every matrix (of an embedding, its first ROWS rows: rows are independent blocks)."""
    _, mix, path, _ = made
    types = set()
    for t in FastGGUFReader(str(path)).tensors:
        if len(t.shape) != 2 or t.tensor_type.name in ("F32",):
            continue
        types.add(t.tensor_type.name)
        data = np.asarray(t.data)[:ROWS]
        w = from_gguf(data, t.tensor_type.name, int(t.shape[0]), name=t.name)
        ours = w.dequantize() if isinstance(w, QuantizedWeight) else w
        reference = gguf.quants.dequantize(data, t.tensor_type).reshape(ours.shape)
        assert np.array_equal(ours, reference.astype(np.float32)), t.name
    assert types
    if mix in models.MORE_MIXES:  # the type the mix stands for is among them
        assert models.MORE_MIXES[mix] in types, (mix, types)


@pytest.mark.parametrize(("mix", "half"), [("F16", np.float16), ("BF16", ml_dtypes.bfloat16)])
@pytest.mark.parametrize("family", ["llama3", "phi3"])
def test_a_half_files_matrices_are_read_as_the_file_holds_them(family, mix, half, llama_cpp):
    """fp16 or bfloat16, not float32 copies (half an export's memory); Phi-3's fused tensors split
    apart and Llama's Q/K rows put back keep the file's type. Norms are float32."""
    path = models.gguf(family, mix, llama_cpp)
    _, weights = read_gguf(path, inspect_gguf(path).metadata, quantized=True)
    read = {(np.ndim(w), np.asarray(w).dtype) for w in weights.values()}
    assert read == {(1, np.dtype(np.float32)), (2, np.dtype(half))}, read


def _weight_bytes(model: Path) -> int:
    """The bytes of `model`'s initializers on disk (external data or inline), rotary tables aside."""
    proto = onnx.load(str(model), load_external_data=False)
    return sum(
        next((int(e.value) for e in t.external_data if e.key == "length"), len(t.raw_data))
        for t in proto.graph.initializer
        if not t.name.startswith("rotary")
    )


def test_the_export_keeps_the_files_blocks(made):
    _, mix, path, result = made
    manifest = result.manifest
    assert (manifest["layout"], manifest["precision"]) == ("gqa", "gguf")
    theirs = sum(t.n_bytes for t in FastGGUFReader(str(path)).tensors)
    ours = _weight_bytes(Path(result.output) / "model.onnx")
    assert ours <= SIZE[mix] * theirs, (ours / theirs, mix)


def test_the_export_decodes_as_llama_server(made, llama_cpp):
    _, _, path, result = made
    with LlamaServer(llama_cpp, path) as server:
        prompt = server.tokenize("The capital of France is")
        found = compare_with_llama_cpp(Path(result.output) / "model.onnx", server, prompt, 16)
    assert found["compared"] >= 12, found
    assert found["worst"] <= TOL, found
    assert found["flat"] <= FLAT_TOL, found  # Gemma 2's fixture has no likely token at any step
    assert found["agree"] == found["decisive"], found
    assert found["same"] >= found["close"], found


# Far from the start the rotary embedding's details show: Llama 3.1+'s files carry rope_freqs, which
# divide its low frequencies by up to 32. At position 20 that moves no logprob by 0.1; at 840, by 5.
FAR = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 60)


@pytest.mark.parametrize("family", models.FAMILIES)
def test_far_positions_decode_as_llama_server(family, llama_cpp):
    """Every token llama-server lists (its top 8, however unlikely: a tiny random model with
    Llama 3's 128k vocabulary has no likely one) after a prompt of some 840 tokens."""
    path = models.gguf(family, "Q8_0", llama_cpp)
    result = _export(path, "Q8_0")
    with LlamaServer(llama_cpp, path) as server:
        prompt = server.tokenize(FAR)
        assert len(prompt) > 800, len(prompt)
        found = compare_with_llama_cpp(
            Path(result.output) / "model.onnx", server, prompt, 3, likely=-np.inf
        )
    assert found["compared"] >= 2, found  # steps llama-server gave numbers for
    assert found["worst"] <= TOL, found
    assert found["agree"] == found["decisive"], found


def test_llama3_files_turn_as_their_hf_folder(llama_cpp):
    """The Llama 3 file's rope_freqs (what the converter made of the HF folder's llama3 scaling)
    give the folder's rotary frequencies: in the export, and in the verify step's reference, which
    transformers' GGUF loader makes without them. The optimum layout, which exports that loader's
    model, refuses the file."""
    from onnxsample.errors import ExportError
    from onnxsample.exporters._weights import read_hf
    from onnxsample.exporters.gguf import check_architecture, gguf_model

    path = models.gguf("llama3", "Q8_0", llama_cpp)
    info = inspect_gguf(path)
    spec, _ = read_gguf(path, info.metadata, quantized=True)
    hf_spec, _ = read_hf(models.hf_folder("llama3", llama_cpp))
    np.testing.assert_allclose(spec.inv_freq(), hf_spec.inv_freq(), rtol=1e-6)
    reference = gguf_model(path, info).model.rotary_emb.inv_freq.numpy()
    np.testing.assert_allclose(reference, spec.inv_freq(), rtol=1e-6)
    with pytest.raises(ExportError, match=r"leaves out its rope_freqs\.weight"):
        check_architecture(info, optimum=True, what=path.name)


@pytest.mark.parametrize("family", models.FAMILIES)
def test_the_export_tokenizes_as_llama_cpp(family, llama_cpp):
    path = models.gguf(family, "Q4_K_M", llama_cpp)
    tokenizer = Tokenizer.from_folder(_export(path, "Q4_K_M").output)
    corpus = [*hard_corpus(tokenizer), models.CHAT[family]]
    with LlamaServer(llama_cpp, path) as server:
        wrong = [
            (text, bos, want, got)
            for text in corpus
            for bos in (True, False)
            if (got := tokenizer.encode(text, add_special_tokens=bos))
            != (want := server.tokenize(text, bos=bos))
        ]
    assert not wrong, f"{len(wrong)} of {2 * len(corpus)} differ, first: {wrong[0]}"


@pytest.mark.parametrize("family", ["gemma3", "llama3", "qwen2"])
def test_the_servers_tokenize_answers_as_llama_servers(family, llama_cpp):
    """`/tokenize` with llama-server's fields (``content``, ``add_special``, ``parse_special``,
    ``with_pieces``) gives llama-server's JSON on the same file: BOS only when asked, special
    tokens' text read as text with ``parse_special: false``, and each piece as text or, where a
    byte-fallback piece is part of a character (Gemma's emoji), as its bytes; `/detokenize` of
    those ids gives llama-server's text, special tokens' text included."""
    path = models.gguf(family, "Q8_0", llama_cpp)
    folder = _export(path, "Q8_0").output
    texts = [*HARD[:30], models.CHAT[family]]
    bodies = [
        {"content": t, **extra}
        for t in texts
        for extra in (
            {},
            {"add_special": True},
            {"add_special": False, "with_pieces": True},
            {"add_special": True, "parse_special": False},
        )
    ]
    with LlamaServer(llama_cpp, path) as theirs, served(folder, "--threads", "1") as ours:
        wrong = [
            (body, want, got)
            for body in bodies
            if (want := theirs.post("/tokenize", body)["tokens"])
            != (got := post(ours.port, "/tokenize", json.dumps(body).encode())[1]["tokens"])
        ]
        assert not wrong, f"{len(wrong)} of {len(bodies)} differ, first: {wrong[0]}"
        ids = [theirs.tokenize(text) for text in texts]
        unlike = [
            (want, got)
            for i in ids
            if (want := theirs.post("/detokenize", {"tokens": i})["content"])
            != (
                got := post(ours.port, "/detokenize", json.dumps({"tokens": i}).encode())[1][
                    "content"
                ]
            )
        ]
    assert not unlike, f"{len(unlike)} of {len(ids)} differ, first: {unlike[0]}"


_JSON_KINDS = (bool, int, float, str, list, dict, type(None))


def _same_kinds(ours, theirs, where: str = "") -> list[str]:
    """Where `ours` has a key `theirs` lacks, or a value of another JSON type."""
    kind = [next(k for k in _JSON_KINDS if isinstance(v, k)) for v in (ours, theirs)]
    if kind[0] is not kind[1]:
        return [f"{where}: {ours!r} where llama-server has {theirs!r}"]
    if kind[0] is not dict:
        return []
    problems = []
    for key, value in ours.items():
        if key not in theirs:
            problems.append(f"{where}.{key}: not llama-server's")
        else:
            problems += _same_kinds(value, theirs[key], f"{where}.{key}")
    return problems


def test_props_answer_as_llama_servers(llama_cpp):
    """`/props`, which llama.cpp's web UI reads when it opens: only llama-server's keys, each
    with a value of the same JSON type, and on the same file the same chat template, BOS, EOS,
    context and modalities."""
    path = models.gguf("qwen2", "Q8_0", llama_cpp)
    with served(_export(path, "Q8_0").output, "--threads", "1") as ours:
        code, raw = get(ours.port, "/props")
    assert code == 200, raw
    mine = json.loads(raw)
    n_ctx = mine["default_generation_settings"]["n_ctx"]
    with LlamaServer(llama_cpp, path, ctx=n_ctx, args=("--jinja",)) as theirs:
        want = theirs.get("/props")
    assert _same_kinds(mine, want) == []
    for key in ("chat_template", "bos_token", "eos_token", "modalities"):
        assert mine[key] == want[key], key
    assert want["default_generation_settings"]["n_ctx"] == n_ctx


def _events(url: str, body: dict) -> list[dict]:
    """A streamed /completion's events from the server at `url`."""
    import http.client
    from urllib.parse import urlsplit

    conn = http.client.HTTPConnection(urlsplit(url).hostname, urlsplit(url).port, timeout=300)
    try:
        conn.request("POST", "/completion", json.dumps({**body, "stream": True}).encode(),
                     {"Content-Type": "application/json"})  # fmt: skip
        lines = conn.getresponse().read().decode().split("\n\n")
    finally:
        conn.close()
    return [json.loads(line.removeprefix("data: ")) for line in lines if line]


def test_completion_answers_as_llama_servers(llama_cpp):
    """`POST /completion`, llama-server's own endpoint, on the same file and request: only
    llama-server's keys, each with a value of its JSON type, whole and streamed (no ``[DONE]``
    on either; with ``timings_per_token``, the timings on every event, and with
    ``return_progress`` the prompt's progress first); the same prompt, ``stop_type`` and counts; the same greedy tokens until llama.cpp's
    top two come within 2 * TOL of each other, and its likely tokens' logprobs within TOL there."""
    path = models.gguf("qwen2", "Q8_0", llama_cpp)
    body = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0,
            "ignore_eos": True, "return_tokens": True, "n_probs": 3}  # fmt: skip
    folder = _export(path, "Q8_0").output
    eos = Tokenizer.from_folder(folder).eos_token_id  # biased: the answer ends at once
    ending = {**body, "logit_bias": [[eos, 100]], "ignore_eos": False, "n_probs": 0}
    timed = {**body, "timings_per_token": True, "return_progress": True}
    with served(folder, "--threads", "1") as ours:
        code, mine = post(ours.port, "/completion", json.dumps(body).encode())
        my_events = _events(f"http://127.0.0.1:{ours.port}", body)
        my_end = post(ours.port, "/completion", json.dumps(ending).encode())[1]
        my_end_events = _events(f"http://127.0.0.1:{ours.port}", ending)
        my_timed = _events(f"http://127.0.0.1:{ours.port}", timed)
    assert code == 200, mine
    with LlamaServer(llama_cpp, path) as server:
        theirs = server.post("/completion", body)
        their_events = _events(server.url, body)
        their_end = server.post("/completion", ending)
        their_end_events = _events(server.url, ending)
        their_timed = _events(server.url, timed)
    keys = ("content", "tokens", "tokens_predicted", "stop_type")
    assert [my_end[k] for k in keys] == [their_end[k] for k in keys] == ["", [eos], 1, "eos"]
    pieces = [
        [(e["tokens"], e["content"], e["stop"]) for e in ev]
        for ev in (my_end_events, their_end_events)
    ]
    assert pieces[0] == pieces[1], pieces
    assert _same_kinds(mine, theirs) == []
    for key in ("prompt", "stop_type", "tokens_evaluated", "tokens_predicted", "stop"):
        assert mine[key] == theirs[key], key
    same = same_answer_until_a_near_tie(mine, theirs, 12)
    assert [e["stop"] for e in their_events][-1] and [e["stop"] for e in my_events][-1]
    for mine_event in my_events:
        assert _same_kinds(mine_event, their_events[0 if not mine_event["stop"] else -1]) == []
    streamed = [
        [(e["tokens"], e["content"]) for e in ev[:-1]][:same] for ev in (my_events, their_events)
    ]
    assert streamed[0] == streamed[1]  # an event a token, with the text it lets out
    # timings_per_token: every event has llama-server's timings, counting the tokens so far;
    # return_progress: events without a token first (llama-server lists token 0 in them, we
    # list none), from the cached part of the prompt to all of it
    before, tokens = [], []
    for events in (my_timed, their_timed):
        first = next(i for i, e in enumerate(events) if "prompt_progress" not in e)
        before.append(events[:first])
        tokens.append(events[first:])
        counts = [e["timings"]["predicted_n"] for e in tokens[-1][:-1]]
        assert counts and counts == [e["tokens_predicted"] for e in tokens[-1][:-1]], events
    for mine, theirs in (before, tokens):
        for mine_event in mine:
            their_event = theirs[0 if not mine_event["stop"] else -1]
            assert _same_kinds(mine_event, their_event) == []
            assert mine_event["timings"].keys() == their_event["timings"].keys()
    progress = [[e["prompt_progress"] for e in events] for events in before]
    for mine, theirs in zip(*progress, strict=False):
        assert mine.keys() == theirs.keys() and mine["total"] == theirs["total"]
    assert [p[-1]["processed"] for p in progress] == [p[-1]["total"] for p in progress]


CHATS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple."},
     {"role": "user", "content": "Another?"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Bonjour"}, {"role": "user", "content": "Thanks"}],
]  # fmt: skip


@pytest.mark.parametrize("family", ["phi3", "qwen2", "qwen3"])  # the files with a chat template
def test_chats_are_the_prompts_llama_server_makes_of_them(family, llama_cpp):
    """llama-server --jinja renders the file's template and tokenises the text with the BOS its
    vocabulary adds: the same ids as ours, system messages included (Phi-3's template writes
    none, so both put the system's text at the start of the user's turn)."""
    path = models.gguf(family, "Q8_0", llama_cpp)
    tokenizer = Tokenizer.from_folder(_export(path, "Q8_0").output)
    assert tokenizer.chat_template
    with LlamaServer(llama_cpp, path, args=("--jinja",)) as server:
        for chat in CHATS:
            text = server.post("/apply-template", {"messages": chat})["prompt"]
            assert tokenizer.apply_chat_template(chat) == server.tokenize(text), (chat, text)
            assert chat[0]["role"] != "system" or chat[0]["content"] in text


# Qwen3's switch: enable_thinking false writes an empty thought after the generation prompt.
THINKING = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)


def test_template_variables_render_as_llama_server_renders_them(llama_cpp, tmp_path):
    """A request's ``chat_template_kwargs`` (here Qwen3's ``enable_thinking``) with a template
    given in place of the file's (`--chat-template-file`, ours `--chat-template`): the same ids.
    Given no value, llama-server passes its own (false unless it knows the template for a
    reasoning one) where transformers and vLLM leave it undefined, so only given values compare."""
    path = models.gguf("qwen3", "Q8_0", llama_cpp)
    (tmp_path / "thinking.jinja").write_text(THINKING)
    tokenizer = Tokenizer.from_folder(_export(path, "Q8_0").output).with_chat_template(THINKING)
    args = ("--jinja", "--chat-template-file", str(tmp_path / "thinking.jinja"))
    with LlamaServer(llama_cpp, path, args=args) as server:
        for variables in ({"enable_thinking": False}, {"enable_thinking": True}):
            body = {"messages": CHATS[1], "chat_template_kwargs": variables}
            text = server.post("/apply-template", body)["prompt"]
            ours = tokenizer.apply_chat_template(CHATS[1], variables=variables)
            assert ours == server.tokenize(text), (variables, text)
            assert ("<think>" in text) == (variables["enable_thinking"] is False)


# OpenAI's reasoning_effort, as llama-server passes it: the variable, or "none" as enable_thinking.
EFFORT = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if reasoning_effort is defined %}{{ 'effort: ' + reasoning_effort + '\\n' }}{% endif %}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)


def test_reasoning_effort_reaches_the_template_as_in_llama_server(llama_cpp, tmp_path):
    """A chat's ``reasoning_effort`` through `/tokenize` (the chat route's prompt): the ids of
    llama-server's rendering of the same request with the same template."""
    path = models.gguf("qwen3", "Q8_0", llama_cpp)
    template = tmp_path / "effort.jinja"
    template.write_text(EFFORT)
    folder = _export(path, "Q8_0").output
    args = ("--jinja", "--chat-template-file", str(template))
    with (
        LlamaServer(llama_cpp, path, args=args) as theirs,
        served(folder, "--threads", "1", "--chat-template", str(template)) as ours,
    ):
        # llama-server gives enable_thinking a value of its own where none is given: pinned
        for effort, thinking, shown in (("high", True, "effort: high"), ("none", None, "<think>")):
            body = {"messages": CHATS[1], "reasoning_effort": effort}
            if thinking is not None:
                body["chat_template_kwargs"] = {"enable_thinking": thinking}
            text = theirs.post("/apply-template", body)["prompt"]
            got = post(ours.port, "/tokenize", json.dumps(body).encode())[1]["tokens"]
            assert got == theirs.tokenize(text), (effort, text)
            assert shown in text


# Llama 3's way: the template writes the BOS that the vocabulary also adds when it tokenises.
BOS_FIRST = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>"
    "\\n\\n' + m.content + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@pytest.mark.parametrize(
    ("family", "template"), [("phi3", None), ("qwen3", None), ("llama3", BOS_FIRST)]
)
def test_apply_template_answers_as_llama_server(family, template, llama_cpp, tmp_path):
    """`/apply-template` on the same file (or template): llama-server's text, the BOS a template
    writes left out where the vocabulary adds one (Llama 3's); the chat route's ids are that
    text tokenised as llama-server tokenises a prompt."""
    path = models.gguf(family, "Q8_0", llama_cpp)
    theirs_args, ours_args = ("--jinja",), ()
    if template is not None:
        (tmp_path / "chat.jinja").write_text(template)
        theirs_args += ("--chat-template-file", str(tmp_path / "chat.jinja"))
        ours_args = ("--chat-template", str(tmp_path / "chat.jinja"))
    bodies = [{"messages": chat} for chat in CHATS]
    bodies.append({"messages": CHATS[1], "chat_template_kwargs": {"enable_thinking": False}})
    bodies.append({"messages": CHATS[1], "add_generation_prompt": False})
    parts = [{"type": "text", "text": "Name a fruit."}, {"type": "text", "text": "Be brief."}]
    bodies.append({"messages": [{"role": "user", "content": parts}]})  # joined by a newline
    folder = _export(path, "Q8_0").output
    with (
        LlamaServer(llama_cpp, path, args=theirs_args) as theirs,
        served(folder, "--threads", "1", *ours_args) as ours,
    ):
        for body in bodies:
            text = theirs.post("/apply-template", body)["prompt"]
            raw = json.dumps(body).encode()
            assert post(ours.port, "/apply-template", raw) == (200, {"prompt": text}), body
            assert post(ours.port, "/tokenize", raw)[1]["tokens"] == theirs.tokenize(text), body
    assert template != BOS_FIRST or not text.startswith("<|begin_of_text|>"), text


@pytest.mark.parametrize("family", ["llama3", "qwen2", "gemma3", "phi3"])
def test_an_export_holds_a_layers_blocks_at_a_time(family, llama_cpp, tmp_path, monkeypatch):
    """A linear weight is read from the file when the graph takes it, and what the graph stores
    goes to the external data file at once (exporters/_gqa_graph.py's ExternalData): the export
    never holds every tensor's blocks, only the embedding's and one layer's (the live
    QuantizedWeight objects, counted at each stored initializer); Phi-3's fused tensors are
    read and split apart when the graph takes the first of their parts."""
    path = models.gguf(family, "Q4_K_M", llama_cpp)
    matrices = sum(len(t.shape) == 2 for t in FastGGUFReader(str(path)).tensors)
    live, store = [], ExternalData.tensor

    def counted(self, array, name):
        live.append(sum(isinstance(o, QuantizedWeight) for o in gc.get_objects()))
        return store(self, array, name)

    monkeypatch.setattr(ExternalData, "tensor", counted)
    export(path, tmp_path / "out", verify_tokens=0)
    assert matrices > 6 and live and max(live) <= 6, (matrices, live)  # can fail
    assert sorted(p.name for p in (tmp_path / "out").glob("model.*")) == [
        "model.onnx",
        "model.onnx.data",
    ]


def test_weights_written_as_made_save_as_weights_held_in_memory(llama_cpp, tmp_path):
    """The same bytes, model and external data, whether the weights went to the data file as the
    graph made them (write_gqa) or were held in memory until ir.save wrote them."""
    path = models.gguf("llama3", "Q4_K_M", llama_cpp)
    metadata = inspect_gguf(path).metadata
    held, written = tmp_path / "held", tmp_path / "written"
    held.mkdir()
    spec, weights = read_gguf(path, metadata, quantized=True)
    ir.save(build_gqa_model(spec, weights), held / "model.onnx", external_data="model.onnx.data")
    spec, weights = read_gguf(path, metadata, quantized=True)
    write_gqa(spec, weights, written / "model.onnx")
    for name in ("model.onnx", "model.onnx.data"):
        assert (held / name).read_bytes() == (written / name).read_bytes(), name
    assert sorted(p.name for p in written.iterdir()) == ["model.onnx", "model.onnx.data"]
