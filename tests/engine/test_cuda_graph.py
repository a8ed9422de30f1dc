"""The CUDA-graph engine's calls, checked for their numbers on the CPU: a static chain gives the
branching chain's tokens and logprobs, and so do fixed-shape decode steps (every slot, the mask as
wide as the KV buffer, inputs written in place into buffers bound once) — the calls a CUDA graph
replays. The CPU provider ignores `gpu_graph_id`, so here they run uncaptured; the simulated device
(tests/cuda_sim) shows the capture itself."""

from __future__ import annotations

import dataclasses

import pytest

import onnxsample.engine._session as session_module
from onnxsample import Generator, InvalidParameter, SamplingParams
from onnxsample.composer import compose
from onnxsample.engine._graphs import CapturedDecode

OPTIONS = {"max_slots": 4, "top_logprobs": 3, "max_bias": 4, "prompt_logprobs": True}
PROMPTS = [
    "Hello there",
    "The quick brown fox jumps over",
    "One two three four",
    "a",
    "Far away",
    "Once upon a time",
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
    assert none == 0 and redrawn >= 20  # the last two requests' tokens, at least
    monkeypatch.setattr(session_module, "GRAPH_DEVICES", ("cuda", "cpu"))
    assert _run(graphs["static"], graphs["source"], cuda_graph=True) == (static, redrawn)


def test_decode_steps_bind_the_rows_of_the_occupied_slots(graphs, monkeypatch, batched_as_alone):
    """Three requests of 16, 10 and 4 tokens take slots 0, 1 and 2: the decode steps bind the
    first 4 rows (model and sampler), then 2 once slot 2 is free, then 1 (a graph each), and
    every request keeps the tokens it has alone and under the branching chain."""
    seen = []
    run = CapturedDecode.run

    def spy(self, call, uniform, rows):
        assert rows == call.input_ids.shape[0]  # the sampler's rows are the model's
        seen.append(rows)
        return run(self, call, uniform, rows)

    monkeypatch.setattr(CapturedDecode, "run", spy)
    monkeypatch.setattr(session_module, "GRAPH_DEVICES", ("cuda", "cpu"))
    prompts, lengths = PROMPTS[:3], [16, 10, 4]
    params = [dataclasses.replace(p, ignore_eos=True) for p in PARAMS[1:4]]

    def alone(model, **options) -> list:
        with Generator(model, tokenizer=graphs["source"], threads=1, **options) as generator:
            if options:
                batched_as_alone(generator, prompts, params, lengths)
            return [
                generator.generate(prompt, p, max_new_tokens=n, chat=False)[0].token_ids
                for prompt, p, n in zip(prompts, params, lengths, strict=True)
            ]

    reference = alone(graphs["branching"])
    assert alone(graphs["static"], cuda_graph=True) == reference
    assert {4, 2, 1} <= set(seen), seen
    assert seen.index(1) > seen.index(2) > seen.index(4)


def test_a_sequence_moves_down_when_the_slots_below_it_free(graphs, monkeypatch):
    """Requests of 3, 4 and 24 tokens take slots 0, 1 and 2; once the first ends, the third
    (with penalties: its counts and prompt mask go with it) moves to slot 0, and the steps bind
    2 rows, then 1, instead of 4. Its tokens are the ones it has alone."""
    seen = []
    run = CapturedDecode.run

    def spy(self, call, uniform, rows):
        seen.append(rows)
        return run(self, call, uniform, rows)

    monkeypatch.setattr(CapturedDecode, "run", spy)
    monkeypatch.setattr(session_module, "GRAPH_DEVICES", ("cuda", "cpu"))
    prompts, lengths = PROMPTS[:3], [3, 4, 24]
    params = [dataclasses.replace(p, ignore_eos=True) for p in (PARAMS[0], PARAMS[1], PARAMS[2])]
    with Generator(
        graphs["static"], tokenizer=graphs["source"], threads=1, cuda_graph=True
    ) as generator:
        engine = generator.engine
        prepared = [
            engine.prepare(p, sp, n, None, False, None, i)
            for i, (p, sp, n) in enumerate(zip(prompts, params, lengths, strict=True))
        ]
        together = [r.result(timeout=300) for r in engine.enqueue(prepared)]
        moved = engine.stats().moved
        [alone] = generator.generate(prompts[2], params[2], max_new_tokens=24, chat=False)
    assert moved == 1
    assert seen[0] == 4 and 2 in seen and seen.count(1) >= 24 - 4, seen
    assert together[2].token_ids == alone.token_ids


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
