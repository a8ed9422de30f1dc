"""How the benchmarks measure: closed-loop load (N client threads, each sending one request after
another), when each token of a stream arrived, latency percentiles, a timed call's median, and the
median and spread of repeated runs."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

# one(client, request) -> (time to first token s, gaps between tokens s, tokens)
OneRequest = Callable[[int, int], tuple[float, list[float], int]]


class Stamps:
    """When each token of one stream arrived: call :meth:`tick` per token."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.gaps: list[float] = []
        self.count = 0

    def tick(self) -> None:
        now = time.perf_counter()
        self.count += 1
        if self.first is None:
            self.first = now
        else:
            self.gaps.append(now - self.last)
        self.last = now

    @property
    def ttft(self) -> float:
        """Seconds from the start to the first token (to now if none came)."""
        return (self.first or time.perf_counter()) - self.start


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile of seconds, in ms."""
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


def latency(ttft: list[float], gaps: list[float]) -> dict:
    """Time to first token and inter-token latency, p50 and p99, in ms."""
    return {
        "ttft_ms_p50": pct(ttft, 50),
        "ttft_ms_p99": pct(ttft, 99),
        "itl_ms_p50": pct(gaps, 50),
        "itl_ms_p99": pct(gaps, 99),
    }


def closed_loop(clients: int, per_client: int, one: OneRequest) -> dict:
    """Run `clients` threads of `per_client` requests each; a failed request fails the run."""
    ttft, gaps, tokens, errors, lock = [], [], [0], [], threading.Lock()

    def client(k: int) -> None:
        try:
            for r in range(per_client):
                t, g, n = one(k, r)
                with lock:
                    ttft.append(t)
                    gaps.extend(g)
                    tokens[0] += n
        except Exception as exc:
            errors.append(exc)

    start = time.perf_counter()
    workers = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} clients failed; the first: {errors[0]}")
    return {
        "clients": clients,
        "requests": clients * per_client,
        "tokens": tokens[0],
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens[0] / wall, 1),
        **latency(ttft, gaps),
    }


def median_ms(
    call: Callable[[], object], budget: float, minimum: int = 5, most: int | None = 2000
) -> float:
    """Median milliseconds of one call after a warm-up call, repeated until `budget` seconds have
    passed and `minimum` calls were made (at most `most` calls; None: no limit)."""
    call()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < minimum or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        if most is not None and len(times) >= most:
            break
    return statistics.median(times) * 1e3


def summary(values: list[float], digits: int = 3) -> dict:
    """Median, min, max (rounded) and count of repeated measurements."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
    }
