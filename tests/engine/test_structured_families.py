"""Structured output on the GGUF files llama.cpp's tools make (tests/_llama_cpp_models.py), with
each family's real tokenizer read from the file: a constraint holds whatever the vocabulary. A
SentencePiece vocabulary (Llama 2, Mistral, Phi-3) puts a space before a text it tokenises; the
grammar's own text must not get one ("no" came out "n o", a JSON object never opened)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import _llama_cpp_models as models
import pytest
from _exports import export_beside

from onnxsample import Constraint, Engine, SamplingParams
from onnxsample.composer import compose

pytestmark = pytest.mark.slow  # an export and a composition per family (cached exports)

FAMILIES = ["llama", "mistral", "phi3", "gemma3", "qwen2"]  # SentencePiece, then byte-level BPE
CASES = [
    (Constraint.choice(["yes", "no"]), lambda text: text in ("yes", "no")),
    (Constraint.regex("🦙{2}[0-9]{2}"), lambda text: re.fullmatch("🦙{2}[0-9]{2}", text)),
    (
        Constraint.grammar('root ::= "The answer is " ("yes" | "no") "."'),
        lambda text: re.fullmatch(r"The answer is (yes|no)\.", text),
    ),
    (
        Constraint.json_schema(
            {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
                "additionalProperties": False,
            }
        ),
        lambda text: isinstance(json.loads(text)["ok"], bool),
    ),
]


@pytest.fixture(scope="module", params=FAMILIES)
def family_engine(request, llama_cpp, tmp_path_factory):
    path = models.gguf(request.param, "Q8_0", llama_cpp)
    folder = Path(export_beside(path, "Q8_0").output)
    composed = tmp_path_factory.mktemp(request.param) / "composed.onnx"
    compose(folder, None, composed, max_slots=2, allowed_tokens=True)
    with Engine(composed, tokenizer=folder, threads=1) as engine:
        yield engine


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constraints_hold_on_every_vocabulary(family_engine, temperature):
    for i, (constraint, check) in enumerate(CASES):
        params = SamplingParams(temperature=temperature, seed=i, constraint=constraint)
        done = family_engine.submit("Answer:", params, max_new_tokens=24, chat=False).result(120)
        assert done.finish_reason == "eos" and check(done.text), (constraint, done.text)
