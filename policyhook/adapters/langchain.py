"""LangChain v1: a drop-in `SummarizationMiddleware` whose every summary is decided by a Guard.

LangChain's middleware replaces the oldest messages of the agent state with one summary message
(`RemoveMessage(REMOVE_ALL_MESSAGES)`, the summary, the kept messages). Once the state holds such a
summary, the next pass summarizes the summary again. This subclass hooks the one seam every pass
goes through, `_create_summary(messages_to_summarize)`, and runs it inside `Guard.guarding`:

1. every original message about to be evicted is recorded as a source in the guard's store
   (kind by message type: `user_turn`, `ai_turn`, `tool_output`, `system_prompt`), so that a later
   re-summarization is allowed while the store still holds them;
2. an earlier summary message is recognised as the summary the guard recorded; one the guard never
   saw (made before the guard was installed, or by another process without a durable store) counts
   as a depth-1 summary resting on a dead source (`untraced:...`);
3. the guard decides (span, metrics, decision log, listeners, as for a decorated function); on a
   grant the summary is written by the unchanged upstream code and recorded as a summary one pass
   deeper;
4. on a refusal the refusing rule's remedy runs in the same step (`Guard.remedy`): its text takes
   the summary's place, so the state goes back under the trigger — a pointer to the archived
   messages with their exact facts pinned (the agent gets a `retrieve_context` tool to read them
   back), or a summary re-derived from the live originals. Nothing is lost: every original is in
   the state or the store. With `remedy=False` the state is kept as it is instead, and the same
   refused summary is not put to the guard again (no refusal loop; a refusal the store's
   failure caused is asked again at the next trigger); `raise_on_refusal=True` raises instead.

Requires `langchain>=1.0,<2` (the `_create_summary` / `_acreate_summary` seam).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.messages import AnyMessage, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.runtime import Runtime

from policyhook import (
    Guard,
    GuardedCall,
    Region,
    Request,
    UnsafeRecompactionError,
    current_request,
    request,
)
from policyhook.adapters import content_of, known, message_kind, message_text, untraced_summary

__all__ = ["GuardedSummarizationMiddleware"]

_logger = logging.getLogger(__name__)

#: The whole message list of the state being compacted, for the request's window size.
_state_messages: ContextVar[Sequence[AnyMessage] | None] = ContextVar(
    "policyhook_langchain_state", default=None
)


def _is_summary(message: BaseMessage) -> bool:
    """Upstream marks its summary messages with `additional_kwargs["lc_source"]`."""
    return bool(message.additional_kwargs.get("lc_source") == "summarization")


class GuardedSummarizationMiddleware(SummarizationMiddleware[Any, Any]):
    """`SummarizationMiddleware` that asks `guard` before every summary and records what it made.

    Takes every argument of `SummarizationMiddleware`, plus:

    - `guard`: the Guard deciding (its store receives the evicted originals);
    - `summarizer_name`: the `summarizer.name` policies and telemetry see;
    - `window`: the window id, or a function of the runtime returning it; default: the LangGraph
      `thread_id` when there is one, else the enclosing `policyhook.request(window=...)`;
    - `remedy`: on a refusal, put the remedy's text in the summary's place (default); False keeps
      the messages unsummarized;
    - `raise_on_refusal`: raise `UnsafeRecompactionError` out of the agent instead.
    """

    def __init__(
        self,
        model: Any,
        *,
        guard: Guard,
        summarizer_name: str = "langchain.summarization",
        window: str | Callable[[Runtime[Any]], str] | None = None,
        raise_on_refusal: bool = False,
        remedy: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(model, **options)
        self.guard = guard
        self.summarizer_name = summarizer_name
        self.window = window
        self.raise_on_refusal = raise_on_refusal
        self.remedy = remedy and not raise_on_refusal
        self.tools = [retrieval_tool(guard)] if self.remedy else []
        #: Ids of summary messages refused while `remedy=False`: never put to the guard again.
        self._refused: set[str] = set()
        prefix = content_of(self._build_new_messages("")[0])
        self._summary_prefix = prefix or ""

    # -- the hooks: same flow as upstream, refusals turned into "no update" ----------------------

    def before_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Summarize as upstream does, if the guard allows; otherwise the remedy, or no update."""
        if self._known_refused(state):
            return None
        with self._compaction(state, runtime):
            try:
                return super().before_model(state, runtime)
            except UnsafeRecompactionError as refusal:
                self._refused_without_remedy(refusal)
                return None

    async def abefore_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Async twin of `before_model`."""
        if self._known_refused(state):
            return None
        with self._compaction(state, runtime):
            try:
                return await super().abefore_model(state, runtime)
            except UnsafeRecompactionError as refusal:
                self._refused_without_remedy(refusal)
                return None

    # -- the seam -------------------------------------------------------------------------------

    def _create_summary(self, messages_to_summarize: list[AnyMessage]) -> str:
        current = self._request(messages_to_summarize)
        value = self._provenance(messages_to_summarize, current.window)
        try:
            with self._guarding(value, current) as call:
                return call.record(super()._create_summary(messages_to_summarize))
        except UnsafeRecompactionError as refusal:
            if not self.remedy:
                self._remember(refusal, messages_to_summarize)
                raise

            def rederive(texts: list[str]) -> str:
                with self._guarding(texts, current) as call:
                    upstream = SummarizationMiddleware._create_summary
                    return call.record(upstream(self, [HumanMessage(t) for t in texts]))

            remedied = self.guard.remedy(
                refusal,
                value,
                summarize=rederive,
                budget_chars=self._budget_chars(),
                summarizer=self.summarizer_name,
                window=current.window,
            )
            return remedied.text

    async def _acreate_summary(self, messages_to_summarize: list[AnyMessage]) -> str:
        current = self._request(messages_to_summarize)
        value = self._provenance(messages_to_summarize, current.window)
        try:
            with self._guarding(value, current) as call:
                return call.record(await super()._acreate_summary(messages_to_summarize))
        except UnsafeRecompactionError as refusal:
            if not self.remedy:
                self._remember(refusal, messages_to_summarize)
                raise

            async def rederive(texts: list[str]) -> str:
                with self._guarding(texts, current) as call:
                    upstream = SummarizationMiddleware._acreate_summary
                    return call.record(await upstream(self, [HumanMessage(t) for t in texts]))

            remedied = await self.guard.aremedy(
                refusal,
                value,
                summarize=rederive,
                budget_chars=self._budget_chars(),
                summarizer=self.summarizer_name,
                window=current.window,
            )
            return remedied.text

    @contextmanager
    def _guarding(
        self, value: list[str | Region] | list[str], current: Request
    ) -> Iterator[GuardedCall]:
        """The guarded call of one summary, decided by the guard."""
        with self.guard.guarding(value, summarizer=self.summarizer_name, request=current) as call:
            yield call

    def _budget_chars(self) -> int | None:
        """What `rederive` may put in one summarizer call: the budget, at ~4 characters a token."""
        budget = self._budget()
        return 4 * budget if budget > 0 else None

    # -- refusals without a remedy: never the same one twice ------------------------------------

    def _remember(self, refusal: UnsafeRecompactionError, messages: Sequence[AnyMessage]) -> None:
        """Keep the refused summaries' ids: the next trigger must not ask again about them. Not
        when the store could not answer: once it does, the same summary may be allowed."""
        if refusal.store_failed:
            return
        self._refused.update(m.id for m in messages if _is_summary(m) and m.id)

    def _known_refused(self, state: Any) -> bool:
        """The state still holds a summary refused before (remedy=False): skip, deciding nothing
        new; the messages stay as they are, as the refusal left them."""
        if not self._refused:
            return False
        return any(_is_summary(m) and m.id in self._refused for m in state["messages"])

    # -- provenance -----------------------------------------------------------------------------

    def _provenance(self, messages: Sequence[AnyMessage], window: str) -> list[str | Region]:
        """Record the originals as sources; map summary messages to the summary text recorded."""
        value: list[str | Region] = []
        for message in messages:
            text = message_text(message)
            if not text.strip():
                continue
            if not _is_summary(message):
                # One id per text (`Guard.text_id`): a message edited in place under its id
                # is a new source, and the old text stays held for the summaries made from it.
                source_id = (
                    self.guard.text_id(f"langchain:{message.id}", text) if message.id else None
                )
                self.guard.try_record_source(text, message_kind(message), source_id)
                value.append(text)
                continue
            prefix = self._summary_prefix
            body = text[len(prefix) :] if prefix and text.startswith(prefix) else text
            if known(self.guard.provenance(body, window)):
                value.append(body)  # a summary the guard recorded, or a remedy's pointer
            else:
                value.append(untraced_summary(body))
        return value

    # -- the request: window, size, pressure ----------------------------------------------------

    @contextmanager
    def _compaction(self, state: Any, runtime: Runtime[Any]) -> Iterator[None]:
        fields: dict[str, Any] = {}
        window = self._window(runtime)
        if window is not None:
            fields["window"] = window
        token = _state_messages.set(state["messages"])
        try:
            with request(**fields):
                yield
        finally:
            _state_messages.reset(token)

    def _request(self, fallback: Sequence[AnyMessage]) -> Request:
        """The current request with the state's size and pressure against the model's budget."""
        messages = _state_messages.get() or fallback
        tokens = int(self.token_counter(messages))
        budget = self._budget()
        pressure = min(1.0, tokens / budget) if budget > 0 else 0.0
        return replace(
            current_request(),
            budget_pressure=pressure,
            window_tokens=tokens,
            window_budget=budget,
        )

    def _budget(self) -> int:
        """The model's input limit when its profile says it, else the lowest token trigger."""
        limit = self._get_profile_limits()
        if limit:
            return limit
        clauses = getattr(self, "_trigger_clauses", [])
        thresholds = [int(c["tokens"]) for c in clauses if "tokens" in c]
        return min(thresholds, default=0)

    def _window(self, runtime: Runtime[Any]) -> str | None:
        if callable(self.window):
            return self.window(runtime)
        if self.window is not None:
            return self.window
        try:
            from langgraph.config import get_config

            thread = get_config().get("configurable", {}).get("thread_id")
        except RuntimeError:  # called outside a LangGraph run
            return None
        return None if thread is None else str(thread)

    def _refused_without_remedy(self, refusal: UnsafeRecompactionError) -> None:
        if self.raise_on_refusal:
            raise refusal
        _logger.warning(
            "policyhook: summarization refused, the agent keeps its messages unsummarized: %s",
            refusal,
        )


def retrieval_tool(guard: Guard) -> BaseTool:
    """The `retrieve_context` tool: gives the agent back, exactly, what a remedy archived."""

    def retrieve_context(ref: str) -> str:
        """Return, exactly, the earlier messages archived under `ref` (an id such as
        `offload:1a2b…` named in a `[policyhook offload …]` note in the conversation)."""
        try:
            return "\n\n".join(guard.retrieve(ref.strip()))
        except (KeyError, ValueError) as error:
            return f"cannot retrieve {ref!r}: {error}"
        except Exception as error:  # the store down: the agent's turn goes on (LangGraph's
            # ToolNode would raise it out of `agent.invoke`)
            _logger.warning("policyhook: retrieve_context could not read the store", exc_info=True)
            return (
                f"cannot retrieve {ref!r} now: the store cannot be read "
                f"({type(error).__name__}); try again later"
            )

    return StructuredTool.from_function(retrieve_context)
