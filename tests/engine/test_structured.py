"""Structured output in the engine: a request's constraint (JSON schema, JSON object, regex,
grammar, choice) holds for every token it takes, sampled or greedy, alone or batched with
unconstrained requests; a bad constraint is refused at submit; end-of-sequence comes where the
grammar is complete."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from _structured_cases import SCHEMA, matches_schema

from onnxsample import Constraint, Engine, SamplingParams
from onnxsample.composer import compose
from onnxsample.errors import InvalidParameter
from onnxsample.text._grammar import GrammarVocabulary

CASES = [
    pytest.param(Constraint.json_schema(SCHEMA), matches_schema, id="json_schema"),
    pytest.param(
        Constraint.choice(["yes", "no", "maybe not"]),
        lambda text: text in ("yes", "no", "maybe not"),
        id="choice",
    ),
    pytest.param(
        Constraint.regex(r"[0-9]{3}-[0-9]{4}"),
        lambda text: re.fullmatch(r"[0-9]{3}-[0-9]{4}", text),
        id="regex",
    ),
    pytest.param(
        Constraint.grammar('root ::= "The " animal " sat."\nanimal ::= "cat" | "dog" | "bird"'),
        lambda text: re.fullmatch(r"The (cat|dog|bird) sat\.", text),
        id="gbnf",
    ),
    pytest.param(  # llama.cpp's code point escapes, and an escaped backslash before a "u"
        Constraint.grammar('root ::= "\\u00e9" [\\u00e0-\\u00ff]{2} "\\U0001F600\\x22\\\\u"'),
        lambda text: re.fullmatch(r'é[à-ÿ]{2}😀"\\u', text),
        id="gbnf-escapes",
    ),
    pytest.param(
        Constraint.grammar('start: "Answer: " /[a-z]{1,8}( [a-z]{1,8}){0,3}/ "."'),
        lambda text: re.fullmatch(r"Answer: [a-z]{1,8}( [a-z]{1,8}){0,3}\.", text),
        id="lark",
    ),
]
PARAMS = [
    pytest.param(SamplingParams(temperature=0), id="greedy"),
    pytest.param(SamplingParams(temperature=1.0, seed=7), id="sampled"),
    pytest.param(
        SamplingParams(temperature=1.3, top_k=20, logit_bias={35: 100.0}, seed=3),
        id="bias-cannot-reopen",
    ),
]


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize(("constraint", "check"), CASES)
def test_output_matches_its_constraint(engine, constraint, check, params):
    params = SamplingParams(**{**params.__dict__, "constraint": constraint})
    done = engine.submit("Say something:", params, max_new_tokens=48, chat=False).result(60)
    assert done.finish_reason == "eos", (done.text, done.finish_reason)
    assert check(done.text), done.text


def test_json_object_is_a_json_object(engine):
    params = SamplingParams(temperature=0, constraint=Constraint.json_object())
    done = engine.submit("{", params, max_new_tokens=120, chat=False).result(60)
    if done.finish_reason == "eos":
        assert isinstance(json.loads(done.text), dict), done.text
    else:  # cut by the token limit: still a prefix of an object, compactly written
        assert done.text.startswith("{") and "\n" not in done.text, done.text


def test_constrained_and_free_requests_batched_as_alone(engine):
    """A batch mixing constrained and unconstrained rows gives each the tokens it gets alone."""
    requests = [
        ("Once upon", SamplingParams(temperature=0)),
        ("Say:", SamplingParams(temperature=0, constraint=Constraint.json_schema(SCHEMA))),
        ("Hi", SamplingParams(temperature=0.8, seed=11)),
        ("Pick:", SamplingParams(seed=5, constraint=Constraint.choice(["alpha", "beta"]))),
    ]
    together = [engine.submit(p, sp, max_new_tokens=24, chat=False) for p, sp in requests]
    together = [r.result(60).token_ids for r in together]
    for (prompt, sp), tokens in zip(requests, together, strict=True):
        alone = engine.submit(prompt, sp, max_new_tokens=24, chat=False).result(60)
        assert alone.token_ids == tokens, prompt


def test_a_seed_repeats_a_constrained_sample(engine):
    params = SamplingParams(temperature=1.5, seed=99, constraint=Constraint.json_schema(SCHEMA))
    first = engine.submit("x", params, max_new_tokens=40, chat=False).result(60)
    again = engine.submit("x", params, max_new_tokens=40, chat=False).result(60)
    assert first.token_ids == again.token_ids
    assert matches_schema(first.text)


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (Constraint.json_schema({"type": "strin"}), "strin"),
        (Constraint.regex("a("), "regex"),
        (Constraint.grammar("root ::= missing"), "missing"),
        (Constraint.grammar("start: ("), "invalid"),
    ],
)
def test_a_bad_constraint_is_refused_at_submit(engine, constraint, message):
    before = engine.stats()
    with pytest.raises(InvalidParameter, match=message):
        engine.submit("x", SamplingParams(constraint=constraint), max_new_tokens=4, chat=False)
    after = engine.stats()
    assert engine.load()["waiting"] == 0
    assert (after.finished, after.failed) == (before.finished, before.failed)


# Constraints that compile and then cannot go on: (constraint, tokens it takes first, why)
DEAD_ENDS = [
    pytest.param(Constraint.grammar("root ::= root"), 0, "allows no token", id="empty-language"),
    pytest.param(  # "ab", then an x that never ends: llguidance gives up looking for an end
        Constraint.grammar('root ::= "ab" x\nx ::= "a" x'), 1, "llguidance failed", id="endless"
    ),
    pytest.param(  # once its lexer gave up, a copy of the compiled grammar allows no token
        Constraint.regex("a{1000000}"), 0, "llguidance failed", id="too-complex"
    ),
    pytest.param(  # forced text, drafted whole: the draft's last row allows end-of-sequence only
        Constraint.grammar('root ::= "The cat sat" x\nx ::= x'),
        3,
        "",
        id="forced-to-a-dead-end",
    ),
]


@pytest.fixture(scope="module")
def drafting(tiny_gqa_export, tmp_path_factory):
    """An engine that drafts (n-grams, and the tokens a grammar forces) and verifies the drafts."""
    folder = tmp_path_factory.mktemp("drafting")
    path = compose(tiny_gqa_export.output, None, folder / "d.onnx", max_slots=2, draft_tokens=4,
                   allowed_tokens=True)  # fmt: skip
    with Engine(path, tokenizer=tiny_gqa_export.output, threads=1, speculative="ngram") as e:
        yield e


@pytest.mark.parametrize("drafts", [False, True])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("constraint", "taken", "why"), DEAD_ENDS)
def test_a_constraint_that_cannot_go_on_fails_the_request(
    engine, drafting, constraint, taken, why, stream, drafts
):
    """Never an end-of-sequence that ends a text the constraint does not match, drafting or not:
    the request fails with InvalidParameter, after the tokens it took (streamed first); the
    engine goes on."""
    engine = drafting if drafts else engine
    before = engine.stats()
    request = engine.submit("x", SamplingParams(temperature=0, constraint=constraint),
                            max_new_tokens=8, chat=False)  # fmt: skip
    pieces = []
    with pytest.raises(InvalidParameter, match=f"invalid constraint: .*{why}.*, after"):
        for event in request if stream else ():
            pieces.append(event.token_id)
        request.result(60)
    assert not stream or len(pieces) >= taken, pieces
    assert engine.stats().failed == before.failed + 1
    fine = SamplingParams(temperature=0, constraint=Constraint.choice(["yes", "no"]))
    assert engine.submit("x", fine, max_new_tokens=8, chat=False).result(60).text in ("yes", "no")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Constraint.json_schema("{not json"), "not valid JSON"),
        (lambda: Constraint.json_schema([1]), "JSON object"),
        (lambda: Constraint.json_schema({"type": {1}}), "JSON values only"),
        (lambda: Constraint.json_schema({"maximum": float("nan")}), "JSON values only"),
        (lambda: Constraint.choice([]), "non-empty"),
        (lambda: Constraint.regex(""), "non-empty"),
        (lambda: SamplingParams(constraint="json").validate(), "Constraint"),
        (lambda: Constraint("xml").validate(), "unknown constraint kind"),
        (lambda: Constraint("regex", 5).validate(), "regex must be a non-empty string"),
        (lambda: Constraint("json_object", {"a": 1}).validate(), "takes no value"),
    ],
)
def test_malformed_constraints_raise(make, message):
    with pytest.raises(InvalidParameter, match=message):
        make()


def test_min_tokens_and_a_constraint_are_refused_together(engine):
    params = SamplingParams(min_tokens=3, constraint=Constraint.json_object())
    with pytest.raises(InvalidParameter, match="min_tokens cannot be combined"):
        engine.submit("x", params, chat=False)


@pytest.mark.parametrize(
    "gbnf",
    [
        "root ::= [\\U00010000-\\U0010FFFF]",  # every character past the BMP
        'root ::= "\\u0600" "\\u2028" "\\u0022" [\\u005D\\u002D]',  # not printable; escaped
    ],
)
def test_gbnf_code_point_escapes_compile(engine, gbnf):
    """As llama.cpp reads them; llguidance's converter would drop their leading zeros."""
    vocabulary = GrammarVocabulary(engine.tokenizer, engine.meta.vocab_size, engine.info.eos_ids)
    assert vocabulary.matcher(Constraint.grammar(gbnf).grammar_text()).failure is None


def test_a_draft_is_cut_before_end_of_sequence(engine):
    """A draft that runs past where the grammar may end stops there, and walking it leaves the
    matcher where it was (llguidance does not count end-of-sequence among the tokens to step
    back)."""
    tokenizer = engine.tokenizer
    vocabulary = GrammarVocabulary(tokenizer, engine.meta.vocab_size, engine.info.eos_ids)
    text = "The cat"
    matcher = vocabulary.matcher(Constraint.regex(text).grammar_text())
    tokens = tokenizer.encode(text, add_special_tokens=False)
    eos = sorted(engine.info.eos_ids)[0]
    assert matcher.valid_prefix([*tokens, eos, *tokens]) == tokens
    fresh = np.zeros(engine.meta.vocab_size, bool)
    matcher.fill(fresh)
    rows = np.ones((len(tokens) + 1, engine.meta.vocab_size), bool)
    matcher.fill_along([*tokens, eos], rows)
    assert set(np.flatnonzero(rows[len(tokens) - 1])) <= set(engine.info.eos_ids)  # complete
    again = np.zeros(engine.meta.vocab_size, bool)
    matcher.fill(again)
    np.testing.assert_array_equal(again, fresh)  # still at the start
    assert all(matcher.consume(t) for t in tokens) and matcher.done


_A = {"a": {"type": "integer"}}


@pytest.mark.parametrize(
    ("schema", "text", "taken"),
    [
        ({"type": "object", "properties": _A}, '{"a": 1}', True),
        ({"type": "object", "properties": _A}, '{"a": 1, "b": 2}', False),
        ({"type": "object", "properties": _A, "additionalProperties": True}, '{"a": 1, "b": 2}',
         True),
        ({"type": "object", "properties": {"o": {"type": "object", "properties": _A}}},
         '{"o": {"a": 1, "b": 2}}', False),
        ({"type": "array", "items": {"type": "object", "properties": _A}}, '[{"a": 1, "c": 3}]',
         False),
        ({"$defs": {"A": {"type": "object", "properties": _A}}, "$ref": "#/$defs/A"},
         '{"a": 1, "b": 2}', False),
        ({"type": "object", "properties": {"properties": {"type": "integer"}}},  # a key's name
         '{"properties": 1}', True),
        ({"type": "object"}, '{"b": 2}', True),  # no properties named: any object
    ],
    ids=["named", "other-key", "other-keys-allowed", "nested", "in-items", "in-defs",
         "a-key-named-properties", "any-object"],
)  # fmt: skip
def test_an_object_takes_only_the_keys_it_names_unless_it_says_otherwise(
    engine, schema, text, taken
):
    """As llama.cpp's converter and vLLM's default backend read a schema (JSON Schema's own
    default lets other keys in: a small model added keys of its own)."""
    tokenizer = engine.tokenizer
    vocabulary = GrammarVocabulary(tokenizer, engine.meta.vocab_size, engine.info.eos_ids)
    matcher = vocabulary.matcher(Constraint.json_schema(schema).grammar_text())
    tokens = tokenizer.encode(text, add_special_tokens=False)
    whole = matcher.valid_prefix(tokens) == tokens
    assert (whole and all(matcher.consume(t) for t in tokens) and matcher.done) == taken


def test_a_model_without_the_mask_refuses_constraints(tiny_gqa_export, tmp_path):
    path = compose(tiny_gqa_export.output, None, tmp_path / "plain.onnx", max_slots=2)
    params = SamplingParams(constraint=Constraint.json_object())
    with (
        Engine(path, tokenizer=tiny_gqa_export.output, threads=1) as e,
        pytest.raises(InvalidParameter, match="--allowed-tokens"),
    ):
        e.submit("x", params, chat=False)


def test_space_prefixed_tokens_read_as_spaces(engine):
    """The exports' tokenizer.json has a decoder that starts with ByteFallback: read from there,
    'Ġb' would be a literal character and every space-prefixed token forbidden. The vocabulary is
    given as each token's bytes instead, so the grammar allows the tokens a text tokenises to."""
    tokenizer = engine.tokenizer
    vocabulary = GrammarVocabulary(tokenizer, engine.meta.vocab_size, engine.info.eos_ids)
    text = "The quick brown fox jumps over the lazy dog."
    matcher = vocabulary.matcher(Constraint.regex(re.escape(text)).grammar_text())
    row = np.zeros(engine.meta.vocab_size, bool)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any(tokenizer.token_to_text(i).startswith(" ") for i in ids)
    for token in ids:
        matcher.fill(row)
        assert row[token], tokenizer.token_to_text(token)
        assert matcher.consume(token)
    matcher.fill(row)
    assert matcher.done and set(np.flatnonzero(row)) <= set(engine.info.eos_ids)


@pytest.mark.parametrize("option", ['He said "hi"', "back\\slash", "ünïcode ✓", "new\nline", "a|b"])
def test_choices_are_taken_literally(engine, option):
    """A choice is matched as the exact text, whatever quotes, escapes or grammar syntax it holds."""
    tokenizer = engine.tokenizer
    vocabulary = GrammarVocabulary(tokenizer, engine.meta.vocab_size, engine.info.eos_ids)
    matcher = vocabulary.matcher(Constraint.choice([option, "other"]).grammar_text())
    row = np.zeros(engine.meta.vocab_size, bool)
    for token in tokenizer.encode(option, add_special_tokens=False):
        matcher.fill(row)
        assert row[token]
        assert matcher.consume(token)
    assert matcher.done


@pytest.mark.parametrize(("option", "other"), [("a|b", "b"), ("x.", "xy"), ("(y)", "y"),
                                               ("a+", "aa"), ("[0-9]", "5")])  # fmt: skip
def test_a_choice_is_no_pattern(engine, option, other):
    """Its characters are text: what they would match as a regex is refused."""
    tokenizer = engine.tokenizer
    vocabulary = GrammarVocabulary(tokenizer, engine.meta.vocab_size, engine.info.eos_ids)
    matcher = vocabulary.matcher(Constraint.choice([option]).grammar_text())
    tokens = tokenizer.encode(other, add_special_tokens=False)
    assert matcher.valid_prefix(tokens) != tokens


def test_a_long_list_of_choices_compiles_as_its_regex_does(engine):
    """60,000 options took 22 s as one grammar rule (a request that held the server's thread
    pool and its shutdown for minutes): as a regex, what a regex of them costs."""
    tokenizer = engine.tokenizer
    vocabulary = GrammarVocabulary(tokenizer, engine.meta.vocab_size, engine.info.eos_ids)
    options = [f"option {i}" for i in range(60_000)]
    matcher = vocabulary.matcher(Constraint.choice(options).grammar_text())
    for token in tokenizer.encode("option 41999", add_special_tokens=False):
        assert matcher.consume(token)
    assert matcher.done


def test_a_token_the_grammar_refuses_never_reaches_the_text(engine):
    """Whatever let it through (a mask is the graph's, a host's or a draft's choice is not), a
    refused token fails the sequence before it is taken: the text never holds what does not
    match, and the matcher is where it was."""
    from onnxsample.engine._sequence import Sequence
    from onnxsample.engine.request import Request
    from onnxsample.text import TextStream
    from onnxsample.text._stops import StopMatcher

    tokenizer = engine.tokenizer
    vocabulary = GrammarVocabulary(tokenizer, engine.meta.vocab_size, engine.info.eos_ids)
    [refused] = tokenizer.encode("No", add_special_tokens=False)[:1]
    seq = Sequence(
        Request("r", 0, lambda: None),
        tokenizer.encode("Is the sky blue?"),
        SamplingParams(),
        8,
        TextStream(tokenizer),
        StopMatcher([]),
        seed=1,
        eos_ids=frozenset(engine.info.eos_ids),
        matcher=vocabulary.matcher(Constraint.choice(["yes", "no"]).grammar_text()),
    )
    failure = seq.constraint_failure(refused)
    assert failure is not None and f"the grammar refused token {refused}" in str(failure)
    assert seq.ids == []
    fresh = vocabulary.matcher(Constraint.choice(["yes", "no"]).grammar_text())
    rows = np.zeros((2, engine.meta.vocab_size), bool)
    seq.matcher.fill(rows[0])
    fresh.fill(rows[1])
    np.testing.assert_array_equal(rows[0], rows[1])


def test_a_grammar_compiled_once_serves_independent_matchers(engine):
    """The same grammar again (n choices, a service's one schema) is a copy of the compiled
    matcher: each copy goes its own way."""
    vocabulary = GrammarVocabulary(engine.tokenizer, engine.meta.vocab_size, engine.info.eos_ids)
    grammar = Constraint.json_schema(SCHEMA).grammar_text()
    first, second = vocabulary.matcher(grammar), vocabulary.matcher(grammar)
    for token in engine.tokenizer.encode('{"ok": true', add_special_tokens=False):
        assert first.consume(token)
    rows = np.zeros((2, engine.meta.vocab_size), bool)
    first.fill(rows[0])
    second.fill(rows[1])
    fresh = np.zeros(engine.meta.vocab_size, bool)
    vocabulary.matcher(grammar).fill(fresh)
    np.testing.assert_array_equal(rows[1], fresh)
    assert not np.array_equal(rows[0], rows[1])
