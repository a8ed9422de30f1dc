"""Speculative decoding (n-gram drafts verified in the graph) against plain decoding and llama.cpp.

    python benchmarks/speculative.py                       # the full matrix, 2 repeats
    python benchmarks/speculative.py --threads 2 --batch 1 --repeats 1 --new-tokens 64   # quick

Three workloads, each one user message through the embedded SmolLM2's chat template:

- ``code-edit``: a 60-line Python function, to be returned whole with one variable renamed;
- ``doc-qa``: a policy document, with a question to answer by quoting it word for word;
- ``story``: an open-ended story (little to copy: the case where drafts mostly fail).

Our side: :class:`onnxsample.Engine` on the embedded model as ``onnxsample run`` uses it (GQA
export on the GGUF's own blocks at accuracy level 4, composed with 8 slots and 8 draft tokens),
greedy, stopping at end-of-sequence or ``--new-tokens``; speculation ``off`` and ``on`` with K
draft tokens for each K in ``--draft-tokens``. Batch B is B copies of the request submitted together.
With ``--attention gqa,exact`` (the default) the same for the export with ``--attention exact``
(engines ``exact-off``, ``exact-kK``), whose speculative output is token for token the plain one's;
each row also says whether its tokens equal plain decoding's on the same export (``same_tokens``).
Peer: llama.cpp (llama-cpp-python, the original Q4_1 GGUF, batch 1, from ``.venv-llamacpp``) on the
same token ids, plain and with its prompt-lookup decoding (``LlamaPromptLookupDecoding``, K drafts).

Per configuration: decode tokens/s (every sequence's tokens after its first, over the time of the
decode calls; for llama.cpp, from the first token to the last), time to first token, and with speculation the drafts verified and
kept (acceptance rate) and tokens per model call. Engines alternate within each repetition; the
medians go to stdout and ``--output`` (``benchmarks/results/speculative.json``) with the load
average of the run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from _harness.machine import emit, load_average, machine, versions
from _harness.process import JsonLinesProcess
from _harness.script import BENCHMARKS, RESULTS, ROOT, ints, logger, parser
from _harness.workload import EMBEDDED_A4_EXACT

_CODE = "\n".join(
    [
        "def summarise_orders(orders, tax_rate=0.2, currency='EUR'):",
        '    """Totals, averages and the largest order of a list of order dicts."""',
        "    if not orders:",
        "        return {'count': 0, 'total': 0.0, 'currency': currency}",
        "    total = 0.0",
        "    largest = None",
        "    by_customer = {}",
        "    skipped = []",
        "    for order in orders:",
        "        if order.get('status') == 'cancelled':",
        "            skipped.append(order['id'])",
        "            continue",
        "        amount = 0.0",
        "        for line in order['lines']:",
        "            price = line['price']",
        "            quantity = line.get('quantity', 1)",
        "            discount = line.get('discount', 0.0)",
        "            amount += price * quantity * (1 - discount)",
        "        amount = round(amount * (1 + tax_rate), 2)",
        "        total += amount",
        "        customer = order['customer']",
        "        by_customer.setdefault(customer, []).append(amount)",
        "        if largest is None or amount > largest['amount']:",
        "            largest = {'id': order['id'], 'amount': amount}",
        "    customers = {}",
        "    for customer, amounts in by_customer.items():",
        "        customers[customer] = {",
        "            'orders': len(amounts),",
        "            'total': round(sum(amounts), 2),",
        "            'average': round(sum(amounts) / len(amounts), 2),",
        "        }",
        "    counted = len(orders) - len(skipped)",
        "    average = round(total / counted, 2) if counted else 0.0",
        "    best = None",
        "    for customer, info in customers.items():",
        "        if best is None or info['total'] > customers[best]['total']:",
        "            best = customer",
        "    report = {",
        "        'count': counted,",
        "        'skipped': skipped,",
        "        'total': round(total, 2),",
        "        'average': average,",
        "        'largest': largest,",
        "        'customers': customers,",
        "        'best_customer': best,",
        "        'currency': currency,",
        "    }",
        "    if tax_rate > 0:",
        "        report['tax'] = round(total - total / (1 + tax_rate), 2)",
        "    else:",
        "        report['tax'] = 0.0",
        "    if skipped:",
        "        report['note'] = f'{len(skipped)} cancelled orders skipped'",
        "    for key in ('total', 'average', 'tax'):",
        "        value = report[key]",
        "        if value < 0:",
        "            raise ValueError(f'negative {key}: {value}')",
        "    report['generated'] = True",
        "    return report",
    ]
)
_DOC = (
    "Returns and refunds. Customers may return any item within 30 days of delivery for a full "
    "refund, provided the item is unused and in its original packaging. Refunds are issued to the "
    "original payment method within 5 business days after the returned item is received at our "
    "warehouse. Items bought on sale can be exchanged but not refunded. Shipping costs are not "
    "refunded unless the item arrived damaged or was not the item ordered.\n\n"
    "Delivery. Orders placed before 2 pm are shipped the same day. Standard delivery takes 3 to 5 "
    "business days; express delivery takes 1 business day and costs 9 euros. We do not deliver "
    "to post office boxes.\n\n"
    "Warranty. Every electronic device carries a two-year warranty against manufacturing "
    "defects. The warranty does not cover damage caused by water, drops or unauthorised repairs. "
    "To make a claim, contact support with the order number and a description of the fault."
)
WORKLOADS = {
    "code-edit": f"Here is a Python function:\n\n{_CODE}\n\nWrite the whole function again, "
    "unchanged except that the variable `total` is renamed to `order_total`.",
    "doc-qa": f"Read this document:\n\n{_DOC}\n\nQuote, word for word, the sentences of the "
    "document about refunds, then say how many days a customer has to return an item.",
    "story": "Write an original short story about a lighthouse keeper who finds a strange map.",
}


def _parse() -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--threads", default="1,2", help="ONNX Runtime / llama.cpp threads to try")
    p.add_argument("--batch", default="1,8", help="batch sizes (ours; llama.cpp runs batch 1)")
    p.add_argument("--draft-tokens", default="4,8", help="K values to try with speculation on")
    p.add_argument("--ngram", type=int, default=3)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--model", help="export folder or composed model (default: the embedded one)")
    p.add_argument(
        "--attention",
        help="the embedded model's exports to compare: gqa,exact (the default without --model); "
        "with --model, gqa (that model)",
    )
    p.add_argument("--llamacpp-python", default=str(ROOT / ".venv-llamacpp/bin/python"))
    p.add_argument("--output", type=Path, default=RESULTS / "speculative.json")
    args = p.parse_args()
    for flag in ("threads", "batch", "draft_tokens"):
        setattr(args, flag, ints(getattr(args, flag), flag.replace("_", "-")))
    return args


class _Ours:
    """One engine: speculation off (k = 0) or on with k draft tokens."""

    def __init__(self, model: Path, threads: int, k: int, ngram: int) -> None:
        from onnxsample import Engine

        spec = {"speculative": "ngram", "draft_tokens": k, "ngram": ngram} if k else {}
        self.engine = Engine(model, threads=threads, prefix_reuse=False, **spec)

    def run(self, ids: list[int], batch: int, new_tokens: int) -> dict:
        from onnxsample import SamplingParams

        before = self.engine.stats()
        start = time.perf_counter()
        requests = [
            self.engine.submit(ids, SamplingParams(temperature=0), max_new_tokens=new_tokens)
            for _ in range(batch)
        ]
        done = [r.result(timeout=900) for r in requests]
        end = time.perf_counter()
        after = self.engine.stats()
        tokens = [len(c.token_ids) for c in done]
        ids = [c.token_ids for c in done]
        drafted = after.drafted_tokens - before.drafted_tokens
        return {
            "tokens": tokens,
            "ids": ids,
            "ttft_s": min(c.timings.ttft_s for c in done),
            # the time of the decode (and verification) calls: with a batch, the prompts of the
            # later requests are prefilled between decode steps, in calls of their own
            "decode_s": after.decode_s - before.decode_s,
            "wall_s": end - start,
            "drafted": drafted,
            "accepted": after.accepted_tokens - before.accepted_tokens,
            "calls": after.decode_steps - before.decode_steps,
        }

    def close(self) -> None:
        self.engine.close()


class _LlamaCpp:
    """llama.cpp in its own interpreter (``benchmarks/e2e_worker.py llamacpp``)."""

    def __init__(self, python: str, threads: int, lookup: int) -> None:
        from onnxsample.exporters import embedded_gguf

        command = [python, str(BENCHMARKS / "e2e_worker.py"), "llamacpp", "--threads", str(threads)]
        command += ["--gguf", str(embedded_gguf()), "--lookup", str(lookup)]
        self.worker = JsonLinesProcess(command)
        if not self.worker.info.get("ready"):
            raise RuntimeError(self.worker.info.get("error"))
        self.versions = self.worker.info.get("versions", {})

    def run(self, ids: list[int], batch: int, new_tokens: int) -> dict:
        assert batch == 1, "llama-cpp-python's Llama API generates one sequence at a time"
        request = {"prompt_ids": ids, "batch": 1, "mode": "greedy", "new_tokens": new_tokens}
        reply = self.worker.request({**request, "seed": 0, "stop_at_eos": True})
        if not reply.get("ok"):
            raise RuntimeError(reply.get("error"))
        return {"tokens": reply["tokens"], "ttft_s": reply["ttft_s"], "decode_s": reply["decode_s"]}

    def close(self) -> None:
        self.worker.close()


def _summary(runs: list[dict]) -> dict:
    rates = [
        (sum(r["tokens"]) - len(r["tokens"])) / r["decode_s"] for r in runs if r["decode_s"] > 0
    ]
    out = {
        "decode_tokens_per_s": round(statistics.median(rates), 1),
        "spread": [round(min(rates), 1), round(max(rates), 1)],
        "ttft_ms": round(statistics.median(r["ttft_s"] for r in runs) * 1000, 1),
        "tokens": runs[0]["tokens"][0],
    }
    if runs[0].get("calls") is not None:
        drafted = sum(r["drafted"] for r in runs)
        accepted = sum(r["accepted"] for r in runs)
        decoded = sum(sum(r["tokens"]) - len(r["tokens"]) for r in runs)
        out["tokens_per_call"] = round(decoded / max(sum(r["calls"] for r in runs), 1), 2)
        if drafted:
            out["acceptance"] = round(accepted / drafted, 3)
            out["drafted_per_token"] = round(drafted / max(decoded, 1), 2)
    return out


def main() -> None:
    args = _parse()  # first: --help needs no onnxsample
    from onnxsample import prepare
    from onnxsample.text._prompt import prompt_tokens

    log = logger("speculative")

    attention = (args.attention or ("gqa" if args.model else "gqa,exact")).split(",")
    if set(attention) - {"gqa", "exact"} or not attention:
        raise SystemExit(f"--attention takes gqa and/or exact, got {args.attention!r}")
    if args.model and attention != ["gqa"]:
        raise SystemExit(
            "--attention compares the embedded model's exports: leave it out with --model"
        )
    models = {"onnxsample": prepare(args.model)}
    if "exact" in attention:
        from onnxsample.exporters import export

        models["exact"] = prepare(
            export(None, EMBEDDED_A4_EXACT, attention="exact", verify_tokens=0).output
        )
    if "gqa" not in attention:
        models.pop("onnxsample")
    workloads = [w for w in args.workloads.split(",") if w]
    ids: dict[str, list[int]] = {}
    loads = [load_average()]
    results: dict = {}
    peers: dict = {}
    for threads in args.threads:
        loaded = {
            f"{prefix}-k{k}" if k else f"{prefix}-off": _Ours(model, threads, k, args.ngram)
            for prefix, model in models.items()
            for k in [0, *args.draft_tokens]
        }
        engine = next(iter(loaded.values())).engine
        for w in workloads:  # the same token ids for every engine
            chat = [{"role": "user", "content": WORKLOADS[w]}]
            ids[w] = prompt_tokens(engine.tokenizer, chat, True, None, engine.vocab_size)
        for name, k in [
            ("llamacpp", 0),
            *((f"llamacpp-lookup{k}", k) for k in args.draft_tokens),
        ]:
            try:
                loaded[name] = _LlamaCpp(args.llamacpp_python, threads, k)
                peers["llama_cpp_python"] = loaded[name].versions.get("llama_cpp_python")
            except (OSError, RuntimeError) as exc:
                results.setdefault("skipped", {})[name] = str(exc).splitlines()[0]
        runs: dict = {}
        for rep in range(args.repeats):
            names = list(loaded)
            names = names[rep % len(names) :] + names[: rep % len(names)]
            for workload in workloads:
                for batch in args.batch:
                    for name in names:
                        if name.startswith("llamacpp") and batch != 1:
                            continue
                        found = loaded[name].run(ids[workload], batch, args.new_tokens)
                        runs.setdefault((workload, batch, name), []).append(found)
                        log(f"{threads} {workload} {batch} {name} {_summary([found])}")
            loads.append(load_average())
        for engine in loaded.values():
            engine.close()
        for (workload, batch, name), found in runs.items():
            key = f"threads={threads}"
            table = (
                results.setdefault(key, {})
                .setdefault(workload, {})
                .setdefault(f"batch={batch}", {})
            )
            table[name] = _summary(found)
        for workload in workloads:
            for batch, table in results[f"threads={threads}"][workload].items():
                gqa_off = table.get("onnxsample-off", {}).get("decode_tokens_per_s")
                peer = table.get("llamacpp", {}).get("decode_tokens_per_s")
                for name, row in table.items():
                    prefix = name.rsplit("-", 1)[0]
                    off = table.get(f"{prefix}-off", {}).get("decode_tokens_per_s")
                    if off and prefix in models and not name.endswith("-off"):
                        row["vs_off"] = round(row["decode_tokens_per_s"] / off, 2)
                        plain = runs[(workload, int(batch.split("=")[1]), f"{prefix}-off")]
                        row["same_tokens"] = (
                            runs[(workload, int(batch.split("=")[1]), name)][0]["ids"]
                            == plain[0]["ids"]
                        )
                    if gqa_off and prefix == "exact":
                        row["vs_gqa_off"] = round(row["decode_tokens_per_s"] / gqa_off, 2)
                    if peer and prefix in models:
                        row["vs_llamacpp"] = round(row["decode_tokens_per_s"] / peer, 2)
    emit(
        {
            "benchmark": "speculative",
            "machine": machine(),
            "load_average": loads,
            "versions": {**versions("onnxsample", "onnxruntime"), **peers},
            "settings": {
                "new_tokens": args.new_tokens,
                "ngram": args.ngram,
                "repeats": args.repeats,
                "prompt_tokens": {w: len(i) for w, i in ids.items()},
            },
            "results": results,
        },
        args.output,
        "speculative",
    )


if __name__ == "__main__":
    main()
