"""`onnxsample run`: generate text with sampling inside the graph."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from onnxsample.cli import _options as opt
from onnxsample.cli._ui import PREPARE_LABELS, err, stages, write
from onnxsample.engine import DEFAULT_PREFILL_CHUNK
from onnxsample.errors import InvalidParameter

_LABELS = PREPARE_LABELS | {"session": "Loading the model into ONNX Runtime"}
_SAMPLING = "Sampling (defaults as llama.cpp's; top-k 0, top-p 1, min-p 0, typical-p 1: off)"


def _bias(values: list[str]) -> dict[int, float]:
    """``ID=VALUE`` or llama.cpp's ``ID+VALUE`` / ``ID-VALUE``; a token given twice gets the sum,
    as llama.cpp adds every entry."""
    table: dict[int, float] = {}
    for item in values:
        found = re.fullmatch(r"\s*(\d+)\s*(?:=\s*(\S+)|([+-]\S+))\s*", item)
        try:
            if found is None:
                raise ValueError
            token = int(found.group(1))
            table[token] = table.get(token, 0.0) + float(found.group(2) or found.group(3))
        except ValueError:
            raise InvalidParameter(
                f"--logit-bias takes ID=VALUE (e.g. 42=-100; or llama.cpp's 42-100), got {item!r}"
            ) from None
    return table


def run(
    model: opt.RunModel = None,
    prompt: Annotated[
        list[str],
        typer.Option("--prompt", "-p", help="A prompt; repeat -p to run several as one batch."),
    ] = (),
    file: Annotated[
        list[str],
        typer.Option(
            "--file",
            "-f",
            help="A prompt read from a file (UTF-8, one trailing newline dropped), - for stdin, "
            "as llama-cli's -f; repeatable, after the -p prompts.",
            show_default=False,
        ),
    ] = (),
    temperature: Annotated[
        float,
        typer.Option("--temperature", "--temp", help="0 = greedy.", rich_help_panel=_SAMPLING),
    ] = 0.8,
    top_k: Annotated[
        int, typer.Option(help="Keep the k most likely tokens.", rich_help_panel=_SAMPLING)
    ] = 40,
    top_p: Annotated[
        float, typer.Option(help="Nucleus mass, in (0, 1].", rich_help_panel=_SAMPLING)
    ] = 0.95,
    min_p: Annotated[
        float, typer.Option(help="Drop p < min_p * p_max.", rich_help_panel=_SAMPLING)
    ] = 0.05,
    typical_p: Annotated[
        float, typer.Option(help="Locally typical mass.", rich_help_panel=_SAMPLING)
    ] = 1.0,
    temperature_last: Annotated[
        bool,
        typer.Option(
            "--temperature-last/--temperature-first",
            help="Temperature after top-k, top-p, min-p and typical-p (where llama.cpp puts it), or "
            "before them (transformers' and vLLM's, the default: a CUDA graph draws it on the "
            "device).",
            rich_help_panel=_SAMPLING,
        ),
    ] = False,
    repetition_penalty: Annotated[
        float,
        typer.Option(
            "--repetition-penalty",
            "--repeat-penalty",
            help="> 1 discourages prompt and output tokens.",
            rich_help_panel=_SAMPLING,
        ),
    ] = 1.0,
    presence_penalty: Annotated[
        float, typer.Option(help="OpenAI's, in [-2, 2].", rich_help_panel=_SAMPLING)
    ] = 0.0,
    frequency_penalty: Annotated[
        float, typer.Option(help="OpenAI's, in [-2, 2].", rich_help_panel=_SAMPLING)
    ] = 0.0,
    logit_bias: Annotated[
        list[str],
        typer.Option(
            help="ID=VALUE (or llama.cpp's ID+VALUE), VALUE in [-100, 100]; repeatable (a token "
            "given twice gets the sum, as in llama.cpp).",
            rich_help_panel=_SAMPLING,
        ),
    ] = (),
    seed: Annotated[
        int | None,
        typer.Option(
            help="Seed of every prompt's own generator; -1 or none: a random one (printed by "
            "--json), as llama-cli's.",
            rich_help_panel=_SAMPLING,
        ),
    ] = None,
    max_new_tokens: Annotated[
        int,
        typer.Option(
            "--max-new-tokens",
            "--n-predict",
            "-n",
            help="Tokens to generate at most; -1: until the end of the sequence or the context, "
            "as llama-cli's.",
        ),
    ] = 256,
    stop: Annotated[list[str], typer.Option(help="Stop string (not printed); repeatable.")] = (),
    system: Annotated[str | None, typer.Option(help="System prompt (chat mode).")] = None,
    chat: Annotated[
        bool | None,
        typer.Option(
            "--chat/--no-chat",
            help="Use the model's chat template (default: when it has one).",
            show_default=False,
        ),
    ] = None,
    logprobs: Annotated[
        int, typer.Option(help="Report each token's logprob and the top N alternatives (0-20).")
    ] = 0,
    stream: Annotated[
        bool | None,
        typer.Option(
            "--stream/--no-stream",
            help="Print text as it is decoded (default: with one prompt and no --json).",
            show_default=False,
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON object per prompt and line.")
    ] = False,
    json_schema: Annotated[
        str | None,
        typer.Option(
            help="Answer in JSON matching this schema: a file, or the schema's JSON text.",
            show_default=False,
        ),
    ] = None,
    json_object: Annotated[
        bool, typer.Option("--json-object", help="Answer with any JSON object.")
    ] = False,
    regex: Annotated[
        str | None,
        typer.Option(help="Answer with text the regular expression matches.", show_default=False),
    ] = None,
    grammar: Annotated[
        str | None,
        typer.Option(
            help="Answer with text the grammar derives (GBNF as llama.cpp writes it, or Lark): "
            "a file, or the grammar's text.",
            show_default=False,
        ),
    ] = None,
    choice: Annotated[
        list[str], typer.Option(help="Answer with exactly one of these strings; repeatable.")
    ] = (),
    provider: opt.Provider = "auto",
    cuda_graph: opt.CudaGraph = None,
    row_buckets: opt.RowBuckets = True,
    chat_template: opt.ChatTemplate = None,
    threads: opt.Threads = None,
    max_len: opt.MaxLen = None,
    prefill_chunk: opt.PrefillChunk = DEFAULT_PREFILL_CHUNK,
    speculative: opt.Speculative = None,
    attention: opt.EmbeddedAttention = "gqa",
    draft_tokens: opt.DraftTokens = None,
    ngram: opt.Ngram = None,
) -> None:
    """Generate text; sampling runs inside the ONNX graph, one seeded generator per prompt.

    Example: onnxsample run -p "Why is the sky blue?" --seed 1   (the embedded model, streamed)
    """
    from onnxsample.engine.generator import Generator
    from onnxsample.params import SamplingParams
    from onnxsample.prepare import prepare

    prompt = [*prompt, *(_read_prompt(name) for name in file)]
    if not prompt:
        taken = f" ({str(model)!r} was read as the model)" if model and not model.exists() else ""
        raise InvalidParameter(f"give at least one prompt with -p TEXT or -f FILE{taken}")
    if stream and (json_output or len(prompt) > 1):
        raise InvalidParameter(
            "--stream prints one prompt's text as it is decoded: with --json or several prompts "
            "each answer is printed whole (drop --stream)"
        )
    if not 0 <= logprobs <= 20:
        raise InvalidParameter(f"logprobs must be in [0, 20], got {logprobs}")
    if max_new_tokens < 1 and max_new_tokens != -1:
        raise InvalidParameter(
            f"--max-new-tokens must be -1 (until the end) or at least 1, got {max_new_tokens}"
        )
    params = SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        typical_p=typical_p,
        temperature_last=temperature_last,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        logit_bias=_bias(logit_bias),
        seed=None if seed == -1 else seed,
        logprobs=logprobs > 0,
        top_logprobs=logprobs,
        constraint=_constraint(json_schema, json_object, regex, grammar, list(choice)),
    )
    params.validate()
    spec = opt.engine_options(
        speculative, draft_tokens, ngram, provider, cuda_graph, row_buckets, chat_template
    )
    if chat_template is not None and chat is False:
        raise InvalidParameter("--chat-template needs chat mode: drop --no-chat")
    with stages(_LABELS) as progress:
        how = opt.preparation(provider, spec, attention)
        composed = prepare(model, progress=progress, **how)
        progress("session")
        generator = Generator(
            composed,
            provider=provider,
            threads=threads,
            max_len=max_len,
            prefill_chunk=prefill_chunk or None,
            **spec,
        )
    limit = None if max_new_tokens == -1 else max_new_tokens  # llama-cli's -1: no limit
    kwargs = dict(max_new_tokens=limit, stop=list(stop), chat=chat, system=system)
    streaming = stream is not False and not json_output and len(prompt) == 1
    with generator:  # closed (its requests cancelled) however this ends: Ctrl-C, a closed pipe
        _answer(generator, prompt, params, kwargs, streaming, json_output, logprobs, limit)


def _answer(generator, prompt, params, kwargs, streaming, json_output, logprobs, limit) -> None:
    """Generate and print: the answers' text on stdout as the model wrote it (no markup, emoji
    codes or control characters rewritten), everything else on stderr."""
    if streaming:
        completions, printed = [], False
        try:
            for event in generator.stream(list(prompt), params, **kwargs):
                write(event.text)
                printed = printed or bool(event.text)
                if event.completion is not None:
                    completions.append(event.completion)
        finally:
            if printed or completions:
                write("\n")  # the text's line ends, before an error's line too
    else:
        completions = generator.generate(list(prompt), params, **kwargs)
    for c in completions:
        if json_output:
            write(json.dumps(c.to_json(), ensure_ascii=False) + "\n")
        elif not streaming:
            header = f"[{c.index}] " if len(prompt) > 1 else ""
            write(header + c.text + "\n")
        if logprobs and not json_output:
            _print_logprobs(generator.tokenizer, c)
        cut_short = c.finish_reason == "stop" or (
            c.finish_reason == "length" and c.constraint_complete is False
        )
        if params.constraint is not None and cut_short:
            which = f"[{c.index}] " if len(prompt) > 1 else ""
            cut = "--max-new-tokens" if limit is not None else "the context's end"
            cut = "a --stop string" if c.finish_reason == "stop" else cut
            err.print(
                f"warning: {which}{cut} ended the answer, not its constraint: it may not match",
                markup=False,
                highlight=False,
            )
    _print_timings(generator, completions)


def _read_prompt(name: str) -> str:
    """The prompt in file `name` (``-``: stdin), read as UTF-8 text without one trailing newline
    (an editor's; llama-cli's ``-f`` drops it too)."""
    if name == "-" and sys.stdin is None:
        raise InvalidParameter("-f - reads the prompt from stdin, which is closed")
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).expanduser().read_bytes()
    except OSError as exc:
        raise InvalidParameter(
            f"cannot read the prompt file {name}: {exc.strerror or exc}"
        ) from None
    try:
        return data.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError as exc:
        where = "stdin" if name == "-" else name
        raise InvalidParameter(
            f"the prompt in {where} is not UTF-8 text (byte {exc.start}: {data[exc.start]:#04x})"
        ) from None


def _print_logprobs(tokenizer, completion) -> None:
    for token, lp, top in zip(
        completion.token_ids, completion.logprobs or [], completion.top_logprobs or [], strict=False
    ):
        alternatives = "  ".join(f"{tokenizer.token_to_text(t)!r} {v:.3f}" for t, v in top)
        err.print(
            f"{tokenizer.token_to_text(token)!r:>14} {lp:8.3f}   {alternatives}",
            markup=False,
            highlight=False,
        )


def _print_timings(generator, completions) -> None:
    t = generator.last_timings
    reasons = ", ".join(sorted({c.finish_reason for c in completions}))
    err.print(
        f"prompt {t.prompt_tokens} tokens in {t.prefill_s * 1000:.0f} ms ({t.prompt_tps:.1f} tok/s) | "
        f"decode {t.generated_tokens - t.sequences} tokens in {t.decode_s * 1000:.0f} ms "
        f"({t.decode_tps:.1f} tok/s) | first token {t.ttft_s * 1000:.0f} ms | {len(completions)} "
        f"sequence(s), finished: {reasons} | {t.cached_tokens} prompt tokens reused | "
        f"{_drafts(t)}{generator.device}, "
        f"{generator.threads or 'default'} threads",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _drafts(t) -> str:
    if not t.draft_tokens:
        return ""
    rate = t.accepted_tokens / t.draft_tokens
    return f"{t.accepted_tokens}/{t.draft_tokens} draft tokens accepted ({rate:.0%}) | "


def _constraint(json_schema, json_object, regex, grammar, choice):
    """The one output constraint the options ask for (structured output), or None."""
    from onnxsample.constraint import Constraint, one_constraint

    given = {
        "--json-schema": json_schema is not None,
        "--json-object": json_object,
        "--regex": regex is not None,
        "--grammar": grammar is not None,
        "--choice": bool(choice),
    }
    if sum(given.values()) > 1:  # named before any is read or compiled
        one_constraint(dict.fromkeys((n for n, on in given.items() if on), True), "run")
    return one_constraint(
        {
            "--json-schema": Constraint.json_schema(_file_or_text(json_schema))
            if json_schema is not None
            else None,
            "--json-object": Constraint.json_object() if json_object else None,
            "--regex": Constraint.regex(regex) if regex is not None else None,
            "--grammar": Constraint.grammar(_file_or_text(grammar))
            if grammar is not None
            else None,
            "--choice": Constraint.choice(choice) if choice else None,
        },
        "run",
    )


# A word with one of these endings is a missing file; a schema or grammar has spaces (a Lark
# regex such as `start: /[a-z]+\.json/` ends in one too).
_FILE_SUFFIXES = (".json", ".gbnf", ".lark", ".txt")


def _file_or_text(value: str) -> str:
    try:
        is_file = Path(value).is_file()
    except (OSError, ValueError):  # text too long (or odd) to be a path: the text itself
        return value
    if not is_file:
        if not any(c.isspace() for c in value) and Path(value).suffix in _FILE_SUFFIXES:
            raise InvalidParameter(f"no such file: {value}")  # not text that reads as a schema
        return value
    try:
        return Path(value).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameter(f"cannot read {value}: {exc}") from None
