"""What an engine has done since it started: :class:`Stats`, read through ``Engine.stats``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Stats"]


@dataclass
class Stats:
    """What the engine has done since it started (only its thread writes these)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_calls: int = 0
    decode_steps: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    drafted_tokens: int = 0  # speculative decoding: draft tokens verified
    accepted_tokens: int = 0  # ... and kept
    fallback_tokens: int = 0  # a static chain's tokens past its candidates, drawn on the host
    moved: int = 0  # sequences moved to a lower slot (fewer rows a step, CUDA graphs)
    finished: int = 0
    failed: int = 0
