"""What the end-to-end benchmark makes of its runs: each run's decode and prefill rates, the median
and spread per configuration, and each engine's final entry (its quality beside the reference's)."""

from __future__ import annotations

from _harness.measure import summary
from e2e_quality import with_delta


def derive(run: dict) -> dict:
    """Add a successful run's decode tokens/s (every sequence's tokens after the first, over the
    decode time) and prefill tokens/s (batch × prompt tokens over the time to first token)."""
    decoded = sum(t - 1 for t in run["tokens"])
    run["decode_tps"] = decoded / run["decode_s"] if run["decode_s"] else 0.0
    run["prefill_tps"] = run["prompt_tokens"] * len(run["tokens"]) / run["ttft_s"]
    return run


def aggregate(runs: list[dict]) -> list[dict]:
    """Median and spread per (engine, threads, batch, mode) over the successful repetitions."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        if run.get("ok") and not run.get("warmup"):
            key = (run["engine"], run["threads"], run["batch"], run["mode"])
            groups.setdefault(key, []).append(run)
    rows = []
    for (engine, threads, batch, mode), group in groups.items():
        rows.append(
            {
                "engine": engine,
                "threads": threads,
                "batch": batch,
                "mode": mode,
                "prompt_tokens": group[0]["prompt_tokens"],
                "tokens_per_sequence": sorted({t for r in group for t in r["tokens"]}),
                "decode_tokens_per_s": summary([r["decode_tps"] for r in group]),
                "prefill_tokens_per_s": summary([r["prefill_tps"] for r in group]),
                "ttft_ms": summary([r["ttft_s"] * 1000 for r in group]),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in group),
            }
        )
    return rows


def finish_engines(
    engines: dict[str, dict],
    names: list[str],
    quality: dict[str, dict] | None,
    reference: float | None,
) -> None:
    """Give every engine asked for an entry (one never started: skipped) and, when quality was
    scored (`quality` not None), its score beside the reference's."""
    for engine in names:
        entry = engines.setdefault(engine, {"status": "skipped", "reason": "not started"})
        if quality is None:
            continue
        score = quality.get(engine)
        if score is None:
            why = entry.get("reason") if entry["status"] != "ok" else "not scored"
            score = {"mean_logprob": None, "reason": f"engine skipped: {why}"}
        entry["quality"] = with_delta(score, reference)
