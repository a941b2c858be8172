"""How the guard reads an input or a summarizer's output: the one definition of every shape.

A value is read as *units* of text: each str, message or content block given on its own (at the
top level or in a list, nested lists flattened) is one unit, a message's parts joined by newlines;
objects of the caller's `keep` types (the ledger's `Region`) pass through whole. Read are: str;
lists and tuples; messages as dicts or objects (LangChain, OpenAI, Anthropic: anything with
`content` or `role`) with their content, refusal and tool calls; content blocks as dicts or objects
(`type` plus fields), listed below. Anything else raises TypeError naming the shape and where it is
(``input[2].content[1]: unsupported block type 'foo'``): a part the guard skipped could hide a
summary whose sources are gone, so nothing is skipped silently. Blocks that hold no readable text
(images, audio, files, redacted thinking, encrypted search results) are skipped by name.
docs/inputs.md is the user's reference to this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

#: Nesting deeper than this is refused (a self-containing list would otherwise never end).
MAX_NESTING = 100

#: Blocks whose text is in a field: (field, required). OpenAI, Anthropic and LangChain v1 names.
TEXT_BLOCKS: Mapping[str, tuple[tuple[str, bool], ...]] = {
    "text": (("text", True),),
    "input_text": (("text", True),),  # OpenAI Responses
    "output_text": (("text", True),),
    "summary_text": (("text", True),),
    "reasoning_text": (("text", True),),
    "text-plain": (("text", False),),  # LangChain v1 plain-text file
    "refusal": (("refusal", True),),  # OpenAI
    "thinking": (("thinking", True),),  # Anthropic
    "reasoning": (("reasoning", False), ("summary", False), ("content", False)),
    "code_execution_result": (("stdout", False), ("stderr", False)),  # Anthropic server tools
    "bash_code_execution_result": (("stdout", False), ("stderr", False)),
}
#: Tool calls: the field holding the arguments (a JSON object, or a str of JSON).
CALL_BLOCKS: Mapping[str, str] = {
    "tool_use": "input",  # Anthropic
    "server_tool_use": "input",
    "mcp_tool_use": "input",
    "tool_call": "args",  # LangChain v1
    "server_tool_call": "args",
    "tool_call_chunk": "args",
    "server_tool_call_chunk": "args",
    "invalid_tool_call": "args",
    "function_call": "arguments",  # OpenAI Responses
    "custom_tool_call": "input",
}
#: Tool results and other wrappers: the field holding their content (read like any value).
RESULT_BLOCKS: Mapping[str, str] = {
    "tool_result": "content",  # Anthropic: a str or a list of blocks
    "mcp_tool_result": "content",
    "search_result": "content",
    "web_fetch_tool_result": "content",
    "web_fetch_result": "content",
    "code_execution_tool_result": "content",
    "bash_code_execution_tool_result": "content",
    "function_call_output": "output",  # OpenAI Responses
    "custom_tool_call_output": "output",
    "server_tool_result": "output",  # LangChain v1
}
#: Blocks with no text the guard can read: skipped by name, never by default.
OPAQUE_BLOCKS = frozenset(
    {
        "image",
        "image_url",
        "input_image",
        "input_audio",
        "audio",
        "video",
        "file",
        "input_file",
        "redacted_thinking",  # encrypted
        "web_search_tool_result",  # results' page text is encrypted
        "web_search_result",
        "container_upload",
    }
)
#: Document sources: text is read, binary and remote ones are skipped.
_DOCUMENT_OPAQUE_SOURCES = frozenset({"base64", "url", "file"})

#: Values that are never a message, block or list: refused where a part is expected.
_SCALARS = (bytes, bytearray, int, float, set, frozenset)

_HINT = "see docs/inputs.md, or pass extractor= to the guard"


def read(value: Any, *, keep: tuple[type, ...] = (), where: str = "input") -> list[Any]:
    """The units of `value`: texts (str, whitespace-only ones dropped) and `keep` objects."""
    if isinstance(value, str):  # the common case, kept cheap
        return [value] if value.strip() else []
    reader = _Reader(keep)
    reader.top(value, where, 0)
    return reader.units


def text(value: Any, *, where: str = "input") -> str:
    """All of `value`'s text, units joined by newlines."""
    return "\n".join(read(value, where=where))


def check_id(name: str, value: str) -> None:
    """Ids (windows, sources, kinds) are keys shared by stores, logs and policies, and must be
    exact: one holding a lone surrogate (a cut character) is refused where it enters, so no part
    sees it. Texts may hold them (every part passes them through)."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f'"{name}" must not hold a lone surrogate: {value!r}') from None


_ABSENT: Any = object()

#: A part's position, rendered only for an error message: the root's name, or (parent, step)
#: with an int step for a list index and a str step for a field.
_Path = str | tuple[Any, int | str]


def _where(path: _Path) -> str:
    steps: list[str] = []
    while isinstance(path, tuple):
        path, step = path
        steps.append(f"[{step}]" if isinstance(step, int) else f".{step}")
    return path + "".join(reversed(steps))


#: A field reader: get(name, default=None) gives the field or `default` when the value lacks it.
_Get = Callable[..., Any]


def _getter(value: Any) -> _Get:
    """A field reader for a dict or an object (`dict.get` itself for dicts, the common case).

    Pydantic models (LangChain messages, the SDKs' types) are read from their fields directly:
    asking one for an attribute it lacks goes through a slow `__getattr__` that raises.
    """
    if type(value) is dict or isinstance(value, Mapping):
        return value.get
    cls = type(value)
    if not isinstance(getattr(cls, "__pydantic_fields__", None), dict):
        return lambda name, default=None: getattr(value, name, default)
    fields: dict[str, Any] = value.__dict__
    extra = getattr(value, "__pydantic_extra__", None)
    names = _class_names(cls)
    if not extra and not names:
        return fields.get  # every field we read is a plain field: the dict's own get

    def get(name: str, default: Any = None) -> Any:
        found = fields.get(name, _ABSENT)
        if found is _ABSENT and extra:
            found = extra.get(name, _ABSENT)
        if found is _ABSENT:
            return getattr(value, name, default) if name in names else default
        return found

    return get


_CLASS_NAMES: dict[type, frozenset[str]] = {}


def _class_names(cls: type) -> frozenset[str]:
    """The names the reader asks for that a class provides itself (properties, methods), not as
    fields: asking pydantic's metaclass is slow, so it is asked once per class."""
    names = _CLASS_NAMES.get(cls)
    if names is None:
        names = _CLASS_NAMES[cls] = frozenset(n for n in _FIELDS_READ if hasattr(cls, n))
    return names


#: Every field name the reader asks of a value (so a class providing one of them itself, not as a
#: field, is known once per class).
_FIELDS_READ = frozenset(
    {
        *(name for fields in TEXT_BLOCKS.values() for name, _ in fields),
        *CALL_BLOCKS.values(),
        *RESULT_BLOCKS.values(),
        *("type", "content", "role", "refusal", "audio", "transcript", "tool_calls"),
        *("invalid_tool_calls", "function_call", "choices", "message", "text", "object"),
        *("output", "page_content", "function", "custom", "name", "args", "input"),
        *("arguments", "source", "data", "context"),
    }
)


class _Plain:
    """What `_plain` reads of a common shape, straight from its fields."""

    __slots__ = ("absent", "empty", "kind", "names", "suffice", "text")

    def __init__(
        self,
        text: str,
        kind: str | None,
        absent: tuple[str, ...] = (),
        empty: tuple[str, ...] = (),
    ) -> None:
        self.text = text  # the field holding the text
        self.kind = kind  # the `type` it must have (None: a message, whose type is not a block's)
        self.absent = absent  # fields that must be absent or None ...
        self.empty = empty  # ... or absent, None or an empty list (of tool calls)
        self.names = frozenset({text, "type", *absent, *empty})
        #: Per pydantic class: are its fields all there is to read (`_fields_suffice`)?
        self.suffice: dict[type, bool] = {}


#: A message whose only readable part is its str content.
_MESSAGE = _Plain(
    "content", None, ("refusal", "audio", "function_call"), ("tool_calls", "invalid_tool_calls")
)
#: A text block: {"type": "text", "text": ...}.
_TEXT_BLOCK = _Plain("text", "text")


def _plain(value: Any, what: _Plain) -> str | None:
    """The text of a plain message or text block (`what`), read straight from a dict's items or
    a pydantic model's fields; None for anything else, which the general path reads (to the
    same text for these shapes)."""
    cls = type(value)
    if cls is dict:
        fields = value
    else:
        suffice = what.suffice.get(cls)
        if suffice is None:
            suffice = what.suffice[cls] = _fields_suffice(cls, what)
        if not suffice or getattr(value, "__pydantic_extra__", None):
            return None
        fields = value.__dict__
    text = fields.get(what.text)
    if type(text) is not str:
        if what.kind is not None or type(text) is not list:
            return None
        text = _plain_content(text)  # a message's list of texts and text blocks
        if text is None:
            return None
    kind = fields.get("type")
    if what.kind is not None:
        return text if kind == what.kind else None
    if kind is not None and (
        not isinstance(kind, str) or kind in _BLOCKS or kind.endswith("_error")
    ):
        return None
    for field in what.absent:
        if fields.get(field) is not None:
            return None
    for field in what.empty:
        calls = fields.get(field)
        if calls is not None and not (type(calls) is list and not calls):
            return None
    return text


def _plain_content(content: list[Any]) -> str | None:
    """A message's content of str and plain text blocks, joined as the general path joins a
    message's pieces (`_Reader.part`, then `flush`: the non-blank ones, by newlines); None when
    an item is anything else."""
    pieces: list[str] = []
    for item in content:
        text = item if type(item) is str else _plain(item, _TEXT_BLOCK)
        if text is None:
            return None
        if text.strip():
            pieces.append(text)
    return "\n".join(pieces)


def _fields_suffice(cls: type, what: _Plain) -> bool:
    """A pydantic model class none of whose fields `what` reads is provided by the class itself
    (a property or method): its `__dict__` is all there is to read of them."""
    return isinstance(getattr(cls, "__pydantic_fields__", None), dict) and not (
        _class_names(cls) & what.names
    )


#: The `type`s the general path reads as a block (not as a message), but for `..._error`.
_BLOCKS = frozenset({*TEXT_BLOCKS, *CALL_BLOCKS, *RESULT_BLOCKS, "document", *OPAQUE_BLOCKS})


def _shape(value: Any) -> str:
    return type(value).__name__


class _Reader:
    def __init__(self, keep: tuple[type, ...]) -> None:
        self.keep = keep
        self.units: list[Any] = []
        self.pieces: list[str] = []  # of the unit being read
        self.calls: set[str] = set()  # its tool calls: LangChain repeats content's in tool_calls

    # -- units ------------------------------------------------------------------------------------

    def top(self, value: Any, path: _Path, depth: int) -> None:
        """Outside any message: each element of a list is a unit of its own."""
        if isinstance(value, list | tuple):
            _nesting(path, depth)
            units = self.units
            for i, item in enumerate(value):
                text = item if type(item) is str else _plain(item, _MESSAGE)
                if text is None:
                    self.top(item, (path, i), depth + 1)
                elif text.strip():  # the common cases, read without the general path
                    units.append(text)
            return
        self.part(value, path, depth)
        self.flush()

    def flush(self) -> None:
        pieces = self.pieces
        if len(pieces) == 1:
            if pieces[0].strip():
                self.units.append(pieces[0])
        elif pieces:
            kept = [p for p in pieces if p.strip()]
            if kept:
                self.units.append(kept[0] if len(kept) == 1 else "\n".join(kept))
        if pieces or self.calls:
            self.pieces, self.calls = [], set()

    # -- inside a unit ----------------------------------------------------------------------------

    def part(self, value: Any, path: _Path, depth: int) -> None:
        if depth > MAX_NESTING:
            _nesting(path, depth)
        cls = type(value)
        if cls is str or isinstance(value, str):
            self.pieces.append(value)
            return
        if self.keep and isinstance(value, self.keep):
            self.flush()
            self.units.append(value)
            return
        if cls is list or cls is tuple or isinstance(value, list | tuple):
            for i, item in enumerate(value):
                text = item if type(item) is str else _plain(item, _TEXT_BLOCK)
                if text is None:
                    self.part(item, (path, i), depth + 1)
                else:  # the common cases, read without the general path
                    self.pieces.append(text)
            return
        if cls is not dict and (value is None or isinstance(value, _SCALARS)):
            raise _unreadable(value, path)
        get = _getter(value)
        kind = get("type")
        if isinstance(kind, str) and self.block(kind, get, path, depth):
            return
        if get("content", _ABSENT) is not _ABSENT or get("role", _ABSENT) is not _ABSENT:
            self.message(get, path, depth)
        elif isinstance(get("choices"), list | tuple):  # an OpenAI chat completion
            for i, choice in enumerate(get("choices")):
                self.choice(choice, ((path, "choices"), i), depth + 1)
        elif get("object") == "response" and isinstance(get("output"), list | tuple):
            self.part(get("output"), (path, "output"), depth + 1)  # an OpenAI Responses response
        elif isinstance(get("page_content"), str):  # a LangChain Document
            self.pieces.append(get("page_content"))
        elif isinstance(kind, str):
            raise TypeError(f"{_where(path)}: unsupported block type {kind!r} ({_HINT})")
        else:
            raise _unreadable(value, path)

    def message(self, get: _Get, path: _Path, depth: int) -> None:
        """A chat message: its content, refusal, audio transcript and tool calls."""
        content = get("content")
        if type(content) is str:  # the common case, kept cheap
            self.pieces.append(content)
        elif content is not None:
            self.part(content, (path, "content"), depth + 1)
        refusal = get("refusal")
        if refusal is not None:
            self.part(refusal, (path, "refusal"), depth + 1)
        audio = get("audio")
        if audio is not None:
            self.optional_text(_getter(audio)("transcript"), ((path, "audio"), "transcript"))
        for name in ("tool_calls", "invalid_tool_calls"):
            calls = get(name)
            if calls is None:
                continue
            if not isinstance(calls, list | tuple):
                raise TypeError(
                    f"{_where((path, name))}: expected a list of calls, got {_shape(calls)}"
                )
            for i, call in enumerate(calls):
                self.tool_call(call, ((path, name), i))
        legacy = get("function_call")  # OpenAI's pre-tools function calling
        if legacy is not None:
            self.tool_call({"function": legacy}, (path, "function_call"))

    def choice(self, choice: Any, path: _Path, depth: int) -> None:
        get = _getter(choice)
        if get("message") is not None:
            self.part(get("message"), (path, "message"), depth + 1)
        elif isinstance(get("text"), str):  # legacy completions
            self.pieces.append(get("text"))
        else:
            raise TypeError(f"{_where(path)}: a choice without 'message' or 'text' ({_HINT})")

    def tool_call(self, call: Any, path: _Path) -> None:
        """One entry of a message's tool_calls: OpenAI's (function / custom) or LangChain's."""
        if call is None or isinstance(call, str | bytes | int | float | list | tuple):
            raise _unreadable(call, path)
        get = _getter(call)
        if get("function") is not None:
            function = _getter(get("function"))
            self.call(function("name"), function("arguments"), ((path, "function"), "arguments"))
        elif get("custom") is not None:
            custom = _getter(get("custom"))
            self.call(custom("name"), custom("input"), ((path, "custom"), "input"))
        else:
            field = next(
                (f for f in ("args", "input", "arguments") if get(f, _ABSENT) is not _ABSENT),
                "args",
            )
            self.call(get("name"), get(field), (path, field))

    def block(self, kind: str, get: _Get, path: _Path, depth: int) -> bool:
        """Read a content block of a known type; False if `kind` is not one."""
        if kind in TEXT_BLOCKS:
            for name, required in TEXT_BLOCKS[kind]:
                value = get(name)
                if isinstance(value, str):
                    self.pieces.append(value)
                elif isinstance(value, list | tuple):  # reasoning summaries and content
                    self.part(value, (path, name), depth + 1)
                elif value is not None or required:
                    raise TypeError(
                        f"{_where((path, name))}: a {kind!r} block needs a str {name!r}, got "
                        f"{_shape(value)}"
                    )
        elif kind in CALL_BLOCKS:
            field = CALL_BLOCKS[kind]
            self.call(get("name"), get(field), (path, field))
        elif kind in RESULT_BLOCKS:
            field = RESULT_BLOCKS[kind]
            if get(field) is not None:
                self.part(get(field), (path, field), depth + 1)
        elif kind == "document":
            self.document(get, path, depth)
        elif kind not in OPAQUE_BLOCKS and not kind.endswith("_error"):  # errors carry a code
            return False
        return True

    def document(self, get: _Get, path: _Path, depth: int) -> None:
        """Anthropic documents: plain-text and content sources are read, files are skipped."""
        source = get("source")
        if source is not None:
            source_get = _getter(source)
            kind = source_get("type")
            at = (path, "source")
            if kind == "text":
                self.optional_text(source_get("data"), (at, "data"), required=True)
            elif kind == "content":
                self.part(source_get("content"), (at, "content"), depth + 1)
            elif kind not in _DOCUMENT_OPAQUE_SOURCES:
                raise TypeError(f"{_where(at)}: unsupported document source type {kind!r}")
        self.optional_text(get("context"), (path, "context"))

    def optional_text(self, value: Any, path: _Path, *, required: bool = False) -> None:
        if isinstance(value, str):
            self.pieces.append(value)
        elif value is not None or required:
            raise TypeError(f"{_where(path)}: expected a str, got {_shape(value)}")

    def call(self, name: Any, args: Any, path: _Path) -> None:
        """A tool call as `[tool call] name(arguments)`, the form adapters archive.

        Arguments are rendered as JSON, which escapes newlines, quotes and non-ASCII: every str
        inside them that the rendering does not hold verbatim is added as a piece of its own, so a
        known text passed as an argument is still found.
        """
        data: Any
        if args is None:
            data, rendered = None, "{}"
        elif isinstance(args, str):  # OpenAI: a str of JSON, as the model wrote it
            rendered = args
            try:
                data = json.loads(args)
            except (ValueError, RecursionError):
                data = None
        else:
            data = args
            _check_json(args, path)
            rendered = json.dumps(args, sort_keys=True)
        line = f"[tool call] {name if isinstance(name, str) else ''}({rendered})"
        if line in self.calls:
            return
        self.calls.add(line)
        self.pieces.append(line)
        self.pieces.extend(s for s in _strings(data) if s not in rendered)


def _nesting(path: _Path, depth: int) -> None:
    if depth > MAX_NESTING:
        raise TypeError(f"{_where(path)[:200]}...: nested deeper than {MAX_NESTING} levels")


def _unreadable(value: Any, path: _Path) -> TypeError:
    return TypeError(
        f"{_where(path)}: got {_shape(value)}; expected a str, a message (with 'content' or "
        f"'role'), a content block (with 'type'), a policyhook.Region or a list of those ({_HINT})"
    )


def _check_json(value: Any, path: _Path) -> None:
    """Tool arguments must be JSON data: anything else could hold text the guard cannot see."""
    stack: list[tuple[Any, _Path, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        _nesting(where, depth)
        if isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise TypeError(
                        f"{_where(where)}: tool argument keys must be str, got {_shape(key)}"
                    )
                stack.append((child, (where, key), depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, (where, i), depth + 1) for i, child in enumerate(item))
        elif not (item is None or isinstance(item, str | int | float | bool)):
            raise TypeError(
                f"{_where(where)}: tool arguments must be JSON data, got {_shape(item)}"
            )


def _strings(data: Any) -> list[str]:
    """Every str inside JSON data (keys and values), depth first."""
    found: list[str] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, Mapping):
            for key, child in reversed(list(item.items())):
                stack.append(child)
                stack.append(key)
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))
    return found
