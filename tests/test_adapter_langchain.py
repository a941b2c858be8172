"""GuardedSummarizationMiddleware inside a real LangChain v1 agent (create_agent + fake chat models)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

if not os.environ.get("CI"):  # in CI the adapters extra must be installed: fail, do not skip
    pytest.importorskip("langchain.agents.middleware")

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.runtime import Runtime
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from outage import store_down
from test_telemetry import Otel
from test_telemetry import telemetry as telemetry  # the fixture

from policyhook import Guard, MemoryStore, SQLiteStore, UnsafeRecompactionError, remedies
from policyhook._loader import compile_sources
from policyhook._telemetry import STORE_ERRORS
from policyhook.adapters.langchain import GuardedSummarizationMiddleware
from policyhook.testing import capture_decisions

SUMMARIES = ["SUMMARY ONE: retry ceiling (config)", "SUMMARY TWO: retries are capped"]
PREFIX = "Here is a summary of the conversation to date:\n\n"


class ToolCallingFake(GenericFakeChatModel):
    """A scripted chat model that accepts tools (the middleware adds `retrieve_context`)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _agent(
    guard: Guard, summaries: list[str] = SUMMARIES, **options: Any
) -> tuple[Any, dict[str, Any]]:
    """An agent that summarizes at 7 messages, keeping the last 2, with scripted models (its
    summarizer answers `summaries`, in turn)."""
    model = ToolCallingFake(messages=iter([AIMessage(f"answer {i}") for i in range(50)]))
    middleware = GuardedSummarizationMiddleware(
        FakeListChatModel(responses=summaries),
        guard=guard,
        trigger=("messages", 6),
        keep=("messages", 2),
        **options,
    )
    agent = create_agent(
        model=model, tools=[], middleware=[middleware], checkpointer=InMemorySaver()
    )
    return agent, {"configurable": {"thread_id": "thread-1"}}


def _ask(agent: Any, config: dict[str, Any], *questions: str) -> list[Any]:
    out: dict[str, Any] = {}
    for question in questions:
        out = agent.invoke({"messages": [HumanMessage(question)]}, config)
    return list(out["messages"])


def _first_pass(agent: Any, config: dict[str, Any]) -> list[Any]:
    """Four questions: the fourth model call finds 7 messages and summarizes the oldest 5."""
    return _ask(agent, config, "q0: read config", "q1", "q2", "q3")


def _never_summarizing(guard: Guard) -> GuardedSummarizationMiddleware:
    """A middleware over `guard` whose model is never asked (remedy off): for provenance tests."""
    return GuardedSummarizationMiddleware(
        FakeListChatModel(responses=["never"]),
        guard=guard,
        trigger=("messages", 4),
        keep=("messages", 1),
        remedy=False,
    )


def _audit_policies() -> Any:
    text = resources.files("policyhook").joinpath("default_policy.yaml").read_text("utf-8")
    return compile_sources([("default.yaml", text)], force_audit=True)


class TestGuardedSummarizationMiddleware:
    def test_first_summarization_is_granted_and_recorded(self) -> None:
        """Summarizing originals is allowed; the summary is recognised later as a depth-1 summary."""
        guard = Guard()
        agent, config = _agent(guard)
        with capture_decisions(guard, phase="input") as seen:
            messages = _first_pass(agent, config)
        assert [d.effect for d, _ in seen] == ["allow"]
        assert seen[0][1]["region"]["depth"] == 0
        activation = seen[0][1]
        assert activation["window"]["id"] == "thread-1"
        assert messages[0].content == PREFIX + SUMMARIES[0]
        assert guard.ledger.resolve(SUMMARIES[0], "thread-1").region.depth == 1

    def test_evicted_originals_are_recorded_by_message_type(self) -> None:
        """Every evicted original is in the store first, under its kind and message id."""
        guard = Guard()
        agent, config = _agent(guard)
        _first_pass(agent, config)
        held = {source.id: (source.kind, text) for source, text in guard.store.sources(100)}
        kinds = {kind for kind, _ in held.values()}
        assert kinds == {"user_turn", "ai_turn"}
        assert ("user_turn", "q0: read config") in held.values()
        assert all(source_id.startswith("langchain:") for source_id in held)

    def test_resummarizing_is_allowed_while_sources_are_live(self) -> None:
        """A summary of the summary is granted when every original it rests on is still held."""
        guard = Guard()
        agent, config = _agent(guard)
        _first_pass(agent, config)
        with capture_decisions(guard, phase="input") as seen:
            messages = _ask(agent, config, "q4", "q5")
        assert [(d.effect, a["region"]["depth"]) for d, a in seen] == [("allow", 1)]
        assert messages[0].content == PREFIX + SUMMARIES[1]

    def test_refusal_without_remedy_keeps_the_state_unchanged_and_never_asks_again(self) -> None:
        """remedy=False: the refused pass leaves every message as it was, and later triggers do
        not put the same refused summary to the guard again (no refusal loop)."""
        guard = Guard()
        agent, config = _agent(guard, remedy=False)
        before = _first_pass(agent, config)
        for source, _ in guard.store.sources(100):
            guard.store.evict(source.id)
        with capture_decisions(guard, phase="input") as seen:
            after = _ask(agent, config, "q4", "q5")
        decision, activation = seen[-1]
        assert decision.effect == "deny"
        assert decision.rule == "live-sources"
        assert activation["region"]["depth"] == 1 and activation["region"]["dead_sources"]
        assert [m.id for m in after[: len(before)]] == [m.id for m in before]
        assert [m.content for m in after[len(before) :]] == ["q4", "answer 4", "q5", "answer 5"]
        assert not any(SUMMARIES[1] in str(m.content) for m in after)
        with capture_decisions(guard, phase="input") as later:
            _ask(agent, config, "q6", "q7", "q8")
        assert later == []

    def test_a_refusal_the_store_caused_is_asked_again_without_remedy(self) -> None:
        """remedy=False and the store down at a trigger: the pass is refused (it cannot be
        decided) but not remembered, so once the store answers the next trigger summarizes
        the summary, whose sources are all live: an outage does not stop compaction for good."""
        guard = Guard()
        agent, config = _agent(guard, remedy=False)
        _first_pass(agent, config)
        with store_down(guard.store), capture_decisions(guard, phase="input") as seen:
            during = _ask(agent, config, "q4", "q5")
        assert [(d.effect, a["region"]["depth"]) for d, a in seen] == [("deny", 1)]
        assert not any(SUMMARIES[1] in str(m.content) for m in during)
        with capture_decisions(guard, phase="input") as later:
            after = _ask(agent, config, "q6")
        assert [(d.effect, a["region"]["depth"]) for d, a in later] == [("allow", 1)]
        assert after[0].content == PREFIX + SUMMARIES[1]

    def test_the_store_down_never_breaks_the_agent(self, telemetry: Otel) -> None:
        """The store down at the next trigger: recording the messages fails (logged, counted),
        the summary of the summary is refused (every source dead) and no remedy can archive,
        so the agent's turns go on with every message kept. Once the store answers again, the
        next trigger summarizes as before."""
        guard = telemetry.guard()
        agent, config = _agent(guard)
        before = _first_pass(agent, config)
        with store_down(guard.store), capture_decisions(guard, phase="input") as seen:
            during = _ask(agent, config, "q4", "q5")
        assert [(d.effect, a["region"]["depth"]) for d, a in seen] == [("deny", 1)]
        assert [m.id for m in during[: len(before)]] == [m.id for m in before]  # kept
        assert [m.content for m in during[len(before) :]] == ["q4", "answer 4", "q5", "answer 5"]
        assert telemetry.total(STORE_ERRORS, operation="put_source") >= 1
        with capture_decisions(guard, phase="input") as later:
            after = _ask(agent, config, "q6")
        assert [(d.effect, a["region"]["depth"]) for d, a in later] == [("allow", 1)]
        assert after[0].content == PREFIX + SUMMARIES[1]

    def test_the_store_down_at_the_first_trigger_keeps_the_originals(self) -> None:
        """The store down at the first trigger: a message the guard cannot look up may be a
        summary another process recorded, so it counts as one resting on dead sources and the
        pass is refused (fail closed); the agent goes on with every message. Once the store
        answers again, the next trigger summarizes the originals."""
        guard = Guard()
        agent, config = _agent(guard)
        with store_down(guard.store), capture_decisions(guard, phase="input") as seen:
            during = _first_pass(agent, config)
        assert [d.effect for d, _ in seen] == ["deny"]
        assert [m.content for m in during[:2]] == ["q0: read config", "answer 0"]
        assert not any(SUMMARIES[0] in str(m.content) for m in during)
        after = _ask(agent, config, "q4")
        assert after[0].content == PREFIX + SUMMARIES[0]
        assert guard.ledger.resolve(SUMMARIES[0], "thread-1").region.depth == 1

    def test_refusal_is_traced_and_logged(self, caplog: pytest.LogCaptureFixture) -> None:
        """The refusal leaves a policyhook.guard span with status ERROR and a warning log line."""
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        guard = Guard(tracer_provider=provider)
        agent, config = _agent(guard, remedy=False)
        _first_pass(agent, config)
        for source, _ in guard.store.sources(100):
            guard.store.evict(source.id)
        exporter.clear()
        with caplog.at_level("WARNING", logger="policyhook.adapters.langchain"):
            _ask(agent, config, "q4", "q5")
        refused = [s for s in exporter.get_finished_spans() if s.name == "policyhook.guard"]
        assert refused and refused[-1].attributes is not None
        assert refused[-1].attributes["policyhook.decision"] == "deny"
        assert refused[-1].attributes["policyhook.summarizer"] == "langchain.summarization"
        assert refused[-1].status.status_code.name == "ERROR"
        assert "summarization refused" in caplog.text

    def test_audit_mode_lets_it_through(self) -> None:
        """Under an audit-mode policy the same pass is summarized and recorded as would_deny."""
        guard = Guard(_audit_policies())
        agent, config = _agent(guard)
        _first_pass(agent, config)
        for source, _ in guard.store.sources(100):
            guard.store.evict(source.id)
        with capture_decisions(guard, phase="input") as seen:
            messages = _ask(agent, config, "q4", "q5")
        assert [d.effect for d, _ in seen] == ["would_deny"]
        assert messages[0].content == PREFIX + SUMMARIES[1]

    def test_raise_on_refusal(self) -> None:
        """With raise_on_refusal the agent run fails with UnsafeRecompactionError."""
        guard = Guard()
        agent, config = _agent(guard, raise_on_refusal=True)
        _first_pass(agent, config)
        for source, _ in guard.store.sources(100):
            guard.store.evict(source.id)
        with pytest.raises(UnsafeRecompactionError) as refusal:
            _ask(agent, config, "q4", "q5")
        assert refusal.value.rule == "live-sources"

    def test_async_agent_refuses_the_same_way(self) -> None:
        """ainvoke goes through abefore_model and gets the same refusal and unchanged state."""
        guard = Guard()
        agent, config = _agent(guard, remedy=False)
        before = _first_pass(agent, config)
        for source, _ in guard.store.sources(100):
            guard.store.evict(source.id)

        async def ask() -> list[Any]:
            out: dict[str, Any] = {}
            for question in ("q4", "q5"):
                out = await agent.ainvoke({"messages": [HumanMessage(question)]}, config)
            return list(out["messages"])

        with capture_decisions(guard, phase="input") as seen:
            after = asyncio.run(ask())
        assert seen[-1][0].effect == "deny"
        assert [m.id for m in after[: len(before)]] == [m.id for m in before]

    def test_unknown_summary_message_rests_on_no_source(self) -> None:
        """A summary message the guard never recorded counts as resting on a dead source."""
        guard = Guard()
        middleware = _never_summarizing(guard)
        summary = middleware._build_new_messages("made by another process, long ago")[0]
        state = {
            "messages": [
                summary,
                HumanMessage("run the tests", id="h1"),
                AIMessage("", id="a1", tool_calls=[{"name": "pytest", "args": {}, "id": "c1"}]),
                ToolMessage("3 passed", tool_call_id="c1", id="t1"),
                HumanMessage("thanks", id="h2"),
            ]
        }
        with capture_decisions(guard, phase="input") as seen:
            update = middleware.before_model(state, Runtime())
        assert update is None
        decision = seen[0][0]
        assert decision.effect == "deny" and decision.rule == "live-sources"
        assert [s.split(":")[0] for s in decision.dead_sources] == ["untraced"]
        kinds = {source.kind for source, _ in guard.store.sources(100)}
        assert kinds == {"user_turn", "ai_turn", "tool_output"}
        a1 = guard.text_id("langchain:a1", "[tool call] pytest({})")
        assert guard.store.get_source(a1) == "[tool call] pytest({})"

    def test_a_message_edited_in_place_keeps_the_old_text_derivable(self) -> None:
        """A message edited under its id is a new source: the old text stays held, so a summary
        made from it rests on sources that can still give it back (one id per message let the
        edit replace the text those summaries rest on, and they still counted as live)."""
        guard = Guard()
        middleware = _never_summarizing(guard)
        before = [HumanMessage("retry ceiling is 7", id="h1")]
        after = [HumanMessage("retry ceiling is 9", id="h1")]
        old = middleware._provenance(before, "thread-1")
        region = guard.provenance(old, "thread-1")
        middleware._provenance(after, "thread-1")  # the edit, recorded at the next pass
        assert [guard.store.get_source(s) for s in region.sources] == ["retry ceiling is 7"]
        assert guard.store.live(region.sources) == region.sources


class TestRemedies:
    """The default: a refusal is answered in the same step, so the state goes back under the trigger."""

    def _refused_pass(
        self, guard: Guard, asynchronous: bool = False
    ) -> tuple[list[Any], list[Any]]:
        agent, config = _agent(guard)
        before = _first_pass(agent, config)
        for source, _ in guard.store.sources(100):
            guard.store.evict(source.id)

        async def ask() -> list[Any]:
            out: dict[str, Any] = {}
            for question in ("q4", "q5"):
                out = await agent.ainvoke({"messages": [HumanMessage(question)]}, config)
            return list(out["messages"])

        after = asyncio.run(ask()) if asynchronous else _ask(agent, config, "q4", "q5")
        return before, after

    @pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
    def test_refusal_is_answered_by_a_pointer_to_the_archived_messages(
        self, asynchronous: bool
    ) -> None:
        """The refused summary and its neighbours are archived losslessly; a pointer replaces them."""
        guard = Guard()
        with capture_decisions(guard, phase="input") as seen:
            before, after = self._refused_pass(guard, asynchronous)
        assert [d.effect for d, _ in seen][-1] == "deny"
        pointer = str(after[0].content)
        assert pointer.startswith(PREFIX + "[policyhook offload offload:")
        assert len(after) < len(before) + 4  # back under the trigger, in the same step
        (ref,) = remedies.pointers(pointer)
        archived = guard.retrieve(ref)
        assert archived[0] == SUMMARIES[0]  # the refused summary itself, exactly
        assert not any(SUMMARIES[1] in str(m.content) for m in after)  # never re-summarized

    def test_the_agent_can_read_the_archive_back(self) -> None:
        """The middleware gives the agent a retrieve_context tool returning the archived texts."""
        guard = Guard()
        _, after = self._refused_pass(guard)
        middleware = GuardedSummarizationMiddleware(FakeListChatModel(responses=[]), guard=guard)
        (tool,) = middleware.tools
        (ref,) = remedies.pointers(str(after[0].content))
        assert tool.name == "retrieve_context"
        assert SUMMARIES[0] in tool.invoke({"ref": ref})
        assert "cannot retrieve" in tool.invoke({"ref": "offload:unknown"})

    def test_with_a_spool_the_store_down_still_leaves_the_state_in_budget(
        self, tmp_path: Path
    ) -> None:
        """The store down at the second trigger, the guard given a local spool: the pass is
        refused (it cannot be decided), the pin is archived in the spool and its pointer takes
        the messages' place in the same step; `retrieve_context` reads them back meanwhile;
        once the store answers, the next trigger summarizes the pointer with the new turns."""
        guard = Guard(spool=SQLiteStore(tmp_path / "spool.db"))
        agent, config = _agent(guard)
        before = _first_pass(agent, config)
        with store_down(guard.store):
            during = _ask(agent, config, "q4", "q5")
            pointer = str(during[0].content)
            (ref,) = remedies.pointers(pointer)
            (tool,) = GuardedSummarizationMiddleware(
                FakeListChatModel(responses=[]), guard=guard
            ).tools
            assert SUMMARIES[0] in tool.invoke({"ref": ref})
        assert pointer.startswith(PREFIX + "[policyhook offload offload:")
        assert len(during) < len(before) + 4  # back under the trigger, in the same step
        with capture_decisions(guard, phase="input") as seen:
            after = _ask(agent, config, "q6", "q7", "q8")
        assert [(d.effect, a["region"]["depth"]) for d, a in seen] == [("allow", 0)]
        summary = str(after[0].content)
        assert summary.startswith(PREFIX + SUMMARIES[1]) and ref in summary  # carried forward
        assert guard.store.get_source(ref) is not None  # moved to the store

    def test_the_agent_reading_an_archive_while_the_store_is_down_goes_on(self) -> None:
        """The agent calls `retrieve_context` with the store down and the archive not in a
        spool: the tool answers that it cannot read the store now, and the turn goes on
        (LangGraph's ToolNode would raise any other error out of `agent.invoke`)."""
        guard = Guard()
        _, after = self._refused_pass(guard)
        (ref,) = remedies.pointers(str(after[0].content))
        calls = [{"name": "retrieve_context", "args": {"ref": ref}, "id": "r1"}]
        model = ToolCallingFake(messages=iter([AIMessage("", tool_calls=calls), AIMessage("ok")]))
        middleware = GuardedSummarizationMiddleware(FakeListChatModel(responses=[]), guard=guard)
        agent = create_agent(model=model, tools=[], middleware=[middleware])
        with store_down(guard.store):
            out = agent.invoke({"messages": [HumanMessage("what was archived?")]})
        answer = next(m for m in out["messages"] if isinstance(m, ToolMessage))
        assert "cannot retrieve" in str(answer.content) and "try again later" in str(answer.content)
        assert out["messages"][-1].content == "ok"

    def test_the_pointer_is_evidence_the_next_pass_may_summarize(self) -> None:
        """After a remedy, the next trigger summarizes the pointer and new turns: allowed."""
        guard = Guard()
        agent, config = _agent(guard)
        _first_pass(agent, config)
        for source, _ in guard.store.sources(100):
            guard.store.evict(source.id)
        _ask(agent, config, "q4", "q5")
        with capture_decisions(guard, phase="input") as seen:
            _ask(agent, config, "q6", "q7", "q8")
        assert [(d.effect, a["region"]["depth"]) for d, a in seen] == [("allow", 0)]


def test_import_policyhook_does_not_import_langchain() -> None:
    """`import policyhook` works without loading any framework."""
    code = (
        "import sys, policyhook, policyhook.adapters\n"
        "frameworks = ('langchain', 'langmem', 'langgraph')\n"
        "print(sorted(m for m in sys.modules if m.startswith(frameworks)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_confabulated_number_is_answered_by_the_remedy() -> None:
    """The default refuses a summary stating a number no message states, on its output; the
    middleware's remedy (pin, the default's) puts a pointer to the archived messages in its
    place, and the agent goes on."""
    guard = Guard()
    agent, config = _agent(guard, ["SUMMARY: retries capped at 5"])
    with capture_decisions(guard) as seen:
        after = _first_pass(agent, config)
    assert [(d.effect, d.rule) for d, _ in seen][-1] == ("deny", "grounded-numbers")
    pointer = str(after[0].content)
    assert pointer.startswith(PREFIX + "[policyhook offload offload:")
    assert "capped at 5" not in pointer


def test_a_store_smaller_than_the_window_still_grounds_the_summary_on_its_messages() -> None:
    """A bounded store (`max_sources=2`) evicts the oldest messages while they are still in the
    state: the summarized messages' sources are mostly dead when the summary is checked. Their
    texts are in the input, so the faithful number the first message states is grounded on it
    and the summary is kept (it was refused by `grounded-numbers` and replaced by a pointer)."""
    guard = Guard(store=MemoryStore(max_sources=2))
    agent, config = _agent(guard, ["SUMMARY: the retry ceiling is 7 (from the config)"])
    with capture_decisions(guard) as seen:
        after = _ask(agent, config, "q0: read config: retry ceiling 7", "q1", "q2", "q3")
    (_, checked), (decision, output) = seen
    assert len(checked["region"]["dead_sources"]) >= 3  # evicted by the store's bound
    assert decision.effect == "allow"
    assert (output["summary"]["grounded"], output["summary"]["ungrounded"]) == (1, 0)
    assert after[0].content == PREFIX + "SUMMARY: the retry ceiling is 7 (from the config)"
