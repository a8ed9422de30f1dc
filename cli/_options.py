"""Option types shared by the commands (typer `Annotated` aliases), so every command spells them alike."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Output = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        help="Folder to write. Default: artifacts/<model name>.",
        show_default=False,
    ),
]
Force = Annotated[
    bool,
    typer.Option(
        "--force",
        "-f",
        help="Replace the export in the output folder instead of reusing it (or refusing a "
        "different one). Only an export's own files are replaced: other files in the folder are "
        "kept, and one the export would write over is an error.",
    ),
]
Layout = Annotated[
    str,
    typer.Option(
        "--layout",
        help="Graph layout: gqa (our GroupQueryAttention graph for Llama, Mistral, Qwen2, Qwen3, "
        "Phi-3, Gemma 2 and Gemma 3 models: fastest, shared KV buffer), optimum (optimum's export, any supported architecture) or auto "
        "(gqa where it applies).",
    ),
]
Precision = Annotated[
    str,
    typer.Option(
        "--precision",
        help="Weights: fp32, fp16 (for GPU use), int8 or int4 (ORT's block quantiser, gqa only), "
        "gguf (the GGUF file's own blocks, Q4_0 to Q8_0, K-quants, IQ4, exactly) or auto (gguf "
        "for a GGUF whose blocks can all be transplanted, else fp32, said in one line).",
    ),
]
AccuracyLevel = Annotated[
    int,
    typer.Option(
        "--accuracy-level",
        help="For quantised weights: 4 computes with int8 activations, as llama.cpp does (fastest "
        "on CPUs); 0 computes in float (exact for gguf).",
    ),
]
Device = Annotated[
    str,
    typer.Option(
        "--device",
        help="cpu (fp32 activations) or cuda: the GPU export, our GroupQueryAttention graph in fp16 "
        "(KV cache too; a GGUF of up to 1B parameters de-quantised to fp16 weights, other "
        "quantised weights as fp16 MatMulNBits) where every compute node has a CUDA kernel. "
        "Verified on the CPU.",
    ),
]
Attention = Annotated[
    str,
    typer.Option(
        "--attention",
        help="gqa (GroupQueryAttention, fastest) or exact: attention from plain ops whose result "
        "for a token does not depend on how many tokens a call computes, so speculative decoding "
        "and echo give exactly what one-token steps give (CPU; plain decoding measured "
        "0.64-0.98x as fast).",
    ),
]
RunModel = Annotated[
    Path | None,
    typer.Argument(
        help="A .gguf file or a Hugging Face model folder (exported on first use into the user "
        "cache, as `onnxsample export` does by default, and reused while its files are "
        "unchanged), an export folder (composed on first use), a composed .onnx file, or nothing "
        "for the embedded SmolLM2-135M-Instruct.",
        show_default=False,
    ),
]
EmbeddedAttention = Annotated[
    str,
    typer.Option(
        "--attention",
        help="The export made on first use (of the embedded model, a .gguf file or a Hugging "
        "Face folder): gqa (fastest) or exact, whose speculative decoding (--speculative) and "
        "echo give token for token what plain decoding gives (plain decoding measured "
        "0.64-0.98x as fast). For an export folder, export it with --attention.",
    ),
]
VerifyTokens = Annotated[
    int,
    typer.Option(
        "--verify-tokens",
        help="Greedy tokens to compare between ONNX Runtime and transformers after export (0 skips).",
        min=0,
    ),
]
KeepHF = Annotated[
    bool,
    typer.Option(
        "--keep-hf",
        help="Keep the de-quantised Hugging Face folder of a GGUF source in <output>/hf.",
    ),
]
Verbose = Annotated[
    bool,
    typer.Option("--verbose", "-v", help="Log what the library does (to stderr)."),
]
Chain = Annotated[
    str | None,
    typer.Option(
        "--chain",
        help="Samplers in the graph, comma-separated: logit_bias, penalties, temperature, top_k, top_p, "
        "min_p, typical_p, dist. Applied in the canonical order whatever order you list. "
        "Default: all of them.",
        show_default=False,
    ),
]
MaxSlots = Annotated[
    int,
    typer.Option("--max-slots", help="Sequences the graph samples at once (its fixed slot count)."),
]
TopLogprobs = Annotated[
    int,
    typer.Option(
        "--top-logprobs", help="L: how many top logprobs per slot the graph returns (0-20)."
    ),
]
MaxBias = Annotated[
    int,
    typer.Option("--max-bias", help="NB: logit-bias entries per slot (0 leaves logit bias out)."),
]
OutputProbs = Annotated[
    bool,
    typer.Option(
        "--output-probs", help="Also return sampler.probs [S, V], the distribution the draw uses."
    ),
]
Candidates = Annotated[
    int,
    typer.Option(
        "--candidates", help="K > 0 also returns the filtered candidates [S, K] (ids and logits)."
    ),
]
ServeCandidates = Annotated[
    int,
    typer.Option(
        "--candidates",
        help="Compose the model with its K best candidates per step instead of draft "
        "verification, for llama.cpp's infill sampler (editors' /infill requests; 64 covers "
        "llama.vim's top_k 40).",
        min=0,
    ),
]
ServeOutputProbs = Annotated[
    bool,
    typer.Option(
        "--output-probs",
        help="Compose the model with the whole distribution each token is drawn from instead of "
        "draft verification, for llama-server's post_sampling_probs with any filters (a little "
        "more work a step).",
    ),
]
PromptLogprobs = Annotated[
    bool,
    typer.Option(
        "--prompt-logprobs",
        help="Also return logprobs of prompt tokens (echo, likelihood scoring); free when unused.",
    ),
]
AllowedTokens = Annotated[
    bool,
    typer.Option(
        "--allowed-tokens",
        help="Add the per-slot mask of allowed tokens (sampler.allowed) that structured output "
        "(JSON schemas, regexes, grammars, choices) needs; free for unconstrained requests.",
    ),
]
GraphDraftTokens = Annotated[
    int,
    typer.Option(
        "--draft-tokens",
        help="K > 0 lets every slot verify up to K draft tokens per run (speculative decoding, "
        "`run --speculative ngram`); GroupQueryAttention exports only. Free when unused.",
        min=0,
    ),
]
Static = Annotated[
    bool,
    typer.Option(
        "--static",
        help="A chain with no control flow and no data-dependent shapes, so a decode step can be "
        "captured as a CUDA graph (run/serve --cuda-graph). Same tokens; it computes every path, "
        "so it is slower on the CPU. No draft verification. Its slot dimension is symbolic (the "
        "engine binds only the occupied slots' rows) and it is inlined, its sizes folded.",
    ),
]
Inline = Annotated[
    bool,
    typer.Option(
        "--inline", help="Inline the sampler functions, for hosts without local-function support."
    ),
]
Gather = Annotated[
    str,
    typer.Option(
        "--gather",
        help="Where the slot rows are picked: auto (before the LM head when verified), lm_head, or logits.",
    ),
]

# ---- running a model (run, serve) ---------------------------------------------------------------
Provider = Annotated[
    str,
    typer.Option(
        help="auto, cpu or cuda. With cuda the embedded model (or an export folder's model) is "
        "exported for the GPU (export --device cuda) on first use."
    ),
]
CudaGraph = Annotated[
    bool | None,
    typer.Option(
        "--cuda-graph/--no-cuda-graph",
        help="With --provider cuda: replay each decode step as a captured CUDA graph (composes a "
        "static chain; no speculative decoding). Default: on with --provider cuda unless "
        "--speculative (an H100 measured it 1.02-1.42x the branching chain).",
        show_default=False,
    ),
]
ChatTemplate = Annotated[
    str | None,
    typer.Option(
        "--chat-template",
        help="A chat template (jinja) in place of the model's, for a file with none or a wrong "
        "one: a file holding it, or its text.",
        show_default=False,
    ),
]
Threads = Annotated[
    int | None,
    typer.Option("--threads", "-t", help="ONNX Runtime intra-op threads.", min=1),
]
MaxLen = Annotated[
    int | None,
    typer.Option(
        "--max-len",
        "--ctx-size",
        "-c",
        help="KV positions per sequence, prompt included (default: the model's context).",
        min=2,
        show_default=False,
    ),
]
PrefillChunk = Annotated[
    int,
    typer.Option(
        "--prefill-chunk",
        help="Prompt tokens per step while other requests decode (0: whole prompts at once).",
        min=0,
    ),
]
Speculative = Annotated[
    str | None,
    typer.Option(
        "--speculative",
        help="Speculative decoding: 'ngram' drafts tokens by looking up the last few tokens earlier "
        "in the prompt and output, and the graph verifies them with each request's own sampler "
        "chain (same output distribution; greedy output unchanged). Pays off where the answer "
        "repeats the context: editing code, quoting a document. Default: off.",
        show_default=False,
    ),
]
DraftTokens = Annotated[
    int | None,
    typer.Option(
        "--draft-tokens",
        help="With --speculative: the most draft tokens per sequence and step (default 8; at most "
        "what the model was composed for, 8 for models `run` and `serve` compose).",
        min=1,
        show_default=False,
    ),
]
Ngram = Annotated[
    int | None,
    typer.Option(
        "--ngram",
        help="With --speculative ngram: the longest suffix to look up (shorter ones are tried "
        "next); 3 by default.",
        min=1,
        show_default=False,
    ),
]


RowBuckets = Annotated[
    bool,
    typer.Option(
        "--row-buckets/--no-row-buckets",
        help="With CUDA graphs: a decode step binds the occupied slots' rows only, rounded up to "
        "1, 2, 4, 8... (default). --no-row-buckets binds every slot every step: on a GPU a "
        "sequence's greedy tokens then never depend on how many others run (cuBLAS picks its "
        "kernels by the number of rows), at the cost of computing every slot.",
    ),
]


def _captured(provider: str, speculative: str | None, cuda_graph: bool | None) -> bool:
    """Whether decode steps are captured as CUDA graphs: `cuda_graph`, or where it is None the
    engine's default, on for --provider cuda without --speculative."""
    return cuda_graph if cuda_graph is not None else provider == "cuda" and speculative is None


def engine_options(
    speculative: str | None,
    draft_tokens: int | None,
    ngram: int | None,
    provider: str = "auto",
    cuda_graph: bool | None = None,
    row_buckets: bool = True,
    chat_template: str | None = None,
) -> dict:
    """The engine's keywords from the options, checked together before any model is prepared:
    speculative decoding, the CUDA-graph mode (None: on for --provider cuda without
    --speculative) and its row buckets, a CUDA provider that is there, and the chat template's
    text (read from its file) that parses."""
    from onnxsample.engine import DEFAULT_NGRAM
    from onnxsample.engine._drafter import check_method
    from onnxsample.engine._session import require_provider
    from onnxsample.errors import InvalidParameter
    from onnxsample.text import read_chat_template

    try:
        check_method(speculative)
    except InvalidParameter:
        raise InvalidParameter(f"--speculative must be ngram, got {speculative!r}") from None
    require_provider(provider)
    if chat_template is not None:
        chat_template = read_chat_template(chat_template)
    for name, value in (("--draft-tokens", draft_tokens), ("--ngram", ngram)):
        if speculative is None and value is not None:
            raise InvalidParameter(f"{name} needs --speculative ngram")
    if cuda_graph and provider != "cuda":
        raise InvalidParameter("--cuda-graph needs --provider cuda")
    if cuda_graph and speculative is not None:
        raise InvalidParameter(
            "--cuda-graph replays a static chain, which verifies no drafts: drop --speculative"
        )
    if not row_buckets and not _captured(provider, speculative, cuda_graph):
        raise InvalidParameter(
            "--no-row-buckets is for CUDA graphs (--provider cuda, without --no-cuda-graph or "
            "--speculative): uncaptured steps run the model over the running sequences only"
        )
    ngram = DEFAULT_NGRAM if ngram is None else ngram
    spec = {"speculative": speculative, "draft_tokens": draft_tokens, "ngram": ngram}
    graph = {"cuda_graph": cuda_graph, "row_buckets": row_buckets}
    return {**spec, **graph, "chat_template": chat_template}


def preparation(
    provider: str, spec: dict, attention: str = "gqa", candidates: int = 0, probs: bool = False
) -> dict:
    """What `prepare` builds for these options: the GPU export for --provider cuda, a static
    chain for --cuda-graph, the exact-attention export for --attention exact, the graph's
    candidates (--candidates) or final distribution (--output-probs) instead of draft
    verification."""
    from onnxsample.errors import InvalidParameter

    for name, on, what in (
        ("--candidates", candidates, "the candidates"),
        ("--output-probs", probs, "the final distribution"),
    ):
        if on and spec.get("speculative") is not None:
            raise InvalidParameter(
                f"{name} composes {what} instead of draft verification: drop --speculative, "
                f"or {name}"
            )
    graph = _captured(provider, spec.get("speculative"), spec.get("cuda_graph"))
    if probs and graph:
        raise InvalidParameter(
            "--output-probs gives the branching chain's final distribution, and CUDA graphs "
            "replay the static chain: add --no-cuda-graph, or drop --output-probs"
        )
    return {
        "device": "cuda" if provider == "cuda" else "cpu",
        "static": graph,
        "attention": attention,
        "candidates": candidates,
        "probs": probs,
    }
