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


def _lookup(value: Any) -> Callable[[str], Any]:
    """A field reader for a dict or an object, giving `_ABSENT` for a field it does not have.

    Pydantic models (LangChain messages, the SDKs' types) are read from their fields directly:
    asking one for an attribute it lacks goes through a slow `__getattr__` that raises.
    """
    if isinstance(value, Mapping):
        return lambda name: value.get(name, _ABSENT)
    cls = type(value)
    if isinstance(getattr(cls, "__pydantic_fields__", None), dict):
        fields = value.__dict__
        extra = getattr(value, "__pydantic_extra__", None) or {}

        def get(name: str) -> Any:
            if name in fields:
                return fields[name]
            if name in extra:
                return extra[name]
            return getattr(value, name, _ABSENT) if name in _class_names(cls) else _ABSENT

        return get
    return lambda name: getattr(value, name, _ABSENT)


_CLASS_NAMES: dict[type, frozenset[str]] = {}


def _class_names(cls: type) -> frozenset[str]:
    """Attributes a class provides (properties, methods): asking pydantic's metaclass is slow."""
    names = _CLASS_NAMES.get(cls)
    if names is None:
        names = _CLASS_NAMES[cls] = frozenset(dir(cls))
    return names


def _getter(value: Any) -> Callable[[str], Any]:
    """A field reader giving None for a field the value does not have."""
    return _or_none(_lookup(value))


def _or_none(look: Callable[[str], Any]) -> Callable[[str], Any]:
    def get(name: str) -> Any:
        found = look(name)
        return None if found is _ABSENT else found

    return get


def _shape(value: Any) -> str:
    return type(value).__name__


class _Reader:
    def __init__(self, keep: tuple[type, ...]) -> None:
        self.keep = keep
        self.units: list[Any] = []
        self.pieces: list[str] = []  # of the unit being read
        self.calls: set[str] = set()  # its tool calls: LangChain repeats content's in tool_calls

    # -- units ------------------------------------------------------------------------------------

    def top(self, value: Any, path: str, depth: int) -> None:
        """Outside any message: each element of a list is a unit of its own."""
        if isinstance(value, list | tuple):
            _nesting(path, depth)
            for i, item in enumerate(value):
                if isinstance(item, str):  # the common case, kept cheap
                    if item.strip():
                        self.units.append(item)
                else:
                    self.top(item, f"{path}[{i}]", depth + 1)
            return
        self.part(value, path, depth)
        self.flush()

    def flush(self) -> None:
        pieces = [p for p in self.pieces if p.strip()]
        if pieces:
            self.units.append(pieces[0] if len(pieces) == 1 else "\n".join(pieces))
        self.pieces, self.calls = [], set()

    # -- inside a unit ----------------------------------------------------------------------------

    def part(self, value: Any, path: str, depth: int) -> None:
        _nesting(path, depth)
        if isinstance(value, str):
            self.pieces.append(value)
            return
        if self.keep and isinstance(value, self.keep):
            self.flush()
            self.units.append(value)
            return
        if isinstance(value, list | tuple):
            for i, item in enumerate(value):
                self.part(item, f"{path}[{i}]", depth + 1)
            return
        if value is None or isinstance(value, bytes | bytearray | int | float | set | frozenset):
            raise _unreadable(value, path)
        look = _lookup(value)
        get = _or_none(look)
        kind = get("type")
        if isinstance(kind, str) and self.block(kind, get, path, depth):
            return
        if look("content") is not _ABSENT or look("role") is not _ABSENT:
            self.message(get, path, depth)
        elif isinstance(get("choices"), list | tuple):  # an OpenAI chat completion
            for i, choice in enumerate(get("choices")):
                self.choice(choice, f"{path}.choices[{i}]", depth + 1)
        elif get("object") == "response" and isinstance(get("output"), list | tuple):
            self.part(get("output"), f"{path}.output", depth + 1)  # an OpenAI Responses response
        elif isinstance(get("page_content"), str):  # a LangChain Document
            self.pieces.append(get("page_content"))
        elif isinstance(kind, str):
            raise TypeError(f"{path}: unsupported block type {kind!r} ({_HINT})")
        else:
            raise _unreadable(value, path)

    def message(self, get: Callable[[str], Any], path: str, depth: int) -> None:
        """A chat message: its content, refusal, audio transcript and tool calls."""
        for name in ("content", "refusal"):
            value = get(name)
            if value is not None:
                self.part(value, f"{path}.{name}", depth + 1)
        audio = get("audio")
        if audio is not None:
            self.optional_text(_getter(audio)("transcript"), f"{path}.audio.transcript")
        for name in ("tool_calls", "invalid_tool_calls"):
            calls = get(name)
            if calls is None:
                continue
            if not isinstance(calls, list | tuple):
                raise TypeError(f"{path}.{name}: expected a list of calls, got {_shape(calls)}")
            for i, call in enumerate(calls):
                self.tool_call(call, f"{path}.{name}[{i}]")
        legacy = get("function_call")  # OpenAI's pre-tools function calling
        if legacy is not None:
            self.tool_call({"function": legacy}, f"{path}.function_call")

    def choice(self, choice: Any, path: str, depth: int) -> None:
        get = _getter(choice)
        if get("message") is not None:
            self.part(get("message"), f"{path}.message", depth + 1)
        elif isinstance(get("text"), str):  # legacy completions
            self.pieces.append(get("text"))
        else:
            raise TypeError(f"{path}: a choice without 'message' or 'text' ({_HINT})")

    def tool_call(self, call: Any, path: str) -> None:
        """One entry of a message's tool_calls: OpenAI's (function / custom) or LangChain's."""
        if call is None or isinstance(call, str | bytes | int | float | list | tuple):
            raise _unreadable(call, path)
        get = _getter(call)
        if get("function") is not None:
            function = _getter(get("function"))
            self.call(function("name"), function("arguments"), f"{path}.function.arguments")
        elif get("custom") is not None:
            custom = _getter(get("custom"))
            self.call(custom("name"), custom("input"), f"{path}.custom.input")
        else:
            look = _lookup(call)
            field = next(
                (f for f in ("args", "input", "arguments") if look(f) is not _ABSENT), "args"
            )
            self.call(get("name"), get(field), f"{path}.{field}")

    def block(self, kind: str, get: Callable[[str], Any], path: str, depth: int) -> bool:
        """Read a content block of a known type; False if `kind` is not one."""
        if kind in TEXT_BLOCKS:
            for name, required in TEXT_BLOCKS[kind]:
                value = get(name)
                if isinstance(value, str):
                    self.pieces.append(value)
                elif isinstance(value, list | tuple):  # reasoning summaries and content
                    self.part(value, f"{path}.{name}", depth + 1)
                elif value is not None or required:
                    raise TypeError(
                        f"{path}.{name}: a {kind!r} block needs a str {name!r}, got {_shape(value)}"
                    )
        elif kind in CALL_BLOCKS:
            field = CALL_BLOCKS[kind]
            self.call(get("name"), get(field), f"{path}.{field}")
        elif kind in RESULT_BLOCKS:
            field = RESULT_BLOCKS[kind]
            if get(field) is not None:
                self.part(get(field), f"{path}.{field}", depth + 1)
        elif kind == "document":
            self.document(get, path, depth)
        elif kind not in OPAQUE_BLOCKS and not kind.endswith("_error"):  # errors carry a code
            return False
        return True

    def document(self, get: Callable[[str], Any], path: str, depth: int) -> None:
        """Anthropic documents: plain-text and content sources are read, files are skipped."""
        source = get("source")
        if source is not None:
            source_get = _getter(source)
            kind = source_get("type")
            if kind == "text":
                self.optional_text(source_get("data"), f"{path}.source.data", required=True)
            elif kind == "content":
                self.part(source_get("content"), f"{path}.source.content", depth + 1)
            elif kind not in _DOCUMENT_OPAQUE_SOURCES:
                raise TypeError(f"{path}.source: unsupported document source type {kind!r}")
        self.optional_text(get("context"), f"{path}.context")

    def optional_text(self, value: Any, path: str, *, required: bool = False) -> None:
        if isinstance(value, str):
            self.pieces.append(value)
        elif value is not None or required:
            raise TypeError(f"{path}: expected a str, got {_shape(value)}")

    def call(self, name: Any, args: Any, path: str) -> None:
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


def _nesting(path: str, depth: int) -> None:
    if depth > MAX_NESTING:
        raise TypeError(f"{path[:200]}...: nested deeper than {MAX_NESTING} levels")


def _unreadable(value: Any, path: str) -> TypeError:
    return TypeError(
        f"{path}: got {_shape(value)}; expected a str, a message (with 'content' or 'role'), a "
        f"content block (with 'type'), a policyhook.Region or a list of those ({_HINT})"
    )


def _check_json(value: Any, path: str) -> None:
    """Tool arguments must be JSON data: anything else could hold text the guard cannot see."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        _nesting(where, depth)
        if isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise TypeError(f"{where}: tool argument keys must be str, got {_shape(key)}")
                stack.append((child, f"{where}.{key}", depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item))
        elif not (item is None or isinstance(item, str | int | float | bool)):
            raise TypeError(f"{where}: tool arguments must be JSON data, got {_shape(item)}")


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
