"""The runtime on the tiny model: greedy parity, seeds, batching, penalties, stops and streaming."""

from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest

from onnxsample.composer import compose
from onnxsample.engine.generator import Generator
from onnxsample.errors import InvalidParameter, RuntimeUnavailable
from onnxsample.params import SamplingParams
from onnxsample.text import TextStream
from onnxsample.text._stops import StopMatcher

PROMPTS = [
    "Once upon a time",
    "The weather today is",
    "def fibonacci(n):",
    "Paris is the capital of",
]


@pytest.fixture(scope="session")
def tiny_composed(tiny_export, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-composed")
    return compose(
        tiny_export.output, None, folder / "composed.onnx", max_slots=4, top_logprobs=3, max_bias=2
    )


@pytest.fixture(scope="session")
def generator(tiny_composed, tiny_export) -> Generator:
    return Generator(tiny_composed, tokenizer=tiny_export.output, threads=1)


@pytest.fixture(scope="session")
def two_slot_generator(tiny_export, tmp_path_factory) -> Generator:
    path = compose(tiny_export.output, None, tmp_path_factory.mktemp("two") / "c.onnx", max_slots=2)
    return Generator(path, tokenizer=tiny_export.output, threads=1)


def _plain_greedy(model_path, ids: list[int], n: int, eos: set[int], adjust=None) -> list[int]:
    """Greedy decoding of the plain export on the host; `adjust(logits, generated)` edits logits."""
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    pasts = {
        i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values.")
    }
    names = [o.name for o in session.get_outputs()]
    step, total, out = np.asarray([ids], np.int64), len(ids), []
    for _ in range(n):
        feeds = {
            "input_ids": step,
            "attention_mask": np.ones((1, total), np.int64),
            "position_ids": np.arange(total - step.shape[1], total, dtype=np.int64)[None],
            **pasts,
        }
        result = dict(zip(names, session.run(names, feeds), strict=True))
        logits = result["logits"][0, -1].astype(np.float64)
        if adjust is not None:
            logits = adjust(logits, out)
        token = int(np.argmax(logits))
        if token in eos:
            break
        out.append(token)
        pasts = {k: result[k.replace("past_key_values.", "present.")] for k in pasts}
        step, total = np.asarray([[token]], np.int64), total + 1
    return out


def test_greedy_matches_the_plain_model(generator, tiny_export):
    [done] = generator.generate(
        PROMPTS[0], SamplingParams(temperature=0), max_new_tokens=20, chat=False
    )
    ids = generator.tokenizer.encode(PROMPTS[0])
    assert done.token_ids == _plain_greedy(tiny_export.model_path, ids, 20, generator.eos_ids)
    assert done.finish_reason in ("length", "eos")


def test_numpy_token_ids_and_counts_are_taken_as_python_ints(generator):
    """A prompt of numpy token ids is one prompt (not one prompt per id), as Engine takes it, and
    max_new_tokens may be a numpy integer as SamplingParams' counts may."""
    greedy = SamplingParams(temperature=0)
    ids = generator.tokenizer.encode(PROMPTS[0])
    [plain] = generator.generate(ids, greedy, max_new_tokens=5)
    [numpy] = generator.generate(list(np.array(ids)), greedy, max_new_tokens=np.int64(5))
    assert numpy.token_ids == plain.token_ids and len(plain.token_ids) <= 5


def test_prompts_of_different_lengths_batch_like_alone(generator):
    """Optimum's graph: left-padded rows with explicit positions, as alone."""
    greedy = SamplingParams(temperature=0)
    batch = generator.generate(PROMPTS, greedy, max_new_tokens=12, chat=False)
    for prompt, together in zip(PROMPTS, batch, strict=True):
        [alone] = generator.generate(prompt, greedy, max_new_tokens=12, chat=False)
        assert together.token_ids == alone.token_ids, prompt


def test_seeded_sampling_repeats_alone_and_in_a_batch(generator):
    mine = SamplingParams(temperature=1.0, top_k=50, seed=1234)
    [first] = generator.generate(PROMPTS[1], mine, max_new_tokens=16, chat=False)
    [again] = generator.generate(PROMPTS[1], mine, max_new_tokens=16, chat=False)
    others = [SamplingParams(temperature=0.7, seed=s, top_p=0.9) for s in (1, 2, 3)]
    batch = generator.generate(
        [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3]],
        [others[0], mine, others[1], others[2]],
        max_new_tokens=16,
        chat=False,
    )
    assert first.token_ids == again.token_ids == batch[1].token_ids
    assert first.seed == 1234
    different = generator.generate(
        PROMPTS[1],
        SamplingParams(temperature=1.0, top_k=50, seed=99),
        max_new_tokens=16,
        chat=False,
    )
    assert different[0].token_ids != first.token_ids, "another seed should draw another sequence"


def test_different_parameters_per_prompt(generator):
    params = [
        SamplingParams(temperature=0),
        SamplingParams(top_k=1, seed=5),
        SamplingParams(temperature=0.9, seed=6),
    ]
    out = generator.generate(PROMPTS[:3], params, max_new_tokens=10, chat=False)
    [greedy_0] = generator.generate(
        PROMPTS[0], SamplingParams(temperature=0), max_new_tokens=10, chat=False
    )
    [greedy_1] = generator.generate(
        PROMPTS[1], SamplingParams(temperature=0), max_new_tokens=10, chat=False
    )
    assert out[0].token_ids == greedy_0.token_ids
    assert out[1].token_ids == greedy_1.token_ids  # top_k=1 is greedy whatever the seed


def test_finished_sequences_free_slots_for_waiting_ones(two_slot_generator, batched_as_alone):
    """Six prompts through two slots: each waits, joins, leaves, and draws as it would alone."""
    prompts = [PROMPTS[i % 4] for i in range(6)]
    params = [SamplingParams(temperature=0.9, seed=100 + i) for i in range(6)]
    lengths = [3, 9, 5, 12, 4, 7]
    batched_as_alone(two_slot_generator, prompts, params, lengths)


@pytest.mark.parametrize(
    "penalties",
    [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"frequency_penalty": 1.0, "presence_penalty": -1.0},
        {"repetition_penalty": 1.8},
    ],
)
def test_penalties_follow_the_formula_step_by_step(generator, tiny_export, penalties):
    """The state the graph carries (output counts, prompt mask) gives the host reference's tokens."""
    ids = generator.tokenizer.encode(PROMPTS[2])
    p = SamplingParams(temperature=0, **penalties)

    def adjust(logits, generated):
        counts = np.bincount(generated, minlength=logits.size).astype(np.float64)
        if p.repetition_penalty != 1.0:
            seen = counts > 0
            seen[ids] = True
            logits = np.where(
                seen,
                np.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty),
                logits,
            )
        return logits - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)

    [done] = generator.generate(PROMPTS[2], p, max_new_tokens=24, chat=False)
    assert done.token_ids == _plain_greedy(
        tiny_export.model_path, ids, 24, generator.eos_ids, adjust
    )
    [plain] = generator.generate(
        PROMPTS[2], SamplingParams(temperature=0), max_new_tokens=24, chat=False
    )
    if len(set(plain.token_ids)) < len(plain.token_ids):  # repeats exist for the penalty to act on
        assert done.token_ids != plain.token_ids


def test_logprobs_are_the_raw_distributions(generator, tiny_export):
    [done] = generator.generate(
        PROMPTS[3],
        SamplingParams(temperature=0, logprobs=True, top_logprobs=3),
        max_new_tokens=6,
        chat=False,
    )
    assert len(done.logprobs) == len(done.token_ids) == len(done.top_logprobs)
    for token, lp, top in zip(done.token_ids, done.logprobs, done.top_logprobs, strict=True):
        assert top[0] == (token, pytest.approx(lp, abs=1e-5))  # greedy takes the most likely token
        assert lp <= 0 and [t[1] for t in top] == sorted((t[1] for t in top), reverse=True)


def test_stop_strings_end_the_text_before_them(generator):
    [full] = generator.generate(
        PROMPTS[0], SamplingParams(temperature=0), max_new_tokens=24, chat=False
    )
    text = full.text
    assert len(text) > 6
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    [stopped] = generator.generate(
        PROMPTS[0], SamplingParams(temperature=0), max_new_tokens=24, chat=False, stop=[stop]
    )
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[: text.index(stop)]
    pieces = [
        e.text
        for e in generator.stream(
            PROMPTS[0], SamplingParams(temperature=0), max_new_tokens=24, chat=False, stop=[stop]
        )
    ]
    assert "".join(pieces) == stopped.text


@pytest.mark.parametrize("text", ["naïve café", "日本語のテキスト", "emoji 🙂🚀 end", "Ωμέγα"])
def test_detokenizer_never_splits_a_character(generator, text):
    ids = generator.tokenizer.encode(text)
    detok = TextStream(generator.tokenizer)
    pieces = [detok.add(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == generator.tokenizer.decode(ids)
    splits = ["\ufffd" in generator.tokenizer.decode([i]) for i in ids]
    if any(splits):  # some token ends inside a character: its piece must wait for the next token
        assert any(split and piece == "" for split, piece in zip(splits, pieces, strict=False))


@pytest.mark.parametrize(
    ("stops", "pieces", "shown", "final"),
    [
        (["END"], ["abc E", "N", "D tail"], ["abc ", "", ""], "abc "),
        (["END"], ["abc E", "x"], ["abc ", "Ex"], "abc Ex"),
        (["\n\n", "###"], ["a\n", "b#", "##c"], ["a", "\nb", ""], "a\nb"),
        ([], ["plain"], ["plain"], "plain"),
    ],
)
def test_stop_matcher_holds_back_possible_stops(stops, pieces, shown, final):
    matcher = StopMatcher(stops)
    assert [matcher.add(p) for p in pieces] == shown
    assert matcher.text == final


def test_streamed_pieces_add_up_to_the_completion(generator):
    events = list(
        generator.stream(
            PROMPTS[:2], SamplingParams(temperature=0.8, seed=3), max_new_tokens=20, chat=False
        )
    )
    for index in range(2):
        mine = [e for e in events if e.index == index]
        assert "".join(e.text for e in mine) == mine[-1].completion.text
        assert all("\ufffd" not in e.text for e in mine)


def test_timings_are_reported(generator):
    [done] = generator.generate(
        PROMPTS[0], SamplingParams(temperature=0), max_new_tokens=8, chat=False
    )
    t = done.timings
    assert t.prompt_tokens == len(done.prompt_token_ids) and t.ttft_s > 0 and t.prefill_s > 0
    run = generator.last_timings
    assert run.prompt_tps > 0 and (run.decode_tps > 0 or done.finish_reason == "eos")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"params": SamplingParams(top_p=1.5)}, "top_p must be in (0, 1], got 1.5"),
        ({"params": SamplingParams(temperature=-1)}, "temperature must be"),
        ({"params": SamplingParams(top_logprobs=5)}, "top_logprobs"),
        ({"params": SamplingParams(logit_bias={1: 1, 2: 1, 3: 1})}, "bias"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1, got 0"),
        ({"prompts": ["word " * 700]}, "does not fit the model's context of 512 tokens"),
        ({"params": SamplingParams(seed=-3)}, "seed must be an integer in [0, 2**64), got -3"),
        ({"prompts": []}, "at least one prompt"),
    ],
)
def test_bad_requests_fail_before_any_work(generator, kwargs, message):
    kwargs = dict(kwargs)
    prompts = kwargs.pop("prompts", PROMPTS[0])
    with pytest.raises(InvalidParameter) as info:
        generator.generate(prompts, kwargs.pop("params", None), chat=False, **kwargs)
    assert message in str(info.value)


def test_cuda_without_cuda_is_a_clear_error(tiny_composed, tiny_export):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has the CUDA provider")
    with pytest.raises(
        RuntimeUnavailable, match=r"provider 'cuda' is not available.*onnxsample\[gpu\]"
    ):
        Generator(tiny_composed, tokenizer=tiny_export.output, provider="cuda")


def test_prepare_takes_a_folder_of_a_composed_model_alone_and_names_an_empty_one(
    tiny_export, tmp_path
):
    """A composed model is whole: its folder may hold it without the plain model.onnx. A folder
    with neither an export nor a Hugging Face model is one line that says so."""
    import shutil

    from onnxsample.errors import ModelError
    from onnxsample.prepare import prepare

    folder = tmp_path / "export"
    shutil.copytree(tiny_export.output, folder)
    composed = prepare(folder)
    (folder / "model.onnx").unlink()
    (folder / "config.json").unlink()  # not a Hugging Face folder to export either
    assert prepare(folder) == composed
    composed.unlink()
    with pytest.raises(ModelError, match=r"is a folder with neither a model\.onnx"):
        prepare(folder)


def test_prepare_reuses_an_up_to_date_composed_model_and_rebuilds_a_stale_one(
    tiny_export, tmp_path
):
    import shutil

    import onnx

    from onnxsample.composer import COMPOSER_REVISION, composed_metadata
    from onnxsample.prepare import prepare

    folder = tmp_path / "export"
    shutil.copytree(tiny_export.output, folder)
    composed = prepare(folder)
    assert composed == folder / "composed.onnx"
    written = composed.stat().st_mtime_ns
    assert prepare(folder).stat().st_mtime_ns == written
    assert prepare(composed) == composed  # a composed file is used as it is
    model = onnx.load(str(composed))
    for prop in model.metadata_props:
        if prop.key == "onnxsample.composer_revision":
            prop.value = "1"  # as written by an older composer
    onnx.save(model, str(composed))
    rebuilt = prepare(folder)
    assert (
        composed_metadata(onnx.load(str(rebuilt), load_external_data=False)).composer_revision
        == COMPOSER_REVISION
    )


def test_prepare_composes_candidates_instead_of_drafts_beside_the_plain_composition(
    tiny_export, tmp_path
):
    """`serve --candidates K`: the graph's K candidates (for host samplers such as llama.cpp's
    infill sampler) instead of draft verification, kept apart from the plain composition."""
    import shutil

    import onnx

    from onnxsample.composer import composed_metadata
    from onnxsample.prepare import prepare

    def meta(path):
        return composed_metadata(onnx.load(str(path), load_external_data=False))

    folder = tmp_path / "export"
    shutil.copytree(tiny_export.output, folder)
    composed = prepare(folder, candidates=8)
    assert composed == folder / "composed-c8.onnx"
    assert (meta(composed).output_candidates, meta(composed).draft_tokens) == (8, 0)
    written = composed.stat().st_mtime_ns
    assert prepare(folder, candidates=8).stat().st_mtime_ns == written
    plain = prepare(folder)
    assert plain == folder / "composed.onnx" and meta(plain).output_candidates == 0
    assert prepare(composed, candidates=8) == composed  # a composed file with them runs as it is
    with pytest.raises(InvalidParameter, match="composed with 0 candidates, not 8"):
        prepare(plain, candidates=8)


def test_prepare_composes_the_final_distribution_apart(tiny_export, tmp_path):
    """`serve --output-probs`: sampler.probs (llama-server's post_sampling_probs over any kept
    set) instead of draft verification, kept apart from the plain composition."""
    import shutil

    import onnx

    from onnxsample.composer import composed_metadata
    from onnxsample.prepare import prepare

    def meta(path):
        return composed_metadata(onnx.load(str(path), load_external_data=False))

    folder = tmp_path / "export"
    shutil.copytree(tiny_export.output, folder)
    composed = prepare(folder, probs=True)
    assert composed == folder / "composed-p.onnx"
    assert (meta(composed).output_probs, meta(composed).draft_tokens) == (True, 0)
    written = composed.stat().st_mtime_ns
    assert prepare(folder, probs=True).stat().st_mtime_ns == written
    assert prepare(composed, probs=True) == composed  # a composed file with them runs as it is
    plain = prepare(folder)
    assert plain == folder / "composed.onnx" and not meta(plain).output_probs
    with pytest.raises(InvalidParameter, match="not composed with the final distribution"):
        prepare(plain, probs=True)
    with pytest.raises(InvalidParameter, match="probs must be a boolean, got 1"):
        prepare(folder, probs=1)
    with pytest.raises(InvalidParameter, match="static composes the static chain"):
        prepare(folder, probs=True, static=True)


@pytest.mark.parametrize(
    ("option", "value"),
    [("candidates", -1), ("candidates", True), ("candidates", 2.0), ("max_slots", 0),
     ("max_slots", True)],
)  # fmt: skip
def test_prepare_refuses_what_is_not_a_count(option, value, tmp_path):
    """Nothing is composed: 0 slots is not the default's 8, True not 1 slot."""
    from onnxsample.prepare import prepare

    with pytest.raises(InvalidParameter, match=f"{option} must be an integer >= "):
        prepare(tmp_path, **{option: value})
    assert not list(tmp_path.iterdir())


@pytest.mark.integration
def test_prepare_exports_the_embedded_model_again_over_another_versions_export(
    tmp_path, monkeypatch
):
    """`onnxsample run` with no model keeps the embedded model's export in the user cache; one
    written by other exporter versions (an upgrade) is made again, not refused."""
    import json

    from conftest import _need_embedded

    from onnxsample.exporters._manifest import EXPORTER_REVISION, MANIFEST_NAME

    _need_embedded()
    from onnxsample.prepare import prepare

    monkeypatch.setenv("ONNXSAMPLE_CACHE", str(tmp_path))
    composed = prepare(None)
    manifest = composed.parent / MANIFEST_NAME
    old = json.loads(manifest.read_text())
    old["exporter"]["revision"] = EXPORTER_REVISION - 1  # as an older onnxsample wrote it
    manifest.write_text(json.dumps(old))
    again = prepare(None)
    assert again.parent == composed.parent and again.is_file()
    assert json.loads(manifest.read_text())["exporter"]["revision"] == EXPORTER_REVISION


@pytest.mark.parametrize(
    ("model", "attention", "message"),
    [
        (None, "flash", "attention must be gqa or exact, got 'flash'"),
        ("folder", "exact", "export your model with `onnxsample export --attention exact`"),
    ],
)
def test_prepare_refuses_an_attention_it_cannot_give(model, attention, message, tmp_path):
    from onnxsample.prepare import prepare

    with pytest.raises(InvalidParameter, match=re.escape(message)):
        prepare(tmp_path if model else None, attention=attention)
