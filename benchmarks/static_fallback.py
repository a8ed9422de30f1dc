"""How often the static chain hands a token to the host: the share of tokens of the embedded model
whose top-p or top-k set reached past the chain's candidates, or that asked for typical-p (its
set follows the row's entropy: always the host's), by sampling setting (``sampler.fallback``), on
the CPU. A count, not a time: the same on any machine for the same model,
prompts and seeds (a GPU's logits differ in their last bits, so its share can differ a little).

    python benchmarks/static_fallback.py [--tokens 48] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import onnxsample as osx
from onnxsample import Engine, SamplingParams
from onnxsample.graphs import STATIC_CANDIDATES

PROMPTS = [
    "Write a short story about a dragon.",
    "Explain photosynthesis.",
    "List three fruits.",
    "What is the capital of France?",
    "Tell me a joke.",
    "Describe the ocean.",
    "How do airplanes fly?",
    "Give me a recipe for pancakes.",
]
SETTINGS = {
    "temperature 1": dict(temperature=1.0),
    "temperature 0.7, top_p 0.9": dict(temperature=0.7, top_p=0.9),
    "temperature 1, top_p 0.95": dict(temperature=1.0, top_p=0.95),
    "temperature 1, top_p 0.99": dict(temperature=1.0, top_p=0.99),
    "temperature 0.8, top_k 40, top_p 0.95, min_p 0.05": dict(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05
    ),
    "temperature 1, typical_p 0.95": dict(temperature=1.0, typical_p=0.95),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48, help="new tokens a prompt")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    model = osx.prepare(static=True)
    rows = []
    with Engine(model, threads=1) as engine:
        for name, setting in SETTINGS.items():
            before = engine.stats()
            requests = [
                engine.submit(prompt, SamplingParams(seed=i, **setting), max_new_tokens=args.tokens)
                for i, prompt in enumerate(PROMPTS)
            ]
            for request in requests:
                request.result(600)
            after = engine.stats()
            tokens = after.generated_tokens - before.generated_tokens
            redrawn = after.fallback_tokens - before.fallback_tokens
            rows.append(
                {
                    "setting": name,
                    "tokens": tokens,
                    "fallback_tokens": redrawn,
                    "share": round(redrawn / tokens, 4),
                }
            )
    report = {
        "model": "SmolLM2-135M-Instruct (embedded), static chain, CPU",
        "candidates": STATIC_CANDIDATES,
        "prompts": len(PROMPTS),
        "rows": rows,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
