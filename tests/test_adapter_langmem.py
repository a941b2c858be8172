"""Guarded langmem running summaries, against the real langmem.short_term functions."""

from __future__ import annotations

import asyncio
import os
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

if not os.environ.get("CI"):  # in CI the adapters extra must be installed: fail, do not skip
    pytest.importorskip("langmem.short_term")

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langmem.short_term import RunningSummary  # type: ignore[import-untyped]
from langmem.short_term import summarize_messages as langmem_summarize
from outage import store_down

from policyhook import Guard, MemoryStore, SQLiteStore, UnsafeRecompactionError, remedies
from policyhook._loader import compile_sources
from policyhook.adapters.langmem import (
    GuardedSummarizationNode,
    asummarize_messages,
    summarize_messages,
)
from policyhook.testing import capture_decisions

SUMMARIES = ["S1: retry ceiling (config)", "S2: retries are capped", "S3: retries capped"]
#: One token per message; summarize once 4 new messages have piled up.
OPTIONS: dict[str, Any] = {
    "max_tokens": 6,
    "max_tokens_before_summary": 4,
    "max_summary_tokens": 1,
    "token_counter": lambda messages: len(list(messages)),
}


class Conversation:
    """A growing message list and its running summary, summarized through the guard."""

    def __init__(self, guard: Guard, **options: Any) -> None:
        self.guard = guard
        self.model = FakeListChatModel(responses=SUMMARIES)
        self.messages: list[AnyMessage] = []
        self.summary: RunningSummary | None = None
        self.options = options
        self.turn = 0

    def say(self, turns: int = 1) -> Any:
        result = None
        for _ in range(turns):
            self.messages += [
                HumanMessage(f"question {self.turn}", id=f"h{self.turn}"),
                AIMessage(f"answer {self.turn}", id=f"a{self.turn}"),
            ]
            self.turn += 1
            result = summarize_messages(
                self.messages,
                running_summary=self.summary,
                model=self.model,
                guard=self.guard,
                window="chat-1",
                **OPTIONS,
                **self.options,
            )
            self.summary = result.running_summary
        return result

    def evict_all(self) -> None:
        for source, _ in self.guard.store.sources(1000):
            self.guard.store.evict(source.id)


def _two_more_turns(chat: Conversation, run: str) -> Any:
    """Questions and answers 2 and 3 folded into the running summary, by `summarize_messages`
    or (`run` "async") `asummarize_messages`: langmem's result, the chat's summary unchanged."""
    chat.messages += [HumanMessage("question 2", id="h2"), AIMessage("answer 2", id="a2")]
    chat.messages += [HumanMessage("question 3", id="h3"), AIMessage("answer 3", id="a3")]
    arguments: dict[str, Any] = {"running_summary": chat.summary, "model": chat.model, **OPTIONS}
    arguments.update(window="chat-1", guard=chat.guard)
    if run == "sync":
        return summarize_messages(chat.messages, **arguments)
    return asyncio.run(asummarize_messages(chat.messages, **arguments))


class TestSummarizeMessages:
    def test_first_summary_is_granted_and_recorded(self) -> None:
        """The first summary folds originals in: allowed, and recorded as a depth-1 summary."""
        chat = Conversation(Guard())
        with capture_decisions(chat.guard, phase="input") as seen:
            result = chat.say(2)
        assert [(d.effect, a["region"]["depth"]) for d, a in seen] == [("allow", 0)]
        assert result.running_summary.summary == SUMMARIES[0]
        assert chat.guard.ledger.resolve(SUMMARIES[0], "chat-1").region.depth == 1
        kinds = {(s.id.rsplit(":", 1)[0], s.kind) for s, _ in chat.guard.store.sources(100)}
        assert ("langmem:h0", "user_turn") in kinds and ("langmem:a1", "ai_turn") in kinds

    def test_no_decision_when_langmem_summarizes_nothing(self) -> None:
        """Below the threshold no summarize call happens, so nothing is decided or changed."""
        chat = Conversation(Guard())
        with capture_decisions(chat.guard, phase="input") as seen:
            result = chat.say(1)
        assert seen == []
        expected = langmem_summarize(chat.messages, running_summary=None, model=None, **OPTIONS)
        assert result.messages == expected.messages and result.running_summary is None

    def test_extending_the_summary_is_allowed_while_sources_are_live(self) -> None:
        """Summary 2 = S(summary 1 + new turns) is granted when summary 1's originals are held."""
        chat = Conversation(Guard())
        chat.say(2)
        with capture_decisions(chat.guard, phase="input") as seen:
            result = chat.say(2)
        assert [(d.effect, a["region"]["depth"]) for d, a in seen] == [("allow", 1)]
        assert result.running_summary.summary == SUMMARIES[1]

    def test_refusal_without_remedy_keeps_the_running_summary_and_every_message(self) -> None:
        """remedy=False: with the originals evicted, langmem is not called; all stays as is."""
        chat = Conversation(Guard(), remedy=False)
        chat.say(2)
        first = chat.summary
        chat.evict_all()
        with capture_decisions(chat.guard, phase="input") as seen:
            result = chat.say(2)
        decision, activation = seen[-1]
        assert decision.effect == "deny" and decision.rule == "live-sources"
        assert activation["region"]["depth"] == 1
        assert result.running_summary is first
        texts = [m.content for m in result.messages]
        assert texts[0] == f"Summary of the conversation so far: {SUMMARIES[0]}"
        assert texts[1:] == ["question 2", "answer 2", "question 3", "answer 3"]
        assert not any(SUMMARIES[1] in str(t) for t in texts)

    @pytest.mark.parametrize("run", ["sync", "async"])
    def test_the_store_down_keeps_the_running_summary_and_the_agent_going(self, run: str) -> None:
        """The store down when the next turns are folded in: recording them fails (logged),
        extending the summary is refused (every source dead) and no remedy can archive, so
        the running summary and every message stay as they are, as with `remedy=False`, and
        nothing raises. Once the store answers again, the summary is extended as before."""
        chat = Conversation(Guard())
        chat.say(2)
        first = chat.summary
        with store_down(chat.guard.store), capture_decisions(chat.guard, phase="input") as seen:
            result = _two_more_turns(chat, run)
        assert [(d.effect, a["region"]["depth"]) for d, a in seen] == [("deny", 1)]
        assert result.running_summary is first
        texts = [m.content for m in result.messages]
        assert texts[1:] == ["question 2", "answer 2", "question 3", "answer 3"]
        chat.summary, chat.turn = first, 4
        assert chat.say(1).running_summary.summary == SUMMARIES[1]

    @pytest.mark.parametrize("run", ["sync", "async"])
    def test_with_a_spool_the_store_down_still_folds_the_messages_away(
        self, run: str, tmp_path: Path
    ) -> None:
        """The same outage, the guard given a spool: the remedy archives the running summary and
        the messages in it, and its pointer becomes the running summary, so the messages leave
        the context as with the store up; the archive reads back from the spool."""
        chat = Conversation(Guard(spool=SQLiteStore(tmp_path / "spool.db")))
        chat.say(2)
        first = chat.summary
        with store_down(chat.guard.store):
            result = _two_more_turns(chat, run)
            running = result.running_summary
            assert running is not None
            (ref,) = remedies.pointers(running.summary)
            assert first is not None and first.summary in chat.guard.retrieve(ref)
        texts = [str(m.content) for m in result.messages]
        assert "question 2" not in texts and len(texts) < len(chat.messages)

    def test_raise_on_refusal(self) -> None:
        """raise_on_refusal=True surfaces the refusal as UnsafeRecompactionError."""
        chat = Conversation(Guard(), raise_on_refusal=True)
        chat.say(2)
        chat.evict_all()
        with pytest.raises(UnsafeRecompactionError) as refusal:
            chat.say(2)
        assert refusal.value.depth == 1

    def test_audit_mode_lets_it_through(self) -> None:
        """Under an audit-mode policy the summary is extended and the decision is would_deny."""
        text = resources.files("policyhook").joinpath("default_policy.yaml").read_text("utf-8")
        guard = Guard(compile_sources([("default.yaml", text)], force_audit=True))
        chat = Conversation(guard)
        chat.say(2)
        chat.evict_all()
        with capture_decisions(guard, phase="input") as seen:
            result = chat.say(2)
        assert [d.effect for d, _ in seen] == ["would_deny"]
        assert result.running_summary.summary == SUMMARIES[1]

    def test_running_summary_from_elsewhere_is_untraced(self) -> None:
        """A RunningSummary the guard never recorded rests on a dead `untraced:` source."""
        guard = Guard()
        messages: list[AnyMessage] = [HumanMessage("old", id="old")]
        messages += [HumanMessage(f"q{i}", id=f"q{i}") for i in range(4)]
        restored = RunningSummary("restored from a checkpoint", {"old"}, "old")
        with capture_decisions(guard, phase="input") as seen:
            result = summarize_messages(
                messages,
                running_summary=restored,
                model=FakeListChatModel(responses=["never"]),
                guard=guard,
                remedy=False,
                **OPTIONS,
            )
        assert result.running_summary is restored
        assert [d.split(":")[0] for d in seen[0][0].dead_sources] == ["untraced"]

    def test_async_refusal(self) -> None:
        """asummarize_messages (remedy=False) refuses the same way and keeps the running summary."""
        chat = Conversation(Guard())
        chat.say(2)
        first = chat.summary
        chat.evict_all()
        chat.messages += [HumanMessage(f"more {i}", id=f"m{i}") for i in range(4)]

        with capture_decisions(chat.guard, phase="input") as seen:
            result = asyncio.run(
                asummarize_messages(
                    chat.messages,
                    running_summary=first,
                    model=chat.model,
                    guard=chat.guard,
                    window="chat-1",
                    remedy=False,
                    **OPTIONS,
                )
            )
        assert [d.effect for d, _ in seen] == ["deny"]
        assert result.running_summary is first

    @pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
    def test_refusal_is_remedied_within_max_tokens(self, asynchronous: bool) -> None:
        """By default the remedy's pointer becomes the running summary: max_tokens holds, the
        refused summary and the folded turns are archived exactly, nothing is re-summarized."""
        chat = Conversation(Guard())
        chat.say(2)
        chat.evict_all()
        chat.messages += [HumanMessage(f"more {i}", id=f"m{i}") for i in range(4)]
        arguments = {
            "running_summary": chat.summary,
            "model": chat.model,
            "guard": chat.guard,
            "window": "chat-1",
            **OPTIONS,
        }
        with capture_decisions(chat.guard, phase="input") as seen:
            result = (
                asyncio.run(asummarize_messages(chat.messages, **arguments))
                if asynchronous
                else summarize_messages(chat.messages, **arguments)
            )
        assert [d.effect for d, _ in seen] == ["deny"]
        pointer = result.running_summary.summary
        (ref,) = remedies.pointers(pointer)
        archived = chat.guard.retrieve(ref)
        assert archived[0] == SUMMARIES[0] and "more 0" in archived
        assert OPTIONS["token_counter"](result.messages) <= OPTIONS["max_tokens"]
        assert not any(SUMMARIES[1] in str(m.content) for m in result.messages)


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    summarized_messages: list[AnyMessage]
    context: dict[str, Any]


def test_guarded_summarization_node_in_a_graph() -> None:
    """GuardedSummarizationNode in a real StateGraph: grants, then refuses once sources are gone."""
    guard = Guard()
    node = GuardedSummarizationNode(
        guard=guard,
        window="graph-1",
        model=FakeListChatModel(responses=SUMMARIES),
        remedy=False,
        **OPTIONS,
    )
    graph = StateGraph(State)
    graph.add_node("summarize", node)
    graph.add_edge(START, "summarize")
    app = graph.compile()
    turns: list[AnyMessage] = [HumanMessage(f"t{i}", id=f"t{i}") for i in range(4)]
    with capture_decisions(guard, phase="input") as seen:
        first = app.invoke({"messages": turns})
        for source, _ in guard.store.sources(100):
            guard.store.evict(source.id)
        more: list[AnyMessage] = [HumanMessage(f"u{i}", id=f"u{i}") for i in range(4)]
        second = app.invoke({"messages": turns + more, "context": first["context"]})
    assert [d.effect for d, _ in seen] == ["allow", "deny"]
    assert second["context"]["running_summary"] is first["context"]["running_summary"]
    assert [m.content for m in second["summarized_messages"][1:]] == [m.content for m in more]


def test_a_confabulated_number_is_answered_by_the_remedy() -> None:
    """The default refuses a summary stating a number no message states ("capped at 5"), on
    its output; the default remedy (pin) answers it in the same call, so the conversation goes
    on with a pointer to the archived turns instead of the confabulation."""
    chat = Conversation(Guard())
    chat.model = FakeListChatModel(responses=["S1: retries capped at 5"])
    with capture_decisions(chat.guard) as seen:
        result = chat.say(2)
    assert [d.effect for d, _ in seen] == ["allow", "deny"]  # input granted, output refused
    assert seen[-1][0].rule == "grounded-numbers"
    summary = result.running_summary.summary
    assert summary.startswith("[policyhook offload offload:") and "capped at 5" not in summary


def test_a_store_smaller_than_the_conversation_still_grounds_the_summary_on_its_messages() -> None:
    """A bounded store (`max_sources=2`) evicts the oldest messages while they are still in the
    list langmem summarizes: their texts are in the input, so the number the first question
    states is grounded on it and the running summary is kept, not replaced by a pointer."""
    chat = Conversation(Guard(store=MemoryStore(max_sources=2)))
    chat.model = FakeListChatModel(responses=["S1: the retry ceiling is 7"])
    chat.messages = [HumanMessage("read the config: retry ceiling 7", id="config")]
    with capture_decisions(chat.guard) as seen:
        result = chat.say(2)
    (_, checked), (decision, output) = seen
    assert checked["region"]["dead_sources"]  # evicted by the store's bound
    assert decision.effect == "allow"
    assert (output["summary"]["grounded"], output["summary"]["ungrounded"]) == (1, 0)
    assert result.running_summary.summary == "S1: the retry ceiling is 7"
