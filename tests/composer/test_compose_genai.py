"""Integration: the composer on a model written by onnxruntime-genai's model builder.

genai's layout is not optimum's: GroupQueryAttention (com.microsoft) with the KV cache as
[B, kv_heads, past, head_dim] (head_dim a symbolic dimension), `attention_mask` over past + current
tokens, no `position_ids`, default opset 22 and the weights in `model.onnx.data`. The model is the
embedded SmolLM2-135M-Instruct, built by `make genai-model` (scripts/build_genai_model.sh, in its own
.venv-genai because the builder needs transformers 5); without it every test here skips.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxsample.chain import SamplerChain
from onnxsample.composer import compose, composed_metadata
from onnxsample.params import SamplingParams, pack_sampling_params

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GENAI_DIR = ROOT / "artifacts" / "cache" / "genai-smollm2-fp32"
GENAI_MODEL = GENAI_DIR / "model.onnx"
MAX_SLOTS = 4
VOCAB = 49152
PROMPTS = ("The capital of France is", "def fibonacci(n):")
GREEDY_STEPS = 8
# ONNX Runtime registers this contrib op in the ONNX domain and genai's builder emits it there; the
# ONNX checker does not know it, so the checker here sees it moved to com.microsoft.
ORT_OPS_IN_ONNX_DOMAIN = frozenset({"SimplifiedLayerNormalization"})


def _session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # the CI machine has 2 shared cores
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@pytest.fixture(scope="module")
def genai_model() -> Path:
    if not GENAI_MODEL.is_file():
        pytest.skip(
            f"no onnxruntime-genai model at {GENAI_MODEL.relative_to(ROOT)}: "
            "build it with `make genai-model` (needs PyPI for .venv-genai)"
        )
    return GENAI_MODEL


@pytest.fixture(scope="module")
def head_dim(genai_model: Path) -> int:
    """The KV head size: the model's inputs name it only symbolically (`kv_cache_dim`)."""
    config = json.loads((genai_model.parent / "genai_config.json").read_text())
    return int(config["model"]["decoder"]["head_size"])


@pytest.fixture(scope="module")
def plain(genai_model: Path):
    return _session(genai_model)


@pytest.fixture(scope="module")
def prompt_ids(embedded_export) -> np.ndarray:
    """Both prompts, tokenized by the embedded model's tokenizer and cut to one length (no padding)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_export.output)
    ids = [tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS]
    length = min(len(i) for i in ids)
    assert length >= 3, ids
    return np.array([i[:length] for i in ids], dtype=np.int64)


@pytest.fixture(scope="module", params=["auto", "logits"])
def composed(request, genai_model: Path, tmp_path_factory):
    """(path, session) of the genai model composed with the full chain, once per gather mode."""
    out = tmp_path_factory.mktemp(f"genai-{request.param}") / "c.onnx"
    path = compose(genai_model, None, out, max_slots=MAX_SLOTS, gather=request.param)
    yield path, _session(path)
    path.unlink(missing_ok=True)  # 540 MB; pytest keeps its last three temporary folders


def _model_feeds(session, ids: np.ndarray, head_dim: int, past: dict | None) -> dict:
    """input_ids, attention_mask over past + current, and the (empty or given) KV cache."""
    batch, length = ids.shape
    past_length = 0 if past is None else past["past_key_values.0.key"].shape[2]
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones((batch, past_length + length), dtype=np.int64),
    }
    for value in session.get_inputs():
        if value.name.startswith("past_key_values."):
            empty = np.zeros((batch, value.shape[1], 0, head_dim), dtype=np.float32)
            feeds[value.name] = empty if past is None else past[value.name]
    return feeds


def _sampler_feeds(session, rows: list[int], counts: np.ndarray | None = None) -> dict:
    """Greedy parameters for the first len(rows) slots (the rest inactive), uniforms, zero state."""
    chain = SamplerChain.full()
    feeds = pack_sampling_params([SamplingParams(temperature=0.0)] * len(rows), chain, MAX_SLOTS)
    row_index = np.zeros(MAX_SLOTS, dtype=np.int64)
    row_index[: len(rows)] = rows
    feeds["sampler.row_index"] = row_index
    feeds["sampler.uniform"] = np.full(MAX_SLOTS, 0.5, dtype=np.float32)
    feeds["sampler.prompt_mask"] = np.zeros((MAX_SLOTS, VOCAB), dtype=bool)
    feeds["sampler.output_counts"] = (
        np.zeros((MAX_SLOTS, VOCAB), dtype=np.int32) if counts is None else counts
    )
    wanted = {v.name for v in session.get_inputs() if v.name.startswith("sampler.")}
    assert wanted <= feeds.keys(), f"sampler inputs not fed: {sorted(wanted - feeds.keys())}"
    return {k: v for k, v in feeds.items() if k in wanted}


def _run(session, feeds: dict) -> dict[str, np.ndarray]:
    names = [v.name for v in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _past(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        "past_key_values." + k.removeprefix("present."): v
        for k, v in outputs.items()
        if k.startswith("present.")
    }


def _greedy_plain(session, ids: np.ndarray, head_dim: int, steps: int) -> list[list[int]]:
    tokens, past, current = [], None, ids
    for _ in range(steps):
        out = _run(session, _model_feeds(session, current, head_dim, past))
        current = out["logits"][:, -1].argmax(axis=-1).astype(np.int64)[:, None]
        tokens.append(current[:, 0].tolist())
        past = _past(out)
    return [list(t) for t in zip(*tokens, strict=True)]


def _greedy_composed(session, ids: np.ndarray, head_dim: int, steps: int) -> list[list[int]]:
    batch = ids.shape[0]
    tokens, past, current, counts = [], None, ids, None
    for _ in range(steps):
        length = current.shape[1]
        rows = [1 + b * length + length - 1 for b in range(batch)]
        feeds = _model_feeds(session, current, head_dim, past)
        feeds |= _sampler_feeds(session, rows, counts)
        out = _run(session, feeds)
        current = out["sampler.next_token"][:batch, None]
        tokens.append(current[:, 0].tolist())
        past, counts = _past(out), out["sampler.output_counts_out"]
    return [list(t) for t in zip(*tokens, strict=True)]


def _check_model(path: Path) -> None:
    """`onnx.checker` with full_check; ONNX Runtime's own ops in the ONNX domain (which the checker
    does not know) are moved to com.microsoft first, and nothing else is excused."""
    try:
        onnx.checker.check_model(str(path), full_check=True)
        return
    except onnx.checker.ValidationError as exc:
        if not any(f"No Op registered for {op} " in str(exc) for op in ORT_OPS_IN_ONNX_DOMAIN):
            raise
    model = onnx.load(str(path))
    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in ORT_OPS_IN_ONNX_DOMAIN:
            node.domain = "com.microsoft"
    onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        ("ir_version", 10),
        ("default_opset", 22),
        ("has com.microsoft", True),
        ("has position_ids", False),
        ("attention", "GroupQueryAttention"),
        ("attention_mask", ["batch_size", "total_sequence_length"]),
        ("past_key_values.0.key", ["batch_size", 3, "past_sequence_length", "kv_cache_dim"]),
        ("logits", ["batch_size", "sequence_length", VOCAB]),
        ("logits producer", "MatMul"),
    ],
)
def test_genai_layout(genai_model, check, expected):
    """The layout this file is about; a builder upgrade that changes it should be noticed here."""
    model = onnx.load(str(genai_model), load_external_data=False)
    opsets = {o.domain: o.version for o in model.opset_import}
    values = {v.name: v for v in [*model.graph.input, *model.graph.output]}

    def dims(name):
        return [d.dim_param or d.dim_value for d in values[name].type.tensor_type.shape.dim]

    facts = {
        "ir_version": lambda: model.ir_version,
        "default_opset": lambda: opsets.get("", opsets.get("ai.onnx")),
        "has com.microsoft": lambda: "com.microsoft" in opsets,
        "has position_ids": lambda: "position_ids" in values,
        "attention": lambda: next(n.op_type for n in model.graph.node if "Attention" in n.op_type),
        "logits producer": lambda: next(
            n.op_type for n in model.graph.node if "logits" in n.output
        ),
    }
    assert (facts[check]() if check in facts else dims(check)) == expected


def test_genai_model_matches_the_optimum_export(plain, head_dim, embedded_export, prompt_ids):
    """Same weights, other graph: the builder's prefill logits agree with our optimum export's."""
    reference = _session(embedded_export.model_path)
    feeds = {}
    for value in reference.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = prompt_ids
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones_like(prompt_ids)
        elif value.name == "position_ids":
            feeds[value.name] = np.tile(np.arange(prompt_ids.shape[1]), (len(prompt_ids), 1))
        else:
            shape = (len(prompt_ids), value.shape[1], 0, value.shape[3])
            feeds[value.name] = np.zeros(shape, dtype=np.float32)
    expected = reference.run(["logits"], feeds)[0]
    got = plain.run(["logits"], _model_feeds(plain, prompt_ids, head_dim, None))[0]
    np.testing.assert_allclose(got, expected, atol=2e-3, rtol=1e-4)
    np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))


def test_composed_model_passes_the_onnx_checker(composed):
    path, _ = composed
    _check_model(path)


def test_gather_mode(composed, request):
    """auto must move the gather before genai's LM head: logits = MatMul(hidden, lm_head weight)."""
    path, _ = composed
    asked = request.node.callspec.params["composed"]
    meta = composed_metadata(onnx.load(str(path), load_external_data=False))
    assert meta.gather == ("lm_head" if asked == "auto" else "logits"), (
        "auto fell back to gathering full logits; see the composer's warning (its check run "
        "cannot fill genai's symbolic KV head dimension, or cannot find model.onnx.data)"
    )
    assert meta.max_slots == MAX_SLOTS


@pytest.mark.parametrize(
    ("n_prompts", "picks"),
    [
        (1, [(0, -1)]),
        (1, [(0, -1), (0, 0), (0, 1)]),
        (2, [(0, -1), (1, -1)]),
        (2, [(1, 2), (0, 0), (1, -1), (0, 1)]),  # every slot, rows in any order
    ],
)
def test_prefill_greedy_and_logprob_match_the_plain_model(
    composed, plain, head_dim, prompt_ids, n_prompts, picks
):
    """temperature 0: next_token is the argmax of the plain model's logits at the selected row, and
    logprob is log_softmax of those raw logits."""
    _, session = composed
    ids = prompt_ids[:n_prompts]
    length = ids.shape[1]
    positions = [(b, t % length) for b, t in picks]
    logits = plain.run(["logits"], _model_feeds(plain, ids, head_dim, None))[0]
    feeds = _model_feeds(session, ids, head_dim, None)
    feeds |= _sampler_feeds(session, [1 + b * length + t for b, t in positions])
    out = _run(session, feeds)
    assert "logits" not in out
    for slot, (b, t) in enumerate(positions):
        expected = int(logits[b, t].argmax())
        assert out["sampler.next_token"][slot] == expected, (slot, b, t)
        np.testing.assert_allclose(
            out["sampler.logprob"][slot], _log_softmax(logits[b, t])[expected], atol=1e-3
        )


@pytest.mark.parametrize("n_prompts", [1, 2])
def test_greedy_decode_matches_the_plain_model(composed, plain, head_dim, prompt_ids, n_prompts):
    _, session = composed
    ids = prompt_ids[:n_prompts]
    expected = _greedy_plain(plain, ids, head_dim, GREEDY_STEPS)
    assert _greedy_composed(session, ids, head_dim, GREEDY_STEPS) == expected


def test_generator_batches_the_genai_layout(composed, plain, head_dim, prompt_ids, embedded_export):
    """GroupQueryAttention: the prompts run as one batch in a shared, right-padded KV buffer, and
    each decodes as the plain model does (tests/test_generator_gqa.py covers the runtime itself)."""
    from onnxsample.engine.generator import Generator
    from onnxsample.params import SamplingParams

    path, _ = composed
    # genai's folder holds a transformers-5 tokenizer; ours is the same vocabulary, readable here.
    generator = Generator(path, tokenizer=embedded_export.output, threads=1)
    assert generator.kv_layout == "gqa"
    assert generator.engine.concurrency == MAX_SLOTS
    prompts = [[int(i) for i in ids] for ids in prompt_ids]  # token ids, used as they are
    done = generator.generate(
        prompts, SamplingParams(temperature=0), max_new_tokens=GREEDY_STEPS, chat=False
    )
    for completion, ids in zip(done, prompt_ids, strict=True):
        assert completion.prompt_token_ids == list(ids)
        expected = _greedy_plain(plain, ids[None], head_dim, GREEDY_STEPS)[0]
        n = len(completion.token_ids)
        assert completion.token_ids == expected[:n] and (
            n == GREEDY_STEPS or completion.finish_reason == "eos"
        )
