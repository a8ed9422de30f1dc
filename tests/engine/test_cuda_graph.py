"""The CUDA-graph engine's calls, checked for their numbers on the CPU: a static chain gives the
branching chain's tokens and logprobs, and so do fixed-shape decode steps (every slot, the mask as
wide as the KV buffer, inputs written in place into buffers bound once) — the calls a CUDA graph
replays. The CPU provider ignores `gpu_graph_id`, so here they run uncaptured; the simulated device
(tests/cuda_sim) shows the capture itself."""

from __future__ import annotations

import dataclasses

import pytest

import onnxsample.engine._session as session_module
from onnxsample import Constraint, Generator, InvalidParameter, SamplingParams
from onnxsample.composer import compose
from onnxsample.engine._graphs import CapturedDecode
from onnxsample.engine._slots import check_params
from onnxsample.metadata import composed_metadata

OPTIONS = {"max_slots": 4, "top_logprobs": 3, "max_bias": 4, "prompt_logprobs": True}
PROMPTS = [
    "Hello there",
    "The quick brown fox jumps over",
    "One two three four",
    "a",
    "Far away",
    "Once upon a time",
    "My favourite colour is",
]
PARAMS = [
    SamplingParams(temperature=0.0, logprobs=True, top_logprobs=3),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=3, logprobs=True),
    SamplingParams(
        temperature=1.0,
        repetition_penalty=1.3,
        presence_penalty=0.5,
        frequency_penalty=0.2,
        logit_bias={5: 2.0, 7: -100.0},
        seed=4,
    ),
    SamplingParams(temperature=0.7, min_p=0.1, typical_p=0.9, seed=5, logprobs=True),
    # past the static chain's candidates: the host's fallback draws these
    SamplingParams(temperature=1.5, top_k=5000, seed=6, logprobs=True),
    SamplingParams(temperature=2.0, top_p=0.999, presence_penalty=0.5, seed=7, logprobs=True),
    # llama.cpp's order: a static chain reads no temperature_last, the engine flags the slot
    SamplingParams(
        temperature=0.6, top_k=40, top_p=0.95, min_p=0.05, temperature_last=True, seed=8
    ),
]


@pytest.fixture(scope="module")
def graphs(tiny_gqa_export, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("cuda-graph")
    source = tiny_gqa_export.output
    return {
        "source": source,
        "static": compose(source, None, folder / "static.onnx", static=True, **OPTIONS),
        "branching": compose(source, None, folder / "branching.onnx", **OPTIONS),
    }


def _run(model, source, **options) -> tuple[list, int]:
    """Each request's tokens and logprobs, and how many tokens the host's fallback drew."""
    with Generator(model, tokenizer=source, threads=1, **options) as generator:
        # Continuous batching: the last ones join while the first four decode.
        done = generator.generate(PROMPTS, PARAMS, max_new_tokens=20, chat=False)
        redrawn = generator.engine.stats().fallback_tokens
        return [(c.token_ids, c.logprobs) for c in done], redrawn


def test_static_chain_and_fixed_decode_steps_give_the_branching_chains_output(graphs, monkeypatch):
    reference, none = _run(graphs["branching"], graphs["source"])
    static, redrawn = _run(graphs["static"], graphs["source"])
    assert static == reference
    assert none == 0 and redrawn >= 40  # the last three requests' tokens, at least
    monkeypatch.setattr(session_module, "GRAPH_DEVICES", ("cuda", "cpu"))
    assert _run(graphs["static"], graphs["source"], cuda_graph=True) == (static, redrawn)


@pytest.mark.parametrize("kind", ["static", "branching"])
def test_a_model_composed_before_temperature_last_refuses_it(graphs, kind):
    """A composed model of an earlier revision reads no sampler.temperature_last (nor does its
    fallback chain): a request whose draw the temperature's place changes is refused, naming
    the field; one where the place changes nothing (temperature 1) is served."""
    meta = dataclasses.replace(composed_metadata(graphs[kind]), composer_revision="28")
    with pytest.raises(InvalidParameter, match=r"^temperature_last needs a model composed"):
        check_params(meta, PARAMS[-1])
    check_params(meta, dataclasses.replace(PARAMS[-1], temperature=1.0))
    check_params(composed_metadata(graphs[kind]), PARAMS[-1])


@pytest.fixture
def captured_rows(monkeypatch) -> list[int]:
    """CUDA-graph engines on the CPU; the rows each of their decode steps binds, in order."""
    seen: list[int] = []
    run = CapturedDecode.run

    def spy(self, call, uniform, rows):
        assert rows == call.input_ids.shape[0]  # the sampler's rows are the model's
        seen.append(rows)
        return run(self, call, uniform, rows)

    monkeypatch.setattr(CapturedDecode, "run", spy)
    monkeypatch.setattr(session_module, "GRAPH_DEVICES", ("cuda", "cpu"))
    return seen


def _queued_at_once(engine, prompts, params, lengths) -> list:
    """Each prompt's tokens, all queued in one go (so they take slots 0, 1, 2… in one step)."""
    prepared = [
        engine.prepare(p, sp, n, None, False, None, i)
        for i, (p, sp, n) in enumerate(zip(prompts, params, lengths, strict=True))
    ]
    return [r.result(timeout=300).token_ids for r in engine.enqueue(prepared)]


def _alone(generator, prompts, params, lengths) -> list:
    return [
        generator.generate(p, sp, max_new_tokens=n, chat=False)[0].token_ids
        for p, sp, n in zip(prompts, params, lengths, strict=True)
    ]


def _changes(rows: list[int]) -> list[int]:
    """The rows of each run of equal steps: [4, 4, 2, 1, 1] -> [4, 2, 1]."""
    return [r for k, r in enumerate(rows) if k == 0 or r != rows[k - 1]]


def test_decode_steps_bind_the_rows_of_the_occupied_slots(graphs, captured_rows):
    """Three requests of 16, 10 and 4 tokens take slots 0, 1 and 2: the decode steps bind the
    first 4 rows (model and sampler), then 2 once slot 2 is free, then 1 (a graph each), and
    every request keeps the tokens it has alone and under the branching chain."""
    prompts, lengths = PROMPTS[:3], [16, 10, 4]
    params = [dataclasses.replace(p, ignore_eos=True) for p in PARAMS[1:4]]
    with Generator(graphs["branching"], tokenizer=graphs["source"], threads=1) as generator:
        reference = _alone(generator, prompts, params, lengths)
    with Generator(
        graphs["static"], tokenizer=graphs["source"], threads=1, cuda_graph=True
    ) as generator:
        together = _queued_at_once(generator.engine, prompts, params, lengths)
        steps = list(captured_rows)
        assert _alone(generator, prompts, params, lengths) == reference
    assert together == reference
    assert _changes(steps) == [4, 2, 1], steps


@pytest.mark.parametrize(
    ("lengths", "moved", "rows"),
    [
        # slot 0 ends: the request in slot 2 moves to 0 (4 rows, then 2, then 1)
        ([3, 4, 24], 1, [4, 2, 1]),
        # slots 0 and 1 end: the requests in 2 and 3 move to 0 and 1 (4 rows, then 2)
        ([3, 3, 20, 20], 2, [4, 2]),
    ],
)
def test_sequences_move_down_when_the_slots_below_them_free(
    graphs, captured_rows, lengths, moved, rows
):
    """Requests take slots 0, 1, 2 (and 3); once the short ones end, the long ones (with
    penalties: their counts and prompt masks go with them) move down into the freed slots and
    the steps bind fewer rows. Each keeps the tokens it has alone."""
    prompts = PROMPTS[: len(lengths)]
    params = [dataclasses.replace(p, ignore_eos=True) for p in PARAMS[: len(lengths)]]
    params[-1] = dataclasses.replace(PARAMS[2], ignore_eos=True)  # penalties
    with Generator(
        graphs["static"], tokenizer=graphs["source"], threads=1, cuda_graph=True
    ) as generator:
        together = _queued_at_once(generator.engine, prompts, params, lengths)
        assert generator.engine.stats().moved == moved
        steps = list(captured_rows)
        alone = _alone(generator, prompts, params, lengths)
    assert together[2:] == alone[2:]
    assert _changes(steps) == rows, steps


def test_without_row_buckets_every_step_binds_every_slot(graphs, captured_rows):
    """row_buckets=False: every decode step binds all 4 slots (one graph), nothing moves, and
    each request keeps its tokens."""
    prompts, lengths = PROMPTS[:3], [16, 10, 4]
    params = [dataclasses.replace(p, ignore_eos=True) for p in PARAMS[1:4]]
    with Generator(graphs["branching"], tokenizer=graphs["source"], threads=1) as generator:
        reference = _alone(generator, prompts, params, lengths)
    with Generator(
        graphs["static"],
        tokenizer=graphs["source"],
        threads=1,
        cuda_graph=True,
        row_buckets=False,
    ) as generator:
        together = _queued_at_once(generator.engine, prompts, params, lengths)
        assert generator.engine.stats().moved == 0
    assert together == reference
    assert captured_rows and set(captured_rows) == {4}, captured_rows


@pytest.mark.parametrize(
    ("model", "provider", "message"),
    [
        ("static", "cpu", "cuda_graph needs the CUDA provider"),
        ("static", "auto", "cuda_graph needs the CUDA provider; the session runs on cpu"),
        ("branching", "auto", "cuda_graph needs a static sampler chain"),
    ],
)
def test_cuda_graph_refuses_what_it_cannot_capture(graphs, model, provider, message):
    with pytest.raises(InvalidParameter, match=message):
        Generator(graphs[model], tokenizer=graphs["source"], provider=provider, cuda_graph=True)


@pytest.mark.parametrize("cuda_graph", [None, False])
def test_fixed_rows_without_buckets_need_cuda_graphs(graphs, cuda_graph):
    with pytest.raises(InvalidParameter, match="row_buckets=False needs cuda_graph"):
        Generator(
            graphs["static"], tokenizer=graphs["source"], cuda_graph=cuda_graph, row_buckets=False
        )


def _mixed(graphs, source, cuda_graph: bool) -> list:
    """Requests that touch every buffer the engine writes by rows (penalty counts and prompt
    masks, host-fallback redraws, allowed-token masks), queued together so some move down."""
    params = [dataclasses.replace(p, ignore_eos=True) for p in PARAMS]
    params[0] = SamplingParams(seed=8, constraint=Constraint.regex("[a-z ]{1,40}"))
    params[3] = dataclasses.replace(params[2], constraint=Constraint.regex("[0-9 ]{1,40}"))
    params[4] = dataclasses.replace(params[2], seed=9)  # penalised, admitted once others run
    lengths = [3, 4, 24, 12, 16, 20, 10]
    with Generator(graphs, tokenizer=source, threads=1, cuda_graph=cuda_graph) as generator:
        done = _queued_at_once(generator.engine, PROMPTS, params, lengths)
        assert generator.engine.stats().fallback_tokens > 0
        assert generator.engine.stats().moved > 0
    return done


def test_buffers_of_their_own_memory_give_the_same_tokens(
    graphs, tmp_path, monkeypatch, own_memory_buffers
):
    """On a device the penalty counts, prompt masks and allowed-token masks are buffers of their
    own, and the engine writes only the rows that change: here, with buffers that do not share
    the host arrays (as on a GPU), a mix of constrained, penalised, fallback-drawn and moving
    requests gets the tokens it gets when every buffer is the host's own array."""
    monkeypatch.setattr(session_module, "GRAPH_DEVICES", ("cuda", "cpu"))
    static = compose(
        graphs["source"],
        None,
        tmp_path / "allowed.onnx",
        static=True,
        allowed_tokens=True,
        **OPTIONS,
    )
    shared = _mixed(static, graphs["source"], cuda_graph=True)
    own_memory_buffers()
    assert _mixed(static, graphs["source"], cuda_graph=True) == shared
