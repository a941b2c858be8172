"""langmem: guarded `summarize_messages` / `asummarize_messages` and a guarded `SummarizationNode`.

langmem keeps a `RunningSummary` and, once enough new messages pile up, asks the model to *extend*
the existing summary with them: summary n+1 = S(summary n + new messages), a summary of a summary.
These wrappers take langmem's own arguments plus a `guard`, and:

1. find out what langmem would summarize by running it once with a probe model that never calls an
   LLM (langmem's public API only; if nothing would be summarized, that result is returned as is);
2. record each new message about to be folded in as a source (kind by message type), and recognise
   the running summary as the one the guard recorded (one it never saw counts as resting on a dead
   `untraced:...` source);
3. run langmem with the real model inside `Guard.guarding` (same span, metrics, decision log and
   listeners as the decorator), and record the new summary one pass deeper.

On refusal (enforce mode) the refusing rule's **remedy** runs (`Guard.remedy`) and its text becomes
the new running summary, through langmem's own code (a model that answers with that text): the
messages it covers leave the context and `max_tokens` holds, as for any summary. The running
summary and the folded messages are archived losslessly behind the remedy's pointer (or, for
`rederive`, summarized again from the live originals, never from the refused summary). With
`remedy=False` langmem's own no-summarization result is returned instead (nothing lost, nothing
re-judged, the context stays larger); `raise_on_refusal=True` raises `UnsafeRecompactionError`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.runnables import RunnableLambda
from langmem.short_term import summarization as upstream  # type: ignore[import-untyped]
from langmem.short_term.summarization import (  # type: ignore[import-untyped]
    RunningSummary,
    SummarizationResult,
)

from policyhook import Guard, GuardedCall, Region, Request, UnsafeRecompactionError, current_request
from policyhook.adapters import content_of, known, message_kind, message_text, untraced_summary
from policyhook.remedies import Remedied

__all__ = ["GuardedSummarizationNode", "asummarize_messages", "summarize_messages"]

_logger = logging.getLogger(__name__)

DEFAULT_NAME = "langmem.summarize_messages"


class _Probe:
    """A stand-in model: tells whether langmem would call the model, and never calls an LLM."""

    def __init__(self) -> None:
        self.called = False
        self.runnable = RunnableLambda(self._answer, afunc=self._aanswer)

    def _answer(self, _: Any) -> AIMessage:
        self.called = True
        return AIMessage(content="")

    async def _aanswer(self, value: Any) -> AIMessage:
        return self._answer(value)


def _text(summary: Any) -> str:
    """The running summary's text (models may return content blocks instead of a str)."""
    return content_of({"content": summary}) or ""


def summarize_messages(
    messages: list[AnyMessage],
    *,
    running_summary: RunningSummary | None,
    model: Any,
    guard: Guard,
    summarizer_name: str = DEFAULT_NAME,
    window: str | None = None,
    raise_on_refusal: bool = False,
    remedy: bool = True,
    **options: Any,
) -> SummarizationResult:
    """langmem's `summarize_messages`, decided by `guard` before it (re-)summarizes.

    `options` are langmem's (`max_tokens`, `max_tokens_before_summary`, `token_counter`, prompts).
    `window` names the conversation for policies and for recognising its summaries (default: the
    enclosing `policyhook.request(window=...)`).
    """
    probe = _Probe()
    dry = upstream.summarize_messages(
        messages, running_summary=running_summary, model=probe.runnable, **options
    )
    if not probe.called:
        return dry  # nothing to summarize: langmem did not touch the model
    current = _request(messages, window, options)
    value = _provenance(guard, messages, running_summary, dry, current.window)
    try:
        with guard.guarding(value, summarizer=summarizer_name, request=current) as call:
            result = upstream.summarize_messages(
                messages, running_summary=running_summary, model=model, **options
            )
            return _recorded(call, result)
    except UnsafeRecompactionError as refusal:
        if raise_on_refusal or not remedy:
            return _refused(refusal, raise_on_refusal, messages, running_summary, options)
        try:
            remedied = guard.remedy(
                refusal,
                value,
                summarize=lambda texts: _summary_of(model, texts, options),
                budget_chars=_budget_chars(options),
                summarizer=summarizer_name,
                window=current.window,
            )
        except UnsafeRecompactionError:  # no remedy could run (the store cannot archive)
            return _refused(refusal, False, messages, running_summary, options)
        return _in_place(remedied, messages, running_summary, options)


async def asummarize_messages(
    messages: list[AnyMessage],
    *,
    running_summary: RunningSummary | None,
    model: Any,
    guard: Guard,
    summarizer_name: str = DEFAULT_NAME,
    window: str | None = None,
    raise_on_refusal: bool = False,
    remedy: bool = True,
    **options: Any,
) -> SummarizationResult:
    """Async twin of `summarize_messages` (langmem's `asummarize_messages`)."""
    probe = _Probe()
    dry = await upstream.asummarize_messages(
        messages, running_summary=running_summary, model=probe.runnable, **options
    )
    if not probe.called:
        return dry
    current = _request(messages, window, options)
    value = _provenance(guard, messages, running_summary, dry, current.window)
    try:
        with guard.guarding(value, summarizer=summarizer_name, request=current) as call:
            result = await upstream.asummarize_messages(
                messages, running_summary=running_summary, model=model, **options
            )
            return _recorded(call, result)
    except UnsafeRecompactionError as refusal:
        if raise_on_refusal or not remedy:
            return _refused(refusal, raise_on_refusal, messages, running_summary, options)

        async def rederive(texts: list[str]) -> str:
            return _text((await model.ainvoke(_prompt(texts, options))).content)

        try:
            remedied = await guard.aremedy(
                refusal,
                value,
                summarize=rederive,
                budget_chars=_budget_chars(options),
                summarizer=summarizer_name,
                window=current.window,
            )
        except UnsafeRecompactionError:  # no remedy could run (the store cannot archive)
            return _refused(refusal, False, messages, running_summary, options)
        return _in_place(remedied, messages, running_summary, options)


class GuardedSummarizationNode(upstream.SummarizationNode):  # type: ignore[misc]
    """langmem's `SummarizationNode` (a LangGraph node) whose summaries go through `guard`.

    Takes every argument of `SummarizationNode`, plus `guard`, `summarizer_name`, `window`,
    `remedy` and `raise_on_refusal` as for `summarize_messages`.
    """

    def __init__(
        self,
        *,
        guard: Guard,
        summarizer_name: str = "langmem.SummarizationNode",
        window: str | None = None,
        raise_on_refusal: bool = False,
        remedy: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.guard = guard
        self.summarizer_name = summarizer_name
        self.window = window
        self.raise_on_refusal = raise_on_refusal
        self.remedy = remedy

    def _options(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "max_tokens_before_summary": self.max_tokens_before_summary,
            "max_summary_tokens": self.max_summary_tokens,
            "token_counter": self.token_counter,
            "initial_summary_prompt": self.initial_summary_prompt,
            "existing_summary_prompt": self.existing_summary_prompt,
            "final_prompt": self.final_prompt,
        }

    def _arguments(self, context: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of (a)summarize_messages for this node."""
        return {
            "running_summary": context.get("running_summary"),
            "model": self.model,
            "guard": self.guard,
            "summarizer_name": self.summarizer_name,
            "window": self.window,
            "raise_on_refusal": self.raise_on_refusal,
            "remedy": self.remedy,
            **self._options(),
        }

    def _func(self, input: Any) -> dict[str, Any]:
        messages, context = self._parse_input(input)
        result = summarize_messages(messages, **self._arguments(context))
        update: dict[str, Any] = self._prepare_state_update(context, result)
        return update

    async def _afunc(self, input: Any) -> dict[str, Any]:
        messages, context = self._parse_input(input)
        result = await asummarize_messages(messages, **self._arguments(context))
        update: dict[str, Any] = self._prepare_state_update(context, result)
        return update


# -- shared steps ---------------------------------------------------------------------------------


def _provenance(
    guard: Guard,
    messages: Sequence[AnyMessage],
    running_summary: RunningSummary | None,
    dry: SummarizationResult,
    window: str,
) -> list[str | Region]:
    """What the summarize call rests on: the running summary, then the messages it folds in."""
    value: list[str | Region] = []
    if running_summary is not None:
        text = _text(running_summary.summary)
        value.append(text if known(guard.provenance(text, window)) else untraced_summary(text))
    done = running_summary.summarized_message_ids if running_summary is not None else set()
    folded = dry.running_summary.summarized_message_ids - done if dry.running_summary else set()
    for message in messages:
        text = message_text(message)
        if message.id not in folded or not text.strip():
            continue
        # One id per text: a message edited in place is a new source (see the langchain adapter).
        source_id = guard.text_id(f"langmem:{message.id}", text)
        guard.try_record_source(text, message_kind(message), source_id)
        value.append(text)
    return value


def _recorded(call: GuardedCall, result: SummarizationResult) -> SummarizationResult:
    """Record langmem's new running summary, and use what the guard says to use: the summary
    with any remedy pointer it lost carried back (in the running summary and its message)."""
    if result.running_summary is None:
        call.record("")
        return result
    made = _text(result.running_summary.summary)
    kept = call.record(made)
    if kept == made:
        return result
    running = replace(result.running_summary, summary=kept)
    messages = [
        m.model_copy(update={"content": str(m.content).replace(made, kept)})
        if isinstance(m.content, str) and made in m.content
        else m
        for m in result.messages
    ]
    return SummarizationResult(messages=messages, running_summary=running)


def _request(
    messages: Sequence[AnyMessage], window: str | None, options: dict[str, Any]
) -> Request:
    """The current request with the messages' size and pressure against `max_tokens`."""
    count = options.get("token_counter", count_tokens_approximately)
    tokens = int(count(messages))
    budget = int(options.get("max_tokens", 0))
    current = replace(
        current_request(),
        budget_pressure=min(1.0, tokens / budget) if budget > 0 else 0.0,
        window_tokens=tokens,
        window_budget=budget,
    )
    return current if window is None else replace(current, window=window)


def _refused(
    refusal: UnsafeRecompactionError,
    raise_on_refusal: bool,
    messages: list[AnyMessage],
    running_summary: RunningSummary | None,
    options: dict[str, Any],
) -> SummarizationResult:
    """langmem's result when it summarizes nothing: the running summary kept as it is."""
    if raise_on_refusal:
        raise refusal
    _logger.warning(
        "policyhook: langmem re-summarization refused, the running summary is kept as it is: %s",
        refusal,
    )
    keep = {**options, "max_tokens_before_summary": sys.maxsize}
    return upstream.summarize_messages(
        messages, running_summary=running_summary, model=_Probe().runnable, **keep
    )


def _in_place(
    remedied: Remedied,
    messages: list[AnyMessage],
    running_summary: RunningSummary | None,
    options: dict[str, Any],
) -> SummarizationResult:
    """langmem's result with the remedy's text as the new running summary: langmem's own code
    decides which messages it covers and keeps the rest within `max_tokens`."""
    answer: RunnableLambda[Any, AIMessage] = RunnableLambda(
        lambda _: AIMessage(content=remedied.text)
    )
    return upstream.summarize_messages(
        messages, running_summary=running_summary, model=answer, **options
    )


def _prompt(texts: list[str], options: dict[str, Any]) -> Any:
    """langmem's first-summary prompt over `texts` (live originals, for `rederive`)."""
    template = options.get("initial_summary_prompt", upstream.DEFAULT_INITIAL_SUMMARY_PROMPT)
    return template.invoke({"messages": [HumanMessage(text) for text in texts]})


def _summary_of(model: Any, texts: list[str], options: dict[str, Any]) -> str:
    return _text(model.invoke(_prompt(texts, options)).content)


def _budget_chars(options: dict[str, Any]) -> int | None:
    """What `rederive` may put in one model call: langmem's `max_tokens`, ~4 characters a token."""
    budget = int(options.get("max_tokens", 0))
    return 4 * budget if budget > 0 else None
