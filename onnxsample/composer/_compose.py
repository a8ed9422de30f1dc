"""The composer: splice a sampler chain after an exported model's ``logits``.

One call reads the model safely (:mod:`onnxsample.composer.loading`), learns what it needs about it
(:mod:`onnxsample.composer._model_facts`), splices the chain (:mod:`onnxsample.composer._splice`), moves the row
gather before the LM head where that is checked to give the same logits (:mod:`onnxsample.composer._lm_head`),
records the result's :class:`~onnxsample.metadata.ComposedMetadata`, and saves one file.

The samplers stay ONNX local functions in domain ``onnxsample`` (one ``SamplerChain`` node that Netron
opens into TopK/TopP/...), unless ``inline`` asks for plain ops or the chain is static (inlined and
its sizes folded: :mod:`onnxsample.composer._static`). The result is one ``.onnx`` file; a
model over 2 GB keeps its weights in one ``<name>.data`` file beside it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import onnx_ir as ir

from onnxsample._process import alive
from onnxsample.chain import SamplerChain
from onnxsample.composer._fold_codes import fold_weight_codes
from onnxsample.composer._in_place import counts_in_place
from onnxsample.composer._lm_head import find_lm_head, verify_lm_head
from onnxsample.composer._model_facts import (
    check_names,
    exact_positions,
    fix_constant_shapes,
    genai_head_size,
    kv_head_size,
    logits_output,
    shared_kv,
    vocab_size,
)
from onnxsample.composer._splice import reconcile_versions, splice
from onnxsample.composer._static import fold_static
from onnxsample.composer._write import write_single_file
from onnxsample.composer.loading import check_model, load_model
from onnxsample.composer.sampler_model import fallback_props
from onnxsample.errors import InvalidParameter, ModelError, check_flag, count
from onnxsample.graphs.chain import DOMAIN
from onnxsample.metadata import (
    COMPOSER_REVISION,
    CONTRACT_VERSION,
    ComposedMetadata,
    composed_metadata,
)
from onnxsample.params import MAX_TOP_LOGPROBS

__all__ = [
    "COMPOSER_REVISION",
    "CONTRACT_VERSION",
    "GATHER_MODES",
    "MAX_DRAFT_TOKENS",
    "STAGES",
    "compose",
    "composed_metadata",
]

log = logging.getLogger(__name__)

GATHER_MODES = ("auto", "lm_head", "logits")
MAX_DRAFT_TOKENS = 16
AUTO_DRAFT_TOKENS = 8
_TWO_GB = 2**31 - 2**26  # protobuf's limit, with room for the graph itself
STAGES = ("read", "splice", "check-gather", "save")

ProgressFn = Callable[[str], None]


def compose(
    model: str | Path,
    chain: SamplerChain | str | None = None,
    output: str | Path | None = None,
    *,
    max_slots: int = 8,
    top_logprobs: int = 0,
    max_bias: int = 0,
    output_probs: bool = False,
    output_candidates: int = 0,
    allowed_tokens: bool = False,
    prompt_logprobs: bool = False,
    draft_tokens: int | str = 0,
    static: bool = False,
    inline: bool = False,
    gather: str = "auto",
    progress: ProgressFn | None = None,
) -> Path:
    """Write model + sampler chain as one ONNX file and return its path.

    `model` is an export folder (its ``model.onnx``) or an ``.onnx`` file; `chain` defaults to the full
    canonical chain; `output` defaults to ``composed.onnx`` beside the model. `gather` is ``auto``
    (move the row gather before the LM head when the pattern is found and verified), ``lm_head``
    (require that) or ``logits`` (gather rows of the full logits). `allowed_tokens` adds
    ``sampler.allowed``, each slot's mask of allowed tokens (structured output: grammars, JSON
    schemas), applied after the logit bias. `prompt_logprobs` adds the inputs
    and outputs that report the logprobs of prompt tokens (echo; see the README's graph contract).
    `draft_tokens` K > 0 lets each slot verify up to K draft tokens per run (speculative decoding:
    the ``sampler.draft_*`` inputs and outputs); it needs a GroupQueryAttention export.
    ``"auto"`` is 8 for such an export and 0 for any other. `static` builds the chain without
    control flow or data-dependent shapes (the same tokens; a decode step can be captured as a
    CUDA graph); it verifies no drafts, so ``"auto"`` then means 0.
    """
    if progress is not None and not callable(progress):
        raise InvalidParameter(f"progress must be a callable or None, got {progress!r}")
    stage = progress or (lambda _name: None)
    chain = SamplerChain.full() if chain is None else SamplerChain(chain)
    max_slots = count("max_slots", max_slots, 1)
    top_logprobs = count("top_logprobs", top_logprobs, 0, MAX_TOP_LOGPROBS)
    max_bias = count("max_bias", max_bias, 0)
    output_candidates = count("output_candidates", output_candidates, 0)
    if draft_tokens != "auto":
        draft_tokens = count("draft_tokens", draft_tokens, 0, MAX_DRAFT_TOKENS)
    output_probs, allowed_tokens, prompt_logprobs, static, inline = (
        check_flag(name, value)
        for name, value in (
            ("output_probs", output_probs),
            ("allowed_tokens", allowed_tokens),
            ("prompt_logprobs", prompt_logprobs),
            ("static", static),
            ("inline", inline),
        )
    )
    if not isinstance(model, (str, os.PathLike)):
        raise InvalidParameter(f"model must be a path, got {type(model).__name__}")
    if output is not None and not isinstance(output, (str, os.PathLike)):
        raise InvalidParameter(f"output must be a path or None, got {type(output).__name__}")
    if gather not in GATHER_MODES:
        raise InvalidParameter(f"gather must be one of {', '.join(GATHER_MODES)}, got {gather!r}")
    source = _model_file(Path(model))
    out = Path(output) if output is not None else source.parent / "composed.onnx"
    out = out.expanduser().absolute()
    if out.resolve() == source.resolve():
        raise ModelError(
            f"the composed model would overwrite its source {source}; choose another -o"
        )
    if out.suffix != ".onnx":
        raise InvalidParameter(f"output must be an .onnx file, got {out.name}")

    _check_drafts(draft_tokens, output_probs, output_candidates)
    stage("read")
    base = load_model(source)
    fix_constant_shapes(base)
    check_names(base)
    logits = logits_output(base)
    vocab = vocab_size(logits)
    options = dict(
        top_logprobs=top_logprobs,
        max_bias=max_bias,
        output_probs=output_probs,
        output_candidates=output_candidates,
        allowed_tokens=bool(allowed_tokens),
    )
    prompt = bool(prompt_logprobs)
    gqa = shared_kv(base)
    if draft_tokens == "auto":
        draft_tokens = AUTO_DRAFT_TOKENS if gqa and not static else 0
        _check_drafts(draft_tokens, output_probs, output_candidates)
    if draft_tokens and static:
        raise InvalidParameter(
            "a static chain verifies no drafts (draft_tokens must be 0): speculative decoding "
            "needs the branching chain"
        )
    if draft_tokens and not gqa:
        raise ModelError(
            f"{source.name}: speculative decoding (draft_tokens={draft_tokens}) needs a "
            "GroupQueryAttention graph: export with --layout gqa"
        )
    spliced = dict(prompt_logprobs=prompt, draft_tokens=draft_tokens, static=bool(static))
    stage("splice")
    composed, mode = None, "logits"
    if gather != "logits":
        ir.passes.common.ShapeInferencePass()(base)  # exports rarely carry intermediate shapes
    head = find_lm_head(logits, exact_positions(base)) if gather != "logits" else None
    if head is not None:
        composed = splice(base, chain, vocab, max_slots, options, head=head, **spliced)
        mode = "lm_head"
    elif gather == "lm_head":
        raise ModelError(
            f"{source.name}: logits do not come from an LM-head MatMul; use gather=logits"
        )
    stage("check-gather")
    if composed is not None:
        head_size = genai_head_size(source)
        problem = verify_lm_head(composed, chain, vocab, max_slots, max_bias, head_size)
        if problem:
            if gather == "lm_head":
                raise ModelError(
                    f"moving the gather before the LM head changes the logits: {problem}"
                )
            log.warning("keeping the gather after the logits: %s", problem)
            composed, mode = None, "logits"
            base = load_model(source, check=False)
            fix_constant_shapes(base)
    if composed is None:
        composed = splice(base, chain, vocab, max_slots, options, head=None, **spliced)
    _finish(composed, chain, vocab, max_slots, {**options, **spliced}, mode, source, inline)

    stage("save")
    _save(composed, out)
    log.info("composed %s (%s, gather=%s) into %s", source.name, chain, mode, out)
    return out


def _remove_dead_partials(out: Path) -> None:
    """Temporary files of compositions of `out` whose process is gone (killed mid-write: SIGKILL,
    the OOM killer), which nothing else would remove."""
    for path in out.parent.glob(f".{out.name}.*.partial"):
        pid = path.name[len(out.name) + 2 :].split(".")[0]
        if pid.isdigit() and not alive(int(pid)):  # another name is not ours to judge
            with contextlib.suppress(OSError):
                path.unlink()


def _check_drafts(draft_tokens, output_probs: bool, output_candidates: int) -> None:
    """Refuse a draft width out of range, or drafts with outputs of one position per slot
    ("auto" is checked once it is resolved: 0 needs no check)."""
    if draft_tokens == "auto":
        return
    if not isinstance(draft_tokens, int) or isinstance(draft_tokens, bool):
        raise InvalidParameter(f"draft_tokens must be an integer, got {draft_tokens!r}")
    if not 0 <= draft_tokens <= MAX_DRAFT_TOKENS:
        raise InvalidParameter(
            f"draft_tokens must be in [0, {MAX_DRAFT_TOKENS}], got {draft_tokens}"
        )
    if draft_tokens and (output_probs or output_candidates):
        raise InvalidParameter(
            "draft_tokens cannot be combined with output_probs or output_candidates "
            "(those outputs describe one position per slot)"
        )


def _model_file(path: Path) -> Path:
    if path.is_dir():
        path = path / "model.onnx"
        if not path.is_file():
            raise ModelError(f"{path.parent} holds no model.onnx: export the model first")
    elif not path.exists():
        raise ModelError(f"no such model file or folder: {path}")
    elif path.suffix != ".onnx":
        raise ModelError(f"{path} is not an .onnx file or an export folder")
    return path


def _finish(
    model: ir.Model, chain, vocab, max_slots, options, mode, source: Path, inline: bool
) -> None:
    graph = model.graph
    graph.outputs[:] = [v for v in graph.outputs if v.name != "logits"]
    _forget_invented_dims(model)
    fold_weight_codes(model)  # widened here once, not at every load
    ir.passes.common.RemoveUnusedNodesPass()(model)
    reconcile_versions(model)
    docs = {v.name: v.doc_string for v in graph.outputs}
    if inline or options["static"]:  # a static chain: see onnxsample.composer._static
        ir.passes.common.InlinePass()(model)
        # An output no node reads (`rows, _ = ...`) leaves its producer behind, which ONNX
        # Runtime would warn about, one line per node, at every load.
        ir.passes.common.RemoveUnusedNodesPass()(model)
        model.opset_imports.pop(DOMAIN, None)
    if options["static"]:
        fold_static(model)
    for value in graph.outputs:  # inlining and folding put other values in their place
        value.doc_string = value.doc_string or docs.get(value.name)
    # "gqa": GroupQueryAttention reads per-row lengths from the mask, so one preallocated buffer per
    # layer serves as past and present (right padding); "concat": the cache grows by concatenation.
    gqa = shared_kv(model)
    meta = ComposedMetadata(
        chain=SamplerChain(n for n in chain.names if n != "logit_bias" or options["max_bias"] > 0),
        max_slots=max_slots,
        vocab_size=vocab,
        top_logprobs=options["top_logprobs"],
        max_bias=options["max_bias"],
        output_probs=bool(options["output_probs"]),
        output_candidates=options["output_candidates"],
        prompt_logprobs=options["prompt_logprobs"],
        draft_tokens=options["draft_tokens"],
        static=options["static"],
        allowed_tokens=options["allowed_tokens"],
        gather=mode,
        inline=inline or options["static"],
        kv_layout="gqa" if gqa else "concat",
        exact_positions=exact_positions(model),
        counts_in_place=counts_in_place(model),
        kv_head_size=kv_head_size(model, source),
        contract=CONTRACT_VERSION,
        composer_revision=COMPOSER_REVISION,
        source=source.name,
        versions={
            package: importlib.metadata.version(package)
            for package in ("onnxsample", "onnx", "onnxscript", "onnx-ir")
        },
    )
    model.metadata_props.update({**meta.to_props(), **fallback_props(meta)})
    graph.doc_string = (
        graph.doc_string or ""
    ) + f"\nonnxsample: sampler chain {chain}, {max_slots} slots"


def _forget_invented_dims(model: ir.Model) -> None:
    """Drop the shape of every value that ONNX shape inference gave a dimension it made up.

    Finding the LM head needs shapes, which exports rarely carry, so ONNX's shape inference runs
    first. It cannot see through `com.microsoft` ops and names each dimension it cannot follow
    ``unk__N``. Left in the file, those names win over the ones ONNX Runtime infers
    (``batch_size``), and the first `Add` of an `unk__0` and a `batch_size` tensor gives a
    dimension no name: from there on no buffer of the model has a shape its memory planner can
    match, so none is reused, and the planner, looking through every freed buffer for each new
    one, spends a third of a session's creation on it. Without them ONNX Runtime infers its own.
    """
    ends = set(model.graph.outputs)  # declared by the export and the composer: kept
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for value in node.outputs:
            shape = value.shape
            if value not in ends and shape is not None and any(_invented(d) for d in shape):
                value.shape = None


def _invented(dim) -> bool:
    return isinstance(dim, ir.SymbolicDim) and (dim.value or "").startswith("unk__")


def _save(model: ir.Model, out: Path) -> None:
    """Write one file and check it; weights over 2 GB go to one `<name>.data` file beside it."""
    # this process's own: two composing the same file at once each write theirs, and the last
    # rename wins (a shared name had one write into the other's file, and its rename fail)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.partial")
    _remove_dead_partials(out)
    data_name = f"{out.name}.data"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        total = sum(
            t.const_value.nbytes for t in model.graph.initializers.values() if t.const_value
        )
        if total > _TWO_GB:
            ir.save(model, tmp, external_data=data_name)
            shutil.move(tmp.with_name(data_name), out.with_name(data_name))
            proto = None
        else:
            with tmp.open("wb") as file:
                proto = write_single_file(model, file)
            out.with_name(data_name).unlink(missing_ok=True)
        tmp.replace(out)
    except OSError as exc:
        raise ModelError(f"cannot write {out}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(OSError):  # a read-only folder: the write said so already
            tmp.unlink(missing_ok=True)
    check_model(out, proto)
