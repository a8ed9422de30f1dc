"""``GET /props``: llama-server's description of the server, which llama.cpp's web UI and other
llama-server clients read when they connect: the context and slots, the model's name, chat
template, BOS and EOS, what it takes in (text only), and the sampling a request to ``/completion``
gets when it sets nothing, under llama-server's names."""

from __future__ import annotations

from typing import Any

from onnxsample import __version__
from onnxsample.chain import SAMPLER_NAMES, SamplerChain
from onnxsample.params import SamplingParams
from onnxsample.serve.llama_fields import LLAMA_DEFAULTS

__all__ = ["generation_settings", "server_props"]

# This server's names for its samplers, as llama-server writes them (common_sampler_type_to_str).
_LLAMA_NAMES = {"typical_p": "typ_p"}


def generation_settings(
    params: SamplingParams, *, n_predict: int, reasoning_format: str | None = None, **more: Any
) -> dict[str, Any]:
    """`params` under llama-server's names (its ``generation_settings``), with the token limit
    `n_predict` (-1: none), the reasoning format where there is one, and `more` as they are."""
    order = [_LLAMA_NAMES.get(s, s) for s in SAMPLER_NAMES if s not in ("logit_bias", "dist")]
    if params.temperature_last:
        order = [*(s for s in order if s != "temperature"), "temperature"]
    settings = {
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "typical_p": params.typical_p,
        "repeat_last_n": -1,  # penalties count the whole sequence
        "repeat_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "ignore_eos": params.ignore_eos,
        "stream": False,
        "n_probs": params.reported_tops,
        **({} if reasoning_format is None else {"reasoning_format": reasoning_format}),
        "samplers": order,
        "post_sampling_probs": params.post_sampling_probs is not None,
    }
    return {**settings, **more}


def _default_params(chain: SamplerChain, reasoning_format: str) -> dict[str, Any]:
    """The sampling a request to llama-server's ``/completion`` gets when it sets nothing:
    llama-server's defaults (:data:`~onnxsample.serve.llama_fields.LLAMA_DEFAULTS`, those `chain`
    draws with) with the temperature after the cuts, no token limit, and the server's reasoning
    format. (OpenAI's routes take OpenAI's neutral values, as vLLM's do.)"""
    on = {k: v for k, v in LLAMA_DEFAULTS.items() if chain.samples and k in chain}
    params = SamplingParams(**on, temperature_last=True)
    return generation_settings(params, n_predict=-1, reasoning_format=reasoning_format)


def server_props(engine: Any, name: str, reasoning_format: str) -> dict[str, Any]:
    """llama-server's ``/props`` answer for `engine` serving the model `name`, a chat's
    reasoning format `reasoning_format` when it sends none."""
    tokenizer = engine.tokenizer

    def text(token: int | None) -> str:
        return "" if token is None else tokenizer.token_to_text(token)

    return {
        "default_generation_settings": {
            "params": _default_params(engine.meta.chain, reasoning_format),
            "n_ctx": engine.limit,
        },
        "total_slots": engine.concurrency,
        "model_alias": name,
        "model_path": str(engine.path),
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": False,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "chat_template": tokenizer.chat_template or "",
        "bos_token": text(tokenizer.bos_token_id),
        "eos_token": text(tokenizer.eos_token_id),
        "build_info": f"onnxsample-{__version__}",
        "is_sleeping": False,
    }
