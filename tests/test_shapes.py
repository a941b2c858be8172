"""Every input shape the guard reads, and the ones it refuses by name, with real framework objects.

LangChain messages are langchain_core's; OpenAI and Anthropic objects are the official SDKs' types
(both installed with the `adapters` extra, which langmem depends on).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic.types as anth
import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from openai.types.chat import ChatCompletion, ChatCompletionMessage

import policyhook
from policyhook import Guard, MemoryStore, Region, _shapes
from policyhook.adapters import content_of, message_text
from policyhook.testing import capture_decisions

CONFIG = "config read: retry_ceiling = 7 for the billing job"
# Newlines, quotes and non-ASCII: JSON-encoding it (tool arguments) changes every one of them.
SUMMARY = 'Summary: the retry "ceiling" is\nseven — per the billing config ✓'


@pytest.fixture
def guard() -> Guard:
    """The default policy, with SUMMARY recorded as a depth-1 summary resting on source "cfg"."""
    guard = Guard(store=MemoryStore())
    guard.record_source(CONFIG, "config_read", "cfg")
    guard(returning(SUMMARY), summarizer="s")(CONFIG)
    return guard


def returning(value: Any) -> Callable[[Any], Any]:
    """A summarize function that returns `value` (typed, so guarding it stays typed)."""

    def summarize(text: Any) -> Any:
        return value

    return summarize


def decide(guard: Guard, value: Any) -> tuple[str, dict[str, Any]]:
    with capture_decisions(guard) as seen:
        guard.check(value, summarizer="probe")
    decision, activation = seen[0]
    return decision.effect, dict(activation["region"])


def anthropic_message(*blocks: Any) -> anth.Message:
    return anth.Message(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-x",
        content=list(blocks),
        stop_reason="end_turn",
        stop_sequence=None,
        usage=anth.Usage(input_tokens=10, output_tokens=10),
    )


def openai_message(content: str | None, arguments: str | None = None) -> ChatCompletionMessage:
    calls = (
        [{"id": "c1", "type": "function", "function": {"name": "save", "arguments": arguments}}]
        if arguments is not None
        else None
    )
    return ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": content, "tool_calls": calls}
    )


def openai_completion(message: ChatCompletionMessage) -> ChatCompletion:
    return ChatCompletion(
        id="chatcmpl-1",
        object="chat.completion",
        created=0,
        model="gpt-x",
        choices=[{"index": 0, "finish_reason": "stop", "message": message}],  # type: ignore[list-item]
    )


#: Each shape puts the summary `s` somewhere a real runtime would.
SHAPES: dict[str, Callable[[str], Any]] = {
    "str": lambda s: f"earlier turns. {s} later turns.",
    "list of str": lambda s: ["a user turn about deploys", s],
    "nested lists": lambda s: [["a user turn", [["a tool output", s]]]],
    "tuple": lambda s: ("a user turn", (s,)),
    # LangChain
    "langchain human": lambda s: [HumanMessage("hi"), HumanMessage(s)],
    "langchain ai blocks": lambda s: [AIMessage([{"type": "text", "text": s}])],
    "langchain tool message": lambda s: [ToolMessage(s, tool_call_id="c1")],
    "langchain system": lambda s: [SystemMessage(f"Summary so far: {s}")],
    "langchain documents": lambda s: [Document("a page"), Document(s, metadata={"p": 2})],
    "langchain tool call args": lambda s: [
        AIMessage("", tool_calls=[{"name": "note", "args": {"text": s}, "id": "c1"}])
    ],
    # OpenAI chat, dicts and SDK objects
    "openai tool role": lambda s: [{"role": "tool", "tool_call_id": "c1", "content": s}],
    "openai content parts": lambda s: [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, s]}
    ],
    "openai content None + tool_calls": lambda s: [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "save", "arguments": json.dumps({"note": s})},
                }
            ],
        }
    ],
    "openai refusal": lambda s: [{"role": "assistant", "content": None, "refusal": s}],
    "openai sdk message": lambda s: [openai_message(None, json.dumps({"note": s}))],
    "openai sdk completion": lambda s: openai_completion(openai_message(s)),
    "openai responses output": lambda s: [
        {"type": "function_call_output", "call_id": "c1", "output": s}
    ],
    # Anthropic, dicts and SDK objects
    "anthropic tool_result str": lambda s: [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": s}]}
    ],
    "anthropic tool_result blocks": lambda s: [
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t",
                    "content": [{"type": "image", "source": {}}, {"type": "text", "text": s}],
                }
            ],
        }
    ],
    "anthropic tool_use input": lambda s: [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "w", "input": {"a": [s]}}],
        }
    ],
    "anthropic document text": lambda s: [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": s}}
    ],
    "anthropic sdk text block": lambda s: anthropic_message(anth.TextBlock(type="text", text=s)),
    "anthropic sdk tool_use": lambda s: [
        anthropic_message(
            anth.TextBlock(type="text", text="saving"),
            anth.ToolUseBlock(type="tool_use", id="t", name="save", input={"note": s}),
        )
    ],
    "anthropic sdk thinking": lambda s: [
        anthropic_message(anth.ThinkingBlock(type="thinking", thinking=s, signature="sig"))
    ],
    "anthropic tool_result of sdk blocks": lambda s: [
        {
            "type": "tool_result",
            "tool_use_id": "t",
            "content": [anth.TextBlock(type="text", text=s)],
        }
    ],
}


class TestSummaryFoundInEveryShape:
    @pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
    def test_summary_is_recognised_and_refused_once_its_source_is_gone(
        self, guard: Guard, shape: Callable[[str], Any]
    ) -> None:
        """A known summary anywhere in the shape makes a depth-1 region on "cfg" (live), refused by
        the default policy once cfg is evicted."""
        region = decide(guard, shape(SUMMARY))[1]
        assert (region["depth"], "cfg" in region["live_sources"]) == (1, True)
        guard.store.evict("cfg")
        effect, region = decide(guard, shape(SUMMARY))
        assert (effect, region["depth"], "cfg" in region["dead_sources"]) == ("deny", 1, True)

    @pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
    def test_shape_without_a_summary_is_original(
        self, guard: Guard, shape: Callable[[str], Any]
    ) -> None:
        """The same shapes holding only new text are original content (depth 0), allowed."""
        guard.store.evict("cfg")
        assert decide(guard, shape("a brand new turn that nobody summarized yet"))[0] == "allow"


class TestUnits:
    def test_each_message_is_one_unit_and_lists_flatten(self) -> None:
        """Top-level items (nested lists flattened) are units; a message's parts join by newline."""
        units = _shapes.read(
            [["first", {"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}], "c"]
        )
        assert units == ["first", "a\nb", "c"]

    def test_regions_pass_through_whole(self) -> None:
        """Kept objects (the ledger's Region) come back as they are, between the texts around."""
        region = Region(id="r1", depth=2)
        units = _shapes.read(
            {"role": "user", "content": ["before", region, "after"]}, keep=(Region,)
        )
        assert units == ["before", region, "after"]

    def test_opaque_blocks_are_skipped_by_name(self) -> None:
        """Images, audio, files and redacted thinking hold no readable text: nothing is read."""
        blocks = [
            {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
            {"type": "image_url", "image_url": {"url": "https://x"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA"}},
            {"type": "file", "file": {"file_id": "f"}},
            anth.RedactedThinkingBlock(type="redacted_thinking", data="opaque"),
            {"type": "document", "source": {"type": "base64", "data": "JVBER"}},
        ]
        assert _shapes.read([{"role": "user", "content": blocks}]) == []

    def test_tool_arguments_keep_every_string_verbatim(self) -> None:
        """JSON escapes newlines, quotes and non-ASCII: such strings are read as pieces too."""
        text = _shapes.text(
            {"role": "assistant", "tool_calls": [{"name": "n", "args": {"a": SUMMARY}}]}
        )
        assert text.startswith('[tool call] n({"a": "Summary: the retry \\"ceiling\\"')
        assert text.endswith(")\n" + SUMMARY)

    def test_invalid_json_arguments_are_read_as_written(self) -> None:
        """OpenAI arguments that are not JSON (models write such) are read raw, never dropped."""
        message = openai_message(None, '{"note": "unterminated')
        assert _shapes.text(message) == '[tool call] save({"note": "unterminated)'

    def test_tool_use_repeated_in_tool_calls_is_read_once(self) -> None:
        """LangChain keeps Anthropic's tool_use blocks in content and in tool_calls: one line."""
        message = AIMessage(
            [{"type": "tool_use", "id": "c1", "name": "pytest", "input": {"k": 1}}],
            tool_calls=[{"name": "pytest", "args": {"k": 1}, "id": "c1"}],
        )
        assert _shapes.text(message) == '[tool call] pytest({"k": 1})'


#: Near-misses of the shapes read without the general path (`_shapes._plain`): each must be read
#: exactly as the general path reads it.
NEAR_PLAIN: list[Any] = [
    {"role": "user", "content": "x", "refusal": ""},
    {"role": "user", "content": "x", "refusal": SUMMARY},
    {"content": "x", "type": 5},
    {"content": "x", "type": "text", "text": SUMMARY},
    {"content": "x", "type": "tool_result"},
    {"content": "x", "type": "tool_use"},
    {"content": "x", "type": "document"},
    {"content": "x", "type": "image"},
    {"content": "x", "type": "web_search_tool_result_error"},
    {"content": "x", "type": "human"},
    {"content": "x", "tool_calls": []},
    {"content": "x", "tool_calls": [{"name": "n", "args": {"a": SUMMARY}}]},
    {"content": "x", "function_call": {}},
    {"content": "x", "audio": {"transcript": SUMMARY}},
    {"content": " ", "role": "user"},
    {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}, "b"]},
    {"role": "user", "content": [{"type": "text", "text": 5}]},
    {"role": "user", "content": [{"type": "thinking", "thinking": SUMMARY, "text": "x"}]},
    HumanMessage("x", additional_kwargs={"refusal": SUMMARY}),
    AIMessage("x", tool_calls=[{"name": "n", "args": {"a": SUMMARY}, "id": "c"}]),
    AIMessage([{"type": "text", "text": "a"}, {"type": "text", "text": SUMMARY, "extras": {}}]),
    AIMessage([{"type": "text", "text": " "}, "", SUMMARY, {"type": "text", "text": "\n"}]),
    AIMessage([{"type": "text", "text": " "}]),
    AIMessage([]),
    AIMessage([{"type": "text", "text": SUMMARY}, {"type": "tool_use", "name": "n", "input": {}}]),
    AIMessage(
        [{"type": "text", "text": SUMMARY}], tool_calls=[{"name": "n", "args": {}, "id": "c"}]
    ),
    HumanMessage([SUMMARY, {"type": "text", "text": "b", "annotations": []}]),
    {"role": "user", "content": [{"text": SUMMARY}]},
    {"role": "user", "content": [{"type": "text", "text": None}]},
    {"role": "user", "content": [{"type": "text"}]},
    {"role": "user", "content": [[SUMMARY], "b"]},
    {"role": "user", "content": [5]},
    {"role": "user", "content": [None]},
    {"role": "user", "content": ["a", {"type": "image", "source": {}}]},
    {"role": "user", "content": ["a", "b"], "refusal": SUMMARY},
    {"role": "user", "content": [], "tool_calls": []},
    {"type": "text", "content": ["a"]},
    {"role": "user", "content": [anth.TextBlock(type="text", text=SUMMARY)]},
    openai_message("x", json.dumps({"note": SUMMARY})),
    ChatCompletionMessage.model_validate({"role": "assistant", "content": "x", "refusal": "no"}),
]


class TestFastPaths:
    @pytest.mark.parametrize(
        "value",
        [*NEAR_PLAIN, *(shape(SUMMARY) for shape in SHAPES.values())],
        ids=[*(f"near-{i}" for i in range(len(NEAR_PLAIN))), *SHAPES.keys()],
    )
    def test_common_shapes_read_as_the_general_path_reads_them(
        self, value: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Plain messages and text blocks are read straight from their fields, to the same units
        (and the same errors) as the general path gives."""

        def outcome() -> Any:
            try:
                return _shapes.read([value, "tail"], keep=(Region,))
            except TypeError as error:
                return str(error)

        fast = outcome()
        monkeypatch.setattr(_shapes, "_plain", lambda value, what: None)
        assert fast == outcome()

    def test_every_field_the_reader_asks_for_is_listed(self) -> None:
        """A class providing a field the reader asks for as a property is found once per class
        (`_FIELDS_READ`): a name missing from that list would be skipped on such classes."""
        source = Path(_shapes.__file__).read_text()
        asked = set(re.findall(r'\b(?:get|function|custom|source_get|\w+\(\w+\))\("(\w+)"', source))
        asked |= {"args", "input", "arguments"}  # tool_call's fallback loop
        assert asked - {"name"} and asked <= _shapes._FIELDS_READ, asked - _shapes._FIELDS_READ


class TestRefusedShapes:
    @pytest.mark.parametrize(
        ("value", "message"),
        [
            (
                [
                    "a",
                    "b",
                    {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "foo"}]},
                ],
                "input[2].content[1]: unsupported block type 'foo'",
            ),
            (42, "input: got int"),
            ([None], "input[0]: got NoneType"),
            ({"role": "user", "content": b"bytes"}, "input.content: got bytes"),
            ({"messages": ["hi"]}, "input: got dict"),
            ({"type": "text"}, "input.text: a 'text' block needs a str 'text', got NoneType"),
            ({"role": "assistant", "tool_calls": "save()"}, "input.tool_calls: expected a list"),
            (
                AIMessage("", tool_calls=[{"name": "n", "args": {"when": object()}, "id": "c"}]),
                "input.tool_calls[0].args.when: tool arguments must be JSON data, got object",
            ),
            (
                {"type": "document", "source": {"type": "carrier-pigeon"}},
                "input.source: unsupported document source type 'carrier-pigeon'",
            ),
            ({"choices": [{"index": 0}]}, "input.choices[0]: a choice without 'message'"),
            (
                anthropic_message(anth.TextBlock(type="text", text="x")).model_copy(
                    update={"content": [{"type": "server_only_thing"}]}
                ),
                "input.content[0]: unsupported block type 'server_only_thing'",
            ),
        ],
    )
    def test_unreadable_part_raises_type_error_naming_it(self, value: Any, message: str) -> None:
        """Whatever the reader cannot read is a TypeError naming the shape and its position."""
        with pytest.raises(TypeError) as raised:
            _shapes.read(value)
        assert str(raised.value).startswith(message)

    def test_self_containing_list_is_refused_not_a_hang(self) -> None:
        """A list that contains itself ends in a clear TypeError, not a RecursionError."""
        loop: list[Any] = ["text"]
        loop.append(loop)
        with pytest.raises(TypeError, match="nested deeper than 100 levels"):
            _shapes.read(loop)

    def test_guard_refuses_unreadable_input_before_deciding(self, guard: Guard) -> None:
        """guard.check on an unreadable part raises TypeError and makes no decision."""
        with capture_decisions(guard) as seen, pytest.raises(TypeError, match=r"input\[1\]"):
            guard.check(["fine", {"type": "foo"}], summarizer="probe")
        assert seen == []


class TestSummarizerOutputs:
    @pytest.mark.parametrize(
        "make",
        [
            lambda: anthropic_message(anth.TextBlock(type="text", text=SUMMARY)),
            lambda: openai_completion(openai_message(SUMMARY)),
            lambda: AIMessage(SUMMARY),
            lambda: [{"type": "text", "text": SUMMARY}],
        ],
        ids=["anthropic message", "openai completion", "langchain message", "blocks"],
    )
    def test_sdk_outputs_are_recorded_as_summaries(self, make: Callable[[], Any]) -> None:
        """A summarizer returning an SDK object has its text recorded: it comes back as depth 1."""
        guard = Guard(store=MemoryStore())
        output = guard(lambda text: make(), summarizer="s")("billing config: retry ceiling 7")
        assert decide(guard, f"later: {SUMMARY}")[1]["depth"] == 1
        assert output is not None

    def test_unreadable_output_is_a_type_error(self) -> None:
        """An output the guard cannot record would come back as evidence: TypeError instead."""
        guard = Guard(store=MemoryStore())
        summarize = guard(returning({"summary": SUMMARY}), summarizer="s")
        with pytest.raises(TypeError, match=r"^output: got dict"):
            summarize("original text to summarize")

    def test_none_output_is_warned_about(self, caplog: pytest.LogCaptureFixture) -> None:
        """A summarizer returning None has nothing to record: a warning, as before."""
        guard = Guard(store=MemoryStore())
        with caplog.at_level(logging.WARNING):
            assert guard(returning(None), summarizer="s")("original text") is None
        assert "cannot read text from NoneType" in caplog.text


class TestAdapterHelpers:
    def test_message_text_is_content_then_tool_calls(self) -> None:
        """message_text keeps its archived form: content, then one line per tool call."""
        message = AIMessage(
            "running the tests",
            tool_calls=[{"name": "pytest", "args": {"path": "tests/"}, "id": "c1"}],
        )
        assert message_text(message) == 'running the tests\n[tool call] pytest({"path": "tests/"})'
        assert message_text(AIMessage("", tool_calls=[{"name": "p", "args": {}, "id": "c"}])) == (
            "[tool call] p({})"
        )

    def test_message_text_refuses_what_it_cannot_read(self) -> None:
        """An adapter archiving an unreadable message gets a TypeError, not an empty source."""
        with pytest.raises(TypeError, match=r"^message\.content\[0\]: unsupported block type"):
            message_text(HumanMessage([{"type": "hologram"}]))

    def test_content_of_is_none_for_unreadable_shapes(self) -> None:
        """content_of (adapters reading known shapes) gives None where the guard would refuse."""
        assert content_of({"content": [{"type": "text", "text": "a"}, "b"]}) == "a\nb"
        assert content_of(42) is None
        assert content_of(Region(id="r")) is None


class TestEdgeValidation:
    @pytest.mark.parametrize(
        ("fields", "message"),
        [
            ({"attempt": 2**63}, '"attempt" must be an int within 1..2\\*\\*63-1'),
            ({"attempt": True}, '"attempt" must be an int'),
            ({"attempt": 1.0}, '"attempt" must be an int'),
            ({"window_tokens": 2**63}, '"window_tokens" must be an int within 0..'),
            ({"window_tokens": -1}, '"window_tokens"'),
            ({"window_budget": 10**30}, '"window_budget"'),
            ({"window_budget": "1000"}, '"window_budget"'),
            ({"budget_pressure": float("nan")}, '"budget_pressure" must be a number within 0..1'),
            ({"budget_pressure": float("inf")}, '"budget_pressure"'),
            ({"budget_pressure": "0.5"}, '"budget_pressure"'),
            ({"budget_pressure": True}, '"budget_pressure"'),
            ({"window": ""}, '"window" must be a non-empty str'),
            ({"window": 7}, '"window" must be a non-empty str'),
        ],
    )
    def test_request_fields_are_range_checked_at_the_call(
        self, fields: dict[str, Any], message: str
    ) -> None:
        """Out-of-range or mistyped request fields fail at policyhook.request(...), naming them."""
        with pytest.raises(ValueError, match=message), policyhook.request(**fields):
            pass

    def test_edge_values_are_accepted_and_decided(self, guard: Guard) -> None:
        """The largest CEL int and pressure 0/1 reach the policy and are decided normally."""
        big = 2**63 - 1
        with policyhook.request(
            attempt=big, window_tokens=big, window_budget=big, budget_pressure=1
        ):
            assert guard.check("new text to summarize", summarizer="p").effect == "allow"

    @pytest.mark.parametrize("count", [10**30, 2**63, -1, 1.5, True, None, "12"])
    def test_token_counter_result_is_checked_before_deciding(self, count: Any) -> None:
        """A token counter returning 10**30 (or a non-int) is a clear ValueError, not a bare
        ValueError('overflow') from the CEL engine, and nothing is decided."""
        guard = Guard(store=MemoryStore(), count_tokens=lambda text: count)
        summarize = guard(returning("s"), summarizer="s")
        with (
            capture_decisions(guard) as seen,
            pytest.raises(
                ValueError, match=r"^count_tokens must return an int within 0\.\.2\*\*63-1"
            ),
        ):
            summarize("some text to summarize")
        assert seen == []

    def test_token_counter_in_range_is_used(self) -> None:
        """A valid count reaches the policy as region.tokens."""
        guard = Guard(store=MemoryStore(), count_tokens=lambda text: 2**63 - 1)
        assert decide(guard, "some text")[1]["tokens"] == 2**63 - 1


class TestRegisteredTextKeepsProvenance:
    def test_registered_turn_quoting_a_dead_summary_is_still_refused(self, guard: Guard) -> None:
        """record_source("Assistant: " + s1) is a depth-1 region on s1's sources and its own id:
        the dead summary inside is not laundered into evidence (issue 10 item 5)."""
        turn = guard.record_source("Assistant: " + SUMMARY, kind="ai_turn", source_id="turn-1")
        guard.store.evict("cfg")
        effect, region = decide(guard, "Assistant: " + SUMMARY)
        assert (effect, region["depth"], region["sources"]) == ("deny", 1, ["cfg", turn.id])
        assert region["dead_sources"] == ["cfg"]
        messages = [HumanMessage("next question"), AIMessage("Assistant: " + SUMMARY)]
        assert decide(guard, messages)[0] == "deny"

    def test_registered_after_the_source_is_gone(self, guard: Guard) -> None:
        """Registering the quoting text after the eviction gives the same answer."""
        guard.store.evict("cfg")
        guard.record_source("Assistant: " + SUMMARY, kind="ai_turn")
        assert decide(guard, "Assistant: " + SUMMARY)[0] == "deny"

    def test_summary_registered_as_a_source_stays_a_summary(self, guard: Guard) -> None:
        """Registering a summary's exact text as a source keeps its depth and sources."""
        source = guard.record_source(SUMMARY, kind="ai_turn", source_id="msg-9")
        region = decide(guard, SUMMARY)[1]
        assert (region["depth"], region["sources"]) == (1, ["cfg", source.id])

    def test_summaries_of_it_rest_on_both(self, guard: Guard) -> None:
        """Summarizing the quoting text is one pass deeper, resting on s1's sources and its own."""
        turn = guard.record_source("Assistant: " + SUMMARY, kind="ai_turn", source_id="turn-1")
        s2 = guard(returning("Summary of the turn: retries capped at seven"), summarizer="s")(
            "Assistant: " + SUMMARY
        )
        region = decide(guard, s2)[1]
        assert (region["depth"], region["sources"]) == (2, ["cfg", turn.id])
        guard.store.evict(turn.id)
        assert decide(guard, s2)[0] == "deny"

    def test_text_without_a_summary_rests_on_itself_only(self, guard: Guard) -> None:
        """Plain evidence is unchanged: depth 0, its own id. Quoting a registered source adds
        nothing, because the new source holds that text verbatim: evicting the quoted one does
        not refuse summaries of it."""
        source = guard.record_source(f"tool output, quoting: {CONFIG}", kind="tool_output")
        guard.store.evict("cfg")
        effect, region = decide(guard, f"tool output, quoting: {CONFIG}")
        assert (effect, region["depth"], region["sources"]) == ("allow", 0, [source.id])

    def test_survives_a_restart(self, tmp_path: Any) -> None:
        """A registered text's carried provenance is stored with it: a new process on the same
        SQLite store still refuses it."""
        from policyhook.stores import SQLiteStore

        path = tmp_path / "store.db"
        with SQLiteStore(path) as store:
            first = Guard(store=store)
            first.record_source(CONFIG, "config_read", "cfg")
            first(returning(SUMMARY), summarizer="s")(CONFIG)
            first.record_source("Assistant: " + SUMMARY, kind="ai_turn", source_id="turn-1")
            store.evict("cfg")
        with SQLiteStore(path) as store:
            effect, region = decide(Guard(store=store), "Assistant: " + SUMMARY)
        assert (effect, region["depth"], region["dead_sources"]) == ("deny", 1, ["cfg"])

    def test_registering_a_summary_keeps_summaries_made_from_it(self, tmp_path: Any) -> None:
        """Registering s1's exact text as a source (an adapter archiving every message) must not
        turn s1's stored record into plain evidence: s2, made from s1 and a live source, still
        rests on s1's dead source, in a new process on the same SQLite store too."""
        from policyhook.stores import SQLiteStore

        path = tmp_path / "store.db"
        s2 = "Summary two: ceiling seven, and notifications go to #ops as configured"
        with SQLiteStore(path) as store:
            first = Guard(store=store)
            first.record_source(CONFIG, "config_read", "cfg")
            notify = "tool(notify): channel #ops configured, retries 3"
            first.record_source(notify, "tool_output", "notify")
            first(returning(SUMMARY), summarizer="s")(CONFIG)
            first(returning(s2), summarizer="s")([SUMMARY, notify])
            first.record_source(SUMMARY, kind="ai_turn", source_id="msg-1")
            store.evict("cfg")
            assert decide(first, s2)[1]["dead_sources"] == ["cfg"]
        with SQLiteStore(path) as store:
            effect, region = decide(Guard(store=store), s2)
        assert (effect, region["depth"], region["dead_sources"]) == ("deny", 2, ["cfg"])


class TestLoneSurrogates:
    """A cut emoji leaves a lone surrogate: texts holding one are handled alike by every part,
    ids holding one are refused where they enter."""

    CUT = "config read \ud83d: retry_ceiling = 7 for the billing job"
    CUT_SUMMARY = "Summary \ud800: the retry ceiling is seven for billing"

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    def test_texts_with_lone_surrogates_work_in_every_store(self, kind: str, tmp_path: Any) -> None:
        """Sources and summaries holding lone surrogates are stored, given back unchanged, given
        the same ids, recognised after a restart, and logged without a crash."""
        from policyhook.decisionlog import read
        from policyhook.stores import SQLiteStore

        def store() -> Any:
            return MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "s.db")

        first_store = store()
        log = tmp_path / "decisions.jsonl"
        guard = Guard(store=first_store, decision_log=log)
        source = guard.record_source(self.CUT, "config_read", "cfg")
        guard(returning(self.CUT_SUMMARY), summarizer="s")(self.CUT)
        assert first_store.get_source("cfg") == self.CUT
        first = decide(guard, [self.CUT_SUMMARY])[1]
        assert (first["depth"], first["sources"]) == (1, [source.id])
        guard.close()
        records = [record for _, record in read(log)]
        assert [r["decision"] for r in records] == ["allow", "allow"]
        assert records[-1]["activation"]["region"]["id"] == first["id"]
        if kind == "sqlite":  # a new process on the same file
            again = decide(Guard(store=store()), [self.CUT_SUMMARY])[1]
            assert (again["id"], again["depth"], again["sources"]) == (
                first["id"],
                1,
                [source.id],
            )

    @pytest.mark.parametrize(
        ("call", "field"),
        [
            (lambda g: g.record_source("text", "config_read", "cfg-\udc00"), "source_id"),
            (lambda g: g.record_source("text", "config\ud800"), "kind"),
            (lambda g: g.record_summary("a summary", of="text", window="w\ud800"), "window"),
        ],
    )
    def test_ids_with_lone_surrogates_are_refused_at_the_edge(
        self, call: Callable[[Guard], Any], field: str
    ) -> None:
        """An id holding a lone surrogate is a ValueError naming it, before any store sees it."""
        store = MemoryStore()
        with pytest.raises(ValueError, match=f'"{field}" must not hold a lone surrogate'):
            call(Guard(store=store))
        assert store.sources(10) == []

    def test_window_with_a_lone_surrogate_is_refused_at_the_request(self) -> None:
        """policyhook.request(window=...) refuses it where it is called."""
        with (
            pytest.raises(ValueError, match='"window" must not hold a lone surrogate'),
            policyhook.request(window="session-\ud83d"),
        ):
            pass
