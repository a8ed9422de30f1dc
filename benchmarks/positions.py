"""What a second position costs a batch-1 decode step, and what a free guess in it would give back.

    python benchmarks/positions.py                 # both exports, 1 and 2 threads
    python benchmarks/positions.py --threads 2 --calls 20 --new-tokens 64   # quick

The question: decode steps that carry the row's token plus one guess (an n-gram draft, else the
last token again) would take the kernels of a multi-position call, so decode, verification, echo
and chunked prefill would agree bit for bit on the default export, and every right guess would be a
token for free. It pays where the guesses are right more often than the second position costs.

- **Cost**: the embedded model's raw step (no sampler), one row, a past of ``--past`` positions,
  one new position against two, the calls alternating; for the default export (GroupQueryAttention,
  the GGUF's own blocks, accuracy level 4) and the ``--attention exact`` export (whose one-position
  calls carry a zero position already). Medians of ``--calls`` calls.
- **Guesses**: greedy decoding of the speculative benchmark's three workloads (code-edit, doc-qa,
  story) on the default export, then each step's free guess replayed on the tokens it produced:
  the n-gram draft's first token (prompt lookup, n = 3 .. 1), else the last token repeated. A guess
  is right when it is the token decoding produced (greedy: exactly what verification would keep).
- **Estimate**: tokens per step (1 + the rate of right guesses) over the cost ratio, against plain
  one-position decoding, per workload and thread count.

JSON to stdout and ``--output`` (``benchmarks/results/positions.json``), with the load average.
"""

from __future__ import annotations

import statistics
import time

from _harness.machine import emit, load_average, machine, versions
from _harness.script import RESULTS, ints, logger, parser
from _harness.workload import EMBEDDED_A4, EMBEDDED_A4_EXACT


def _cost(folder, threads: int, past: int, calls: int) -> dict:
    """Median ms of a one-row raw step with 1 and 2 new positions (alternating calls)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(
        str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    room = past + 8  # one buffer per layer, longer than any mask (as the engine binds it)
    feeds = {}
    for new in (1, 2):
        feed = {
            "input_ids": np.full((1, new), 42, np.int64),
            "attention_mask": np.ones((1, past + new), np.int64),
        }
        for i in session.get_inputs():
            if i.name.startswith("past_key_values."):
                feed[i.name] = np.zeros((1, i.shape[1], room, i.shape[3]), np.float32)
        feeds[new] = feed
    times: dict[int, list[float]] = {1: [], 2: []}
    for k in range(2 * calls + 4):
        new = 1 + k % 2
        start = time.perf_counter()
        session.run(["logits"], feeds[new])
        if k >= 4:  # warm-up calls left out
            times[new].append(time.perf_counter() - start)
    one, two = (statistics.median(times[n]) * 1e3 for n in (1, 2))
    return {"ms_one": round(one, 2), "ms_two": round(two, 2), "ratio": round(two / one, 3)}


def _guesses(history: list[int], prompt_len: int) -> dict:
    """Replay each decode step's free guess over a greedy sequence (prompt + output)."""
    import numpy as np

    from onnxsample.engine._drafter import DEFAULT_NGRAM, NgramDrafter

    drafter = NgramDrafter(1, DEFAULT_NGRAM)
    ids = np.asarray(history, np.int64)
    steps = ngram_right = repeat_right = right = ngram_made = 0
    # the first output token comes from the prefill; each later one from a decode step
    for t in range(prompt_len + 1, len(ids)):
        seen, actual = ids[:t], int(ids[t])
        draft = drafter.propose(seen, 1)
        guess = draft[0] if draft else int(seen[-1])
        steps += 1
        ngram_made += bool(draft)
        ngram_right += bool(draft) and draft[0] == actual
        repeat_right += int(seen[-1]) == actual
        right += guess == actual
    return {
        "steps": steps,
        "right": round(right / steps, 3) if steps else 0.0,
        "ngram_drafted": round(ngram_made / steps, 3) if steps else 0.0,
        "ngram_right": round(ngram_right / steps, 3) if steps else 0.0,
        "repeat_right": round(repeat_right / steps, 3) if steps else 0.0,
    }


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--past", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--output", default=str(RESULTS / "positions.json"))
    args = p.parse_args()
    threads_list = ints(args.threads, "threads")
    from speculative import WORKLOADS

    from onnxsample import Engine, SamplingParams, prepare
    from onnxsample.exporters import export
    from onnxsample.text._prompt import prompt_tokens

    log = logger("positions")
    loads = [load_average()]
    default = export(None, EMBEDDED_A4, verify_tokens=0).output
    exact = export(None, EMBEDDED_A4_EXACT, attention="exact", verify_tokens=0).output
    cost: dict = {}
    for threads in threads_list:
        for name, folder in (("default", default), ("exact", exact)):
            cost.setdefault(f"threads={threads}", {})[name] = found = _cost(
                folder, threads, args.past, args.calls
            )
            log(f"{threads} thread(s) {name}: {found}")
        loads.append(load_average())
    guesses: dict = {}
    with Engine(prepare(default), threads=max(threads_list)) as engine:
        for workload, text in WORKLOADS.items():
            chat = [{"role": "user", "content": text}]
            prompt = prompt_tokens(engine.tokenizer, chat, True, None, engine.vocab_size)
            done = engine.submit(
                prompt, SamplingParams(temperature=0), max_new_tokens=args.new_tokens
            ).result()
            guesses[workload] = _guesses(prompt + list(done.token_ids), len(prompt))
            log(f"{workload}: {guesses[workload]}")
    loads.append(load_average())
    estimate = {
        key: {
            workload: round((1 + g["right"]) / entry["default"]["ratio"], 3)
            for workload, g in guesses.items()
        }
        for key, entry in cost.items()
    }
    emit(
        {
            "benchmark": "positions",
            "machine": machine(),
            "load_average": loads,
            "versions": versions("onnxsample", "onnxruntime", "numpy"),
            "settings": {"past": args.past, "calls": args.calls, "new_tokens": args.new_tokens},
            "cost": cost,
            "guesses": guesses,
            "tokens_per_second_vs_plain": estimate,
        },
        args.output,
        "positions",
    )


if __name__ == "__main__":
    main()
