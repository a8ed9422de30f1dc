"""Sampler subgraphs written in onnxscript, one sampler per module."""
