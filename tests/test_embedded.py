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
        # llama.cpp's end-of-generation set: <|endoftext|>, <|im_end|> (EOS) and <reponame> (its
        # FIM repository token, which llama.cpp also ends generation on)
        (("tokens", "eos_token_ids"), [0, 2, 4]),
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


@pytest.fixture(scope="session")
def embedded_composed(embedded_export, tmp_path_factory):
    from onnxsample.composer import compose

    return compose(
        embedded_export.output, None, tmp_path_factory.mktemp("smol") / "composed.onnx", max_slots=2
    )


def _composed_greedy(path, ids: list[int], n: int) -> list[int]:
    """Greedy decoding through the composed graph: slot 0 samples the last row, present.* fed back."""
    import numpy as np
    import onnxruntime as ort

    from onnxsample.params import SamplingParams, pack_sampling_params

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    vocab = 49152
    feeds = pack_sampling_params(
        [SamplingParams(temperature=0.0)],
        "penalties,temperature,top_k,top_p,min_p,typical_p,dist",
        2,
    )
    feeds = {k: v for k, v in feeds.items() if k in inputs}
    feeds["sampler.uniform"] = np.full(2, 0.5, np.float32)
    feeds["sampler.prompt_mask"] = np.zeros((2, vocab), bool)
    feeds["sampler.output_counts"] = np.zeros((2, vocab), np.int32)
    pasts = {
        name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
        for name, i in inputs.items()
        if name.startswith("past_key_values.")
    }
    step, total, tokens = np.asarray([ids], np.int64), len(ids), []
    for _ in range(n):
        seq = step.shape[1]
        feeds.update(pasts)
        feeds["input_ids"] = step
        feeds["attention_mask"] = np.ones((1, total), np.int64)
        feeds["position_ids"] = np.arange(total - seq, total, dtype=np.int64)[None]
        feeds["sampler.row_index"] = np.asarray([seq, 0], np.int64)  # last position of batch row 0
        names = [o.name for o in session.get_outputs()]
        out = dict(zip(names, session.run(names, feeds), strict=True))
        token = int(out["sampler.next_token"][0])
        tokens.append(token)
        feeds["sampler.output_counts"] = out["sampler.output_counts_out"]
        pasts = {name: out[name.replace("past_key_values.", "present.")] for name in pasts}
        step, total = np.asarray([[token]], np.int64), total + 1
    return tokens


def test_composed_greedy_matches_the_plain_model(embedded_export, embedded_composed):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_export.output)
    ids = prompt_ids(tokenizer, "List three colours.")
    assert _composed_greedy(embedded_composed, ids, 24) == ort_greedy(
        embedded_export.model_path, ids, 24
    )


def test_composed_embedded_model_uses_the_moved_gather(embedded_composed):
    import onnx

    from onnxsample.composer import composed_metadata

    meta = composed_metadata(onnx.load(str(embedded_composed), load_external_data=False))
    assert meta.gather == "lm_head"


@pytest.fixture(scope="session")
def embedded_generator(embedded_export, embedded_composed):
    from onnxsample.engine.generator import Generator

    return Generator(embedded_composed, tokenizer=embedded_export.output)


def test_generator_greedy_matches_transformers_for_64_tokens(embedded_generator):
    import torch
    from transformers import AutoModelForCausalLM

    from onnxsample.params import SamplingParams

    prompt = "Write a long story about a dragon who learns to paint."
    [done] = embedded_generator.generate(prompt, SamplingParams(temperature=0), max_new_tokens=64)
    assert len(done.token_ids) == 64, done.finish_reason
    gguf = embedded_gguf()
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    assert done.token_ids == torch_greedy(model.eval(), done.prompt_token_ids, 64)


def test_seeded_sampling_repeats_inside_a_batch(embedded_generator):
    from onnxsample.params import SamplingParams

    mine = SamplingParams(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1, seed=2024
    )
    [alone] = embedded_generator.generate("Name a fruit and describe it.", mine, max_new_tokens=32)
    batch = embedded_generator.generate(
        ["Tell me about the moon in one long paragraph.", "Name a fruit and describe it."],
        [SamplingParams(temperature=0.9, seed=1), mine],
        max_new_tokens=32,
    )
    assert batch[1].token_ids == alone.token_ids
    assert batch[1].text == alone.text
