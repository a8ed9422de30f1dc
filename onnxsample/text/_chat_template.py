"""Chat templates as transformers renders them: where AutoTokenizer finds a folder's template, and
the sandboxed jinja2 environment it compiles one in (``trim_blocks``/``lstrip_blocks``, its
``tojson`` filter, ``raise_exception``, ``strftime_now`` and the ``{% generation %}`` tag)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from onnxsample.errors import InvalidParameter, first_line

__all__ = [
    "chat_template_of",
    "check_chat_template",
    "compile_template",
    "fold_system",
    "has_text_parts",
    "is_text_parts",
    "join_text_parts",
    "joined_text_parts",
    "read_chat_template",
    "renders_system",
    "renders_tool",
    "takes_text_parts",
]

_NEEDLE = "<system message probe>"


@lru_cache(maxsize=16)
def compile_template(template: str) -> Any:
    """transformers' jinja2 environment for chat templates (utils/chat_template_utils.py). One
    compile per text: the check of a user's template, the engine's and the tokenizer's share it
    (a compiled template only renders, so sharing it is safe across threads)."""
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` marks assistant text; here it just renders."""

        tags = frozenset({"generation"})

        def parse(self, parser: Any) -> Any:
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(line)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def chat_template_of(folder: Path, config: dict, processor: dict) -> str | None:
    """As AutoTokenizer: chat_template.jinja (and additional_chat_templates/*.jinja) over the
    config's entry; of several, "default". chat_template.json (a processor's file AutoTokenizer
    ignores; `processor` is its content) only where there is nothing else."""
    files = {p.stem: p for p in sorted((folder / "additional_chat_templates").glob("*.jinja"))}
    if (folder / "chat_template.jinja").is_file():
        files["default"] = folder / "chat_template.jinja"
    template = {k: p.read_text(encoding="utf-8") for k, p in files.items()} or config.get(
        "chat_template"
    )
    if template is None:
        template = processor.get("chat_template")
    if isinstance(template, list):
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def check_chat_template(template: str) -> Any:
    """`template` compiled, or :class:`InvalidParameter` naming what does not parse (a template
    given in place of the model's, where the model's own only warns)."""
    if not isinstance(template, str) or not template.strip():
        raise InvalidParameter("a chat template must be non-empty jinja text")
    try:
        return compile_template(template)
    except Exception as exc:
        raise InvalidParameter(f"the chat template does not parse: {first_line(exc)}") from exc


def read_chat_template(value: str) -> str:
    """A chat template as options and config files give it: the jinja text itself, or a file
    holding it (as vLLM's and llama-server's ``--chat-template`` / ``--chat-template-file``);
    what is neither, or does not parse, raises :class:`InvalidParameter`."""
    if not isinstance(value, str):
        raise InvalidParameter(
            f"a chat template is jinja text or a file's path, got {type(value).__name__}"
        )
    text, path = value, Path(value).expanduser()
    if "{{" not in value and "{%" not in value:
        try:
            is_file = path.is_file()
        except OSError:  # a name no file system takes (too long)
            is_file = False
        if not is_file:
            raise InvalidParameter(
                f"chat template {value!r} is neither a file nor jinja text ({{{{ }}}}, {{% %}})"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidParameter(
                f"cannot read the chat template {path}: {first_line(exc)}"
            ) from exc
    check_chat_template(text)
    return text


def renders_system(render: Callable[[list[dict]], str]) -> bool:
    """Whether a template writes a system message, `render` rendering messages with it
    (llama.cpp's probe: a system and a user message, the system's text looked for in the output;
    a template that raises on them, as Gemma 2's does, writes none)."""
    try:
        text = render([{"role": "system", "content": _NEEDLE}, {"role": "user", "content": "Hey"}])
    except Exception:
        return False
    return _NEEDLE in text


def renders_tool(render: Callable[[list[dict]], str]) -> bool:
    """Whether a template writes a ``tool`` message, `render` rendering messages with it (a user's,
    an assistant's and a tool's message, the tool's text looked for in the output; a template
    that raises on them, as Gemma 2's does, writes none)."""
    probe = [
        {"role": "user", "content": "Hey"},
        {"role": "assistant", "content": "Hi"},
        {"role": "tool", "content": _NEEDLE},
    ]
    try:
        return _NEEDLE in render(probe)
    except Exception:
        return False


class _Parts(list):
    """A message's content parts that note whether a template reads them as a list."""

    read = False

    def __iter__(self):  # a for loop, selectattr, map, join
        self.read = True
        return super().__iter__()

    def __getitem__(self, index):  # content[0]
        self.read = True
        return super().__getitem__(index)


def takes_text_parts(render: Callable[[list[dict]], str]) -> bool:
    """Whether a template reads a message's content as OpenAI's list of parts, `render` rendering
    messages with it (llama.cpp's ``supports_typed_content``: the template iterates or indexes the
    content, and the text of its part appears in the output). Such a template gets the parts as
    they came, so it joins them as it means to; another gets them joined by
    :func:`join_text_parts`."""
    parts = _Parts([{"type": "text", "text": _NEEDLE}])
    try:
        text = render([{"role": "user", "content": parts}])
    except Exception:
        return False
    return parts.read and _NEEDLE in text


def join_text_parts(parts: list[dict]) -> str:
    """Text parts as one string for a template that takes a string: a newline between them, none
    before the first text (llama.cpp's ``concat_content_parts``; vLLM's newline too)."""
    text = ""
    for part in parts:
        text = f"{text}\n{part['text']}" if text else part["text"]
    return text


def is_text_parts(content: object) -> bool:
    """Whether a message's content is a list of text parts (OpenAI's ``{"type": "text", "text":
    ...}``)."""
    return isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    )


def has_text_parts(messages: list[dict]) -> bool:
    """Whether a message's content is a list of text parts."""
    return any(isinstance(m, dict) and is_text_parts(m.get("content")) for m in messages)


def joined_text_parts(messages: list[dict]) -> list[dict]:
    """`messages` with every content that is a list of text parts joined by
    :func:`join_text_parts`."""
    return [
        {**m, "content": join_text_parts(m["content"])}
        if isinstance(m, dict) and is_text_parts(m.get("content"))
        else m
        for m in messages
    ]


def fold_system(messages: list[dict]) -> list[dict]:
    """The messages for a template that writes no system message, as llama.cpp renders them: a
    system message's text goes to the start of the next user message (a newline between), and
    becomes a user message of its own where another role or the end comes first."""
    folded: list[dict] = []
    pending: list[str] = []

    def flush() -> None:
        if pending:
            folded.append({"role": "user", "content": "\n".join(pending)})
            pending.clear()

    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            if message.get("role") == "system":
                pending.append(content)
                continue
            if message.get("role") == "user" and pending:
                text = "\n".join(pending) + ("\n" + content if content else "")
                message = {**message, "content": text}
                pending.clear()
            else:
                flush()
        folded.append(message)
    flush()
    return folded
