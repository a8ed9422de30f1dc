"""SamplerChain, SamplingParams validation and parameter packing."""

from __future__ import annotations

import numpy as np
import pytest

from onnxsample import (
    InvalidParameter,
    SamplerChain,
    SamplingParams,
    build_sampler_model,
    pack_sampling_params,
    sampler_feeds,
)

FULL = "logit_bias,penalties,temperature,top_k,top_p,min_p,typical_p,dist"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            "penalties,temperature,top_k,top_p,min_p,dist",
            "penalties,temperature,top_k,top_p,min_p,dist",
        ),
        ("dist,top_p,temperature", "temperature,top_p,dist"),
        (" top_k , dist ", "top_k,dist"),
        (["min_p", "top_k", "dist"], "top_k,min_p,dist"),
        ("", ""),
        (FULL, FULL),
    ],
)
def test_chain_is_canonical_and_round_trips(spec, expected):
    chain = SamplerChain(spec)
    assert str(chain) == expected
    assert SamplerChain(str(chain)) == chain
    assert list(chain) == [n for n in expected.split(",") if n]


def test_default_chain_is_full():
    assert SamplerChain() == SamplerChain.full()
    assert str(SamplerChain.full()) == FULL
    assert not SamplerChain.greedy().samples
    assert SamplerChain.full().samples


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("top_k,topp", "unknown sampler 'topp'"),
        ("greedy", "unknown sampler 'greedy'"),
        ("top_k,dist,top_k", "sampler 'top_k' is listed twice"),
    ],
)
def test_chain_rejects_bad_names_and_lists_valid_ones(spec, message):
    with pytest.raises(InvalidParameter) as err:
        SamplerChain(spec)
    assert message in str(err.value)
    assert "valid samplers: " + FULL.replace(",", ", ") in str(err.value)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -0.1, "temperature must be a finite float32 >= 0, got -0.1"),
        ("temperature", float("inf"), "temperature must be a finite float32 >= 0, got inf"),
        ("temperature", float("nan"), "temperature must be a finite float32 >= 0, got nan"),
        ("temperature", 1e39, "temperature must be a finite float32 >= 0, got 1e+39"),  # inf
        (
            "repetition_penalty",
            1e308,
            "repetition_penalty must be a finite float32 > 0, got 1e+308",
        ),
        ("top_k", -1, "top_k must be an integer >= 0 (0 disables), got -1"),
        ("top_k", 2.5, "top_k must be an integer >= 0 (0 disables), got 2.5"),
        ("top_p", 1.5, "top_p must be in (0, 1], got 1.5"),
        ("top_p", 0.0, "top_p must be in (0, 1], got 0.0"),
        ("min_p", -0.01, "min_p must be in [0, 1], got -0.01"),
        ("min_p", 1.01, "min_p must be in [0, 1], got 1.01"),
        ("typical_p", 0.0, "typical_p must be in (0, 1], got 0.0"),
        ("repetition_penalty", 0.0, "repetition_penalty must be a finite float32 > 0, got 0.0"),
        ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2], got 2.5"),
        ("frequency_penalty", -2.01, "frequency_penalty must be in [-2, 2], got -2.01"),
        ("top_logprobs", 21, "top_logprobs must be in [0, 20], got 21"),
        ("logit_bias", {5: 101.0}, "logit_bias[5] must be in [-100, 100], got 101.0"),
        ("logit_bias", {100: 1.0}, "logit_bias token id must be in [0, 100), got 100"),
        ("logit_bias", {-1: 1.0}, "logit_bias token id must be in [0, 100), got -1"),
        ("seed", "abc", "seed must be an integer in [0, 2**64), got 'abc'"),
        ("seed", -1, "seed must be an integer in [0, 2**64), got -1"),
        ("seed", 2**64, f"seed must be an integer in [0, 2**64), got {2**64}"),
        ("seed", 1.5, "seed must be an integer in [0, 2**64), got 1.5"),
        ("prompt_logprobs", 21, "prompt_logprobs must be None or in [0, 20], got 21"),
        ("prompt_logprobs", -1, "prompt_logprobs must be None or in [0, 20], got -1"),
        ("ignore_eos", "yes", "ignore_eos must be a bool, got 'yes'"),
        # an integer past every float: refused by name, not an OverflowError
        (
            "temperature",
            10**400,
            "temperature must be a finite float32 >= 0, got an integer of 1329 bits",
        ),
        (
            "logit_bias",
            {5: 10**400},
            "logit_bias[5] must be in [-100, 100], got an integer of 1329 bits",
        ),
    ],
)
def test_validate_rejects_with_vllm_style_message(field, value, message):
    """Against a vocabulary of 100; without one, a token id's bound is int64's."""
    if field == "logit_bias" and "token id" in message and -1 in value:
        with pytest.raises(InvalidParameter, match=r"must be in \[0, 2\*\*63\), got -1$"):
            SamplingParams(**{field: value}).validate()
    with pytest.raises(InvalidParameter) as err:
        SamplingParams(**{field: value}).validate(vocab_size=100)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.0, top_k=1, top_p=1.0, min_p=1.0, typical_p=1.0),
        SamplingParams(top_p=1e-6, min_p=0.0, repetition_penalty=1e-3, presence_penalty=-2.0),
        SamplingParams(frequency_penalty=2.0, logit_bias={0: -100.0, 99: 100.0}, top_logprobs=20),
        SamplingParams(seed=123, logprobs=True),
        SamplingParams(seed=0, prompt_logprobs=0),
        SamplingParams(seed=2**64 - 1, prompt_logprobs=20, ignore_eos=True),
    ],
)
def test_validate_accepts_the_range_ends(params):
    assert params.validate(vocab_size=100) is params


def test_pack_neutral_values_for_inactive_slots():
    arrays = pack_sampling_params([None, SamplingParams(top_k=5, top_p=0.5)], FULL, 3, max_bias=2)
    assert arrays["sampler.temperature"].tolist() == [1.0, 1.0, 1.0]
    assert arrays["sampler.top_k"].tolist() == [0, 5, 0]
    assert arrays["sampler.top_k"].dtype == np.int64
    assert arrays["sampler.top_p"].tolist() == [1.0, 0.5, 1.0]
    assert arrays["sampler.min_p"].tolist() == [0.0] * 3
    assert arrays["sampler.typical_p"].tolist() == [1.0] * 3
    assert arrays["sampler.repetition_penalty"].tolist() == [1.0] * 3
    assert arrays["sampler.bias_ids"].tolist() == [[-1, -1]] * 3
    assert arrays["sampler.bias_values"].dtype == np.float32


@pytest.mark.parametrize(
    ("top_k", "vocab_size", "packed"),
    [
        (99, 100, 99),
        (100, 100, 0),  # k ≥ V keeps every token, as k = 0 does
        (10**30, 100, 0),
        (10**30, None, 2**62),  # the vocabulary unknown: one int64 past any
    ],
)
def test_pack_a_top_k_past_the_vocabulary_as_off(top_k, vocab_size, packed):
    arrays = pack_sampling_params([SamplingParams(top_k=top_k)], FULL, 1, vocab_size=vocab_size)
    assert arrays["sampler.top_k"].tolist() == [packed]


def test_pack_only_the_chains_inputs():
    arrays = pack_sampling_params([SamplingParams(top_k=3)], "top_k,dist", 2)
    assert sorted(arrays) == ["sampler.top_k"]


@pytest.mark.parametrize(
    ("slots", "packed"),
    [
        ([SamplingParams(temperature=0.7, top_p=0.9)], None),  # a static chain reads none
        ([SamplingParams(temperature_last=True)], [True, False]),
        ([None, SamplingParams(temperature=0.7, top_p=0.9, temperature_last=True)], [False, True]),
    ],
)
def test_pack_temperature_last_only_where_a_slot_sets_it(slots, packed):
    arrays = pack_sampling_params(slots, FULL, 2)
    got = arrays.get("sampler.temperature_last")
    assert (got if got is None else got.tolist()) == packed


def test_pack_bias_table():
    arrays = pack_sampling_params(
        [SamplingParams(logit_bias={7: 2.5, 3: -1.0})], FULL, 1, max_bias=3
    )
    assert arrays["sampler.bias_ids"].tolist() == [[3, 7, -1]]
    assert arrays["sampler.bias_values"].tolist() == [[-1.0, 2.5, 0.0]]


@pytest.mark.parametrize(
    ("chain", "params", "kwargs", "message"),
    [
        ("temperature,dist", SamplingParams(top_k=40), {}, "top_k=40 needs the top_k sampler"),
        (  # every value the chain cannot apply at once, not one a try (llama.cpp's defaults)
            "temperature,dist",
            SamplingParams(top_k=40, top_p=0.95, min_p=0.05),
            {},
            "top_k=40, top_p=0.95, min_p=0.05 need the top_k, top_p, min_p samplers, which the "
            "chain 'temperature,dist' does not contain",
        ),
        (
            "top_k,dist",
            SamplingParams(temperature=0.0),
            {},
            "temperature=0.0 needs the temperature",
        ),
        ("dist", SamplingParams(repetition_penalty=1.2), {}, "needs the penalties sampler"),
        ("top_k,dist", SamplingParams(typical_p=0.9), {}, "typical_p=0.9 needs the typical_p"),
        ("top_k", SamplingParams(), {}, "needs the dist sampler"),
        (
            "dist",
            SamplingParams(logit_bias={1: 1.0}),
            {},
            "logit_bias needs the logit_bias sampler",
        ),
        (
            FULL,
            SamplingParams(logit_bias={1: 1.0, 2: 2.0}),
            {"max_bias": 1},
            "more than max_bias=1",
        ),
        (FULL, SamplingParams(top_logprobs=5), {"top_logprobs": 2}, "top_logprobs=5 is more"),
        (FULL, SamplingParams(top_p=2.0), {}, "top_p must be in (0, 1], got 2.0"),
    ],
)
def test_pack_rejects_what_the_graph_cannot_do(chain, params, kwargs, message):
    with pytest.raises(InvalidParameter) as err:
        pack_sampling_params([params], chain, 2, **kwargs)
    assert message in str(err.value)


def test_pack_rejects_too_many_slots():
    with pytest.raises(InvalidParameter, match="more than max_slots=1"):
        pack_sampling_params([None, None], "dist", 1)


def test_greedy_chain_accepts_temperature_zero():
    assert (
        pack_sampling_params([SamplingParams(temperature=0.0)], "top_k", 1)["sampler.top_k"][0] == 0
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vocab_size": 0}, "vocab_size must be an integer >= 1"),
        ({"max_slots": 0}, "max_slots must be an integer >= 1, got 0"),
        ({"top_logprobs": 21}, "top_logprobs must be in [0, 20]"),
        ({"top_logprobs": 9, "vocab_size": 8}, "top_logprobs must be <= vocab_size"),
        ({"max_bias": -1}, "max_bias must be an integer >= 0, got -1"),
        ({"output_candidates": 9, "vocab_size": 8}, "output_candidates must be in [0, 8]"),
        ({"chain": "dist", "max_bias": 2}, "max_bias=2 needs logit_bias in the chain"),
        ({"chain": "dist,dist"}, "listed twice"),
    ],
)
def test_build_rejects_bad_options(kwargs, message):
    options = {"chain": FULL, "vocab_size": 8, "max_slots": 2, **kwargs}
    chain, vocab, slots = options.pop("chain"), options.pop("vocab_size"), options.pop("max_slots")
    with pytest.raises(InvalidParameter) as err:
        build_sampler_model(chain, vocab, slots, **options)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("slots", "options", "message"),
    [
        ([{"temperature": 0.5}], {}, "each slot is SamplingParams or None, got dict"),
        ([SamplingParams()], {"max_slots": "2"}, "max_slots must be an integer >= 1, got '2'"),
        ([SamplingParams()], {"max_slots": 0}, "max_slots must be an integer >= 1, got 0"),
        ([SamplingParams()], {"max_bias": 1.5}, "max_bias must be an integer >= 0, got 1.5"),
        ([SamplingParams()], {"max_bias": -1}, "max_bias must be an integer >= 0, got -1"),
    ],
)
def test_packing_refuses_what_no_graph_takes(slots, options, message):
    options = {"max_slots": 2, **options}
    with pytest.raises(InvalidParameter) as err:
        pack_sampling_params(slots, "logit_bias,dist", **options)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("logits", "options", "message"),
    [
        (np.zeros(5), {}, r"logits must be \[rows, vocab\], got shape \(5,\)"),
        ([["a"]], {}, "logits must be numbers"),
        (np.zeros((2, 5)), {"uniform": [0.5, 0.5]}, r"uniform must be \[1\], got shape \(2,\)"),
        (np.zeros((2, 5)), {"uniform": [1.5]}, r"uniform must be in \[0, 1\]"),
        (np.zeros((2, 5)), {"row_index": [7]}, "row_index must index the 2 rows of logits"),
        (np.zeros((2, 5)), {"prompt_mask": [[1]]}, r"prompt_mask must be \[1, 5\]"),
    ],
)
def test_sampler_feeds_refuse_what_the_model_cannot_take(logits, options, message):
    """A typed error naming the input, not numpy's IndexError or a feed the session refuses."""
    with pytest.raises(InvalidParameter, match=message):
        sampler_feeds("penalties,dist", logits, [SamplingParams()], **options)


@pytest.mark.parametrize("field", ["temperature", "seed", "logit_bias"])
def test_an_integer_str_cannot_print_is_named_by_its_size(field):
    """Past 4,300 digits Python's str() refuses an integer: the message gives its size instead."""
    value = {10**5000: 1.0} if field == "logit_bias" else 10**5000
    with pytest.raises(InvalidParameter, match="got an integer of 16610 bits"):
        SamplingParams(**{field: value}).validate()
