"""Exports the tests cache between runs: made once into a cache folder, made anew where the folder
holds an export of another request or exporter version."""

from __future__ import annotations

from pathlib import Path


def export_cached(source, output: Path, **options):
    """export() into a cache folder; an older export there (other request or versions) is replaced."""
    from onnxsample.exporters import export
    from onnxsample.exporters._export import DifferentExport

    try:
        return export(source, output, **options)
    except DifferentExport:
        return export(source, output, force=True, **options)


def export_beside(gguf: Path, mix: str):
    """The default export of a llama.cpp-made fixture, cached beside the file (``onnx-<mix>``)."""
    return export_cached(gguf, gguf.with_name(f"onnx-{mix}"), verify_tokens=0)
