"""ONNX Runtime sessions: provider choice, thread settings, and an honest report of what loaded.

onnxruntime-gpu falls back to the CPU when the CUDA provider's libraries are missing, logging the
reason where nobody looks. We check `session.get_providers()` after creating a session: asking for
``cuda`` and not getting it is an error naming the library that failed to load; ``auto`` falls back
and logs that once.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import os
from pathlib import Path

from onnxsample.engine._options import check_threads
from onnxsample.errors import InvalidParameter, ModelError, RuntimeUnavailable, first_line
from onnxsample.metadata import ComposedMetadata, composed_metadata

__all__ = [
    "GRAPH_DEVICES",
    "PROVIDERS",
    "captured_by_default",
    "check_cuda_graph",
    "create_session",
    "input_names",
    "require_provider",
    "warn_if_cpu_shaped",
]

log = logging.getLogger(__name__)

PROVIDERS = ("auto", "cpu", "cuda")
_CUDA = "CUDAExecutionProvider"
_CPU = "CPUExecutionProvider"
_warned_fallback = False


def input_names(session) -> set[str]:
    """Every input `session` reads, those with a default included (``sampler.logprobs`` and
    ``sampler.temperature_last`` of a branching chain), which ``get_inputs()`` leaves out."""
    return {i.name for i in [*session.get_inputs(), *session.get_overridable_initializers()]}


def _cuda_load_error() -> str:
    """Why the CUDA provider library does not load here, in the loader's own words."""
    import onnxruntime as ort

    library = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    if not library.is_file():
        return "this onnxruntime build has no CUDA provider (install onnxsample[gpu] in place of onnxsample[cpu])"
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return str(exc)
    return "the CUDA provider loaded but the session did not use it (no usable GPU?)"


def require_provider(provider: str) -> None:
    """Raise unless `provider` is one we know and, for ``cuda``, this onnxruntime build has it."""
    import onnxruntime as ort

    if provider not in PROVIDERS:
        raise InvalidParameter(f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    available = ort.get_available_providers()
    if provider == "cuda" and _CUDA not in available:
        raise RuntimeUnavailable(
            f"provider 'cuda' is not available: onnxruntime {ort.__version__} offers only "
            f"{', '.join(available)}; install onnxsample[gpu] in place of onnxsample[cpu]"
        )


def create_session(
    path: str | Path,
    provider: str = "auto",
    *,
    threads: int | None = None,
    optimization: str = "all",
    cuda_graph: bool = False,
):
    """An InferenceSession on the requested provider; returns (session, device) with device
    'cuda'/'cpu'. `cuda_graph` turns on the CUDA provider's graph capture (``enable_cuda_graph``):
    ONNX Runtime refuses a model it cannot capture (control flow, nodes off CUDA, host copies)."""
    import onnxruntime as ort

    global _warned_fallback
    require_provider(provider)
    check_threads(threads)
    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    if optimization not in levels:
        raise InvalidParameter(
            f"optimization must be one of {', '.join(levels)}, got {optimization!r}"
        )
    want_cuda = provider == "cuda" or (
        provider == "auto" and _CUDA in ort.get_available_providers()
    )
    cuda_options = {"enable_cuda_graph": "1"} if cuda_graph else {}
    providers = [(_CUDA, cuda_options), _CPU] if want_cuda else [_CPU]
    options = ort.SessionOptions()
    options.graph_optimization_level = levels[optimization]
    options.log_severity_level = 3  # errors only: ORT's warnings about our If subgraphs are noise
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if want_cuda and hasattr(ort, "preload_dlls"):
        said = io.StringIO()  # it prints what it could not load; stdout may be `run --json`
        try:
            with contextlib.redirect_stdout(said):
                ort.preload_dlls()  # CUDA/cuDNN from the nvidia-* pip packages, when present
        except Exception as exc:  # the check below reports what is missing
            log.debug("preload_dlls: %s", exc)
        if said.getvalue().strip():
            log.debug("preload_dlls: %s", said.getvalue().strip())
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
    except Exception as exc:
        raise ModelError(f"ONNX Runtime cannot load {Path(path).name}: {first_line(exc)}") from exc
    used = session.get_providers()
    if want_cuda and used[0] != _CUDA:
        reason = _cuda_load_error()
        if provider == "cuda":
            raise RuntimeUnavailable(
                f"CUDA did not load, so the session would run on the CPU: {reason}"
            )
        if not _warned_fallback:
            log.warning("CUDA is not usable (%s); running on the CPU", reason)
            _warned_fallback = True
    device = "cuda" if used[0] == _CUDA else "cpu"
    log.info("session on %s (%s threads)", device, threads or os.cpu_count())
    return session, device


# Devices a CUDA-graph engine may run on (the tests run the same calls uncaptured on the CPU).
GRAPH_DEVICES = ("cuda",)


def check_cuda_graph(meta: ComposedMetadata | None, name: str) -> None:
    """Refuse, before loading it, a model whose decode steps could not be captured."""
    if meta is None:
        raise ModelError(f"{name} is not a composed model: run `onnxsample compose` on it first")
    if not meta.static:
        raise InvalidParameter(
            f"cuda_graph needs a static sampler chain: {name} has control flow "
            "(onnxsample compose --static)"
        )
    if meta.kv_layout != "gqa":
        raise InvalidParameter(
            f"cuda_graph needs a GroupQueryAttention export (fixed KV buffers): {name} grows its "
            "cache by concatenation (onnxsample export --device cuda)"
        )


def captured_by_default(path: Path, provider: str, speculative: str | None) -> bool:
    """What ``Engine(cuda_graph=None)`` means: capture where it can be had, that is on
    ``provider="cuda"`` without speculation, for a static chain over a GroupQueryAttention export
    whose attention runs on CUDA (an fp32 one keeps it on the CPU, which capture refuses)."""
    if provider != "cuda" or speculative is not None:
        return False
    meta = composed_metadata(path)
    if meta is None or not meta.static or meta.kv_layout != "gqa":
        return False
    import onnx

    from onnxsample._wire import read_without_weights

    graph = read_without_weights(path).graph
    pasts = [i for i in graph.input if i.name.startswith("past_key_values.")]
    return not any(i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for i in pasts)


def warn_if_cpu_shaped(meta: ComposedMetadata, pasts: dict, path: Path) -> None:
    """One warning when a CUDA session runs an export whose attention cannot run on CUDA."""
    if meta.kv_layout == "gqa" and any(arg.type == "tensor(float)" for arg in pasts.values()):
        log.warning(
            "%s computes attention in fp32, which CUDA's GroupQueryAttention does not take: "
            "attention and the KV cache stay on the CPU, with copies every step. Export for the "
            "GPU instead: onnxsample export --device cuda",
            path.name,
        )
