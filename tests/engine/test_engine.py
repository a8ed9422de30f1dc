"""The serving engine on the tiny model, in both KV layouts: requests from many threads at any time,
chunked prefill, prefix reuse, prompt logprobs, cancel, the queue bound, and the faults.

Every equality below is exact: a request's tokens do not depend on what else runs, on how its prompt
was chunked, or on a reused prefix.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading

import numpy as np
import onnxruntime as ort
import pytest

from onnxsample.composer import compose
from onnxsample.engine import Engine
from onnxsample.engine.generator import Generator
from onnxsample.errors import EngineClosed, InvalidParameter, OutOfMemory, QueueFull
from onnxsample.params import SamplingParams

PROMPTS = [
    "Once upon a time",
    "The weather today is",
    "def fibonacci(n):",
    "Paris is the capital of",
]
LONG = " ".join(f"word{i}" for i in range(90))  # ~180 tokens: several chunks of 32
GREEDY = SamplingParams(temperature=0)
LAYOUTS = ["concat", "gqa"]


def _seeded(seed: int, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.9, top_k=50, seed=seed, **extra)


@pytest.fixture(scope="session")
def models(tiny_export, tiny_gqa_export, tmp_path_factory) -> dict:
    """Each layout composed with 4 slots, 3 top logprobs, prompt logprobs; and with 2 slots."""
    folder = tmp_path_factory.mktemp("engine")
    out = {}
    for layout, export in (("concat", tiny_export), ("gqa", tiny_gqa_export)):
        for slots in (4, 2):
            path = compose(
                export.output,
                None,
                folder / f"{layout}-{slots}.onnx",
                max_slots=slots,
                top_logprobs=3,
                max_bias=2,
                prompt_logprobs=True,
            )
            out[layout, slots] = (path, export.output)
    return out


@pytest.fixture(scope="module", params=LAYOUTS)
def layout(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine(models, layout):
    path, folder = models[layout, 4]
    with Engine(path, tokenizer=folder, threads=1, prefill_chunk=32) as e:
        yield e


@pytest.fixture(scope="module")
def fresh(models, layout):
    """Engines of this layout with other settings, closed at the end of the module."""
    made = []

    def make(slots: int = 4, **options) -> Engine:
        path, folder = models[layout, slots]
        e = Engine(path, tokenizer=folder, threads=1, **options)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close(cancel=True)


def _alone(engine: Engine, prompt, params, n=16, **kw):
    return engine.submit(prompt, params, max_new_tokens=n, chat=False, **kw).result(timeout=120)


def test_the_layout_is_what_the_graph_says(engine, layout):
    assert engine.kv_layout == layout and engine.max_slots == 4


def test_two_threads_get_what_each_gets_alone(engine):
    """Two threads stream at once; each gets exactly its tokens alone, with the same seed."""
    jobs = [(PROMPTS[i], _seeded(10 + i)) for i in range(4)] + [(LONG, _seeded(7))]
    alone = [_alone(engine, p, s, 24).token_ids for p, s in jobs]
    got: dict[int, list[int]] = {}

    def client(indices):
        for i in indices:
            events = list(engine.submit(jobs[i][0], jobs[i][1], max_new_tokens=24, chat=False))
            got[i] = events[-1].completion.token_ids

    threads = [threading.Thread(target=client, args=(ix,)) for ix in ([0, 2, 4], [1, 3])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [got[i] for i in range(5)] == alone


def test_a_paused_stream_is_not_disturbed_by_another_request(models, layout):
    """The bug of the closed-batch Generator: pause stream A, run generate(), resume A."""
    path, folder = models[layout, 4]
    with Generator(path, tokenizer=folder, threads=1) as gen:
        [expected] = gen.generate(PROMPTS[0], _seeded(5), max_new_tokens=20, chat=False)
        stream = gen.stream(PROMPTS[0], _seeded(5), max_new_tokens=20, chat=False)
        head = [next(stream) for _ in range(4)]
        [other] = gen.generate(PROMPTS[1], _seeded(6), max_new_tokens=20, chat=False)
        rest = list(stream)
    tokens = [e.token_id for e in head + rest if e.token_id is not None]
    assert tokens[: len(expected.token_ids)] == expected.token_ids
    assert rest[-1].completion.token_ids == expected.token_ids
    assert other.token_ids


def test_two_threads_on_one_generator(models, layout):
    """The batch API is as safe: two threads calling generate() on one Generator at once."""
    path, folder = models[layout, 4]
    with Generator(path, tokenizer=folder, threads=1) as gen:
        alone = {
            i: gen.generate(PROMPTS[i], _seeded(40 + i), max_new_tokens=16, chat=False)[0].token_ids
            for i in range(4)
        }
        got: dict[int, list[int]] = {}

        def client(indices):
            for i in indices:
                [done] = gen.generate(PROMPTS[i], _seeded(40 + i), max_new_tokens=16, chat=False)
                got[i] = done.token_ids

        threads = [threading.Thread(target=client, args=(ix,)) for ix in ([0, 1], [2, 3])]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert got == alone


def test_a_late_request_starts_while_an_early_one_decodes(engine):
    early = engine.submit(PROMPTS[0], _seeded(1, ignore_eos=True), max_new_tokens=120, chat=False)
    stream = iter(early)
    for _ in range(3):
        next(stream)
    late = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=2, chat=False)
    first = next(iter(late))
    assert first.token_id is not None
    assert not early.done, "the late request waited for the early one to finish"
    done = early.result(timeout=120)
    assert len(done.token_ids) == 120 and done.finish_reason == "length"
    assert late.result(timeout=60).timings.ttft_s < done.timings.decode_s


def test_cancel_frees_the_slot(fresh):
    engine = fresh(slots=2)
    long = SamplingParams(temperature=0.8, seed=3, ignore_eos=True)
    a = engine.submit(PROMPTS[0], long, max_new_tokens=400, chat=False)
    b = engine.submit(PROMPTS[1], long, max_new_tokens=400, chat=False)
    next(iter(a)), next(iter(b))
    waiting = engine.submit(PROMPTS[2], GREEDY, max_new_tokens=3, chat=False)
    a.cancel()
    done = a.result(timeout=60)
    assert done.finish_reason == "cancelled" and 0 < len(done.token_ids) < 400
    assert waiting.result(timeout=60).finish_reason in ("length", "eos")
    assert not b.done, "the freed slot went to the waiting request while b still decodes"
    b.cancel()
    assert b.result(timeout=60).finish_reason == "cancelled"
    assert engine.load()["slots_busy"] == 0


def test_queue_full_is_a_typed_error_at_once(fresh):
    engine = fresh(slots=2, max_queue=1)
    long = SamplingParams(temperature=0.8, seed=4, ignore_eos=True)
    running = [engine.submit(p, long, max_new_tokens=400, chat=False) for p in PROMPTS[:2]]
    queued = engine.submit(PROMPTS[2], long, max_new_tokens=400, chat=False)
    with pytest.raises(QueueFull, match="max_queue=1"):
        engine.submit(PROMPTS[3], GREEDY, max_new_tokens=2, chat=False)
    for r in [*running, queued]:
        r.cancel()
    assert [r.result(timeout=60).finish_reason for r in [*running, queued]] == ["cancelled"] * 3
    assert engine.submit(PROMPTS[3], GREEDY, max_new_tokens=2, chat=False).result(timeout=60)


def test_async_iteration_and_result(engine):
    expected = _alone(engine, PROMPTS[2], _seeded(9), 12)

    async def main():
        pieces = []
        request = engine.submit(PROMPTS[2], _seeded(9), max_new_tokens=12, chat=False)
        async for event in request:
            pieces.append(event)
        other = await engine.submit(PROMPTS[2], _seeded(9), max_new_tokens=12, chat=False).aresult()
        return pieces, other

    pieces, other = asyncio.run(main())
    assert pieces[-1].completion.token_ids == expected.token_ids == other.token_ids
    assert "".join(e.text for e in pieces) == expected.text


@pytest.mark.parametrize("chunk", [None, 7, 32, 64])
def test_chunked_prefill_gives_the_same_tokens_and_prompt_logprobs(fresh, layout, chunk):
    """GroupQueryAttention computes a chunk's keys and values bit for bit as a whole prompt's, so
    the generated tokens and their logprobs are identical; optimum's attention (MatMuls over
    [chunk, total]) agrees to float rounding. A prompt row's logits come from an LM-head MatMul
    over more or fewer rows, so prompt logprobs agree to float rounding in both."""
    reference = fresh(prefill_chunk=None, prefix_reuse=False)
    engine = fresh(prefill_chunk=chunk, prefix_reuse=False)
    params = _seeded(21, prompt_logprobs=2, logprobs=True)
    a = _alone(reference, LONG, params, 12)
    b = _alone(engine, LONG, params, 12)
    assert b.token_ids == a.token_ids
    assert [[t for t, _ in top] for top in b.prompt_top_logprobs[1:]] == [
        [t for t, _ in top] for top in a.prompt_top_logprobs[1:]
    ]
    if layout == "gqa":
        assert b.logprobs == a.logprobs
    else:
        np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(b.prompt_logprobs[1:], a.prompt_logprobs[1:], atol=1e-5)


def test_streams_keep_decoding_while_a_long_prompt_is_admitted(fresh):
    """With chunks of 16, a 180-token prompt takes several steps, and the running stream gets a
    token in each of them."""
    engine = fresh(prefill_chunk=16)
    running = engine.submit(PROMPTS[0], _seeded(2, ignore_eos=True), max_new_tokens=60, chat=False)
    stream = iter(running)
    next(stream)
    before = engine.stats()
    late = engine.submit(LONG, GREEDY, max_new_tokens=1, chat=False)
    late.result(timeout=120)
    after = engine.stats()
    calls = after.prefill_calls - before.prefill_calls
    assert calls >= len(late.result().prompt_token_ids) // 16
    assert after.decode_steps - before.decode_steps >= calls - 1
    running.cancel()


def test_prompt_logprobs_are_the_plain_models(engine, tiny_export):
    """Echo: each prompt token's logprob under the raw distribution, computed in the graph."""
    params = SamplingParams(temperature=0, prompt_logprobs=3)
    done = _alone(engine, LONG, params, 1)
    ids = done.prompt_token_ids
    session = ort.InferenceSession(str(tiny_export.model_path), providers=["CPUExecutionProvider"])
    feeds = {
        "input_ids": np.asarray([ids], np.int64),
        "attention_mask": np.ones((1, len(ids)), np.int64),
        "position_ids": np.arange(len(ids), dtype=np.int64)[None],
    }
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    logits = session.run(["logits"], feeds)[0][0].astype(np.float64)
    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    assert done.prompt_logprobs[0] is None and done.prompt_top_logprobs[0] is None
    assert len(done.prompt_logprobs) == len(ids)
    expected = [logp[i - 1, ids[i]] for i in range(1, len(ids))]
    np.testing.assert_allclose(done.prompt_logprobs[1:], expected, atol=2e-4)
    for i in (1, len(ids) // 2, len(ids) - 1):
        top = done.prompt_top_logprobs[i]
        assert [t for t, _ in top] == list(np.argsort(-logp[i - 1], kind="stable")[:3])


def test_a_request_without_prompt_logprobs_gets_none(engine):
    done = _alone(engine, PROMPTS[0], GREEDY, 2)
    assert done.prompt_logprobs is None and done.prompt_top_logprobs is None


def test_prefix_reuse_computes_only_the_new_tokens(fresh):
    """A chat's second turn reuses the first turn's cache: same tokens as without reuse."""
    reuse, plain = fresh(prefill_chunk=32), fresh(prefill_chunk=32, prefix_reuse=False)
    chat = [{"role": "user", "content": LONG}]
    turns = {}
    for name, engine in (("reuse", reuse), ("plain", plain)):
        first = engine.submit(chat, _seeded(31), max_new_tokens=10).result(timeout=120)
        follow = [
            *chat,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And then?"},
        ]
        second = engine.submit(follow, _seeded(32), max_new_tokens=10).result(timeout=120)
        turns[name] = (first, second)
    first, second = turns["reuse"]
    assert first.timings.cached_tokens == 0
    assert second.timings.cached_tokens >= len(first.prompt_token_ids) - 2
    assert turns["plain"][1].timings.cached_tokens == 0
    assert second.token_ids == turns["plain"][1].token_ids
    again = reuse.submit(chat, _seeded(31), max_new_tokens=10).result(timeout=120)
    assert again.token_ids == first.token_ids  # the same prompt again: all but 2 tokens reused
    assert again.timings.cached_tokens == len(again.prompt_token_ids) - 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"params": SamplingParams(seed=-1)}, "seed must be an integer in [0, 2**64), got -1"),
        ({"params": SamplingParams(seed=1.5)}, "seed must be an integer"),
        ({"params": SamplingParams(top_p=1.5)}, "top_p must be in (0, 1], got 1.5"),
        ({"params": SamplingParams(top_logprobs=5)}, "top_logprobs"),
        ({"params": SamplingParams(prompt_logprobs=4)}, "prompt_logprobs=4 is more than"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1, got 0"),
        ({"prompt": "word " * 700}, "does not fit the model's context of 512 tokens"),
        ({"prompt": [1, 2, 10**9]}, "token ids must be integers in [0, 49152)"),
        ({"prompt": []}, "the prompt is empty"),
        ({"prompt": ""}, "the prompt is empty"),
        ({"prompt": [{"role": "user"}]}, "'content'"),
        ({"prompt": 3.5}, "a prompt is a string"),
        ({"stop": ["a", 3]}, "stop must be a string or a list of strings"),
    ],
)
def test_bad_requests_fail_at_submit(engine, kwargs, message):
    kwargs = dict(kwargs)  # the table is shared by both layouts
    prompt = kwargs.pop("prompt", PROMPTS[0])
    params = kwargs.pop("params", GREEDY)
    before = engine.stats()
    with pytest.raises(InvalidParameter) as info:
        engine.submit(prompt, params, chat=False, **kwargs)
    assert message in str(info.value)
    assert engine.stats() == before


def test_a_plain_stop_string_is_one_stop_string(engine):
    full = _alone(engine, PROMPTS[0], GREEDY, 24)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert len(stop) == 3
    done = _alone(engine, PROMPTS[0], GREEDY, 24, stop=stop)
    assert done.finish_reason == "stop" and done.text == full.text[: full.text.index(stop)]


@pytest.mark.parametrize("temperature", [1e-30, 1e-7, 9e-6])
def test_a_tiny_temperature_is_greedy(engine, temperature):
    greedy = _alone(engine, PROMPTS[3], GREEDY, 16)
    tiny = _alone(engine, PROMPTS[3], SamplingParams(temperature=temperature, seed=1), 16)
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
    full = _alone(engine, PROMPTS[2], GREEDY, 40)
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
        running = engine.submit(PROMPTS[0], _seeded(1), max_new_tokens=30, chat=False)
        next(iter(running))
        greedy = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=2**39, chat=False)
        with pytest.raises(OutOfMemory, match="cannot allocate the KV cache"):
            greedy.result(timeout=60)
        assert running.result(timeout=60).token_ids
        after = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=5, chat=False)
        assert after.result(timeout=60).token_ids


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
    assert _alone(engine, PROMPTS[0], forced, 20).token_ids == []
    held = SamplingParams(temperature=0, logit_bias={eos: 100.0}, min_tokens=5)
    done = _alone(engine, PROMPTS[0], held, 20)
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
