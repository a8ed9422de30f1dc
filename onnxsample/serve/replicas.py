"""The same server as Ray Serve replicas: `onnxsample serve --replicas N`, or your own `serve.run`.

Each replica owns one :class:`~onnxsample.Engine` (its own ORT session, slots and KV buffers) and
serves the app of :func:`~onnxsample.serve.create_app`; Ray Serve's proxy routes HTTP requests
between replicas and queues them when every replica is busy. A replica takes at most as many
requests as its graph has slots (``max_ongoing_requests``), so a request waits at the proxy, not
behind a busy replica, and goes to whichever replica frees a slot first; past ``max_queued``
waiting requests the proxy answers 503 at once. Every response names its replica in the
``x-onnxsample-replica`` header.

    from ray import serve
    from onnxsample.serve.replicas import ReplicaOptions, Scaling, build_application

    app = build_application(ReplicaOptions("model/composed.onnx", "smol"), Scaling(replicas=2))
    serve.run(app, route_prefix="/")

On a cluster every node needs onnxsample and the composed model at the same path (a shared
filesystem, or the same copy step on each node).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ray import serve

from onnxsample.engine import DEFAULT_NGRAM, DEFAULT_PREFILL_CHUNK, Engine
from onnxsample.engine._drafter import speculation
from onnxsample.engine._options import check_ahead
from onnxsample.engine._session import captured_by_default, check_cuda_graph
from onnxsample.errors import InvalidParameter, ModelError, OnnxSampleError
from onnxsample.metadata import composed_metadata
from onnxsample.serve.app import ServeSettings, create_app
from onnxsample.serve.middleware import origins_for
from onnxsample.text import check_chat_template, read_chat_template

__all__ = ["APP_NAME", "ReplicaOptions", "Scaling", "app_builder", "build_application", "run"]

log = logging.getLogger(__name__)

APP_NAME = "onnxsample"


@dataclass(frozen=True)
class ReplicaOptions:
    """What each replica serves: the composed `model` (a path every node can read) and the engine's
    settings; `threads` are ONNX Runtime's intra-op threads per replica."""

    model: str
    served_model_name: str
    threads: int | None = 1
    max_len: int | None = None
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK
    provider: str = "auto"
    api_key: str | None = None
    allowed_hosts: frozenset[str] | None = None
    allowed_origins: frozenset[str] | None = frozenset()
    speculative: str | None = None
    draft_tokens: int | None = None
    ngram: int = DEFAULT_NGRAM
    cuda_graph: bool | None = None
    row_buckets: bool = True
    chat_template: str | None = None  # jinja text in place of the model folder's
    reasoning_format: str = "none"  # a chat's when it sends none


@dataclass(frozen=True)
class Scaling:
    """How many replicas and what each reserves. `cpus` is Ray's ``num_cpus`` per replica; with
    `min_replicas` and `max_replicas` Serve autoscales between them (starting at `replicas`),
    aiming at `target_ongoing_requests` per replica; `max_queued` requests wait at the proxy
    before it answers 503."""

    replicas: int = 1
    cpus: float = 1.0
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    max_queued: int = 256

    def check(self) -> None:
        if self.replicas < 1:
            raise InvalidParameter(f"replicas must be >= 1, got {self.replicas}")
        if not self.cpus > 0:
            raise InvalidParameter(f"replica cpus must be > 0, got {self.cpus}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise InvalidParameter("autoscaling needs both min_replicas and max_replicas")
        if self.min_replicas is not None and not (
            0 <= self.min_replicas <= self.replicas <= self.max_replicas
        ):
            raise InvalidParameter(
                f"autoscaling needs 0 <= min_replicas <= replicas <= max_replicas, got "
                f"{self.min_replicas} <= {self.replicas} <= {self.max_replicas}"
            )
        if self.target_ongoing_requests is not None and self.min_replicas is None:
            raise InvalidParameter(
                "target_ongoing_requests is an autoscaling target: give min_replicas and "
                "max_replicas too"
            )
        if self.target_ongoing_requests is not None and not self.target_ongoing_requests > 0:
            raise InvalidParameter(
                f"target_ongoing_requests must be > 0, got {self.target_ongoing_requests}"
            )
        if self.max_queued < 1:
            raise InvalidParameter(f"max_queued must be >= 1, got {self.max_queued}")

    @property
    def most(self) -> int:
        """The most replicas this scaling can run at once."""
        return self.max_replicas if self.max_replicas is not None else self.replicas


@serve.ingress()
class OnnxsampleReplica:
    """One replica: its engine is loaded before it takes requests (so Serve marks it ready only
    then), and a dead engine fails Serve's health check, which replaces the replica."""

    def __init__(self, options: ReplicaOptions) -> None:
        self.options = options
        self.name = _replica_name()
        self.engine = Engine(
            options.model,
            provider=options.provider,
            threads=options.threads,
            max_len=options.max_len,
            max_queue=None,  # Serve keeps the queue; a replica takes only what its slots hold
            prefill_chunk=options.prefill_chunk,
            speculative=options.speculative,
            draft_tokens=options.draft_tokens,
            ngram=options.ngram,
            cuda_graph=options.cuda_graph,
            row_buckets=options.row_buckets,
            chat_template=options.chat_template,
        )
        log.info("replica %s loaded %s", self.name, options.model)

    def __serve_build_asgi_app__(self):
        settings = ServeSettings(
            served_model_name=self.options.served_model_name,
            api_key=self.options.api_key,
            allowed_hosts=self.options.allowed_hosts,
            allowed_origins=self.options.allowed_origins,
            replica=self.name,
            reasoning_format=self.options.reasoning_format,
        )
        return create_app(self.engine, settings)

    def check_health(self) -> None:
        if self.engine.failure is not None:
            raise RuntimeError(f"the engine stopped: {self.engine.failure}")


def build_application(options: ReplicaOptions, scaling: Scaling | None = None) -> serve.Application:
    """The Serve application of `options` on `scaling` replicas, for ``serve.run`` or a config."""
    scaling = scaling or Scaling()
    scaling.check()
    options = replace(options, model=str(Path(options.model).resolve()))  # replicas' cwd differs
    meta = composed_metadata(options.model)
    if meta is None:
        raise ModelError(f"{options.model} is not a composed model: run onnxsample compose first")
    # the engine's numbers, speculative, CUDA-graph and template settings fail here, not in
    # every replica (whose error Serve keeps in its logs: serve.run says only that it failed)
    check_ahead(Path(options.model), threads=options.threads, max_len=options.max_len,
                prefill_chunk=options.prefill_chunk)  # fmt: skip
    speculation(meta, options.speculative, options.draft_tokens, options.ngram)
    if options.chat_template is not None:
        check_chat_template(options.chat_template)
    if options.cuda_graph:
        check_cuda_graph(meta, Path(options.model).name)
    captured = options.cuda_graph
    if captured is None:
        captured = captured_by_default(Path(options.model), options.provider, options.speculative)
    if not options.row_buckets and not captured:
        raise InvalidParameter(
            "row_buckets=False needs cuda_graph: an uncaptured step runs the model over the "
            "running sequences only"
        )
    deployment = serve.deployment(
        OnnxsampleReplica,
        name=APP_NAME,
        ray_actor_options={"num_cpus": scaling.cpus},
        max_ongoing_requests=meta.max_slots,
        max_queued_requests=scaling.max_queued,
        graceful_shutdown_timeout_s=10,
        health_check_period_s=5,
    )
    if scaling.min_replicas is None:
        deployment = deployment.options(num_replicas=scaling.replicas)
    else:
        autoscaling = {
            "min_replicas": scaling.min_replicas,
            "initial_replicas": scaling.replicas,
            "max_replicas": scaling.max_replicas,
        }
        if scaling.target_ongoing_requests is not None:
            autoscaling["target_ongoing_requests"] = scaling.target_ongoing_requests
        deployment = deployment.options(autoscaling_config=autoscaling)
    return deployment.bind(options)


def app_builder(args: dict[str, str]) -> serve.Application:
    """:func:`build_application` from strings, for Serve's CLI and config files:
    ``serve run onnxsample.serve.replicas:app_builder model=/models/c.onnx replicas=2``. Keys are
    the fields of :class:`ReplicaOptions` and :class:`Scaling`; `served_model_name` defaults to
    the model's folder name."""
    known = {f.name: f for cls in (ReplicaOptions, Scaling) for f in fields(cls)}
    unknown = sorted(set(args) - set(known))
    if unknown or "model" not in args:
        raise InvalidParameter(
            f"app_builder needs model=PATH and takes {', '.join(sorted(known))}; got "
            f"{', '.join(unknown) or 'no model'}"
        )
    values = {k: _typed(known[k].type, v) for k, v in args.items()}
    if values.get("allowed_origins"):
        values["allowed_origins"] = origins_for(values["allowed_origins"])
    if values.get("chat_template") is not None:  # a file, or the template's text
        values["chat_template"] = read_chat_template(values["chat_template"])
    values.setdefault("served_model_name", Path(values["model"]).resolve().parent.name)
    split = {cls: {k: v for k, v in values.items() if k in {f.name for f in fields(cls)}}
             for cls in (ReplicaOptions, Scaling)}  # fmt: skip
    return build_application(ReplicaOptions(**split[ReplicaOptions]), Scaling(**split[Scaling]))


def _typed(annotation: str, raw: str):
    """A config string as the field's type (the annotations are strings here)."""
    if raw is None or (raw == "None" and "None" in annotation):
        return None
    if annotation.startswith("bool"):
        if raw.lower() not in ("true", "false", "1", "0"):
            raise InvalidParameter(f"{raw!r} is not true or false")
        return raw.lower() in ("true", "1")
    if annotation.startswith("frozenset"):  # allowed hosts, origins: comma-separated; * for any
        names = frozenset(n.strip().lower() for n in raw.split(",") if n.strip())
        return None if "*" in names else names
    for kind in (int, float):
        if annotation.startswith(kind.__name__):
            try:
                return kind(raw)
            except ValueError:
                raise InvalidParameter(f"{raw!r} is not {annotation}") from None
    return str(raw)


def run(
    app: serve.Application,
    scaling: Scaling,
    *,
    host: str,
    port: int,
    address: str | None = None,
    on_ready: Callable[[], None] = lambda: None,
) -> None:
    """Serve `app` until SIGINT/SIGTERM. Without `address` a local Ray instance is started with
    enough CPUs for the replicas and stopped at the end (its processes with it); with one, the
    app joins that cluster and is deleted from it at the end, leaving the cluster running."""
    import ray

    local = address is None
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    # A signal ends whichever wait it comes in (Ray's start, the replicas' loading, serving), and
    # the finally block stops what was started (the app, the local Ray) in order. While the
    # replicas load, it interrupts serve.run as Ctrl-C does (the one exception Ray's waits let
    # through); otherwise it only sets `stop`.
    stop = threading.Event()
    state = {"deploying": False, "serve": False, "deployed": False}

    def on_signal(*_) -> None:
        stop.set()
        if state["deploying"]:
            state["deploying"] = False
            raise KeyboardInterrupt

    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, on_signal) for s in signals}
    try:
        with _signals_kept():
            if local:
                cpus = max(os.cpu_count() or 1, math.ceil(scaling.most * scaling.cpus))
                ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                         logging_level=logging.WARNING, configure_logging=False)  # fmt: skip
            else:
                ray.init(address=address, logging_level=logging.WARNING, configure_logging=False)
        for s in signals:  # set again: a part of Ray may have set its own
            signal.signal(s, on_signal)
        if stop.is_set():
            return
        serve.start(http_options={"host": host, "port": port}, logging_config=quiet)
        state["serve"] = True
        if stop.is_set():
            return
        try:
            state["deploying"] = state["deployed"] = True
            serve.run(app, name=APP_NAME, route_prefix="/", logging_config=quiet)
            state["deploying"] = False
        except RuntimeError as exc:  # a replica that failed to start: its error, in one line
            raise OnnxSampleError(f"the replicas failed to start: {_first_line(exc)}") from None
        if stop.is_set():
            return
        on_ready()
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        if not stop.is_set():  # not the command's signal
            raise
    finally:
        state["deploying"] = False
        try:
            if state["serve"] and local:
                serve.shutdown()
            elif state["deployed"]:  # on a cluster: this command's app, not its Serve
                serve.delete(APP_NAME)
        finally:
            ray.shutdown()  # what a failed start left too (it never starts one)
            for s, handler in previous.items():
                signal.signal(s, handler)


@contextlib.contextmanager
def _signals_kept():
    """Ray's start without its SIGTERM handlers (one exits mid-start, leaving the agents it had
    started running; the local node's kills its processes and exits): the command's own stay, so
    a SIGTERM then stops Ray as one after the start does."""
    from ray._private import utils

    own = getattr(utils, "set_sigterm_handler", None)
    if own is not None:
        utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        if own is not None:
            utils.set_sigterm_handler = own


def _replica_name() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a replica (a test building the class directly)
        return f"{socket.gethostname()}-{os.getpid()}"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line and ":" in line]
    return (errors[-1] if errors else lines[0] if lines else type(exc).__name__)[:500]
