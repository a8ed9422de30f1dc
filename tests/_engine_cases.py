"""What the engine tests feed the tiny model: prompts, a long prompt, greedy and seeded parameters,
and one request run alone."""

from __future__ import annotations

from onnxsample.engine import Engine
from onnxsample.params import SamplingParams

PROMPTS = [
    "Once upon a time",
    "The weather today is",
    "def fibonacci(n):",
    "Paris is the capital of",
]
LONG = " ".join(f"word{i}" for i in range(90))  # ~180 tokens: several chunks of 32
GREEDY = SamplingParams(temperature=0)


def seeded(seed: int, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.9, top_k=50, seed=seed, **extra)


def alone(engine: Engine, prompt, params, n=16, **kw):
    return engine.submit(prompt, params, max_new_tokens=n, chat=False, **kw).result(timeout=120)
