"""Exports the tests cache between runs: made once into a cache folder, made anew where the folder
holds an export of another request or exporter version."""

from __future__ import annotations

from pathlib import Path

from onnxsample.errors import ExportError


def export_cached(source, output: Path, **options):
    """export() into a cache folder; an older export there (other request or versions) is replaced."""
    from onnxsample.exporters import export

    try:
        return export(source, output, **options)
    except ExportError as exc:
        if "different export" not in str(exc):
            raise
        return export(source, output, force=True, **options)
