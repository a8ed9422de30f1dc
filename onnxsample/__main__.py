"""`python -m onnxsample` is the `onnxsample` command."""

from onnxsample.cli import main

main()
