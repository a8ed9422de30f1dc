"""``GET /props``: llama-server's description of the server, which llama.cpp's web UI and other
llama-server clients read when they connect: the context and slots, the model's name, chat
template, BOS and EOS, what it takes in (text only), and the sampling a request gets when it sets
nothing, under llama-server's names."""

from __future__ import annotations

from typing import Any

from onnxsample import __version__
from onnxsample.chain import SAMPLER_NAMES
from onnxsample.params import SamplingParams

__all__ = ["server_props"]

# This server's names for its samplers, as llama-server writes them (common_sampler_type_to_str).
_LLAMA_NAMES = {"typical_p": "typ_p"}


def _default_params(reasoning_format: str) -> dict[str, Any]:
    """A request's sampling when it sets nothing: the neutral values (``SamplingParams()``), no
    token limit for a chat (a text completion's is OpenAI's 16), the temperature first, and the
    server's reasoning format."""
    neutral = SamplingParams()
    order = [_LLAMA_NAMES.get(s, s) for s in SAMPLER_NAMES if s not in ("logit_bias", "dist")]
    return {
        "temperature": neutral.temperature,
        "top_k": neutral.top_k,
        "top_p": neutral.top_p,
        "min_p": neutral.min_p,
        "typical_p": neutral.typical_p,
        "repeat_last_n": -1,  # penalties count the whole sequence
        "repeat_penalty": neutral.repetition_penalty,
        "presence_penalty": neutral.presence_penalty,
        "frequency_penalty": neutral.frequency_penalty,
        "max_tokens": -1,
        "n_predict": -1,
        "ignore_eos": neutral.ignore_eos,
        "stream": False,
        "n_probs": 0,
        "reasoning_format": reasoning_format,
        "samplers": order,
        "post_sampling_probs": False,
    }


def server_props(engine: Any, name: str, reasoning_format: str) -> dict[str, Any]:
    """llama-server's ``/props`` answer for `engine` serving the model `name`, a chat's
    reasoning format `reasoning_format` when it sends none."""
    tokenizer = engine.tokenizer

    def text(token: int | None) -> str:
        return "" if token is None else tokenizer.token_to_text(token)

    return {
        "default_generation_settings": {
            "params": _default_params(reasoning_format),
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
