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
        "--force", "-f", help="Overwrite what the output folder holds instead of reusing it."
    ),
]
Precision = Annotated[
    str,
    typer.Option(
        "--precision",
        help="Weight precision of the ONNX model: fp32 (CPU and GPU) or fp16 (for GPU use).",
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
