"""OpenTelemetry for every decision: one span and metric points, grant or refusal.

Only the OpenTelemetry API is used, so the hook joins whatever TracerProvider and MeterProvider
the host configured and costs next to nothing when there is none (the SDK appears only in
`policyhook.otel`, the optional setup helper). Telemetry never raises into a summarize call: a
failing provider, tracer or instrument is logged and the call goes on. Region text and summaries
are never recorded unless content capture is turned on (`capture_content=True` or
POLICYHOOK_CAPTURE_CONTENT=true).

Spans: `policyhook.guard` (one per decision, child of the caller's current span) and, for a
granted call, `policyhook.summarize` inside it (the summarizer's own work). Metric names are an
interface: dashboards and alert rules query their Prometheus forms (see docs/telemetry.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    Span,
    SpanKind,
    Status,
    StatusCode,
    TracerProvider,
)

from policyhook import _env
from policyhook._activation import Activation
from policyhook._errors import UnsafeRecompactionError
from policyhook._policy import Decision, Effect, Mode

__all__ = [
    "INVALID_SPAN",
    "MeterProvider",
    "Span",
    "Telemetry",
    "TracerProvider",
    "capture_content_from_env",
]

_logger = logging.getLogger("policyhook.telemetry")  # documented name; the module is private

try:
    VERSION = version("policyhook")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    VERSION = "0.0.0"

SCOPE = "policyhook"
SPAN_NAME = "policyhook.guard"
SUMMARIZE_SPAN_NAME = "policyhook.summarize"
CAPTURE_CONTENT_ENV = "POLICYHOOK_CAPTURE_CONTENT"

# Metric names are an interface: dashboards and alert rules query their Prometheus forms.
DECISIONS = "policyhook.decisions"  # policyhook_decisions_total
DECISION_DURATION = "policyhook.decision.duration"  # policyhook_decision_duration_seconds
REGION_DEPTH = "policyhook.region.depth"  # policyhook_region_depth
EVALUATION_ERRORS = "policyhook.evaluation.errors"  # policyhook_evaluation_errors_total
POLICY_RELOADS = "policyhook.policy.reloads"  # policyhook_policy_reloads_total
CALLS = "policyhook.calls"  # policyhook_calls_total
STORE_ERRORS = "policyhook.store.errors"  # policyhook_store_errors_total
REMEDIES = "policyhook.remedies"  # policyhook_remedies_total
REMEDY_SPAN_NAME = "policyhook.remedy"

_DURATION_BUCKETS = (
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
_DEPTH_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20)

#: The attributes of each instrument's points on every call, in the order `_counted` and
#: `ended` give their values (docs/telemetry.md lists them).
_KEYS: Mapping[str, tuple[str, ...]] = {
    DECISIONS: (
        "decision", "policy", "rule", "mode", "trigger", "summarizer", "region_kind",
        "dead_sources",
    ),
    DECISION_DURATION: ("decision", "mode", "summarizer"),
    REGION_DEPTH: ("decision", "summarizer"),
    EVALUATION_ERRORS: ("policy", "rule", "outcome"),
    CALLS: ("outcome", "summarizer"),
}  # fmt: skip
_MAX_ATTRIBUTE_SETS = 4096


def capture_content_from_env() -> bool:
    """Whether POLICYHOOK_CAPTURE_CONTENT asks for region text and summaries on spans."""
    return _env.flag(CAPTURE_CONTENT_ENV)


#: The summarizer's exception last recorded on a `policyhook.summarize` span in this context, so
#: the enclosing guard span marks it as failed without recording the same exception twice.
_summarizer_error: ContextVar[int] = ContextVar("policyhook_summarizer_error", default=0)


def _untraced() -> Span:
    """What the API's no-op tracer would give (the caller's context, not recording), cheaper:
    the caller's own span when it does not record (nothing can be written on it), else a
    non-recording span of its context (the guard never writes on the caller's span)."""
    current = trace.get_current_span()
    return current if not current.is_recording() else NonRecordingSpan(current.get_span_context())


#: `summarizing` while nothing records (`nullcontext` keeps no state: shared by every call).
_NOT_SUMMARIZING: AbstractContextManager[Span] = nullcontext(INVALID_SPAN)

#: What `_unset` reads when the API keeps its global providers where it has since 1.0.
_UNKNOWN: Any = object()


def _unset(api: Any, attribute: str, provider: Any) -> bool:
    """Whether the host has set no global provider yet (nothing could record), asked every call
    while it has not, so one set later is joined at once (it can be set only once).

    The API's own global is read (`opentelemetry.trace._TRACER_PROVIDER`, one attribute
    lookup); `get_tracer_provider()` would also read the environment on every call while none
    is set, ~1 µs, for a provider named there, which it loads on its first call (made when the
    guard got its tracer and meter). An API that keeps the global elsewhere is asked the public
    way, `provider()`: then the result is the proxy while unset.
    """
    current = getattr(api, attribute, _UNKNOWN)
    if current is _UNKNOWN:
        return type(provider()).__name__.startswith(("Proxy", "_Proxy"))
    return current is None


def _failed(what: str) -> None:
    _logger.warning("policyhook: failed to %s; the call goes on without it", what, exc_info=True)


class Telemetry:
    """The instruments of one guard. Cheap to make; the providers are looked up once, here."""

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool | None = None,
    ) -> None:
        self.capture_content = (
            capture_content_from_env() if capture_content is None else capture_content
        )
        # A provider given, or a global one once set (for good): every call records from then on.
        self._tracing_on = tracer_provider is not None
        self._metering_on = meter_provider is not None
        #: Metric attributes by their values, made once per distinct set (they are few: the
        #: attributes are low-cardinality by design); cleared past `_MAX_ATTRIBUTE_SETS`.
        self._attributes: dict[tuple[Any, ...], dict[str, Any]] = {}
        try:
            self.tracer = trace.get_tracer(SCOPE, VERSION, tracer_provider=tracer_provider)
        except Exception:
            _failed("get a tracer (spans are off for this guard)")
            self.tracer = trace.NoOpTracer()
        try:
            self._instruments(metrics.get_meter(SCOPE, VERSION, meter_provider=meter_provider))
        except Exception:
            _failed("create the metric instruments (metrics are off for this guard)")
            self._instruments(metrics.NoOpMeter(SCOPE, VERSION))

    def _instruments(self, meter: metrics.Meter) -> None:
        self.decisions = meter.create_counter(
            DECISIONS, unit="{decision}", description="Decisions made by the guard, by outcome."
        )
        self.duration = meter.create_histogram(
            DECISION_DURATION,
            unit="s",
            description="Time to decide one call: provenance, liveness lookup and policy.",
            explicit_bucket_boundaries_advisory=list(_DURATION_BUCKETS),
        )
        self.depth = meter.create_histogram(
            REGION_DEPTH,
            unit="{pass}",
            description="Summarization depth of the regions the guard decided on.",
            explicit_bucket_boundaries_advisory=list(_DEPTH_BUCKETS),
        )
        self.errors = meter.create_counter(
            EVALUATION_ERRORS,
            unit="{error}",
            description="Policy expressions that failed to evaluate, by what failurePolicy did.",
        )
        self.reloads = meter.create_counter(
            POLICY_RELOADS, unit="{reload}", description="Policy reload attempts, by outcome."
        )
        self.calls = meter.create_counter(
            CALLS,
            unit="{call}",
            description="Guarded calls by how they ended: summarized, store_error, failed, "
            "cancelled, refused, unrecorded, checked.",
        )
        self.store_errors = meter.create_counter(
            STORE_ERRORS,
            unit="{error}",
            description="Store operations that failed during a call, by operation.",
        )
        self.remedies = meter.create_counter(
            REMEDIES,
            unit="{remedy}",
            description="Remedies run after refusals, by remedy, requested remedy and outcome.",
        )

    # -- spans ----------------------------------------------------------------------------------

    def guarded(self, summarizer: str) -> AbstractContextManager[Span]:
        """The span of one guarded call, child of the caller's current span.

        A refusal is marked by `refused`. Any other exception leaving the call (the summarizer's,
        or the guard's own) sets status ERROR and `error.type`; the summarizer's exception event
        is on `policyhook.summarize`, so it is recorded here only when it came from elsewhere.
        """
        return self._guarded() if self._tracing() else nullcontext(_untraced())

    @contextmanager
    def _guarded(self) -> Iterator[Span]:
        manager = self._start(
            SPAN_NAME,
            kind=SpanKind.INTERNAL,
            record_exception=False,
            set_status_on_exception=False,
        )
        with manager as span:
            try:
                yield span
            except UnsafeRecompactionError:
                raise
            except Exception as error:
                recorded = _summarizer_error.get() == id(error)
                _summarizer_error.set(0)
                self._error(span, error, record=not recorded)
                raise
            except BaseException as error:
                self._cancelled(span, error)
                raise

    def summarizing(self, summarizer: str) -> AbstractContextManager[Span]:
        """The summarizer's own work, as a child span; its exception is recorded and re-raised.

        Untraced, the span is INVALID_SPAN: nothing reads it (the guard span carries the
        caller's context for the decision log)."""
        return self._summarizing(summarizer) if self._tracing() else _NOT_SUMMARIZING

    @contextmanager
    def _summarizing(self, summarizer: str) -> Iterator[Span]:
        manager = self._start(
            SUMMARIZE_SPAN_NAME,
            kind=SpanKind.INTERNAL,
            attributes={"policyhook.summarizer": summarizer},
            record_exception=False,
            set_status_on_exception=False,
        )
        with manager as span:
            try:
                yield span
            except Exception as error:
                _summarizer_error.set(id(error))
                self._error(span, error, record=True)
                raise
            except BaseException as error:
                self._cancelled(span, error)
                raise

    def _tracing(self) -> bool:
        """False while nobody could record a span: no provider given and no global one set."""
        if not self._tracing_on and not _unset(
            trace, "_TRACER_PROVIDER", trace.get_tracer_provider
        ):
            self._tracing_on = True
        return self._tracing_on

    def _metering(self) -> bool:
        """False while no metric point could be recorded: no provider given, no global one set.

        The instruments are then the API's proxies, which a provider set later connects (they
        record from the next call on); until then, no point is built for them.
        """
        if not self._metering_on and not _unset(
            metrics._internal, "_METER_PROVIDER", metrics.get_meter_provider
        ):
            self._metering_on = True
        return self._metering_on

    def _attributes_of(self, *values: Any) -> dict[str, Any]:
        """The metric attributes for `values` (the instrument's name first, then its
        attributes' values in the order of `_KEYS`), made once per distinct set. Never
        mutated: instruments only read them."""
        attributes = self._attributes.get(values)
        if attributes is None:
            if len(self._attributes) >= _MAX_ATTRIBUTE_SETS:
                self._attributes = {}
            attributes = dict(zip(_KEYS[values[0]], values[1:], strict=True))
            self._attributes[values] = attributes
        return attributes

    @contextmanager
    def _start(self, name: str, **options: Any) -> Iterator[Span]:
        """`tracer.start_as_current_span`; a failing tracer costs the span, never the call.

        The body's exception always propagates unchanged; errors of the tracer itself (starting
        or ending the span) are logged.
        """
        try:
            manager: AbstractContextManager[Span] = self.tracer.start_as_current_span(
                name, **options
            )
            span = manager.__enter__()
        except Exception:
            _failed(f"start span {name}")
            yield INVALID_SPAN
            return
        try:
            yield span
        except BaseException as error:
            try:
                manager.__exit__(type(error), error, error.__traceback__)
            except BaseException as other:
                if other is not error:
                    _failed(f"end span {name}")
            raise
        try:
            manager.__exit__(None, None, None)
        except Exception:
            _failed(f"end span {name}")

    def _error(self, span: Span, error: BaseException, *, record: bool) -> None:
        """Status ERROR and `error.type`, as OpenTelemetry's own instrumentations do."""
        try:
            if not span.is_recording():
                return
            kind = type(error).__qualname__
            span.set_status(Status(StatusCode.ERROR, f"{kind}: {error}"))
            span.set_attribute("error.type", kind)
            if record:
                span.record_exception(error)
        except Exception:
            _failed("record an exception on a span")

    def _cancelled(self, span: Span, error: BaseException) -> None:
        """A call cut short (task cancelled, timed out, interrupted): the summary never came.

        Status ERROR (the work did not complete), `error.type`, `policyhook.outcome=cancelled`
        and a `policyhook.cancelled` event, so a trace never shows a cancelled call as a success.
        """
        try:
            if not span.is_recording():
                return
            kind = type(error).__qualname__
            span.set_status(Status(StatusCode.ERROR, f"cancelled: {kind}"))
            span.set_attributes({"error.type": kind, "policyhook.outcome": "cancelled"})
            span.add_event("policyhook.cancelled", {"exception.type": kind})
        except Exception:
            _failed("record a cancellation on a span")

    # -- one decision ---------------------------------------------------------------------------

    def decided(
        self,
        span: Span,
        decision: Decision,
        activation: Mapping[str, Any],
        seconds: float,
        content: str | None = None,
    ) -> None:
        """Record one decision on the span and the metrics. Never raises."""
        try:
            self._traced(span, decision, activation, content)
        except Exception:
            _failed("record the decision on its span")
        try:
            self._counted(decision, activation, seconds)
        except Exception:
            _failed("record the decision's metrics")

    def _traced(
        self,
        span: Span,
        decision: Decision,
        activation: Mapping[str, Any],
        content: str | None,
    ) -> None:
        if not span.is_recording():
            return
        request = activation["request"]
        kind, depth, sources, live, dead = _region(activation)
        span.set_attributes(
            {
                "policyhook.decision": decision.effect,
                "policyhook.decision_id": decision.decision_id,
                "policyhook.mode": decision.mode,
                "policyhook.policy": decision.policy,
                "policyhook.rule": decision.rule,
                "policyhook.trigger": request["trigger"],
                "policyhook.summarizer": activation["summarizer"]["name"],
                "policyhook.region.kind": kind,
                "policyhook.region.depth": depth,
                "policyhook.region.sources": sources,
                "policyhook.region.live_sources": live,
                "policyhook.region.dead_sources": dead,
                "policyhook.policy.revision": decision.revision,
                "policyhook.window.id": activation["window"]["id"],
            }
        )
        if decision.message:
            span.set_attribute("policyhook.message", decision.message)
        if self.capture_content and content is not None:
            span.set_attribute("policyhook.region.text", content)

    def _counted(self, decision: Decision, activation: Mapping[str, Any], seconds: float) -> None:
        if not self._metering():
            return
        kind, depth, _, _, dead = _region(activation)
        summarizer = activation["summarizer"]["name"]
        effect, mode = str(decision.effect), str(decision.mode)
        self.decisions.add(
            1,
            self._attributes_of(
                DECISIONS,
                effect,
                decision.policy,
                decision.rule,
                mode,
                activation["request"]["trigger"],
                summarizer,
                kind,
                "true" if dead else "false",
            ),
        )
        self.duration.record(
            seconds, self._attributes_of(DECISION_DURATION, effect, mode, summarizer)
        )
        self.depth.record(depth, self._attributes_of(REGION_DEPTH, effect, summarizer))
        for error in decision.errors:
            # What failurePolicy did to the call: refused it, would have (audit/warn), let it pass.
            outcome = Effect.ALLOW
            if error in decision.violations:
                outcome = Effect.DENY if error.mode == Mode.ENFORCE else Effect.WOULD_DENY
            attributes = self._attributes_of(
                EVALUATION_ERRORS, error.policy, error.rule, str(outcome)
            )
            self.errors.add(1, attributes)

    def refused(self, span: Span, error: UnsafeRecompactionError) -> None:
        """Mark the span of a refused call: status ERROR, `error.type`, exception event."""
        try:
            if not span.is_recording():
                return
            span.set_status(Status(StatusCode.ERROR, str(error)))
            span.set_attribute("error.type", type(error).__name__)
            span.record_exception(error)
        except Exception:
            _failed("record a refusal on its span")

    def summarized(self, span: Span, output: str | None) -> None:
        """Attach the summarizer's output to the span, only when content capture is on."""
        if not self.capture_content or output is None:
            return
        try:
            if span.is_recording():
                span.set_attribute("policyhook.summary.text", output)
        except Exception:
            _failed("record the summary on its span")

    def ended(self, span: Span, outcome: str, summarizer: str) -> None:
        """Count how one call ended and put the outcome on its span. Never raises."""
        try:
            if span.is_recording():
                span.set_attribute("policyhook.outcome", outcome)
        except Exception:
            _failed("record a call's outcome on its span")
        try:
            if self._metering():
                self.calls.add(1, self._attributes_of(CALLS, outcome, summarizer))
        except Exception:
            _failed("count a call's outcome")

    def undecided(self, summarizer: str, error: BaseException) -> None:
        """A call the guard could not decide, so refused before any decision (an adapter that
        cannot read its input): a guard span with status ERROR, `error.type` and
        `policyhook.outcome=undecided`, counted in `policyhook.calls`. Only the exception's type
        is recorded, never its message (it may quote the input). Never raises."""
        kind = type(error).__qualname__
        with self.guarded(summarizer) as span:
            try:
                if span.is_recording():
                    span.set_status(Status(StatusCode.ERROR, f"undecided: {kind}"))
                    span.set_attribute("error.type", kind)
            except Exception:
                _failed("record an undecided call on its span")
            self.ended(span, "undecided", summarizer)

    def store_failed(self, span: Span, operation: str, error: Exception) -> None:
        """A store operation failed during a call: counted and marked on the span. Never raises.

        Only the operation and the exception's type are recorded, never its message or any text.
        """
        try:
            self.store_errors.add(1, {"operation": operation})
        except Exception:
            _failed("count a store error")
        try:
            if span.is_recording():
                span.set_attribute("policyhook.store.error", operation)
                span.add_event(
                    "policyhook.store.error",
                    {
                        "policyhook.store.operation": operation,
                        "exception.type": type(error).__qualname__,
                    },
                )
        except Exception:
            _failed("record a store error on its span")

    def reloaded(self, outcome: str, revision: str) -> None:
        """Count one policy reload attempt. Never raises."""
        try:
            self.reloads.add(1, {"outcome": outcome, "revision": revision})
        except Exception:
            _failed("count a policy reload")

    # -- remedies -------------------------------------------------------------------------------

    @contextmanager
    def remedying(self, decision: Decision, summarizer: str) -> Iterator[Span]:
        """The span of one remedy run after a refusal, child of the caller's current span."""
        if not self._tracing():
            yield _untraced()
            return
        attributes = {
            "policyhook.summarizer": summarizer,
            "policyhook.decision_id": decision.decision_id,
            "policyhook.remedy.requested": decision.remedy,
        }
        with self._start(
            REMEDY_SPAN_NAME,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    def remedied(
        self,
        span: Span,
        summarizer: str,
        requested: str,
        remedy: str,
        outcome: str,
        details: Mapping[str, Any],
        error: BaseException | None = None,
    ) -> None:
        """Count one remedy and describe it on its span (ids and counts, never text).

        `outcome` is `applied` (the requested remedy ran), `fallback` (another one ran instead)
        or `failed` (none could: the refusal stands). Never raises.
        """
        try:
            self.remedies.add(
                1,
                {
                    "remedy": remedy,
                    "requested": requested,
                    "outcome": outcome,
                    "summarizer": summarizer,
                },
            )
        except Exception:
            _failed("count a remedy")
        try:
            if span.is_recording():
                span.set_attributes(
                    {
                        "policyhook.remedy": remedy,
                        "policyhook.remedy.outcome": outcome,
                        **{f"policyhook.remedy.{k}": v for k, v in details.items()},
                    }
                )
                if error is not None:
                    self._error(span, error, record=True)
        except Exception:
            _failed("record a remedy on its span")


def _region(activation: Mapping[str, Any]) -> tuple[Any, Any, int, int, int]:
    """The region's kind, depth and source, live and dead counts: read off an `Activation`
    without making its k-long lists (a rolling chain's span costs the same at any k)."""
    if type(activation) is Activation:
        return (
            activation.region_kind,
            activation.region_depth,
            activation.region_sources_size,
            activation.region_live_sources_size,
            activation.region_dead_sources_size,
        )
    region = activation["region"]
    return (
        region["kind"],
        region["depth"],
        len(region["sources"]),
        len(region["live_sources"]),
        len(region["dead_sources"]),
    )
