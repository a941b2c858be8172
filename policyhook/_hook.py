"""The guard: decides every summarize call before it runs, and remembers what granted calls made.

One call, top to bottom (`Guard.guarding`; the decorator and every adapter go through it):
  input ─▶ ledger.resolve: which known sources / earlier summaries is it made of?
        ─▶ store.live: which of its sources can still be given back? (one lookup)
        ─▶ activation (plain data, no text) ─▶ policies.decide ─▶ Decision
        ─▶ telemetry + listeners, for every grant and refusal
        ─▶ deny (enforce): raise UnsafeRecompactionError; nothing runs, nothing is recorded
        ─▶ otherwise: the caller's block runs the summarizer; `call.record(output)` records its
           output as a summary one pass deeper (a store failure there is reported, never raised)
        ─▶ the call ends: its outcome goes on the span, a metric and the decision log
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AbstractContextManager, ContextDecorator, contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast, overload

from policyhook import _activation as schema
from policyhook import _shapes, grounding, remedies
from policyhook._cel import Backend
from policyhook._errors import UnsafeRecompactionError
from policyhook._loader import load_default
from policyhook._policy import Decision, Effect, Mode, PolicySet
from policyhook._provenance import (
    Ledger,
    Region,
    Resolution,
    Source,
    SourceIdConflictError,
    sources_of,
)
from policyhook._reload import PolicyWatcher
from policyhook._spool import Spool
from policyhook._telemetry import INVALID_SPAN, MeterProvider, Span, Telemetry, TracerProvider
from policyhook.decisionlog import DecisionLog, Outcome
from policyhook.remedies import Escalation, Remedied
from policyhook.stores import MemoryStore, Store

_logger = logging.getLogger("policyhook")
#: The effects every call tests, read once (an enum member's lookup costs 5x a global's).
_DENY, _WOULD_DENY = Effect.DENY, Effect.WOULD_DENY

#: The guarded function's parameters and result: `guard(fn)` has fn's own signature, and a
#: lambda (`guard(lambda text: ...)`) gets a typed one, callable from strictly typed code.
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
#: The largest CEL int: request fields and token counts beyond it are refused at the call.
INT64_MAX = 2**63 - 1
#: Called with every decision and its activation (see `policyhook.testing.capture_decisions`).
DecisionListener = Callable[[Decision, Mapping[str, Any]], None]


def _int_within(value: Any, low: int) -> bool:
    """An int (not a bool) within low..INT64_MAX."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= INT64_MAX


@dataclass(frozen=True)
class Request:
    """What the runtime knows about the compaction about to happen."""

    trigger: str | None = None  # None: the decorator's default trigger
    budget_pressure: float = 0.0
    attempt: int = 1
    window: str = "default"
    window_tokens: int = 0
    window_budget: int = 0

    def __post_init__(self) -> None:
        """Every field checked here, at the call: a bad value must not reach the policy engine."""
        trigger, pressure, window = self.trigger, self.budget_pressure, self.window
        attempt, tokens, budget = self.attempt, self.window_tokens, self.window_budget
        if (  # the usual values, in one expression (adapters make a request per call)
            (trigger is None or trigger == "automatic" or trigger == "manual")
            and type(pressure) is float
            and 0.0 <= pressure <= 1.0
            and type(attempt) is type(tokens) is type(budget) is int
            and attempt >= 1
            and tokens | budget >= 0  # (negative if either is)
            and attempt | tokens | budget <= INT64_MAX
            and type(window) is str
            and window.isascii()  # (so no lone surrogate: `_shapes.check_id`)
            and window != ""
        ):
            return
        if self.trigger is not None and self.trigger not in schema.TRIGGERS:
            raise ValueError(f'"trigger" must be automatic or manual: {self.trigger!r}')
        pressure = self.budget_pressure
        if (
            isinstance(pressure, bool)
            or not isinstance(pressure, int | float)
            or not 0.0 <= pressure <= 1.0  # also refuses NaN
        ):
            raise ValueError(f'"budget_pressure" must be a number within 0..1: {pressure!r}')
        object.__setattr__(self, "budget_pressure", float(pressure))  # as the activation has it
        for name, low in (("attempt", 1), ("window_tokens", 0), ("window_budget", 0)):
            value = getattr(self, name)
            if not _int_within(value, low):
                raise ValueError(f'"{name}" must be an int within {low}..2**63-1: {value!r}')
        if not isinstance(self.window, str) or not self.window:
            raise ValueError(f'"window" must be a non-empty str: {self.window!r}')
        _shapes.check_id("window", self.window)


_current_request: ContextVar[Request | None] = ContextVar("policyhook_request", default=None)
_DEFAULT_REQUEST = Request()


def current_request() -> Request:
    """The request guarded calls made here would see: the innermost `request(...)`, or defaults."""
    current = _current_request.get()
    return current if current is not None else _DEFAULT_REQUEST


@functools.lru_cache(maxsize=1024)
def _with_trigger(request: Request, trigger: str) -> Request:
    """`request` with `trigger`: made (and checked) once per request in force, not per call."""
    return replace(request, trigger=trigger)


def request(**fields: Any) -> _RequestBlock:
    """Describe the compaction for guarded calls made in this context (threads and tasks alike).

    >>> with policyhook.request(trigger="manual", budget_pressure=0.9, window="session-7"):
    ...     summarize(messages)

    Also a decorator (`@policyhook.request(window=...)`). The fields are merged with the
    enclosing request, and checked, when the block is entered.
    """
    return _RequestBlock(fields)


class _RequestBlock(ContextDecorator):
    """The block of one `request(...)`. A plain context manager, not a generator's: adapters
    enter one per call, and contextlib's generator machinery cost more than the request."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields
        self._tokens: list[Token[Request | None]] = []  # (a stack: a block may be re-entered)

    def _recreate_cm(self) -> _RequestBlock:
        return _RequestBlock(self._fields)  # each call of a decorated function its own block

    def __enter__(self) -> Request:
        outer, fields = _current_request.get(), self._fields
        current = replace(outer, **fields) if outer is not None else Request(**fields)
        self._tokens.append(_current_request.set(current))
        return current

    def __exit__(self, *exc: object) -> None:
        _current_request.reset(self._tokens.pop())


class GuardedCall:
    """One guarded call in flight: its decision, then the recording of what the summarizer made.

    Made by `Guard.guarding`; the caller runs its summarizer inside the block and hands the output
    to `record`, which returns what the caller should use. Today that is the output itself; an
    output-phase check may later refuse it there (raising `UnsafeRecompactionError` with its own
    decision) or a remedy may replace it, without changing how callers use the seam.
    """

    __slots__ = (
        "_activation", "_guard", "_input", "_outcome", "_resolution", "_returned", "_span",
        "_units", "_value", "decision", "grounding", "request", "summarizer",
    )  # fmt: skip

    def __init__(
        self,
        guard: Guard,
        summarizer: str,
        request: Request,
        resolution: Resolution,
        decision: Decision,
        activation: schema.Activation,
        span: Span,
        value: Any = None,
        units: Sequence[Region | str] = (),
    ) -> None:
        self.summarizer = summarizer
        self.request = request
        self.decision = decision
        self._value = value
        self._units = units  # the input as the guard read it (`_shapes.read`)
        self._guard = guard
        self._resolution = resolution
        self._input = activation  # what the input was decided on (the output check reads it)
        #: What the decision log records: the input's activation, or the output's once checked.
        self._activation: Mapping[str, Any] = activation
        self._span = span
        self._outcome: Outcome | None = None
        #: The output's facts and their sources, when output-phase policies checked it.
        self.grounding: grounding.Grounding | None = None
        self._returned: list[tuple[Source, str]] | None = None

    def _returned_originals(self) -> list[tuple[Source, str]]:
        """The input's dead sources whose text it holds (`Ledger.held_in`), asked once: content
        the call reads, as unrecognised content is (grounded on, archived)."""
        if self._returned is None:
            ledger = self._guard.ledger
            self._returned = ledger.held_in(self._units, self._resolution, self._input.dead)
        return self._returned

    @property
    def region(self) -> Region:
        """What the input rests on (depth, sources), as the policies saw it."""
        return self._resolution.region

    def record(self, output: T) -> T:
        """Record a granted call's output as a summary of its input; returns what to use.

        A text output gets back every remedy pointer of the input it lost (appended verbatim:
        the way back to an archive, and its pinned facts, are never re-judged by a summarizer).
        Never raises for a store failure: the summarizer has run, so its output is the caller's.
        The failure is logged, counted (`policyhook.store.errors`) and marked on the span, and the
        call ends with outcome `store_error`.
        """
        if self._outcome is not None:
            raise RuntimeError(f"guarded call of {self.summarizer!r} was already recorded")
        if isinstance(output, str):
            value = self._value
            texts = (value,) if type(value) is str else _unit_texts(self._units)
            for text in texts:  # (a loop in place: no frame of its own, `in` a memchr scan)
                if remedies.POINTER_PREFIX in text:
                    output = cast(T, remedies.carried(texts, output))
                    break
        guard = self._guard
        if guard.policies.checks_output:  # they decide before anything is recorded (raising)
            output = guard._check_output(output, self)
        self._outcome = guard._record(output, self._resolution, self.request.window, self)
        return output

    def _end(self, outcome: Outcome) -> None:
        """The call is over: its outcome goes on the span, a metric and the decision log."""
        self._guard._ended(self, outcome)


class _Guarding:
    """The block of one `Guard.guarding` call: the guard span around the decision and the
    summarizer's span around the block, the call ended with the block's outcome. A plain
    context manager, not a generator's: the decorator enters one per call, and contextlib's
    machinery cost more than this. The telemetry's spans never suppress an exception."""

    __slots__ = ("_args", "_call", "_traced", "_work")

    def __init__(
        self,
        guard: Guard,
        value: Any,
        summarizer: str,
        request: Request | None,
        lossless: bool,
        idempotent: bool,
    ) -> None:
        self._args = (guard, value, summarizer, request, lossless, idempotent)

    def __enter__(self) -> GuardedCall:
        guard, value, summarizer, request, lossless, idempotent = self._args
        req = request if request is not None else current_request()
        traced = guard._telemetry.guarded(summarizer)
        span = traced.__enter__()
        try:
            call = guard._decide(value, summarizer, req, lossless, idempotent, span)
            try:
                work = guard._telemetry.summarizing(summarizer)
                work.__enter__()
            except BaseException as error:
                call._end(_outcome(call, error))
                raise
        except BaseException as error:
            traced.__exit__(type(error), error, error.__traceback__)
            raise
        self._call, self._traced, self._work = call, traced, work
        return call

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: Any
    ) -> None:
        call = self._call
        try:
            try:
                self._work.__exit__(kind, error, tb)  # records the summarizer's exception
            except BaseException as raised:  # the span's own failure ends the call instead
                call._end(_outcome(call, raised))
                raise
            if error is None:
                call._end(call._outcome or "unrecorded")
            else:
                call._end(_outcome(call, error))
        except BaseException as raised:
            self._traced.__exit__(type(raised), raised, raised.__traceback__)
            raise
        self._traced.__exit__(kind, error, tb)  # the block's exception, if any, goes on


def _outcome(call: GuardedCall, error: BaseException) -> Outcome:
    """How a call that `error` left ends: a refusal by the output check is `refused` (one raised
    in the block by anything else, `failed`), another exception `failed`, a cancellation
    (`asyncio.CancelledError`, KeyboardInterrupt) `cancelled`."""
    if isinstance(error, UnsafeRecompactionError):
        return "refused" if call.grounding is not None else "failed"
    return "failed" if isinstance(error, Exception) else "cancelled"


def _texts(output: Any) -> list[str]:
    """A summarizer's output as the summaries to record; TypeError if its shape is unreadable
    (an output the guard cannot record would come back later as original evidence)."""
    if output is None:
        return []
    if type(output) is str:  # the common case: one text
        text = output.strip()
        return [text] if text else []
    units = _shapes.read(output, keep=(Region,), where="output")
    texts = [u.text or "" if isinstance(u, Region) else u for u in units]
    return [t.strip() for t in texts if t.strip()]


@dataclass(frozen=True)
class Summarizer:
    """A guarded function's declared properties, fixed at decoration."""

    name: str
    lossless: bool = False
    idempotent: bool = False
    trigger: str = "automatic"
    extractor: Callable[..., Any] | None = field(default=None, compare=False)
    argument: str | None = None  # name of the parameter holding the input
    position: int = 0  # its position among positional arguments

    def input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.extractor is not None:
            return self.extractor(*args, **kwargs)
        if len(args) > self.position:
            return args[self.position]
        if self.argument in kwargs:
            return kwargs[self.argument]
        raise TypeError(f"guarded summarizer {self.name!r} was called without its input")

    #: The last request in force and what `request` made of it, as one pair (most calls see
    #: the same request; a pair is read and replaced whole, so threads never mix two).
    _last: list[tuple[Request, Request]] = field(default_factory=list, compare=False, repr=False)

    def request(self) -> Request:
        """The current request, with this summarizer's default trigger when it names none."""
        current = current_request()
        if current.trigger is not None:
            return current
        last = self._last[-1] if self._last else None
        if last is not None and last[0] is current:
            return last[1]
        made = _with_trigger(current, self.trigger)
        self._last[:] = [(current, made)]
        return made


class Guard:
    """Gates summarize calls with policies over the provenance of what they summarize.

    `policies` is a compiled PolicySet, a path to policy YAML (a file or a folder, reloaded while
    running every `reload_interval` seconds), or None for the embedded default policy.
    """

    def __init__(
        self,
        policies: PolicySet | str | Path | None = None,
        *,
        store: Store | None = None,
        reload_interval: float = 2.0,
        backend: Backend | None = None,
        archive_originals: bool = False,
        decision_log: DecisionLog | str | Path | None = None,
        capture_content: bool | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        count_tokens: Callable[[str], int] | None = None,
        max_texts: int = 65_536,
        max_windows: int = 4_096,
        max_fact_sources: int = 4_096,
        escalation: Escalation | None = None,
        pin_limit: int = 40,
        cite_sources: bool = False,
        spool: Store | None = None,
    ) -> None:
        self.store: Store = store if store is not None else MemoryStore()
        if spool is not None and spool is self.store:
            raise ValueError('"spool" must be another store than "store" (a local SQLiteStore)')
        #: Where remedies archive while the store refuses writes (see `policyhook._spool`).
        self._spool = None if spool is None else Spool(spool)
        self.escalation = escalation
        self.pin_limit = pin_limit
        self.ledger = Ledger(self.store, max_texts=max_texts, max_windows=max_windows)
        self._telemetry = Telemetry(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            capture_content=capture_content,
        )
        self.archive_originals = archive_originals
        self.count_tokens = count_tokens
        #: Render the live sources of each grounded fact into a text output (`ceiling 7 [cfg-42]`)
        #: when output-phase policies check it; `call.grounding` has them either way.
        self.cite_sources = cite_sources
        # facts of the sources, indexed when an output is first checked against them; a cache
        self._facts = grounding.FactIndex(max_sources=max_fact_sources)
        self._grounding = threading.Lock()
        if isinstance(decision_log, str | Path):
            decision_log = DecisionLog(decision_log)
        self.decision_log = decision_log
        self._listeners: tuple[DecisionListener, ...] = ()
        self._watcher: PolicyWatcher | None = None
        if isinstance(policies, str | Path):
            self._watcher = PolicyWatcher(
                policies,
                interval=reload_interval,
                backend=backend,
                on_reload=self._telemetry.reloaded,
            ).start()
            self._policies = self._watcher.current
        else:
            self._policies = policies if policies is not None else load_default(backend=backend)

    @classmethod
    def from_path(cls, path: str | Path, **options: Any) -> Guard:
        """A guard whose policies are read from `path` and reloaded when the files change."""
        return cls(Path(path), **options)

    @property
    def policies(self) -> PolicySet:
        """The policy set in force now (the watcher's latest good revision, if following files)."""
        return self._watcher.current if self._watcher is not None else self._policies

    def reload(self) -> bool:
        """Re-read the policy files now; True when a new set was put in force.

        A guard follows its files on its own; this is for callers that cannot wait for the next
        poll (tests, an admin endpoint). A set that fails to load is counted and the last good
        one stays, as for a poll. A guard not made from a path has nothing to reload: False.
        """
        return self._watcher.check() if self._watcher is not None else False

    def close(self) -> None:
        """Stop following policy files, write what the store still lacks (summaries whose write
        failed, archives in the spool, if it is back) and close the decision log."""
        if self._watcher is not None:
            self._watcher.stop()
        if self._spool is not None:
            while self._spool.holding and self._spool.move(self._unspool):
                pass  # a batch a time, while the store takes them
            if self._spool.holding:
                _logger.warning(
                    "policyhook: the store did not take what the spool holds; the next guard "
                    "given this spool moves it"
                )
        owed = self.ledger.write_unwritten()
        if owed:
            _logger.warning(
                "policyhook: %d granted summaries could not be written to the store; other "
                "processes will not recognise them as summaries",
                owed,
            )
        if self.decision_log is not None:
            self.decision_log.close()

    def add_listener(self, listener: DecisionListener) -> None:
        """Call `listener(decision, activation)` after every decision; its errors are logged."""
        self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: DecisionListener) -> None:
        self._listeners = tuple(x for x in self._listeners if x is not listener)

    def record_source(self, text: str, kind: str, source_id: str | None = None) -> Source:
        """Register original evidence (config read, tool output, user turn) before it is evicted.

        A text quoting known summaries keeps their provenance (see `Ledger.record_source`).
        """
        return self.ledger.record_source(text, kind, source_id, window=current_request().window)

    def try_record_source(
        self, text: str, kind: str, source_id: str | None = None
    ) -> Source | None:
        """`record_source` for a caller that must go on while the store cannot take the text
        (an adapter recording the messages a summary is about to replace): a store failure is
        logged and counted (`policyhook.store.errors{operation="put_source"}`), and None
        returned. The text is then content no store holds, dead: a summary in the same input
        is refused (the store down, every source is dead), and one made of originals alone
        rests on it, so it is refused once summarized again unless its originals come back.
        Errors of the caller's own (a `SourceIdConflictError`, a text that is not a str) are
        raised as by `record_source`."""
        try:
            return self.record_source(text, kind, source_id)
        except (SourceIdConflictError, TypeError):
            raise
        except Exception as error:
            self._put_failed(error, "the %s text is decided as content no store holds (dead)", kind)
            return None

    def _put_failed(
        self, error: Exception, outcome: str, *args: object, span: Span = INVALID_SPAN
    ) -> None:
        """A source the store could not take: logged with what became of it (never its text),
        counted, and marked on `span` (a remedy's) if there is one."""
        _logger.warning(f"policyhook: store put_source failed; {outcome}", *args, exc_info=True)
        self._telemetry.store_failed(span, "put_source", error)

    def text_id(self, prefix: str, text: str) -> str:
        """`prefix:<keyed digest of text>`: the same in every process sharing the store, and no
        clue to a short text outside it. Adapters name a message's source with it, so a message
        edited in place under its id is a new source and the old text stays held."""
        return self.ledger.text_id(prefix, text)

    def provenance(self, value: Any, window: str | None = None) -> Region:
        """What `value` rests on in `window` (default: the current request's), without deciding.

        `depth > 0` means the guard recognises it as a summary it recorded: adapters use this to
        tell a known summary from one made before the guard was installed.
        """
        window = window or current_request().window
        resolution = self.ledger.resolve(value, window)
        if self._spool is not None and self._unspooled(resolution):
            resolution = self.ledger.resolve(value, window)
        return resolution.region

    # -- the seam: one guarded call -------------------------------------------------------------

    def guarding(
        self,
        value: Any,
        *,
        summarizer: str,
        request: Request | None = None,
        lossless: bool = False,
        idempotent: bool = False,
    ) -> AbstractContextManager[GuardedCall]:
        """Decide a summarize call on `value`; the block runs it if granted.

        >>> with guard.guarding(messages, summarizer="chat-summary") as call:
        ...     summary = call.record(llm.summarize(messages))

        Entering raises `UnsafeRecompactionError` on a refusal (enforce mode): the block never
        runs. Otherwise the block is the summarizer's work (the `policyhook.summarize` span) and
        hands its output to `call.record`, which returns what the caller should use. An exception
        leaving the block marks the spans and ends the call as `failed`; a cancellation
        (`asyncio.CancelledError`, a timeout, KeyboardInterrupt) as `cancelled`; either way nothing
        is recorded. `request` describes the compaction (default: `current_request()`).

        One synchronous context manager serves sync and async code alike: deciding is
        CPU-bound work of microseconds plus one store lookup, exactly what the decorator does
        in an async function, so an async twin would only be a second path to keep equal. Use
        it as `with` inside `async def` and `await` the summarizer in the block.
        """
        return _Guarding(self, value, summarizer, request, lossless, idempotent)

    # -- decorating -----------------------------------------------------------------------------

    @overload
    def __call__(
        self,
        fn: Callable[P, R],
        *,
        summarizer: str | None = None,
        lossless: bool = False,
        idempotent: bool = False,
        trigger: str = "automatic",
        extractor: Callable[..., Any] | None = None,
        remedy: bool = False,
        budget_chars: int | None = None,
    ) -> Callable[P, R]: ...

    @overload
    def __call__(
        self,
        fn: None = None,
        *,
        summarizer: str | None = None,
        lossless: bool = False,
        idempotent: bool = False,
        trigger: str = "automatic",
        extractor: Callable[..., Any] | None = None,
        remedy: bool = False,
        budget_chars: int | None = None,
    ) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    def __call__(
        self,
        fn: Callable[P, R] | None = None,
        *,
        summarizer: str | None = None,
        lossless: bool = False,
        idempotent: bool = False,
        trigger: str = "automatic",
        extractor: Callable[..., Any] | None = None,
        remedy: bool = False,
        budget_chars: int | None = None,
    ) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
        """Guard a summarize function (sync or async, plain or method), through `guarding`.

        `summarizer` names it in policies and telemetry (default: the function's qualified name);
        `lossless` / `idempotent` declare properties policies may exempt; `trigger` is the default
        when no `policyhook.request(...)` says otherwise; `extractor(*args, **kwargs)` returns the
        input for signatures whose first argument is not it.

        With `remedy=True` a refusal does not raise: the refusing rule's remedy runs (see
        `Guard.remedy`; `rederive` calls this function on chunks of at most `budget_chars` of live
        originals) and its text is returned in place of the summary, so a caller that replaces
        the region with what the summarizer returned keeps going, in budget. Only when no remedy
        can run (the store cannot archive) is the refusal raised.
        """
        if trigger not in schema.TRIGGERS:
            raise ValueError(f'"trigger" must be automatic or manual: {trigger!r}')

        def decorate(fn: Callable[P, R]) -> Callable[P, R]:
            spec = _spec(fn, summarizer, lossless, idempotent, trigger, extractor)

            def call(
                args: tuple[Any, ...], kwargs: dict[str, Any]
            ) -> AbstractContextManager[GuardedCall]:
                # `self.guarding(...)`'s block, made here: one layer less on every call
                return _Guarding(
                    self,
                    spec.input(args, kwargs),
                    spec.name,
                    spec.request(),
                    spec.lossless,
                    spec.idempotent,
                )

            if inspect.iscoroutinefunction(fn):

                async def summarize_async(*args: Any, **kwargs: Any) -> Any:
                    with call(args, kwargs) as guarded:
                        return guarded.record(await fn(*args, **kwargs))

                @functools.wraps(fn)
                async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                    if not remedy:
                        return await summarize_async(*args, **kwargs)
                    try:
                        return await summarize_async(*args, **kwargs)
                    except UnsafeRecompactionError as refusal:
                        again = _with_input(spec, args, kwargs, summarize_async)
                        remedied = await self.aremedy(
                            refusal,
                            spec.input(args, kwargs),
                            summarize=again,
                            budget_chars=budget_chars,
                            summarizer=spec.name,
                        )
                        return remedied.text

                return cast(Callable[P, R], guarded_async)

            def summarize_sync(*args: Any, **kwargs: Any) -> Any:
                with call(args, kwargs) as guarded:
                    return guarded.record(fn(*args, **kwargs))

            @functools.wraps(fn)
            def guarded_sync(*args: Any, **kwargs: Any) -> Any:
                if not remedy:
                    return summarize_sync(*args, **kwargs)
                try:
                    return summarize_sync(*args, **kwargs)
                except UnsafeRecompactionError as refusal:
                    remedied = self.remedy(
                        refusal,
                        spec.input(args, kwargs),
                        summarize=_with_input(spec, args, kwargs, summarize_sync),
                        budget_chars=budget_chars,
                        summarizer=spec.name,
                    )
                    return remedied.text

            return cast(Callable[P, R], guarded_sync)

        return decorate(fn) if fn is not None else decorate

    # -- after a refusal: the way forward -------------------------------------------------------

    def remedy(
        self,
        refusal: UnsafeRecompactionError,
        value: Any,
        *,
        summarize: Callable[[list[str]], Any] | None = None,
        budget_chars: int | None = None,
        summarizer: str = "",
        window: str | None = None,
    ) -> Remedied:
        """Run the remedy `refusal` names for the refused call on `value`; `.text` is what to put
        in the window where the summary would have gone (see `policyhook.remedies`).

        `summarize(texts)` is what `rederive` runs on chunks of at most `budget_chars` characters
        of live originals: the summarizer the refused call would have used. A remedy that cannot
        run falls back to `pin` (lossless); when even that fails (the store cannot archive), the
        refusal is raised again, so the caller keeps its window and nothing is lost. Traced as a
        `policyhook.remedy` span and counted on `policyhook.remedies`.
        """
        can_summarize = summarize is not None
        with self._remedying(
            refusal, value, can_summarize, budget_chars, window, summarizer
        ) as run:
            for step, texts in run:
                if step == "summarize":
                    assert summarize is not None and texts is not None
                    run.answer = "\n".join(_texts(summarize(texts)))
                else:
                    run.answer = self._escalation().ask(refusal)
        return run.result()

    async def aremedy(
        self,
        refusal: UnsafeRecompactionError,
        value: Any,
        *,
        summarize: Callable[[list[str]], Awaitable[Any]] | None = None,
        budget_chars: int | None = None,
        summarizer: str = "",
        window: str | None = None,
    ) -> Remedied:
        """`remedy` for async callers: `summarize` is awaited and an escalation never blocks the
        event loop. The same plan runs (`policyhook.remedies.plan`); only the driver differs."""
        can_summarize = summarize is not None
        with self._remedying(
            refusal, value, can_summarize, budget_chars, window, summarizer
        ) as run:
            for step, texts in run:
                if step == "summarize":
                    assert summarize is not None and texts is not None
                    run.answer = "\n".join(_texts(await summarize(texts)))
                else:
                    run.answer = await self._escalation().aask(refusal)
        return run.result()

    def retrieve(self, ref: str) -> list[str]:
        """The texts an offload archived under `ref`, exactly as they were.

        A KeyError when the store no longer holds them (evicted, expired, or never offloaded).
        An archive the store could not take is read from the spool until it is moved; with the
        store failing, what the spool lacks raises the store's error.
        """
        failure: Exception | None = None
        try:
            payload = self.store.get_source(ref)
        except Exception as error:
            if self._spool is None:
                raise
            payload, failure = None, error
        if payload is None and self._spool is not None:
            payload = self._spool.get(ref)  # an archive the store could not take
        if payload is None and failure is not None:
            raise failure
        if payload is None:
            raise KeyError(
                f"no offloaded region {ref!r} in the store (evicted, expired or unknown)"
            )
        return remedies.unarchive(payload, ref)

    @contextmanager
    def _remedying(
        self,
        refusal: UnsafeRecompactionError,
        value: Any,
        can_summarize: bool,
        budget_chars: int | None,
        window: str | None,
        summarizer: str,
    ) -> Iterator[_RemedyRun]:
        """One remedy run, traced: the driver answers its steps; a failure re-raises the refusal
        (the caller keeps its window), a result is recorded and counted."""
        window = window or current_request().window
        with self._telemetry.remedying(refusal.decision, summarizer) as span:
            try:  # (the store failing while the situation is read too: the refusal stands)
                situation = self._situation(
                    refusal, value, can_summarize, budget_chars, window, span
                )
                spooled: list[str] = []  # refs `_offload` archived in the spool
                offload = functools.partial(self._offload, span, spooled)
                run = _RemedyRun(remedies.plan(situation, offload))
                yield run
            except Exception as error:
                self._remedy_failed(refusal, error, summarizer, span)
                raise refusal from error
            result = run.done()
            if result.ref in spooled:
                result = replace(result, spooled=True)
            run.remedied = self._remedied(result, situation, refusal, window, summarizer, span)

    def _situation(
        self,
        refusal: UnsafeRecompactionError,
        value: Any,
        can_summarize: bool,
        budget_chars: int | None,
        window: str,
        span: Span,
    ) -> remedies.Situation:
        """What a remedy needs: the input's exact texts, and its sources' texts while the store
        still holds them (oldest put first), looked up now: liveness is never cached. A store
        that cannot give them back holds none: `pin` still archives the input's texts."""
        region = self.ledger.resolve(value, window).region
        try:
            live = self.store.get_sources(region.sources)
            order = self._put_order(live)
        except Exception as error:
            _logger.warning(
                "policyhook: store get_sources failed; the remedy runs with no live source",
                exc_info=True,
            )
            self._telemetry.store_failed(span, "get_sources", error)
            live, order = {}, []
        units = _shapes.read(value, keep=(Region,))
        return remedies.Situation(
            requested=remedies.remedy_name(refusal.remedy or remedies.FALLBACK),
            texts=tuple(u.text or "" if isinstance(u, Region) else u for u in units),
            live=tuple((s, live[s]) for s in order),
            dead=tuple(s for s in sorted(region.sources) if s not in live),
            can_summarize=can_summarize,
            budget_chars=budget_chars,
            escalation=self.escalation,
            pin_limit=self.pin_limit,
        )

    def _put_order(self, ids: Collection[str]) -> list[str]:
        """`ids` oldest put first, as the originals were written (a summary is read in order);
        ids the store's recent listing does not reach go last, by id."""
        recent = self.store.sources(max(10_000, 4 * len(ids)))
        rank = {source.id: i for i, (source, _) in enumerate(recent)}
        return sorted(ids, key=lambda s: (rank.get(s, len(rank)), s))

    def _offload(
        self,
        span: Span,
        spooled: list[str],
        texts: Sequence[str],
        pinned: Sequence[remedies.Pinned],
    ) -> tuple[str, str]:
        """Archive `texts` under a keyed ref; the pointer standing in for them is recorded as
        original evidence resting on that ref's own source, so it may be summarized later.
        A ref archived in the spool instead is added to `spooled`."""
        payload = remedies.archive_payload(texts)
        ref = self.ledger.text_id("offload", payload)  # (keyed with the store's secret)
        archive = Source(ref, remedies.OFFLOAD_KIND)
        pointer = remedies.pointer_text(ref, texts, pinned)
        try:
            self.store.put_source(archive, payload)
            # Its id is derived from its text (the same archive pinned otherwise is another text).
            self.ledger.record_source(pointer, remedies.POINTER_KIND)
        except SourceIdConflictError:
            raise
        except Exception as error:
            if self._spool is None:
                raise
            # The store refuses writes: both into the spool (which raising, the refusal stands),
            # moved to the store once it answers (`_unspool`)
            self._spool.put(archive, payload)
            pointer_id = self.ledger.text_id(remedies.POINTER_KIND, pointer)
            self._spool.put(Source(pointer_id, remedies.POINTER_KIND), pointer)
            spooled.append(ref)
            self._put_failed(
                error, "archive %s kept in the spool until the store answers", ref, span=span
            )
        return ref, pointer

    def _unspooled(self, resolution: Resolution) -> bool:
        """Once the store answers a read, what an outage left in the spool goes to it; True
        when something moved (then the input is read again: a pointer in it is known now)."""
        assert self._spool is not None
        return (
            self._spool.holding
            and resolution.failure is None
            and self._spool.move(self._unspool) > 0
        )

    def _unspool(self, source: Source, text: str) -> None:
        """Write one spooled entry to the store as `_offload` would have: the archive as it is,
        the pointer as original evidence through the ledger."""
        if source.kind == remedies.OFFLOAD_KIND:
            self.store.put_source(source, text)
        else:
            self.ledger.record_source(text, source.kind, source.id)

    def _escalation(self) -> Escalation:
        assert self.escalation is not None  # the plan asks only when one is configured
        return self.escalation

    def _remedied(
        self,
        result: Remedied,
        situation: remedies.Situation,
        refusal: UnsafeRecompactionError,
        window: str,
        summarizer: str,
        span: Span,
    ) -> Remedied:
        if result.remedy == "rederive":  # rests on the originals: one pass deep, recognised
            originals = self.ledger.resolve([text for _, text in situation.live], window)
            self.ledger.record_summary(result.text, originals.region, window)
        outcome = "fallback" if result.fell_back else "applied"
        details: dict[str, Any] = {"pinned": len(result.pinned)}
        if result.ref is not None:
            details.update(ref=result.ref, archived_items=result.archived_items)
        if result.reason:
            _logger.warning(
                "policyhook: remedy %s for decision %s fell back to %s: %s",
                result.requested,
                refusal.decision_id,
                result.remedy,
                result.reason,
            )
        self._telemetry.remedied(
            span, summarizer, result.requested, result.remedy, outcome, details
        )
        return result

    def _remedy_failed(
        self,
        refusal: UnsafeRecompactionError,
        error: Exception,
        summarizer: str,
        span: Span,
    ) -> None:
        _logger.warning(
            "policyhook: no remedy could run for decision %s; the refusal stands",
            refusal.decision_id,
            exc_info=True,
        )
        requested = refusal.remedy or remedies.FALLBACK
        self._telemetry.remedied(span, summarizer, requested, requested, "failed", {}, error)

    # -- deciding without running anything (adapters, dry runs) ---------------------------------

    def check(
        self,
        value: Any,
        *,
        summarizer: str,
        request: Request | None = None,
        lossless: bool = False,
        idempotent: bool = False,
        enforce: bool = False,
    ) -> Decision:
        """Decide a call on `value` without running anything; raises on deny only if `enforce`.

        The deciding half of `guarding`: traced, counted and logged like a guarded call's
        decision (outcome `checked`), with no summarizer span.
        """
        req = request if request is not None else current_request()
        try:
            with self._telemetry.guarded(summarizer) as span:
                call = self._decide(value, summarizer, req, lossless, idempotent, span)
                call._end("checked")
                return call.decision
        except UnsafeRecompactionError as refusal:
            if enforce:
                raise
            return refusal.decision

    def record_summary(self, output: Any, of: Any, window: str | None = None) -> list[Region]:
        """Record `output` as a summary of `of`, for adapters that produce summaries themselves.

        No decision is made. A store failure raises here: nothing was decided, so the caller
        chooses what a lost record means.
        """
        window = window or current_request().window
        units = _shapes.read(of, keep=(Region,))
        resolution = self.ledger.resolve_units(units, window)
        regions = [self.ledger.record_summary(t, resolution.region, window) for t in _texts(output)]
        if self.archive_originals:
            sources = resolution.region.sources
            live = self.store.live(sources) if resolution.live is None else resolution.live
            returned = self.ledger.held_in(units, resolution, sources - live)
            self.ledger.archive(resolution.unregistered, returned)
        return regions

    # -- the data path of one call --------------------------------------------------------------

    def _decide(
        self,
        value: Any,
        summarizer: str,
        req: Request,
        lossless: bool,
        idempotent: bool,
        span: Span,
    ) -> GuardedCall:
        """Decide one call inside its span; raises `UnsafeRecompactionError` on a refusal."""
        policies = self.policies  # one revision for the whole decision
        started = time.perf_counter()
        units = _shapes.read(value, keep=(Region,))  # read once: resolved, then seen by record
        resolution = self.ledger.resolve_units(units, req.window)
        if self._spool is not None and self._unspooled(resolution):
            resolution = self.ledger.resolve_units(units, req.window)
        region = resolution.region
        depth = self._window_depth(req.window, span)
        live = resolution.live  # read with the provenance, the usual case
        sources = sources_of(region)  # (a rolling chain's k ids: not made into a set)
        if depth is None:  # the store is unreachable: every source dead
            live = None
        elif live is None or not sources:
            live = self._live(resolution, span)
        unanswered = live is None  # the store could not say: none held (fail closed)
        if live is None:
            live = frozenset()
        # `schema.build`'s activation, made directly (its keywords cost a tenth of the call's
        # own code): a Request's budget_pressure is a float already, as build would make it
        activation = schema.Activation(
            region,
            frozenset() if live is sources else schema.dead_of(region.sources, live),
            region.chars // 4 if self.count_tokens is None else self._tokens(value),
            req.trigger or "automatic",
            req.budget_pressure,
            req.attempt,
            req.window,
            req.window_tokens,
            req.window_budget,
            region.depth if depth is None else max(depth, region.depth),  # (it is in the window)
            summarizer,
            lossless,
            idempotent,
        )
        decision = policies.decide(activation)
        content = _joined(value) if self._telemetry.capture_content else None
        self._telemetry.decided(span, decision, activation, time.perf_counter() - started, content)
        if self._listeners:
            self._notify(decision, activation)
        call = GuardedCall(
            self, summarizer, req, resolution, decision, activation, span, value, units
        )
        effect = decision.effect
        if effect == _DENY:
            refusal = UnsafeRecompactionError(decision, store_failed=unanswered)
            self._telemetry.refused(span, refusal)
            call._end("refused")
            raise refusal
        if effect == _WOULD_DENY:
            level = logging.WARNING if decision.mode == Mode.WARN else logging.INFO
            _logger.log(
                level,
                "policyhook (%s mode) would refuse: %s",
                decision.mode,
                UnsafeRecompactionError(decision),
            )
        return call

    def _check_output(self, output: T, call: GuardedCall) -> T:
        """Output phase: map the output's facts to the input's live sources; output policies
        decide on the `summary` activation. Returns what to use (cited when asked)."""
        policies = self.policies
        if not policies.checks_output:
            return output
        texts = _texts(output)
        live, scope = set(call._input.live_set), set(call._input.source_set)  # nothing sorted
        # scope, what the input rests on: only these may state a fact, not whatever else the
        # process-wide index holds from other calls (that would make an invented number
        # unverifiable instead of ungrounded, and a finding depend on the cache); the live
        # sources are among them
        failed = False  # a store read failing: a refusal that may not stand once it answers
        try:  # per-fact provenance of the input's summaries, recorded by any process
            recorded = self.store.facts(call._resolution.summaries)
            carried = grounding.carried(r for facts in recorded.values() for r in facts)
        except Exception as error:
            self._store_failed(call, "facts", error)
            failed = True
            carried = None  # facts only an earlier summary stated have no source: refused
        # the input's own new content, and its dead sources back in it verbatim (found as those
        # sources or not: the cache's doing)
        content = call._resolution.unregistered
        if call._input.dead:
            try:
                content += tuple((s.id, text) for s, text in call._returned_originals())
            except Exception as error:
                self._store_failed(call, "lookup", error)  # they vouch for nothing
                failed = True
        written = "\n".join(remedies.without_pointers(t) for t in texts)
        with self._grounding:  # the index is a bounded cache: fill, check, then trim, as one
            missing = [s for s in live if s not in self._facts]
            try:  # one lookup for every live source this process has not indexed yet
                fetched = self.store.get_sources(missing) if missing else {}
            except Exception as error:
                self._store_failed(call, "get_sources", error)
                failed = True
                fetched = {}  # their facts stay unverifiable: nothing to check them against
            for source_id, text in (*fetched.items(), *content):
                # a remedy's pointer is carried into the output verbatim: none of its facts is
                # one the summary drops
                kept = remedies.without_pointers(text) if remedies.POINTER_PREFIX in text else None
                self._facts.add(source_id, text, must_keep=kept)
            for source_id, _ in content:
                live.add(source_id)
                scope.add(source_id)
            found = grounding.check(written, self._facts, live, carried=carried, scope=scope)
            self._facts.trim(keep=live)
        call.grounding = found
        activation = {**call._input, "summary": schema.summary(found.summary())}
        decision = policies.decide(activation, phase="output")
        if decision.effect != Effect.ALLOW:
            decision = replace(decision, message=f"{decision.message}: {found.describe()}")
            # the decision log and the refusal carry the output's decision, not the input's
            call.decision, call._activation = decision, activation
        self._notify(decision, activation)
        if decision.effect == Effect.DENY:
            refusal = UnsafeRecompactionError(decision, store_failed=failed)
            self._telemetry.refused(call._span, refusal)
            raise refusal
        if decision.effect == Effect.WOULD_DENY:
            _logger.log(
                logging.WARNING if decision.mode == Mode.WARN else logging.INFO,
                "policyhook (%s mode) would refuse the output: %s",
                decision.mode,
                UnsafeRecompactionError(decision),
            )
        if self.cite_sources and isinstance(output, str):
            return cast(T, grounding.cite(output, found))
        return output

    def _record(
        self, output: Any, resolution: Resolution, window: str, call: GuardedCall
    ) -> Outcome:
        texts = _texts(output)
        if not texts:
            _logger.warning(
                "policyhook: cannot read text from %s returned by %r; it will not be recognised "
                "as a summary when it comes back",
                type(output).__name__,
                call.summarizer,
            )
        outcome: Outcome = "summarized"
        checked, at = call.grounding, 0
        for text in texts:
            facts: list[tuple[str, tuple[str, ...]]] = []
            if checked is not None:  # the facts this text states (all, for one: maybe cited)
                span = (0, None) if len(texts) == 1 else (at, at + len(text))
                facts = grounding.fact_records(checked, *span)
            at += len(text) + 1
            try:
                self.ledger.record_summary(text, resolution.region, window, facts)
            except Exception as error:
                self._store_failed(call, "put_summary", error)
                outcome = "store_error"
        if self.archive_originals:
            try:
                self.ledger.archive(resolution.unregistered, call._returned_originals())
            except Exception as error:
                self._store_failed(call, "put_source", error)
                outcome = "store_error"
        if self._telemetry.capture_content:
            self._telemetry.summarized(call._span, "\n".join(texts))
        return outcome

    def _store_failed(self, call: GuardedCall, operation: str, error: Exception) -> None:
        """After a grant: the output is the caller's whatever the store says; say what was lost."""
        if operation in ("put_summary", "put_source"):
            outcome = "the output is returned"
            if operation == "put_summary":
                outcome += (
                    ", and written to the store before the next decision (until then, only this "
                    "process recognises it as a summary)"
                )
        else:  # a read of the output check: what it would have brought vouches for nothing
            outcome = "the output is checked without what it would have read"
        _logger.warning(
            "policyhook: store %s failed after %r was granted; %s",
            operation,
            call.summarizer,
            outcome,
            exc_info=True,
        )
        self._telemetry.store_failed(call._span, operation, error)

    def _ended(self, call: GuardedCall, outcome: Outcome) -> None:
        self._telemetry.ended(call._span, outcome, call.summarizer)
        if self.decision_log is None:
            return
        try:
            context = call._span.get_span_context()
            trace_id = f"{context.trace_id:032x}" if context.is_valid else ""
            span_id = f"{context.span_id:016x}" if context.is_valid else ""
            self.decision_log.write(call.decision, call._activation, trace_id, span_id, outcome)
        except Exception:
            _logger.warning("policyhook: failed to write the decision log", exc_info=True)

    def _notify(self, decision: Decision, activation: Mapping[str, Any]) -> None:
        for listener in self._listeners:
            try:
                listener(decision, activation)
            except Exception:
                _logger.warning("policyhook: decision listener %r failed", listener, exc_info=True)

    def _window_depth(self, window: str, span: Span) -> int | None:
        """The window's deepest summary; None when the store cannot say (then it counts as
        unreachable for the whole decision: every source dead, fail closed)."""
        try:
            return self.ledger.max_depth(window)
        except Exception as error:
            _logger.warning(
                "policyhook: store unreachable (window depth); treating every source as dead",
                exc_info=True,
            )
            self._telemetry.store_failed(span, "window_depth", error)
            return None

    def _live(self, resolution: Resolution, span: Span) -> frozenset[str] | None:
        """Sources the store holds now (read with the provenance when it could be: one round
        trip); None when the store cannot say (then it holds none: fail closed)."""
        region = resolution.region
        if not region.sources:
            return frozenset()
        if resolution.live is not None:
            return resolution.live
        try:
            if resolution.failure is not None:
                raise resolution.failure
            return self.store.live(region.sources)
        except Exception as error:
            _logger.warning(
                "policyhook: store unreachable; treating all %d sources as dead",
                len(region.sources),
                exc_info=True,
            )
            self._telemetry.store_failed(span, "live", error)
            return None

    def _tokens(self, value: Any) -> int:
        assert self.count_tokens is not None
        return _token_count(self.count_tokens(_joined(value)))


def _unit_texts(units: Sequence[Region | str]) -> list[str]:
    """The input's units as texts (a Region's, its text), as the guard read them."""
    return [unit.text or "" if isinstance(unit, Region) else unit for unit in units]


def _joined(value: Any) -> str:
    """The input's text as one string (for token counting and content capture)."""
    units = _shapes.read(value, keep=(Region,))
    return "\n".join(u.text or "" if isinstance(u, Region) else u for u in units)


def _token_count(count: Any) -> int:
    """`count_tokens`' result, checked before it reaches a policy (CEL ints are 64-bit)."""
    if not _int_within(count, 0):
        raise ValueError(f"count_tokens must return an int within 0..2**63-1: {count!r}")
    return int(count)


def _spec(
    fn: Callable[..., Any],
    name: str | None,
    lossless: bool,
    idempotent: bool,
    trigger: str,
    extractor: Callable[..., Any] | None,
) -> Summarizer:
    """Find which parameter holds the input: the first one, after `self`/`cls` for methods."""
    # A callable object (functools.partial, an instance with __call__) has no __qualname__.
    label = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    position = 1 if params and params[0].name in ("self", "cls") else 0
    argument = params[position].name if len(params) > position else None
    if argument is None and extractor is None:
        raise TypeError(f"cannot guard {label}: it takes no input argument; pass extractor=")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        # (its first call would be granted, then fail: a generator is no summary to record)
        raise TypeError(
            f"cannot guard {label}: it is a generator function, and the guard records the "
            "summary a summarizer returns; join its stream inside it and return the text"
        )
    return Summarizer(
        name=name or label,
        lossless=lossless,
        idempotent=idempotent,
        trigger=trigger,
        extractor=extractor,
        argument=argument,
        position=position,
    )


class _RemedyRun:
    """The steps of a remedy plan (`remedies.plan`) for a driver to answer: `remedy` answers
    them synchronously, `aremedy` by awaiting; the plan itself is the same."""

    def __init__(self, plan: Generator[remedies.Step, Any, Remedied]) -> None:
        self._plan = plan
        self._done: Remedied | None = None
        self.answer: Any = None
        self.remedied: Remedied | None = None

    def __iter__(self) -> Iterator[remedies.Step]:
        try:
            while True:
                yield self._plan.send(self.answer)
        except StopIteration as stop:
            self._done = stop.value

    def done(self) -> Remedied:
        assert self._done is not None, "the plan was not run to its end"
        return self._done

    def result(self) -> Remedied:
        assert self.remedied is not None, "the remedy was not recorded"
        return self.remedied


def _with_input(
    spec: Summarizer, args: tuple[Any, ...], kwargs: dict[str, Any], call: Callable[..., T]
) -> Callable[[list[str]], T] | None:
    """`call` as a function of a new input, every other argument as in the refused call (for
    `rederive`); None when an `extractor` hides where the input goes."""
    if spec.extractor is not None:
        return None

    def again(texts: list[str]) -> T:
        if len(args) > spec.position:
            return call(*args[: spec.position], texts, *args[spec.position + 1 :], **kwargs)
        return call(*args, **{**kwargs, str(spec.argument): texts})

    return again
