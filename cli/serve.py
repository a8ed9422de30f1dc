"""`onnxsample serve`: an OpenAI-compatible HTTP server with a chat page, on the engine."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from onnxsample.cli import _options as opt
from onnxsample.cli._ui import PREPARE_LABELS, err, stages
from onnxsample.engine import DEFAULT_PREFILL_CHUNK
from onnxsample.errors import InvalidParameter, OnnxSampleError, RuntimeUnavailable

_RAY = "Ray Serve replicas"


def serve(
    model: opt.RunModel = None,
    host: Annotated[
        str,
        typer.Option(help="Address to listen on (0.0.0.0: every interface; then set --api-key)."),
    ] = "127.0.0.1",
    allowed_hosts: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="Also answer requests for this Host name (repeatable; * for any). By default a "
            "server answers its own address and localhost only, so a web page cannot reach it "
            "through a name it points at 127.0.0.1 (DNS rebinding).",
            show_default=False,
        ),
    ] = None,
    allowed_origins: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-origin",
            help="Let web pages from this origin (e.g. http://localhost:5173) call the server from "
            "a browser: CORS, preflights included (repeatable; * for any, as llama-server and "
            "vLLM answer by default). By default only the server's own chat page can.",
            show_default=False,
        ),
    ] = None,
    port: Annotated[int, typer.Option(help="Port to listen on.", min=0, max=65535)] = 8080,
    threads: opt.Threads = None,
    max_slots: Annotated[
        int | None,
        typer.Option(
            "--max-slots",
            help="Sequences decoded at once, when serve composes an export folder (default 8; a "
            "composed file keeps its own).",
            min=1,
            show_default=False,
        ),
    ] = None,
    shutdown_grace: Annotated[
        float | None,
        typer.Option(
            "--shutdown-grace",
            help="Seconds open responses may run after SIGTERM / Ctrl-C; then what still runs is "
            "cut (a stream ends with an error chunk and [DONE], a waiting request gets 503). "
            "[default: 10; one process: Ray Serve stops replicas by its own rules]",
            min=0,
            show_default=False,
        ),
    ] = None,
    max_queue: Annotated[
        int,
        typer.Option("--max-queue", help="Requests waiting for a slot before 429s.", min=0),
    ] = 256,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="ONNXSAMPLE_API_KEY",
            help="Require 'Authorization: Bearer KEY' on the API (or $ONNXSAMPLE_API_KEY).",
            show_default=False,
        ),
    ] = None,
    served_model_name: Annotated[
        str | None,
        typer.Option(
            "--served-model-name",
            help="The model's name in the API (default: the export folder's name).",
            show_default=False,
        ),
    ] = None,
    max_len: opt.MaxLen = None,
    prefill_chunk: opt.PrefillChunk = DEFAULT_PREFILL_CHUNK,
    provider: opt.Provider = "auto",
    cuda_graph: opt.CudaGraph = None,
    row_buckets: opt.RowBuckets = True,
    chat_template: opt.ChatTemplate = None,
    reasoning_format: Annotated[
        str,
        typer.Option(
            "--reasoning-format",
            help="A chat's reasoning_format when it sends none: none (the text as written), or "
            "auto / deepseek (a <think> thought in reasoning_content), as llama-server's.",
        ),
    ] = "none",
    speculative: opt.Speculative = None,
    attention: opt.EmbeddedAttention = "gqa",
    draft_tokens: opt.DraftTokens = None,
    ngram: opt.Ngram = None,
    candidates: opt.ServeCandidates = 0,
    output_probs: opt.ServeOutputProbs = False,
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas",
            help="Serve from N Ray Serve replicas, each with its own engine (needs the ray extra).",
            min=1,
            show_default=False,
            rich_help_panel=_RAY,
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="Join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting a "
            "local Ray for the command.",
            show_default=False,
            rich_help_panel=_RAY,
        ),
    ] = None,
    replica_cpus: Annotated[
        float | None,
        typer.Option(
            "--replica-cpus",
            help="Ray CPUs per replica. [default: 1]",
            min=0.01,
            show_default=False,
            rich_help_panel=_RAY,
        ),
    ] = None,
    min_replicas: Annotated[
        int | None,
        typer.Option(
            "--min-replicas",
            help="Autoscale: the fewest replicas (with --max-replicas).",
            min=0,
            show_default=False,
            rich_help_panel=_RAY,
        ),
    ] = None,
    max_replicas: Annotated[
        int | None,
        typer.Option(
            "--max-replicas",
            help="Autoscale: the most replicas (with --min-replicas).",
            min=1,
            show_default=False,
            rich_help_panel=_RAY,
        ),
    ] = None,
    target_ongoing_requests: Annotated[
        float | None,
        typer.Option(
            "--target-ongoing-requests",
            help="Autoscale: requests per replica to aim at (default: Serve's).",
            min=0.01,
            show_default=False,
            rich_help_panel=_RAY,
        ),
    ] = None,
) -> None:
    """Serve a model over OpenAI's API (chat and text completions), with a chat page at /.

    Example: onnxsample serve   (the embedded model at http://127.0.0.1:8080)

    With --replicas N the same API runs on N Ray Serve replicas behind Ray's proxy; --threads is
    then per replica (default: --replica-cpus, at least 1) and --max-queue is how many requests
    wait at the proxy before 503.
    """
    try:
        import uvicorn

        from onnxsample.serve import ServeSettings, create_app
        from onnxsample.serve.app import CUT_MARGIN
        from onnxsample.serve.middleware import hosts_for, origins_for
    except ImportError as exc:
        raise RuntimeUnavailable(
            f"serving needs the serve extra ({exc.name} is not installed): "
            "pip install 'onnxsample[serve]'"
        ) from None
    from onnxsample.serve.reasoning import check_format

    check_format(reasoning_format)
    origins = origins_for(allowed_origins or ())
    spec = opt.engine_options(
        speculative, draft_tokens, ngram, provider, cuda_graph, row_buckets, chat_template
    )
    how = opt.preparation(provider, spec, attention, candidates, output_probs)
    ray = (replicas, ray_address, min_replicas, max_replicas)
    if all(option is None for option in ray):
        for name, given in (
            ("--replica-cpus", replica_cpus),
            ("--target-ongoing-requests", target_ongoing_requests),
        ):
            if given is not None:
                raise InvalidParameter(f"{name} is for Ray Serve replicas: give --replicas too")
    elif shutdown_grace is not None:
        raise InvalidParameter(
            "--shutdown-grace is for one server process: Ray Serve stops replicas by its own "
            "rules (its proxy stops first, cutting open responses)"
        )
    else:
        _serve_replicas(
            model, host=host, port=port, threads=threads, max_slots=max_slots,
            max_queue=max_queue, api_key=api_key, allowed_hosts=allowed_hosts or [], allowed_origins=origins,
            served_model_name=served_model_name,
            max_len=max_len, prefill_chunk=prefill_chunk, provider=provider, spec=spec,
            replicas=replicas, ray_address=ray_address, replica_cpus=replica_cpus,
            min_replicas=min_replicas, max_replicas=max_replicas,
            target_ongoing_requests=target_ongoing_requests, how=how,
            reasoning_format=reasoning_format,
        )  # fmt: skip
        return
    shutdown_grace = 10.0 if shutdown_grace is None else shutdown_grace
    from onnxsample.engine import Engine

    hosts = hosts_for(host, allowed_hosts or ())
    listening = _listen(host, port)  # before the model: a port in use fails at once
    try:
        composed, name = _prepared(model, max_slots, served_model_name, how)
    except BaseException:
        listening.close()
        raise

    def load() -> Engine:
        return Engine(
            composed,
            provider=provider,
            threads=threads,
            max_len=max_len,
            max_queue=max_queue,
            prefill_chunk=prefill_chunk or None,
            **spec,
        )

    failed: list[BaseException] = []
    config = uvicorn.Config(
        None,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=shutdown_grace + CUT_MARGIN,
        access_log=False,
    )
    server = _graceful(uvicorn)(config)

    def on_load_error(exc: BaseException) -> None:
        failed.append(exc)
        server.should_exit = True

    settings = ServeSettings(
        served_model_name=name,
        api_key=api_key,
        allowed_hosts=hosts,
        allowed_origins=origins,
        reasoning_format=reasoning_format,
    )
    config.app = create_app(load, settings, on_load_error=on_load_error)
    logging.getLogger("onnxsample").setLevel(logging.INFO)
    # the port bound: the system's choice for --port 0
    _announce(name, composed, host, listening.getsockname()[1], api_key)
    server.run(sockets=[listening])
    if failed:
        exc = failed[0]
        raise exc if isinstance(exc, OnnxSampleError) else OnnxSampleError(str(exc))


def _serve_replicas(model: Path | None, *, host: str, port: int, threads: int | None,
                    max_slots: int | None, max_queue: int, api_key: str | None,
                    allowed_hosts: list[str], allowed_origins: frozenset[str] | None,
                    served_model_name: str | None, max_len: int | None, prefill_chunk: int,
                    provider: str, spec: dict, replicas: int | None, ray_address: str | None,
                    replica_cpus: float | None, min_replicas: int | None,
                    max_replicas: int | None,
                    target_ongoing_requests: float | None, how: dict,
                    reasoning_format: str = "none") -> None:  # fmt: skip
    if ray_address is not None:
        _use_ray_token()  # before Ray is imported: it reads the mode once
    try:
        from onnxsample.serve import replicas as ray_serve
        from onnxsample.serve.middleware import hosts_for
    except ImportError as exc:
        raise RuntimeUnavailable(
            f"--replicas needs the ray extra ({exc.name} is not installed): "
            "pip install 'onnxsample[ray]'"
        ) from None

    if max_queue < 1:  # Serve's queue at the proxy is at least one request (or unbounded)
        raise InvalidParameter(
            "--max-queue with --replicas is the requests waiting at Ray Serve's proxy: at least 1"
        )
    if ray_address is None:  # the local Ray's proxy listens there: a taken port fails late
        _listen(host, port).close()
    replica_cpus = 1.0 if replica_cpus is None else replica_cpus
    scaling = ray_serve.Scaling(
        replicas=replicas or min_replicas or 1,
        cpus=replica_cpus,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        target_ongoing_requests=target_ongoing_requests,
        max_queued=max_queue,
    )
    scaling.check()
    composed, name = _prepared(model, max_slots, served_model_name, how)
    options = ray_serve.ReplicaOptions(
        model=str(composed),
        served_model_name=name,
        threads=threads or max(1, int(replica_cpus)),
        max_len=max_len,
        prefill_chunk=prefill_chunk or None,
        provider=provider,
        api_key=api_key,
        allowed_hosts=hosts_for(host, allowed_hosts),
        allowed_origins=allowed_origins,
        reasoning_format=reasoning_format,
        **spec,
    )
    app = ray_serve.build_application(options, scaling)
    where = f"the Ray cluster at {ray_address}" if ray_address else "a local Ray"
    err.print(f"starting {scaling.replicas} replicas of {name} on {where}…", markup=False)

    def ready() -> None:
        _announce(name, composed, host, port, api_key, f" from {scaling.replicas} replicas")

    ray_serve.run(app, scaling, host=host, port=port, address=ray_address, on_ready=ready)


def _prepared(model: Path | None, max_slots: int | None, served_name: str | None, how: dict):
    """The composed model to serve (composed or exported first when needed; `how`:
    :func:`~cli._options.preparation`'s) and its API name."""
    from onnxsample.prepare import prepare

    with stages(PREPARE_LABELS) as progress:
        composed = prepare(model, progress=progress, max_slots=max_slots, **how).resolve()
    return composed, served_name or composed.parent.name


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port`, as uvicorn binds one (IPv6 where the host is an IPv6
    address), for the server to listen on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        raise InvalidParameter(
            f"cannot listen on {where}: {exc.strerror or exc} (--host, --port)"
        ) from None
    return sock


def _announce(
    name: str, composed: Path, host: str, port: int, api_key: str | None, by: str = ""
) -> None:
    everywhere = host in ("0.0.0.0", "::", "")
    shown = "localhost" if host == "127.0.0.1" else host
    where = f"every interface, port {port}" if everywhere else f"http://{shown}:{port}"
    err.print(
        f"serving {name} ({composed}){by} at {where}  — chat page at /, OpenAI API at /v1; "
        "Ctrl-C stops",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    if everywhere and api_key is None:
        err.print(
            "warning: listening on every interface without --api-key: anyone who can reach this "
            "machine can use the API",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _use_ray_token() -> None:
    """Clusters started with ``ray start --head`` (Ray 2.5x) require a token, which a driver
    sends only with ``RAY_AUTH_MODE=token``; without it, joining retries forever. As Ray does for
    local clusters: when the mode is unset and a token is at hand (``RAY_AUTH_TOKEN`` or
    ``~/.ray/auth_token``), use it."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    if os.environ.get("RAY_AUTH_TOKEN") or (Path.home() / ".ray" / "auth_token").is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


def _graceful(uvicorn):
    """uvicorn's server, except that Ctrl-C / SIGTERM tell the app to cut what still runs
    ``CUT_MARGIN`` seconds before the graceful shutdown's time is up (serve sets that time to
    --shutdown-grace + ``CUT_MARGIN``; streams end with an error chunk and ``[DONE]``, not
    a dropped connection), and end the command with status 0 (uvicorn re-raises the signal,
    which would end it as killed)."""
    from onnxsample.serve.app import CUT_MARGIN

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            begin = getattr(getattr(self.config.app, "state", None), "begin_shutdown", None)
            if not self.should_exit and begin is not None:
                try:
                    loop = asyncio.get_running_loop()  # a signal handler runs in the loop's thread
                except RuntimeError:
                    loop = None
                if loop is not None:
                    limit = self.config.timeout_graceful_shutdown or CUT_MARGIN
                    loop.call_soon_threadsafe(begin, max(0.0, limit - CUT_MARGIN))
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    return Server
