"""The serving engine on the tiny model, in both KV layouts, at the edges of what a request may ask:
bad requests refused at submit, stop strings, a tiny temperature, min_tokens, a greedy-only graph,
the end of the cache and of the context; and its faults and shutdown: a failed KV allocation, closing
with and without cancel."""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pytest
from _engine_cases import GREEDY, LONG, PROMPTS, alone, seeded

from onnxsample.composer import compose
from onnxsample.engine import Engine
from onnxsample.errors import (
    EngineClosed,
    GenerationError,
    InvalidParameter,
    ModelError,
    OutOfMemory,
)
from onnxsample.params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"params": SamplingParams(seed=-1)}, "seed must be an integer in [0, 2**64), got -1"),
        ({"params": SamplingParams(seed=1.5)}, "seed must be an integer"),
        ({"params": SamplingParams(top_p=1.5)}, "top_p must be in (0, 1], got 1.5"),
        ({"params": SamplingParams(top_logprobs=5)}, "top_logprobs"),
        ({"params": SamplingParams(prompt_logprobs=4)}, "prompt_logprobs=4 is more than"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1, got 0"),
        (
            {"params": SamplingParams(min_tokens=5), "max_new_tokens": 2},
            "min_tokens must be at most the new tokens asked for (2), got 5",
        ),
        ({"prompt": "word " * 700}, "does not fit the model's context of 512 tokens"),
        ({"prompt": [1, 2, 10**9]}, "token ids must be integers in [0, 49152)"),
        ({"prompt": []}, "the prompt is empty"),
        ({"prompt": ""}, "the prompt is empty"),
        ({"prompt": [{"role": "user"}]}, "'content'"),
        ({"prompt": 3.5}, "a prompt is a string"),
        ({"stop": ["a", 3]}, "stop must be a string or a list of strings"),
        ({"stop": 5}, "stop must be a string or a list of strings, got 5"),
        ({"system": 5}, "system must be a string, got int"),
        ({"chat": "no"}, "chat must be a bool or None, got 'no'"),
        ({"index": "a"}, "index must be an integer >= 0, got 'a'"),
        ({"index": -1}, "index must be an integer >= 0, got -1"),
        ({"prompt": [1, 2, 3], "system": "Be brief."}, "token ids are the prompt as it is"),
        ({"prompt": [1, 2, 3], "chat": True}, "token ids are the prompt as it is"),
        (
            {"prompt": [{"role": "system", "content": "A"}, {"role": "user", "content": "B"}],
             "system": "C"},
            "the messages hold a system message already",
        ),
        ({"prompt": [{"role": "user", "content": [{"type": "image_url"}]}]}, "list of text parts"),
    ],
)  # fmt: skip
def test_bad_requests_fail_at_submit(engine, kwargs, message):
    kwargs = dict(kwargs)  # the table is shared by both layouts
    prompt = kwargs.pop("prompt", PROMPTS[0])
    params = kwargs.pop("params", GREEDY)
    chat = kwargs.pop("chat", False)
    before = engine.stats()
    with pytest.raises(InvalidParameter) as info:
        engine.submit(prompt, params, chat=chat, **kwargs)
    assert message in str(info.value)
    assert engine.stats() == before


def test_a_messages_text_parts_are_its_text_joined_by_newlines(engine):
    """OpenAI's content parts, as vLLM's LLM.chat takes them: the text parts joined by a newline,
    as the server and its peers join them."""
    parts = [{"type": "text", "text": "Name a fruit."}, {"type": "text", "text": "Be brief."}]
    joined = engine.submit([{"role": "user", "content": "Name a fruit.\nBe brief."}], GREEDY,
                           max_new_tokens=2)  # fmt: skip
    split = engine.submit([{"role": "user", "content": parts}], GREEDY, max_new_tokens=2)
    want = joined.result(timeout=60)
    assert split.result(timeout=60).prompt_token_ids == want.prompt_token_ids


@pytest.mark.parametrize(
    ("model", "options", "error", "message"),
    [
        (None, {}, InvalidParameter, "model must be the path of a composed .onnx file"),
        ("{folder}", {}, ModelError, "is a folder: give its composed model"),
        ("{gguf}", {}, ModelError, "is a GGUF file: run what onnxsample.prepare("),
        ("{path}", {"max_len": 10**6}, InvalidParameter,
         "max_len must be at most the model's context (512 positions), got 1000000"),
    ],
)  # fmt: skip
def test_an_engine_refuses_what_it_cannot_open(
    models, layout, model, options, error, message, tmp_path
):
    path, folder = models[layout, 4]
    gguf = tmp_path / "model.gguf"  # a GGUF's magic and version: ONNX Runtime's parse error else
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    given = {"{folder}": str(folder), "{path}": str(path), "{gguf}": str(gguf)}.get(model, model)
    with pytest.raises(error) as info:
        Engine(given, tokenizer=folder, threads=1, **options)
    assert message in str(info.value)


def test_a_prefill_chunk_of_0_is_whole_prompts_as_on_the_command_line(fresh):
    assert fresh(prefill_chunk=0).prefill_chunk is None


def test_a_plain_stop_string_is_one_stop_string(engine):
    full = alone(engine, PROMPTS[0], GREEDY, 24)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert len(stop) == 3
    done = alone(engine, PROMPTS[0], GREEDY, 24, stop=stop)
    assert done.finish_reason == "stop" and done.text == full.text[: full.text.index(stop)]


def test_an_empty_stop_string_is_refused(engine):
    """As vLLM refuses it (it was dropped without a word)."""
    for stop in ("", ["x", ""]):
        with pytest.raises(InvalidParameter, match="stop must not contain an empty string"):
            engine.submit(PROMPTS[0], GREEDY, max_new_tokens=4, stop=stop)


@pytest.mark.parametrize("seed", [np.uint64(2**64 - 1), np.int64(7), np.int32(7)])
def test_a_numpy_seed_is_a_seed(engine, seed):
    """A numpy integer passes validate(), so it is taken as its value (its modulo overflowed)."""
    params = SamplingParams(temperature=0.9, seed=seed)
    done = alone(engine, PROMPTS[0], params, 6)
    assert done.seed == int(seed)
    assert (
        done.token_ids
        == alone(engine, PROMPTS[0], SamplingParams(temperature=0.9, seed=int(seed)), 6).token_ids
    )


@pytest.mark.parametrize("temperature", [1e-30, 1e-7, 9e-6])
def test_a_tiny_temperature_is_greedy(engine, temperature):
    greedy = alone(engine, PROMPTS[3], GREEDY, 16)
    tiny = alone(engine, PROMPTS[3], SamplingParams(temperature=temperature, seed=1), 16)
    assert tiny.token_ids == greedy.token_ids


def test_a_greedy_only_graph_runs(models, layout, tmp_path):
    _, folder = models[layout, 4]
    path = compose(folder, "", tmp_path / "greedy.onnx", max_slots=2)
    with Engine(path, tokenizer=folder, threads=1) as engine:
        a = engine.submit(PROMPTS[0], GREEDY, max_new_tokens=8, chat=False)
        b = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=8, chat=False)
        assert a.result(timeout=60).token_ids and b.result(timeout=60).token_ids
        with pytest.raises(InvalidParameter, match="needs the dist sampler"):
            engine.submit(PROMPTS[0], SamplingParams(temperature=0.5), chat=False)


def test_generation_ends_with_length_at_the_end_of_the_cache(fresh, engine):
    short = fresh(max_len=24)
    done = short.submit(PROMPTS[2], GREEDY, max_new_tokens=100, chat=False).result(timeout=60)
    full = alone(engine, PROMPTS[2], GREEDY, 40)
    room = 24 - len(done.prompt_token_ids)
    assert done.token_ids == full.token_ids[:room]
    if len(full.token_ids) >= room:
        assert done.finish_reason == "length" and len(done.token_ids) == room
    with pytest.raises(
        InvalidParameter, match=r"does not fit max_len=24 \(it must be at most 23\)"
    ):
        short.submit(LONG, GREEDY, chat=False)


def test_a_failed_kv_allocation_fails_that_request_only(models, tmp_path):
    """A request whose cache cannot be allocated fails with OutOfMemory; the others go on."""
    path, folder = models["gqa", 4]
    huge = tmp_path / "huge-context"
    shutil.copytree(folder, huge, ignore=shutil.ignore_patterns("*.onnx", "*.data"))
    manifest = json.loads((huge / "onnxsample.json").read_text())
    manifest["model"]["max_position_embeddings"] = 2**40  # a context no machine can hold
    (huge / "onnxsample.json").write_text(json.dumps(manifest))
    with Engine(path, tokenizer=huge, threads=1) as engine:
        running = engine.submit(PROMPTS[0], seeded(1), max_new_tokens=30, chat=False)
        next(iter(running))
        greedy = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=2**39, chat=False)
        with pytest.raises(OutOfMemory, match="cannot allocate the KV cache"):
            greedy.result(timeout=60)
        assert running.result(timeout=60).token_ids
        after = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=5, chat=False)
        assert after.result(timeout=60).token_ids


def test_a_fault_while_admitting_fails_that_request_and_the_engine_goes_on(fresh, monkeypatch):
    """A bug between a request's leaving the queue and its first call (here the sampler state's
    assign) fails that request with the reason, and no other: one that runs meanwhile goes on.
    (It used to be in no list, and never answered.)"""
    engine = fresh(slots=2)
    alone = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=40, chat=False).result(timeout=60)
    state_class, faults = type(engine._scheduler.state), []
    assign = state_class.assign

    def faulty(self, *args, **kwargs):
        if faults == ["armed"]:
            faults.append("raised")
            raise IndexError("index 32000 is out of bounds")
        return assign(self, *args, **kwargs)

    monkeypatch.setattr(state_class, "assign", faulty)
    running = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=40, chat=False)
    next(iter(running))
    faults.append("armed")
    with pytest.raises(GenerationError, match="internal error: index 32000 is out of bounds"):
        engine.submit(PROMPTS[0], GREEDY, max_new_tokens=3, chat=False).result(timeout=60)
    assert running.result(timeout=60).token_ids == alone.token_ids
    assert engine.submit(PROMPTS[1], GREEDY, max_new_tokens=3, chat=False).result(timeout=60)


def test_a_tokenizer_with_tokens_past_the_models_vocabulary_is_refused(models, tmp_path):
    """A prompt that the tokenizer turns into an id the model does not have is refused at submit,
    naming the token (a tokenizer with an added token that is not the model's)."""
    from tokenizers import AddedToken, Tokenizer

    path, folder = models["gqa", 2]
    wider = tmp_path / "wider-tokenizer"
    shutil.copytree(folder, wider, ignore=shutil.ignore_patterns("*.onnx", "*.data"))
    tok = Tokenizer.from_file(str(wider / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    while tok.get_vocab_size() <= vocab:  # past the model's vocabulary (the tokenizer's own)
        tok.add_special_tokens([AddedToken(f"<|extra{tok.get_vocab_size()}|>", special=True)])
    tok.save(str(wider / "tokenizer.json"))
    extra = tok.id_to_token(tok.get_vocab_size() - 1)
    with Engine(path, tokenizer=wider, threads=1) as engine:
        with pytest.raises(InvalidParameter, match=r"past the model's vocabulary of \d+: this "):
            engine.submit(f"Hello {extra}", GREEDY, max_new_tokens=2, chat=False)
        assert engine.submit("Hello", GREEDY, max_new_tokens=2, chat=False).result(timeout=60)


def test_a_closed_engine_refuses_requests(models, layout):
    path, folder = models[layout, 2]
    engine = Engine(path, tokenizer=folder, threads=1)
    request = engine.submit(PROMPTS[0], GREEDY, max_new_tokens=5, chat=False)
    engine.close()  # drains: the running request finishes
    assert request.result(timeout=0).token_ids
    with pytest.raises(EngineClosed):
        engine.submit(PROMPTS[0], GREEDY, chat=False)
    engine.close()  # idempotent


def test_close_with_cancel_stops_running_requests(models, layout):
    path, folder = models[layout, 2]
    engine = Engine(path, tokenizer=folder, threads=1)
    long = SamplingParams(temperature=0.7, seed=2, ignore_eos=True)
    requests = [engine.submit(p, long, max_new_tokens=400, chat=False) for p in PROMPTS]
    next(iter(requests[0]))
    engine.close(cancel=True, timeout=60)
    assert {r.result(timeout=0).finish_reason for r in requests} == {"cancelled"}


def test_min_tokens_holds_end_of_sequence_back(engine):
    """A bias that forces EOS at once: with min_tokens=5 the first five tokens are something else."""
    eos = min(engine.eos_ids)
    forced = SamplingParams(temperature=0, logit_bias={eos: 100.0})
    assert alone(engine, PROMPTS[0], forced, 20).token_ids == []
    held = SamplingParams(temperature=0, logit_bias={eos: 100.0}, min_tokens=5)
    done = alone(engine, PROMPTS[0], held, 20)
    assert len(done.token_ids) == 5 and done.finish_reason == "eos"
    assert eos not in done.token_ids


def test_min_tokens_needs_room_in_the_bias_table(engine):
    full = {i: 1.0 for i in range(10, 12)}  # the graph holds 2 entries
    with pytest.raises(InvalidParameter, match="min_tokens needs 3 logit-bias entries"):
        engine.submit(PROMPTS[0], SamplingParams(logit_bias=full, min_tokens=2), chat=False)


def test_without_a_token_limit_generation_runs_to_the_end_of_the_context(fresh):
    short = fresh(max_len=60)
    p = SamplingParams(temperature=0.8, seed=4, ignore_eos=True)
    done = short.submit(PROMPTS[1], p, max_new_tokens=None, chat=False).result(timeout=120)
    assert done.finish_reason == "length"
    assert len(done.prompt_token_ids) + len(done.token_ids) == 60


def _copy_without(folder, tmp_path, missing: str):
    out = tmp_path / "folder"
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns(missing, "*.onnx", "*.data"))
    return out


@pytest.mark.parametrize(
    ("model", "tokenizer", "message"),
    [
        ("missing", "folder", "no such composed model"),
        ("plain", "no tokenizer", "is not a composed model"),  # the model's error comes first
        ("composed", "no tokenizer", r"no tokenizer\.json"),
        ("composed", "missing", "no such tokenizer folder"),
        ("composed", "bad tokenizer", "cannot read"),
    ],
)
def test_a_bad_model_or_tokenizer_folder_is_a_typed_error(
    models, tiny_export, tmp_path, model, tokenizer, message
):
    """The session is made while the tokenizer is read (onnxsample.engine._loaded): each error
    still reaches the caller, the model's before the folder's, and nothing is left running."""
    path, folder = models["concat", 4]
    paths = {"missing": tmp_path / "none.onnx", "plain": tiny_export.output / "model.onnx"}
    if tokenizer == "folder":
        where = folder
    elif tokenizer == "missing":
        where = tmp_path / "nowhere"
    else:
        where = _copy_without(folder, tmp_path, "tokenizer.json")
        if tokenizer == "bad tokenizer":
            (where / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError, match=message):
        Engine(paths.get(model, path), tokenizer=where, threads=1)
    assert not any(t.name == "onnxsample-session" for t in threading.enumerate())


def test_the_tokenizer_is_read_while_the_session_initialises(models, monkeypatch):
    """ONNX Runtime initialises a session without the GIL, which the tokenizer holds while it
    reads its file: the engine reads it then, after the model is read and before the session is
    made (a second less for a 262k vocabulary), not after."""
    from onnxsample.engine import _loaded

    events = []
    read, create = _loaded.ModelInfo.read, _loaded.create_session

    def reading(folder):
        events.append("tokenizer read")
        return read(folder)

    def creating(*args, **kwargs):
        made = create(*args, **kwargs)
        events.append("session made")
        return made

    monkeypatch.setattr(_loaded.ModelInfo, "read", staticmethod(reading))
    monkeypatch.setattr(_loaded, "create_session", creating)
    path, folder = models["gqa", 4]
    with Engine(path, tokenizer=folder, threads=1):
        pass
    assert events == ["tokenizer read", "session made"]


def test_a_chat_template_given_to_the_engine_renders_its_chats(models, tmp_path):
    """`Engine(chat_template=...)` in place of the folder's (a GGUF may carry none): requests'
    chats render with it; one that does not parse is refused before the model loads."""
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<answer>"
    path, folder = models["gqa", 4]
    with Engine(path, tokenizer=folder, threads=1, chat_template=template) as engine:
        chat = [{"role": "user", "content": "Hi there"}]
        want = engine.tokenizer.encode("<user>Hi there<answer>", add_special_tokens=False)
        assert engine.tokenizer.apply_chat_template(chat) == want
        done = engine.submit(chat, SamplingParams(temperature=0), max_new_tokens=1).result()
        assert done.prompt_token_ids == want
    with pytest.raises(InvalidParameter, match="chat template does not parse"):
        Engine(tmp_path / "none.onnx", tokenizer=folder, chat_template="{% for %}")
