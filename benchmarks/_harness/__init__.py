"""The benchmarks' one harness: what every script in benchmarks/ builds on.

- ``machine``: the machine, the load average, package versions, memory, the JSON report's emission;
- ``script``: the folders, the command line (description, comma-separated integers), stderr logs,
  reading results back;
- ``process``: a child process that speaks JSON lines, from either end (the e2e engine workers);
- ``workload``: what the benchmarks run: the shared model folders, composed graphs cached beside
  them, ONNX Runtime sessions, the chat request and the sampled settings;
- ``measure``: closed-loop load, token stamps, latency percentiles, a timed call's median, median
  and spread (numpy);
- ``tables``: the markdown of docs/benchmarks.md: numbers, ratios, tables, the load-average lines;
- ``projections``: the embedded model's four projections a layer as small ONNX models, and the
  alternating timer of the GGUF weight-form benchmarks (numpy and onnx).

Every module but ``measure`` and ``projections`` needs the standard library only at import time
(``workload`` imports onnxruntime and onnxsample inside its functions): ``e2e_worker.py`` runs in
other virtual environments that hold the standard library and one engine. This file imports nothing, so importing
one module of the harness loads that module alone.
"""
