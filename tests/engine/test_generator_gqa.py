"""The Generator on GroupQueryAttention graphs: a shared, right-padded KV buffer, written in place.

The model comes from the `gqa_model` fixture: our own export of the tiny random Llama, and
onnxruntime-genai's build of the embedded SmolLM2 (`make genai-model`; those tests skip without it). Its reference is the plain, uncomposed graph run by a
simple loop that feeds each step's ``present.*`` back as the next ``past_key_values.*`` (the cache
grows by concatenation, batch of one): an independent check of the shared buffer, the right padding
and the in-place writes.
"""

from __future__ import annotations

import json
import mmap
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onnxsample.composer import compose
from onnxsample.engine._kv_shared import SharedKV, SharedLayout, buffer_length
from onnxsample.engine.generator import Generator
from onnxsample.errors import InvalidParameter
from onnxsample.params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
GENAI_MODEL = ROOT / "artifacts" / "cache" / "genai-smollm2-fp32" / "model.onnx"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n <= 1:\n        return n\n    return",
    "Once upon a time there was a little",
    "The three primary colors are",
    "import numpy as np\n",
]
GREEDY = SamplingParams(temperature=0)
STEPS = 10


@dataclass(frozen=True)
class GQAModel:
    source: Path  # the plain GQA graph
    composed: Path  # composed with max_slots=4
    tokenizer: Path  # a folder with its tokenizer and onnxsample.json (context length)


@pytest.fixture(scope="session", params=["tiny", "genai"])
def gqa_model(request, tmp_path_factory) -> GQAModel:
    """A GQA model composed once per session: our tiny random Llama export, and genai's SmolLM2."""
    if request.param == "tiny":
        export = request.getfixturevalue("tiny_gqa_export")
        source, tokenizer = export.model_path, export.output
    else:
        if not GENAI_MODEL.is_file():
            pytest.skip(
                f"no onnxruntime-genai model at {GENAI_MODEL.relative_to(ROOT)}: "
                "build it with `make genai-model`"
            )
        # genai's folder holds a transformers-5 tokenizer; the optimum export's is the same vocabulary.
        source, tokenizer = GENAI_MODEL, request.getfixturevalue("embedded_export").output
    out = compose(source, None, tmp_path_factory.mktemp("gqa") / "c.onnx", max_slots=4)
    yield GQAModel(source, out, tokenizer)
    out.unlink(missing_ok=True)  # hundreds of MB; pytest keeps its last three temporary folders


@pytest.fixture(scope="module")
def generator(gqa_model) -> Generator:
    return Generator(gqa_model.composed, tokenizer=gqa_model.tokenizer, threads=1)


@pytest.fixture(scope="module")
def two_slots(gqa_model, tmp_path_factory):
    out = compose(gqa_model.source, None, tmp_path_factory.mktemp("gqa2") / "c.onnx", max_slots=2)
    yield Generator(out, tokenizer=gqa_model.tokenizer, threads=1)
    out.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def plain_greedy(gqa_model, generator):
    """Greedy tokens of the plain graph: numpy loop, batch of one, past = the last present."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        str(gqa_model.source), options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    pasts = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    config = gqa_model.source.parent / "genai_config.json"
    head_size = pasts[0].shape[3]
    if not isinstance(head_size, int):
        head_size = json.loads(config.read_text())["model"]["decoder"]["head_size"]

    def run(ids: list[int], n: int) -> list[int]:
        past = {i.name: np.zeros((1, i.shape[1], 0, head_size), np.float32) for i in pasts}
        step, tokens = np.asarray([ids], np.int64), []
        for _ in range(n):
            total = len(ids) + len(tokens)
            feeds = {"input_ids": step, "attention_mask": np.ones((1, total), np.int64), **past}
            out = dict(zip(names, session.run(names, feeds), strict=True))
            token = int(out["logits"][0, -1].argmax())
            if token in generator.eos_ids:
                break
            tokens.append(token)
            past = {k: out["present." + k.removeprefix("past_key_values.")] for k in past}
            step = np.asarray([[token]], np.int64)
        return tokens

    return run


@pytest.fixture(scope="module")
def greedy_batch(generator):
    return generator.generate(PROMPTS[:3], GREEDY, max_new_tokens=STEPS, chat=False)


@pytest.mark.parametrize(
    ("need", "limit", "expected"),
    [
        (1, None, 64),
        (64, 8192, 64),
        (65, 8192, 128),
        (300, 8192, 320),
        (300, 100, 100),  # max_len (or the context) caps the rounding
        (9000, 8192, 8192),
        (130, 150, 150),
    ],
)
def test_buffer_length(need, limit, expected):
    assert buffer_length(need, limit) == expected


def test_the_layout_is_gqa_with_every_slot(generator):
    assert generator.kv_layout == "gqa"
    assert generator.engine.concurrency == generator.max_slots == 4


@pytest.mark.parametrize("index", range(3))
def test_greedy_alone_in_a_batch_and_in_the_plain_graph_agree(
    generator, greedy_batch, plain_greedy, index
):
    """Three prompts of different lengths (right padding), each as alone and as the plain graph."""
    [alone] = generator.generate(PROMPTS[index], GREEDY, max_new_tokens=STEPS, chat=False)
    assert greedy_batch[index].prompt_token_ids == alone.prompt_token_ids
    assert greedy_batch[index].token_ids == alone.token_ids
    assert alone.token_ids == plain_greedy(alone.prompt_token_ids, STEPS)
    assert len(alone.token_ids) == STEPS or alone.finish_reason == "eos"


def test_prompts_have_different_lengths(greedy_batch):
    assert len({len(c.prompt_token_ids) for c in greedy_batch}) == 3


def _kv(generator) -> SharedKV:
    return generator.engine._scheduler.layout.kv


def test_presents_are_the_shared_buffers(generator, monkeypatch):
    """ORT writes in place: every call's present.* is a row range of the buffer itself."""
    seen = []
    session = generator.engine.session
    run = session.run_with_iobinding

    def spy(binding, *args):
        run(binding, *args)
        seen.append([(v.data_ptr(), v.shape()) for v in binding.get_outputs()])

    monkeypatch.setattr(session, "run_with_iobinding", spy)
    generator.generate(PROMPTS[:3], GREEDY, max_new_tokens=4, chat=False)
    kv = _kv(generator)
    buffers = list(kv.buffers.values())
    row = next(iter(kv.specs.values()))
    row_bytes = row[0] * row[1] * kv.length * np.dtype(row[2]).itemsize
    assert len(seen) >= 4  # one prefill per prompt, then decodes
    for outputs in seen:
        presents = outputs[: len(buffers)]  # bound first
        for (ptr, shape), buffer in zip(presents, buffers, strict=True):
            offset = ptr - buffer.data_ptr()
            assert offset % row_bytes == 0 and 0 <= offset // row_bytes < kv.rows
            assert shape[2] == kv.length


@pytest.mark.parametrize(
    ("mode", "lengths"),
    [
        # slot 0 frees first, then slot 1; at the end slot 1 runs alone (an idle row below it)
        ("greedy", [9, 3, 5, 12, 4]),
        ("seeded", [9, 3, 5, 12, 4]),
        ("seeded", [2, 2, 6, 1, 7]),
    ],
)
def test_continuous_batching_matches_alone(two_slots, mode, lengths, batched_as_alone):
    """Five prompts through two slots: each waits, reuses a freed row, and decodes as alone."""
    if mode == "greedy":
        params = [GREEDY] * 5
    else:
        params = [SamplingParams(temperature=0.9, top_k=40, seed=100 + i) for i in range(5)]
    batched_as_alone(two_slots, PROMPTS, params, lengths)
    assert _kv(two_slots).rows == 2


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, repetition_penalty=1.3, logprobs=True),
        SamplingParams(temperature=0.9, presence_penalty=1.5, frequency_penalty=1.0, seed=5),
    ],
)
def test_reused_decode_binding_matches_binding_every_step(generator, monkeypatch, params):
    """Decode steps reuse one IOBinding (penalty counts double-buffered): same tokens, logprobs."""
    runner = generator.engine._scheduler.runner
    fast = generator.generate(PROMPTS[:3], params, max_new_tokens=12, chat=False)
    assert runner._bindings  # the decode steps kept theirs
    original = runner.run

    def fresh_binding(call, *uniforms):
        runner.invalidate()
        return original(call, *uniforms)

    monkeypatch.setattr(runner, "run", fresh_binding)
    slow = generator.generate(PROMPTS[:3], params, max_new_tokens=12, chat=False)
    for a, b in zip(fast, slow, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == b.logprobs and a.top_logprobs == b.top_logprobs


def test_seeded_sampling_alone_and_in_a_batch(generator):
    mine = SamplingParams(temperature=1.0, top_k=50, seed=1234)
    [alone] = generator.generate(PROMPTS[1], mine, max_new_tokens=12, chat=False)
    others = [SamplingParams(temperature=0.7, top_p=0.9, seed=s) for s in (1, 2, 3)]
    batch = generator.generate(
        PROMPTS[:4], [others[0], mine, others[1], others[2]], max_new_tokens=12, chat=False
    )
    assert batch[1].token_ids == alone.token_ids
    [other_seed] = generator.generate(
        PROMPTS[1],
        SamplingParams(temperature=1.0, top_k=50, seed=99),
        max_new_tokens=12,
        chat=False,
    )
    assert other_seed.token_ids != alone.token_ids


# (positions reserved one after the other, the limit) -> buffer lengths after each: at least 512
# positions at first, then doubling (at least what is asked), rounded to 64, never past the limit.
RESERVES = [
    ([10, 300, 600, 700, 1500], 8192, [512, 512, 1024, 1024, 2048]),
    ([10, 5000], 8192, [512, 5056]),
    ([10, 600], 700, [512, 700]),
    ([10], 100, [100]),
]


@pytest.mark.parametrize(("reserves", "limit", "lengths"), RESERVES)
def test_the_buffers_grow_by_doubling_and_keep_their_contents(reserves, limit, lengths):
    specs = {
        "past_key_values.0.key": (2, 4, np.float32),
        "past_key_values.0.value": (2, 4, np.float32),
    }
    kv = SharedKV(specs, "cpu")
    layout = SharedLayout(kv, 3, 0, limit)
    rng = np.random.default_rng(0)
    for positions, length in zip(reserves, lengths, strict=True):
        before = {k: v.numpy().copy() for k, v in kv.buffers.items()}
        layout.reserve(1, positions)
        assert (kv.rows, kv.length) == (3, length)
        for name, old in before.items():  # what the old buffers held is still there
            np.testing.assert_array_equal(kv.buffers[name].numpy()[:, :, : old.shape[2]], old)
        for value in kv.buffers.values():
            value.update_inplace(rng.random(value.shape(), dtype=np.float32))


def _vm_flags(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping of this process that holds `address` (Linux)."""
    mapping = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            mapping = start <= address < end
        elif head == "VmFlags:" and mapping:
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="reads Linux's smaps")
def test_the_buffers_are_zeros_not_advised_to_huge_pages():
    """numpy advises transparent huge pages on arrays over 4 MB; where the kernel compacts memory
    to fault those in (THP defrag "madvise", Debian's and Ubuntu's default), growing a cache
    stalled every running stream for seconds. The buffers are mapped without that advice."""
    specs = {f"past_key_values.{i}.{kv}": (3, 64, np.float32) for i in range(2) for kv in "kv"}
    kv = SharedKV(specs, "cpu")
    kv.grow(8, 2048)  # 12 MiB a buffer
    for value in kv.buffers.values():
        middle = value.data_ptr() + value.numpy().nbytes // 2
        assert "hg" not in _vm_flags(middle)
        assert not value.numpy().any()
    advised = mmap.mmap(-1, 2**23, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advised.madvise(mmap.MADV_HUGEPAGE)  # the advice numpy gives, which the check sees
    assert "hg" in _vm_flags(np.frombuffer(advised, np.uint8).ctypes.data + 2**22)


def test_growing_the_buffers_keeps_a_running_sequence_as_it_was(gqa_model, tmp_path):
    """A request that reserves more positions arrives while another decodes: the buffers are
    replaced under the running sequence, which goes on as if nothing happened; once the large
    request has gone (and then the other), they shrink back."""
    folder = _long_context(gqa_model, tmp_path)
    with Generator(gqa_model.composed, tokenizer=folder, threads=1) as gen:
        [alone] = gen.generate(PROMPTS[0], GREEDY, max_new_tokens=30, chat=False)
    with Generator(gqa_model.composed, tokenizer=folder, threads=1) as gen:
        engine = gen.engine
        running = engine.submit(PROMPTS[0], GREEDY, max_new_tokens=30, chat=False)
        next(iter(running))
        first = _kv(gen).buffers["past_key_values.0.key"]
        grown = engine.submit(PROMPTS[1], GREEDY, max_new_tokens=2000, chat=False)
        next(iter(grown))
        assert _kv(gen).length > 2000 and _kv(gen).buffers["past_key_values.0.key"] is not first
        grown.cancel()
        assert running.result(timeout=120).token_ids == alone.token_ids
        assert _kv(gen).length == 512  # both ended: the buffers shrank back


def _long_context(gqa_model, tmp_path) -> Path:
    """The tiny model's tokenizer folder, its context widened (reservations only)."""
    folder = tmp_path / "long-context"
    shutil.copytree(gqa_model.tokenizer, folder, ignore=shutil.ignore_patterns("*.onnx", "*.data"))
    manifest = folder / "onnxsample.json"
    data = json.loads(manifest.read_text()) if manifest.is_file() else {"model": {}}
    data.setdefault("model", {})["max_position_embeddings"] = 100_000
    manifest.write_text(json.dumps(data))
    return folder


def test_a_chats_next_turn_finds_its_whole_conversation_cached(embedded_gqa_exports, tmp_path):
    """A conversation long enough to grow the buffers past four times the first length: its next
    turn reuses every token the last one left, though a short unrelated request ended between
    the two (the buffers used to shrink back to 512 positions when it ended, and the next turn
    recomputed all but 511); once its tokens are older than the layout keeps them, the idle
    engine gives the memory back, no other request needed."""
    folder = embedded_gqa_exports["gguf-a4"].output
    composed = compose(folder, None, tmp_path / "two.onnx", max_slots=2)
    history = [int(t) for t in np.random.default_rng(0).integers(100, 20_000, 2100)]
    with Generator(composed, tokenizer=folder) as gen:
        engine = gen.engine
        first = engine.submit(history, GREEDY, max_new_tokens=4).result(timeout=120)
        engine.submit([5, 6, 7], GREEDY, max_new_tokens=4).result(timeout=120)  # a chat's title
        assert _kv(gen).length > 2048
        turn = [*history, *first.token_ids, 7, 8, 9]
        second = engine.submit(turn, GREEDY, max_new_tokens=4).result(timeout=120)
        assert second.timings.cached_tokens >= len(history) + len(first.token_ids) - 2
        engine._scheduler.layout.keep_seconds = 5.0
        engine.submit([5, 6, 7], GREEDY, max_new_tokens=4).result(timeout=120)
        assert _kv(gen).length > 2048  # the conversation ended under 5 s ago: kept
        deadline = time.monotonic() + 60
        while _kv(gen).length != 512:  # idle, the engine wakes when it has expired
            assert time.monotonic() < deadline, "an idle engine kept the buffers"
            time.sleep(0.1)


@pytest.mark.parametrize("bad", [0, 1, -5, 2.5, "64", True])
def test_max_len_must_be_an_integer_of_at_least_2(gqa_model, bad):
    with pytest.raises(InvalidParameter, match="max_len must be None or an integer >= 2"):
        Generator(gqa_model.composed, tokenizer=gqa_model.tokenizer, max_len=bad)


@pytest.fixture(scope="module")
def short(gqa_model) -> Generator:
    return Generator(gqa_model.composed, tokenizer=gqa_model.tokenizer, threads=1, max_len=24)


def test_a_prompt_longer_than_max_len_is_refused(short):
    long = "one two three four five six seven eight nine ten " * 3
    assert len(short.tokenizer.encode(long)) >= 24
    with pytest.raises(
        InvalidParameter, match=r"does not fit max_len=24 \(it must be at most 23\)"
    ):
        short.generate([PROMPTS[0], long], GREEDY, max_new_tokens=4, chat=False)


@pytest.mark.parametrize("prompts", [[0], [0, 2, 1]])
def test_generation_stops_with_length_at_max_len(short, generator, prompts):
    texts = [PROMPTS[i] for i in prompts]
    done = short.generate(texts, GREEDY, max_new_tokens=100, chat=False)
    assert _kv(short).length == 24  # max_len caps the buffer: no rounding past it
    for c, text in zip(done, texts, strict=True):
        [full] = generator.generate(text, GREEDY, max_new_tokens=30, chat=False)
        room = 24 - len(c.prompt_token_ids)
        assert c.token_ids == full.token_ids[:room]
        if len(full.token_ids) >= room:
            assert c.finish_reason == "length" and len(c.token_ids) == room
