"""The guard: decides every summarize call before it runs, and remembers what granted calls made.

One call, top to bottom (`Guard._guarding`):
  input ─▶ ledger.resolve: which known sources / earlier summaries is it made of?
        ─▶ store.live: which of its sources can still be given back? (one lookup)
        ─▶ activation (plain data, no text) ─▶ policies.decide ─▶ Decision
        ─▶ telemetry + decision log, for every grant and refusal
        ─▶ deny (enforce): raise UnsafeRecompactionError; nothing runs, nothing is recorded
        ─▶ otherwise: run the summarizer; its output is recorded as a summary one pass deeper
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar, cast, overload

from opentelemetry import metrics, trace

from policyhook import _shapes
from policyhook import activation as schema
from policyhook.cel import Backend
from policyhook.decisionlog import DecisionLog
from policyhook.errors import UnsafeRecompactionError
from policyhook.loader import load_default
from policyhook.policy import Decision, PolicySet
from policyhook.provenance import Ledger, Region, Resolution, Source
from policyhook.reload import PolicyWatcher
from policyhook.stores import MemoryStore, Store
from policyhook.telemetry import Telemetry

_logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
#: The largest CEL int: request fields and token counts beyond it are refused at the call.
INT64_MAX = 2**63 - 1
#: Called with every decision and its activation (see `policyhook.testing.capture_decisions`).
DecisionListener = Callable[[Decision, Mapping[str, Any]], None]


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
        if self.trigger is not None and self.trigger not in schema.TRIGGERS:
            raise ValueError(f'"trigger" must be automatic or manual: {self.trigger!r}')
        pressure = self.budget_pressure
        if (
            isinstance(pressure, bool)
            or not isinstance(pressure, int | float)
            or not 0.0 <= pressure <= 1.0  # also refuses NaN
        ):
            raise ValueError(f'"budget_pressure" must be a number within 0..1: {pressure!r}')
        for name, low in (("attempt", 1), ("window_tokens", 0), ("window_budget", 0)):
            value = getattr(self, name)
            if not _int_within(value, low):
                raise ValueError(f'"{name}" must be an int within {low}..2**63-1: {value!r}')
        if not isinstance(self.window, str) or not self.window:
            raise ValueError(f'"window" must be a non-empty str: {self.window!r}')


_current_request: ContextVar[Request | None] = ContextVar("policyhook_request", default=None)


@contextmanager
def request(**fields: Any) -> Iterator[Request]:
    """Describe the compaction for guarded calls made in this context (threads and tasks alike).

    >>> with policyhook.request(trigger="manual", budget_pressure=0.9, window="session-7"):
    ...     summarize(messages)
    """
    outer = _current_request.get()
    current = replace(outer, **fields) if outer is not None else Request(**fields)
    token = _current_request.set(current)
    try:
        yield current
    finally:
        _current_request.reset(token)


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


@dataclass
class _Call:
    """One guarded call in flight."""

    guard: Guard
    spec: Summarizer
    window: str
    resolution: Resolution
    decision: Decision
    span: Any

    @contextmanager
    def summarizing(self) -> Iterator[None]:
        with self.guard.telemetry.summarizing(self.spec.name):
            yield

    def remember(self, output: Any) -> Any:
        """Record a granted call's output as a summary of its input; returns it unchanged."""
        texts = _texts(output)
        if not texts:
            _logger.warning(
                "policyhook: cannot read text from %s returned by %r; it will not be recognised "
                "as a summary when it comes back",
                type(output).__name__,
                self.spec.name,
            )
        for text in texts:
            self.guard.ledger.record_summary(text, self.resolution.region, self.window)
        if self.guard.archive_originals:
            self.guard.ledger.archive(self.resolution.unregistered)
        if self.guard.telemetry.capture_content:
            self.guard.telemetry.summarized(self.span, "\n".join(texts))
        return output


def _texts(output: Any) -> list[str]:
    """A summarizer's output as the summaries to record; TypeError if its shape is unreadable
    (an output the guard cannot record would come back later as original evidence)."""
    if output is None:
        return []
    units = _shapes.read(output, keep=(Region,), where="output")
    texts = [u.text or "" if isinstance(u, Region) else u for u in units]
    return [t.strip() for t in texts if t.strip()]


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
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        count_tokens: Callable[[str], int] | None = None,
        max_texts_per_window: int = 1024,
    ) -> None:
        self.store: Store = store if store is not None else MemoryStore()
        self.ledger = Ledger(self.store, max_texts_per_window=max_texts_per_window)
        self.telemetry = Telemetry(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            capture_content=capture_content,
        )
        self.archive_originals = archive_originals
        self.count_tokens = count_tokens
        if isinstance(decision_log, str | Path):
            decision_log = DecisionLog(decision_log)
        self.decision_log = decision_log
        self._listeners: tuple[DecisionListener, ...] = ()
        self.watcher: PolicyWatcher | None = None
        if isinstance(policies, str | Path):
            self.watcher = PolicyWatcher(
                policies,
                interval=reload_interval,
                backend=backend,
                on_reload=self.telemetry.reloaded,
            ).start()
            self._policies = self.watcher.current
        else:
            self._policies = policies if policies is not None else load_default(backend=backend)

    @classmethod
    def from_path(cls, path: str | Path, **options: Any) -> Guard:
        """A guard whose policies are read from `path` and reloaded when the files change."""
        return cls(Path(path), **options)

    @property
    def policies(self) -> PolicySet:
        """The policy set in force now (the watcher's latest good revision, if following files)."""
        return self.watcher.current if self.watcher is not None else self._policies

    def close(self) -> None:
        """Stop following policy files and close the decision log."""
        if self.watcher is not None:
            self.watcher.stop()
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
        return self.ledger.record_source(text, kind, source_id, window=_request().window)

    # -- decorating -----------------------------------------------------------------------------

    @overload
    def __call__(
        self,
        fn: F,
        *,
        summarizer: str | None = None,
        lossless: bool = False,
        idempotent: bool = False,
        trigger: str = "automatic",
        extractor: Callable[..., Any] | None = None,
    ) -> F: ...

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
    ) -> Callable[[F], F]: ...

    def __call__(
        self,
        fn: F | None = None,
        *,
        summarizer: str | None = None,
        lossless: bool = False,
        idempotent: bool = False,
        trigger: str = "automatic",
        extractor: Callable[..., Any] | None = None,
    ) -> F | Callable[[F], F]:
        """Guard a summarize function (sync or async, plain or method).

        `summarizer` names it in policies and telemetry (default: the function's qualified name);
        `lossless` / `idempotent` declare properties policies may exempt; `trigger` is the default
        when no `policyhook.request(...)` says otherwise; `extractor(*args, **kwargs)` returns the
        input for signatures whose first argument is not it.
        """
        if trigger not in schema.TRIGGERS:
            raise ValueError(f'"trigger" must be automatic or manual: {trigger!r}')

        def decorate(fn: F) -> F:
            spec = _spec(fn, summarizer, lossless, idempotent, trigger, extractor)
            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                    with self._guarding(spec, spec.input(args, kwargs)) as call:
                        with call.summarizing():
                            output = await fn(*args, **kwargs)
                        return call.remember(output)

                return cast(F, guarded_async)

            @functools.wraps(fn)
            def guarded(*args: Any, **kwargs: Any) -> Any:
                with self._guarding(spec, spec.input(args, kwargs)) as call:
                    with call.summarizing():
                        output = fn(*args, **kwargs)
                    return call.remember(output)

            return cast(F, guarded)

        return decorate(fn) if fn is not None else decorate

    # -- deciding without a decorator (adapters, dry runs) --------------------------------------

    def check(
        self,
        value: Any,
        *,
        summarizer: str,
        lossless: bool = False,
        idempotent: bool = False,
        enforce: bool = False,
    ) -> Decision:
        """Decide a call on `value` without running anything; raises on deny only if `enforce`.

        The decision is traced, counted and logged like a guarded call's.
        """
        spec = Summarizer(summarizer, lossless, idempotent)
        try:
            with self._guarding(spec, value) as call:
                return call.decision
        except UnsafeRecompactionError as refusal:
            if enforce:
                raise
            return refusal.decision

    def record_summary(self, output: Any, of: Any, window: str | None = None) -> list[Region]:
        """Record `output` as a summary of `of`, for adapters that produce summaries themselves."""
        window = window or _request().window
        resolution = self.ledger.resolve(of, window)
        regions = [self.ledger.record_summary(t, resolution.region, window) for t in _texts(output)]
        if self.archive_originals:
            self.ledger.archive(resolution.unregistered)
        return regions

    # -- the data path of one call --------------------------------------------------------------

    @contextmanager
    def _guarding(self, spec: Summarizer, value: Any) -> Iterator[_Call]:
        req = _request()
        policies = self.policies  # one revision for the whole decision
        with self.telemetry.guarded(spec.name) as span:
            started = time.perf_counter()
            resolution = self.ledger.resolve(value, req.window)
            region = resolution.region
            live = self._live(region)
            activation = schema.build(
                region,
                live,
                trigger=req.trigger or spec.trigger,
                budget_pressure=req.budget_pressure,
                attempt=req.attempt,
                window_id=req.window,
                window_tokens=req.window_tokens,
                window_budget=req.window_budget,
                window_max_depth=self.ledger.max_depth(req.window),
                summarizer=spec.name,
                lossless=spec.lossless,
                idempotent=spec.idempotent,
                tokens=self._tokens(value),
            )
            decision = policies.decide(activation)
            content = _joined(value) if self.telemetry.capture_content else None
            self.telemetry.decided(
                span, decision, activation, time.perf_counter() - started, content
            )
            self._log(decision, activation, span)
            self._notify(decision, activation)
            if decision.effect == "deny":
                refusal = UnsafeRecompactionError(decision)
                self.telemetry.refused(span, refusal)
                raise refusal
            if decision.effect == "would_deny":
                level = logging.WARNING if decision.mode == "warn" else logging.INFO
                _logger.log(
                    level,
                    "policyhook (%s mode) would refuse: %s",
                    decision.mode,
                    UnsafeRecompactionError(decision),
                )
            yield _Call(self, spec, req.window, resolution, decision, span)

    def _notify(self, decision: Decision, activation: Mapping[str, Any]) -> None:
        for listener in self._listeners:
            try:
                listener(decision, activation)
            except Exception:
                _logger.warning("policyhook: decision listener %r failed", listener, exc_info=True)

    def _live(self, region: Region) -> frozenset[str]:
        """Sources the store holds now; an unreachable store holds none (fail closed)."""
        if not region.sources:
            return frozenset()
        try:
            return self.store.live(region.sources)
        except Exception:
            _logger.warning(
                "policyhook: store unreachable; treating all %d sources as dead",
                len(region.sources),
                exc_info=True,
            )
            return frozenset()

    def _tokens(self, value: Any) -> int | None:
        if self.count_tokens is None:
            return None
        return _token_count(self.count_tokens(_joined(value)))

    def _log(self, decision: Decision, activation: dict[str, Any], span: Any) -> None:
        if self.decision_log is None:
            return
        try:
            context = span.get_span_context()
            trace_id = f"{context.trace_id:032x}" if context.is_valid else ""
            span_id = f"{context.span_id:016x}" if context.is_valid else ""
            self.decision_log.write(decision, activation, trace_id, span_id)
        except Exception:
            _logger.warning("policyhook: failed to write the decision log", exc_info=True)


def _request() -> Request:
    current = _current_request.get()
    return current if current is not None else Request()


def _joined(value: Any) -> str:
    """The input's text as one string (for token counting and content capture)."""
    units = _shapes.read(value, keep=(Region,))
    return "\n".join(u.text or "" if isinstance(u, Region) else u for u in units)


def _int_within(value: Any, low: int) -> bool:
    """An int (not a bool) within low..INT64_MAX."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= INT64_MAX


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
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    position = 1 if params and params[0].name in ("self", "cls") else 0
    argument = params[position].name if len(params) > position else None
    if argument is None and extractor is None:
        raise TypeError(
            f"cannot guard {fn.__qualname__}: it takes no input argument; pass extractor="
        )
    return Summarizer(
        name=name or fn.__qualname__,
        lossless=lossless,
        idempotent=idempotent,
        trigger=trigger,
        extractor=extractor,
        argument=argument,
        position=position,
    )
