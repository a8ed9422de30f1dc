"""Integration: the real embedded SmolLM2-135M-Instruct, exported once and shared with `make run`."""

from __future__ import annotations

import pytest

from onnxsample.exporters import embedded_gguf
from onnxsample.exporters._verify import ort_greedy, prompt_ids, torch_greedy

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (("source", "kind"), "embedded"),
        (("model", "vocab_size"), 49152),
        (("model", "num_layers"), 30),
        (("model", "num_key_value_heads"), 3),
        (("io", "kv_cache", "head_dim"), 64),
        (("tokens", "eos_token_ids"), [2]),
        (("tokens", "add_bos_token"), False),
        (("verify", "ok"), True),
    ],
)
def test_manifest(embedded_export, path, expected):
    value = embedded_export.manifest
    for key in path:
        value = value[key]
    assert value == expected


def test_tokenizer_matches_the_original_model(embedded_export):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_export.output)
    assert tokenizer("Hello world").input_ids == [19556, 905]  # no BOS, as SmolLM2's own tokenizer
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True
    )
    assert ids.count(1) == 3  # <|im_start|> once per turn (system, user, assistant), not doubled
    assert tokenizer.decode([2]) == "<|im_end|>" and tokenizer.eos_token_id == 2


def test_greedy_matches_transformers_on_32_tokens(embedded_export):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf()
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(embedded_export.output)
    ids = prompt_ids(tokenizer, "Write a short poem about the sea.")
    reference = torch_greedy(model.eval(), ids, 32)
    assert ort_greedy(embedded_export.model_path, ids, 32) == reference
