"""Prometheus metrics of one server: load, tokens, latencies, rejections (``GET /metrics``)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    """The counters the request handlers feed and the gauges read from the engine's load."""

    def __init__(self, load: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

        def gauge(name: str, doc: str, key: str) -> None:
            Gauge(name, doc, registry=r).set_function(lambda: load().get(key, 0))

        gauge("onnxsample_requests_running", "Requests holding a slot.", "running")
        gauge("onnxsample_requests_waiting", "Requests waiting for a slot.", "waiting")
        gauge("onnxsample_slots_busy", "Slots in use.", "slots_busy")
        self.prompt_tokens = Counter(
            "onnxsample_prompt_tokens", "Prompt tokens of finished requests.", registry=r
        )
        self.cached_tokens = Counter(
            "onnxsample_prompt_tokens_cached",
            "Prompt tokens reused from a slot's cache.",
            registry=r,
        )
        self.generated_tokens = Counter(
            "onnxsample_generation_tokens", "Tokens generated.", registry=r
        )
        self.draft_tokens = Counter(
            "onnxsample_spec_decode_draft_tokens",
            "Draft tokens verified (speculative decoding).",
            registry=r,
        )
        self.accepted_tokens = Counter(
            "onnxsample_spec_decode_accepted_tokens",
            "Draft tokens kept (speculative decoding).",
            registry=r,
        )
        self.requests = Counter(
            "onnxsample_requests", "Finished requests.", ["finish_reason"], registry=r
        )
        self.rejected = Counter(
            "onnxsample_requests_rejected", "Requests refused.", ["reason"], registry=r
        )
        self.ttft = Histogram(
            "onnxsample_time_to_first_token_seconds",
            "From the request's arrival to its first token.",
            buckets=_LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "onnxsample_inter_token_latency_seconds",
            "Between two tokens of one request.",
            buckets=_LATENCY,
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
