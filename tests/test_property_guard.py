"""Property: a summary whose source is gone is never allowed, whatever shape it arrives in.

Hypothesis builds nestings of every shape the guard reads (str, lists and tuples, LangChain
messages, OpenAI and Anthropic message dicts and SDK objects, content blocks as dicts and objects,
tool calls and tool results, opaque blocks) around known texts: recorded summaries whose source is
live or evicted, registered texts quoting those summaries, registered sources and new text, sometimes with a part the guard cannot read.
Each example is checked twice, through `guard.check` and through a decorated summarizer, under the
default policy and every installed CEL backend. Fixed budget, derandomized: CI stays bounded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic.types as anth
import deep
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from openai.types.chat import ChatCompletionMessage
from outage import one_fault, store_down

from policyhook import Guard, MemoryStore, UnsafeRecompactionError, _shapes
from policyhook import _cel as cel
from policyhook._loader import load_default

SOURCES = {
    "cfg-live": "config read: retry_ceiling = 7 for the billing job",
    "cfg-dead": "config read: deploy window is 02:00-04:00 UTC on weekdays",
}
#: Summary text -> whether its source is evicted. Quotes, newlines and non-ASCII on purpose.
SUMMARIES = {
    'Summary: the retry "ceiling" is seven — billing config ✓': False,
    "Summary: deploys run\nin the window 02:00-04:00 UTC": True,
}
#: Registered texts (ai_turn) quoting a summary: they carry its provenance (issue 10 item 5).
QUOTING = {f"Assistant: as summarized, {text}": dead for text, dead in SUMMARIES.items()}
FRESH = ["a new user turn about the deploy", "tool output: 3 files changed", "ok", "\ud83d cut"]
PRESSURE = deep.suite(150, None, HealthCheck.function_scoped_fixture)


@dataclass(frozen=True)
class Built:
    """A generated value and what the generator put in it."""

    value: Any
    texts: tuple[str, ...] = ()  # every known or new text placed in it
    dead: bool = False  # holds a summary whose source is evicted
    summary: bool = False  # holds any recorded summary
    unreadable: bool = False  # holds a part the guard cannot read


def combine(value: Any, parts: list[Built]) -> Built:
    return Built(
        value,
        tuple(t for p in parts for t in p.texts),
        any(p.dead for p in parts),
        any(p.summary for p in parts),
        any(p.unreadable for p in parts),
    )


# -- leaves: a text, placed whole or inside other words -------------------------------------------


@st.composite
def leaf_text(draw: st.DrawFn) -> Built:
    kind = draw(st.sampled_from(["summary", "quoting", "source", "fresh"]))
    if kind in ("summary", "quoting"):
        known = SUMMARIES if kind == "summary" else QUOTING
        text = draw(st.sampled_from(sorted(known)))
        dead, summary = known[text], True
    else:
        text = draw(st.sampled_from(sorted(SOURCES.values()) if kind == "source" else FRESH))
        dead = summary = False
    if draw(st.booleans()):
        text_in = f"{draw(st.sampled_from(FRESH))} {text} {draw(st.sampled_from(FRESH))}"
    else:
        text_in = text
    return Built(text_in, (text,), dead, summary)


def wrap(make: Callable[[str], Any]) -> Callable[[Built], Built]:
    """A shape holding one text."""
    return lambda b: Built(make(b.value), b.texts, b.dead, b.summary, b.unreadable)


def openai_call(text: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "note", "arguments": json.dumps({"text": text})},
            }
        ],
    }


TEXT_SHAPES: list[Callable[[Built], Built]] = [
    lambda b: b,  # a bare str
    wrap(HumanMessage),
    wrap(lambda t: AIMessage([{"type": "text", "text": t}])),
    wrap(lambda t: ToolMessage(t, tool_call_id="c1")),
    wrap(lambda t: AIMessage("", tool_calls=[{"name": "note", "args": {"t": [t]}, "id": "c"}])),
    wrap(lambda t: {"role": "user", "content": t}),
    wrap(lambda t: {"role": "tool", "tool_call_id": "c1", "content": t}),
    wrap(openai_call),
    wrap(lambda t: ChatCompletionMessage.model_validate(openai_call(t))),
    wrap(lambda t: {"type": "text", "text": t}),
    wrap(lambda t: {"type": "tool_result", "tool_use_id": "t", "content": t}),
    wrap(
        lambda t: {
            "type": "tool_result",
            "tool_use_id": "t",
            "content": [anth.TextBlock(type="text", text=t)],
        }
    ),
    wrap(lambda t: {"type": "tool_use", "id": "t", "name": "w", "input": {"q": t}}),
    wrap(lambda t: anth.ToolUseBlock(type="tool_use", id="t", name="w", input={"q": t})),
    wrap(lambda t: anth.ThinkingBlock(type="thinking", thinking=t, signature="s")),
    wrap(lambda t: {"type": "document", "source": {"type": "text", "data": t}}),
    wrap(lambda t: {"type": "function_call_output", "call_id": "c", "output": t}),
]
OPAQUE = [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}},
    {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
    anth.RedactedThinkingBlock(type="redacted_thinking", data="opaque"),
]
UNREADABLE = [
    {"type": "hologram", "text": "x"},
    42,
    b"raw bytes",
    {"messages": ["x"]},
    {"role": "user", "content": object()},
]


@st.composite
def piece(draw: st.DrawFn) -> Built:
    """One content piece: a text in a shape, an opaque block, or (rarely) an unreadable part."""
    choice = draw(st.integers(0, 19))
    if choice == 0:
        return Built(draw(st.sampled_from(UNREADABLE)), unreadable=True)
    if choice == 1:
        return Built(draw(st.sampled_from(OPAQUE)))
    return draw(st.sampled_from(TEXT_SHAPES))(draw(leaf_text()))


def container(children: st.SearchStrategy[Built]) -> st.SearchStrategy[Built]:
    """Shapes holding several pieces: lists, tuples, messages with block content, tool results."""

    def build(kind: int, parts: list[Built]) -> Built:
        values = [p.value for p in parts]
        made: Any
        if kind == 0:
            made = values
        elif kind == 1:
            made = tuple(values)
        elif kind == 2:
            made = {"role": "user", "content": values}
        elif kind == 3:  # unvalidated: LangChain would refuse the unreadable parts itself
            made = HumanMessage.model_construct(content=values)
        elif kind == 4:
            made = {"type": "tool_result", "tool_use_id": "t", "content": values}
        else:
            made = anth.Message.model_construct(
                id="m", type="message", role="assistant", content=values, model="x"
            )
        return combine(made, parts)

    return st.builds(build, st.integers(0, 5), st.lists(children, min_size=1, max_size=4))


VALUES = st.recursive(piece(), container, max_leaves=12)


def returning(output: str) -> Callable[[Any], str]:
    def summarize(value: Any) -> str:
        return output

    return summarize


@pytest.fixture
def guard(backend: cel.Backend) -> Guard:
    """The default policy; SUMMARIES recorded, each on its source, and cfg-dead evicted."""
    guard = Guard(load_default(backend=backend), store=MemoryStore())
    for source_id, text in SOURCES.items():
        guard.record_source(text, "config_read", source_id)
    for summary, dead in SUMMARIES.items():
        source = "cfg-dead" if dead else "cfg-live"
        guard(returning(summary), summarizer="setup")(SOURCES[source])
    for text in QUOTING:
        guard.record_source(text, "ai_turn")
    guard.store.evict("cfg-dead")
    return guard


def check(guard: Guard, built: Built) -> None:
    calls: list[Any] = []

    def summarize(value: Any) -> str:
        calls.append(value)
        return f"fresh output number {len(calls)} of a test summarizer"

    guarded = guard(summarize, summarizer="property")
    if built.unreadable:
        with pytest.raises(TypeError):
            guard.check(built.value, summarizer="property")
        with pytest.raises(TypeError):
            guarded(built.value)
        assert calls == []
        return
    read = "\n".join(_shapes.read(built.value))
    missing = [t for t in built.texts if t.strip() and t not in read]
    assert not missing, f"read without {missing!r}"
    with one_fault([guard.store], 0) as made:  # (counting the decision's store calls)
        effect = guard.check(built.value, summarizer="property").effect
    if built.dead:
        assert effect == "deny"
        with pytest.raises(UnsafeRecompactionError):
            guarded(built.value)
        assert calls == []
        for at in range(1, len(made) + 1):  # any one of the decision's store calls failing
            with one_fault([guard.store], at):
                assert guard.check(built.value, summarizer="property").effect == "deny", at
        with store_down(guard.store):
            assert guard.check(built.value, summarizer="property").effect == "deny"
    elif not built.summary:
        assert effect == "allow"  # original content only: the property is not vacuous


@PRESSURE
@given(built=VALUES)
def test_dead_source_summary_in_any_shape_is_never_allowed(guard: Guard, built: Built) -> None:
    """Any nesting holding a summary whose source is evicted is refused by the default policy
    (guard.check and a decorated summarizer), with any one store call of the decision failing
    and with the store down too; every generated text is read, never skipped; a part the guard
    cannot read is a TypeError; and original content alone is allowed."""
    check(guard, built)
