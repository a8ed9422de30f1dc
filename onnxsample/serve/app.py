"""The FastAPI app: OpenAI's chat and text completions over one :class:`~onnxsample.Engine`.

Every choice of every request is one engine request with its own parameters and seed in its own
slot. The engine is loaded in a thread after the server starts (``/health`` answers 503 until it is
ready); only the engine's thread touches the session and the cache — handlers submit and read
events (asyncio iteration of :class:`~onnxsample.Request`). Tokenising, the chat template and
detokenising run in worker threads (``tokenizers`` lets go of the GIL), never on the event loop,
so one client's large prompt cannot stall the others' streams.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from onnxsample import __version__
from onnxsample.engine import Engine
from onnxsample.engine.request import Completion
from onnxsample.errors import InvalidParameter
from onnxsample.serve import convert, reasoning, tools
from onnxsample.serve.errors import APIError, install, name_fields, request_names
from onnxsample.serve.llama_fields import (
    apply_llama_names,
    post_sampling_bound,
    take_post_sampling,
)
from onnxsample.serve.metrics import Metrics
from onnxsample.serve.middleware import (
    BodyLimit,
    HostCheck,
    KeyRequired,
    ReplicaHeader,
    cross_origin,
)
from onnxsample.serve.native import add_native_routes
from onnxsample.serve.native_answer import Endings
from onnxsample.serve.peer_fields import refuse_unsupported
from onnxsample.serve.props import server_props
from onnxsample.serve.relay import collect, enqueue
from onnxsample.serve.schemas import (
    ChatRequest,
    CompletionRequest,
)
from onnxsample.serve.streaming import (
    Job,
    chat_stream,
    completion_stream,
    request_options,
    sse,
)
from onnxsample.serve.structured import constraint_field

__all__ = ["CUT_MARGIN", "FINGERPRINT", "ServeSettings", "create_app"]

log = logging.getLogger(__name__)

FINGERPRINT = f"onnxsample-{__version__}"
# Seconds a stopping server waits, after cutting what still ran, for the last chunks to go out.
CUT_MARGIN = 1.0


@dataclass
class ServeSettings:
    """`served_model_name` is what clients call the model; `api_key`, when set, is required as
    ``Authorization: Bearer <key>`` on every route but /health and the chat page; bodies over
    `max_body_bytes` get 413; `allowed_hosts` are the Host names answered (None: any; see
    :func:`~onnxsample.serve.middleware.hosts_for`); `allowed_origins` the web origins whose pages
    may call it from a browser (CORS; None: any; empty: none, see
    :func:`~onnxsample.serve.middleware.origins_for`); `replica`, when set, names this process in
    every response's ``x-onnxsample-replica`` header (one of several replicas behind a proxy);
    `reasoning_format` is a chat's ``reasoning_format`` when it sends none (llama-server's
    ``--reasoning-format``)."""

    served_model_name: str
    api_key: str | None = None
    allowed_hosts: frozenset[str] | None = None
    allowed_origins: frozenset[str] | None = frozenset()
    max_body_bytes: int = 4 * 2**20
    drain_seconds: float = 30.0
    replica: str | None = None
    reasoning_format: str = "none"

    def __post_init__(self) -> None:
        reasoning.check_format(self.reasoning_format)


class _State:
    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.error: BaseException | None = None
        self.loaded_at = int(time.time())
        self.stopping = False  # the server cut what was still running (see begin_shutdown)


def create_app(
    load: Callable[[], Engine] | Engine,
    settings: ServeSettings,
    *,
    on_load_error: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The app; `load()` builds the engine (in a thread, once the server is up), or `load` is
    the engine, loaded already. The app closes the engine when it stops."""
    state = _State()
    if isinstance(load, Engine):
        state.engine = load
    metrics = Metrics(lambda: state.engine.load() if state.engine else {})

    def loader() -> None:
        try:
            state.engine = load()
            state.loaded_at = int(time.time())
            log.info("model loaded: %s", state.engine)
        except BaseException as exc:  # reported by /health and to the command
            state.error = exc
            log.error("the model failed to load: %s", exc)
            if on_load_error is not None:
                on_load_error(exc)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if state.engine is None:
            threading.Thread(target=loader, name="onnxsample-load", daemon=True).start()
        yield
        if state.engine is not None:
            await asyncio.to_thread(state.engine.close, cancel=True, timeout=settings.drain_seconds)

    app = FastAPI(title="onnxsample", version=__version__, lifespan=lifespan)
    install(app)

    def begin_shutdown(grace: float) -> None:
        """The server stops (SIGTERM, Ctrl-C): open responses run for `grace` seconds, then what
        still runs is cut, so that every stream ends with an error chunk and ``[DONE]`` and every
        waiting request with a 503, instead of a dropped connection (the server's own limit is
        ``CUT_MARGIN`` seconds later, for those last chunks)."""
        loop = asyncio.get_running_loop()

        def cut() -> None:
            state.stopping = True
            if state.engine is not None:
                log.warning("shutting down: cutting the requests still running")
                loop.run_in_executor(None, lambda: state.engine.close(cancel=True))

        loop.call_later(grace, cut)

    app.state.begin_shutdown = begin_shutdown
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    if settings.api_key is not None:
        app.add_middleware(KeyRequired, key=settings.api_key)
    cross_origin(app, settings.allowed_origins)  # a preflight carries no key
    app.add_middleware(HostCheck, allowed=settings.allowed_hosts)  # outermost: runs first
    if settings.replica is not None:
        app.add_middleware(ReplicaHeader, name=settings.replica)
    static = resources.files("onnxsample.serve") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")

    def engine() -> Engine:
        if state.engine is None:
            why = f"the model failed to load: {state.error}" if state.error else "loading the model"
            raise APIError(503, why, code="loading", headers={"Retry-After": "1"})
        return state.engine

    def check_model(name: str | None) -> None:
        if name is not None and name != settings.served_model_name:
            raise APIError(404, f"the model {name!r} does not exist", param="model")

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(str(static / "index.html"))

    @app.get("/health")
    async def health() -> JSONResponse:
        engine()
        return JSONResponse({"status": "ok"})

    app.head("/health", include_in_schema=False)(health)  # load balancers' probes

    @app.get("/version")  # vLLM's
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/props")
    async def props() -> dict:
        return server_props(engine(), settings.served_model_name, settings.reasoning_format)

    def model_card() -> dict:
        return {
            "id": settings.served_model_name,
            "object": "model",
            "created": state.loaded_at,
            "owned_by": "onnxsample",
            "root": str(engine().path),  # vLLM's: the model served under the name
            "parent": None,
            "max_model_len": engine().limit,
        }

    async def embeddings() -> None:  # llama-server's answer without --embeddings
        raise APIError(
            501,
            "this server does not compute embeddings: it serves a generative model's "
            "completions and chats",
        )

    for path in ("/v1/embeddings", "/embeddings", "/embedding"):
        app.post(path)(embeddings)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    app.get("/models", include_in_schema=False)(models)  # llama-server's alias

    @app.get("/v1/models/{name:path}")  # OpenAI's retrieve; a served name may hold a slash
    async def model(name: str) -> dict:
        check_model(name)
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        e = engine()
        check_model(body.model)
        apply_llama_names(body)  # n_predict, repeat_penalty: llama-server's names
        endings = Endings.read(body.model_extra, fields=False)  # n_indent, t_max_predict_ms
        # llama-server's: the final distribution's probabilities, when there are logprobs
        post_sampling = take_post_sampling(body.model_extra or {}) and bool(body.logprobs)
        refuse_unsupported(body.model_extra, route="chat", sampling=body, context=e.limit)
        tools.check_text_only(body)
        native = tools.native_format(e.tokenizer)
        plan = tools.plan_tools(body, native)
        top = body.top_logprobs or 0
        if top and not body.logprobs:
            raise InvalidParameter("top_logprobs needs logprobs=true")
        bound = post_sampling_bound(body, e.meta) if post_sampling else None
        if post_sampling and (top < 0 or (bound is not None and top > bound)):
            within = ">= 0" if bound is None else f"in [0, {bound}] (the model's candidates)"
            raise InvalidParameter(f"top_logprobs must be {within}, got {top}")
        if plan is not None and body.logprobs:  # its tokens spell the calls' format, not content
            raise InvalidParameter(
                "logprobs are not returned with tools: the answer's tokens are the tool-call "
                "format's, not the message's (ask without tools, or with tool_choice none)"
            )
        asked = {"post_sampling_probs": top} if post_sampling else {}
        if not post_sampling:
            asked = {"logprobs": body.logprobs, "top_logprobs": top}
        calls = plan.constraint if plan is not None else None
        name_fields(request, constraint_field(body, bool(calls)), prompt="messages")
        params = convert.choice_params(body, tools=calls, **asked)
        given = body.max_completion_tokens
        limit = convert.token_limit(body.max_tokens if given is None else given, None)

        def prepared() -> list:
            prompt = tools.chat_prompt(e.tokenizer, body, native, plan)  # messages, or ids
            seqs = [
                e.prepare(prompt, p, limit, body.stop, None, None, i) for i, p in enumerate(params)
            ]
            return endings.apply(request_options(seqs, body))

        seqs = await asyncio.to_thread(prepared)
        opened = None  # where the thought goes apart: whether the prompt opened it
        if (body.reasoning_format or settings.reasoning_format) != "none":
            tail = e.tokenizer.decode(seqs[0].prompt[-8:], skip_special_tokens=False)
            opened = reasoning.opens_thought(tail)
        requests = enqueue(e, seqs, metrics)
        meta = _meta("chatcmpl", settings)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            job = Job(
                e, requests, seqs, [seqs[0].prompt], meta, usage, metrics, "chat.completion.chunk"
            )
            job.stopping, job.names = (lambda: state.stopping), request_names(request)
            return sse(chat_stream(job, plan, opened))
        done = await collect(
            requests, request, metrics, lambda: state.stopping, tools.loop_watch(plan, len(seqs))
        )
        choices = []
        for c in done:
            message, finish = tools.answer(c, plan, opened)
            logprobs = None
            if body.logprobs:
                kept = c.written_tokens()  # a stop string's tokens are no part of the content
                end, end_lp, end_top = convert.end_entry(c)
                content = convert.chat_logprobs(
                    e.tokenizer,
                    c.token_ids[:kept] + end,
                    list(c.logprobs or [])[:kept] + end_lp,
                    None if c.top_logprobs is None else c.top_logprobs[:kept] + end_top,
                    post_sampling=post_sampling,
                )
                logprobs = {"content": content}
            choices.append(
                {
                    "index": c.index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                    "timings": convert.timings(c),
                }
            )
        return {
            **meta,
            "object": "chat.completion",
            "choices": choices,
            "usage": convert.usage(done, [seqs[0].prompt]),
            "timings": choices[0]["timings"],  # llama-server's place for them (the first choice)
        }

    app.post("/chat/completions", include_in_schema=False)(chat)  # llama-server's alias

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        e = engine()
        check_model(body.model)
        apply_llama_names(body)  # n_predict, repeat_penalty: llama-server's names
        endings = Endings.read(body.model_extra, fields=False)  # n_indent, t_max_predict_ms
        refuse_unsupported(body.model_extra, route="completion", sampling=body, context=e.limit)
        prompts = convert.prompts(body.prompt)
        n_logprobs = body.logprobs
        if n_logprobs is not None and not 0 <= n_logprobs <= e.meta.top_logprobs:
            raise InvalidParameter(
                f"logprobs must be in [0, {e.meta.top_logprobs}], got {n_logprobs}"
            )
        score_only = body.echo and body.max_tokens == 0  # likelihood scoring: the prompt alone
        limit = 1 if score_only else convert.token_limit(body.max_tokens, 16)
        name_fields(request, constraint_field(body))
        params = convert.choice_params(
            body,
            logprobs=n_logprobs is not None,
            top_logprobs=n_logprobs or 0,
            prompt_logprobs=n_logprobs if body.echo and n_logprobs is not None else None,
        )

        def prepared() -> tuple[list, dict]:
            seqs = [
                e.prepare(prompt, p, limit, body.stop, False, None, k * body.n + j)
                for k, prompt in enumerate(prompts)
                for j, p in enumerate(params)
            ]
            endings.apply(request_options(seqs, body))
            if not body.echo:
                return seqs, {}
            return seqs, {s.index: _echo_text(e, prompts[s.index // body.n]) for s in seqs}

        seqs, echo = await asyncio.to_thread(prepared)
        requests = enqueue(e, seqs, metrics, "n" if body.n > 1 else "prompt")
        meta = _meta("cmpl", settings)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            unique = [s.prompt for s in seqs[:: body.n]]
            job = Job(e, requests, seqs, unique, meta, usage, metrics, "text_completion")
            job.stopping, job.names = (lambda: state.stopping), request_names(request)
            return sse(completion_stream(job, echo, n_logprobs, score_only))
        done = await collect(requests, request, metrics, lambda: state.stopping)
        choices = [
            _completion_choice(e, c, echo.get(c.index), n_logprobs, score_only) for c in done
        ]
        return {
            **meta,
            "object": "text_completion",
            "choices": choices,
            "usage": convert.usage([] if score_only else done, [s.prompt for s in seqs[:: body.n]]),
            "timings": choices[0]["timings"],
        }

    add_native_routes(
        app, engine, check_model, settings.served_model_name, metrics, lambda: state.stopping
    )

    return app


def _meta(prefix: str, settings: ServeSettings) -> dict:
    return {
        "id": f"{prefix}-{secrets.token_hex(12)}",
        "created": int(time.time()),
        "model": settings.served_model_name,
        "system_fingerprint": FINGERPRINT,
    }


def _echo_text(engine: Engine, prompt) -> str:
    """The prompt as an echo writes it: a text as sent, token ids as their text with the special
    tokens (as a text prompt keeps them), so that ``text_offset`` points into it."""
    if isinstance(prompt, str):
        return prompt
    return engine.tokenizer.decode(prompt, skip_special_tokens=False)


def _completion_choice(
    engine: Engine, c: Completion, echo: str | None, n_logprobs: int | None, score_only: bool
) -> dict:
    tokens = [] if score_only else c.token_ids[: c.written_tokens()]  # not a stop string's
    text = "" if score_only else c.text
    logprobs = None
    if n_logprobs is not None:
        lps: list = [] if score_only else list(c.logprobs or [])[: len(tokens)]
        tops: list = [] if score_only else list(c.top_logprobs or [[]] * len(tokens))[: len(tokens)]
        ids = list(tokens)
        if not score_only:  # the end-of-sequence token that ended it, as vLLM lists it
            end, end_lp, end_top = convert.end_entry(c)
            ids, lps, tops = ids + end, lps + end_lp, tops + end_top
        if echo is not None:
            ids = c.prompt_token_ids + ids
            lps = list(c.prompt_logprobs or []) + lps
            tops = list(c.prompt_top_logprobs or []) + tops
        logprobs = convert.legacy_logprobs(engine.tokenizer, ids, lps, tops)
    return {
        "index": c.index,
        "text": (echo or "") + text,
        "logprobs": logprobs,
        "finish_reason": "length" if score_only else convert.FINISH[c.finish_reason],
        "timings": convert.timings(c, score_only=score_only),
    }
