"""`onnxsample compose`: splice a sampler chain after an exported model's logits."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from onnxsample.cli import _options as opt
from onnxsample.cli._ui import COMPOSE_LABELS, out, stages
from onnxsample.cli.inspect import render_summary


def compose(
    model: Annotated[
        Path,
        typer.Argument(
            help="An export folder (its model.onnx) or an .onnx file.", show_default=False
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="The .onnx file to write. Default: composed.onnx beside the model.",
            show_default=False,
        ),
    ] = None,
    chain: opt.Chain = None,
    max_slots: opt.MaxSlots = 8,
    top_logprobs: opt.TopLogprobs = 0,
    max_bias: opt.MaxBias = 0,
    output_probs: opt.OutputProbs = False,
    candidates: opt.Candidates = 0,
    prompt_logprobs: opt.PromptLogprobs = False,
    allowed_tokens: opt.AllowedTokens = False,
    draft_tokens: opt.GraphDraftTokens = 0,
    static: opt.Static = False,
    inline: opt.Inline = False,
    gather: opt.Gather = "auto",
) -> None:
    """Write model + sampler chain as one ONNX file whose sampler parameters are runtime inputs.

    Every slot gets its own temperature, top_k, top_p, ... as input tensors (sampler.*), so one file
    serves every request. Open the result with `onnxsample inspect FILE --netron`.
    """
    from onnxsample.composer import compose as run_compose
    from onnxsample.composer.inspection import inspect_model

    start = time.perf_counter()
    with stages(COMPOSE_LABELS) as progress:
        path = run_compose(
            model,
            chain,
            output,
            max_slots=max_slots,
            top_logprobs=top_logprobs,
            max_bias=max_bias,
            output_probs=output_probs,
            output_candidates=candidates,
            prompt_logprobs=prompt_logprobs,
            allowed_tokens=allowed_tokens,
            draft_tokens=draft_tokens,
            static=static,
            inline=inline,
            gather=gather,
            progress=progress,
        )
    render_summary(inspect_model(path), brief=True)
    out.print(f"composed in {time.perf_counter() - start:.1f} s")
