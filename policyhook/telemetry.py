"""OpenTelemetry for every decision: one span and metric points, grant or refusal.

Only the OpenTelemetry API is used, so the hook joins whatever TracerProvider and MeterProvider
the host configured and costs next to nothing when there is none. Telemetry never raises into a
summarize call: a failure here is logged and the call goes on. Region text is never recorded
unless content capture is turned on (`capture_content=True` or POLICYHOOK_CAPTURE_CONTENT=true).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from policyhook.policy import Decision

_logger = logging.getLogger(__name__)

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
_TRUE = ("1", "true", "yes", "on")


def capture_content_from_env() -> bool:
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in _TRUE


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
        self.tracer = trace.get_tracer(SCOPE, VERSION, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, VERSION, meter_provider=meter_provider)
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

    @contextmanager
    def guarded(self, summarizer: str) -> Iterator[Span]:
        """The span of one guarded call, child of the caller's current span."""
        with self.tracer.start_as_current_span(
            SPAN_NAME,
            kind=SpanKind.INTERNAL,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    @contextmanager
    def summarizing(self, summarizer: str) -> Iterator[Span]:
        """The summarizer's own work, as a child span; its exception is recorded and re-raised."""
        with self.tracer.start_as_current_span(
            SUMMARIZE_SPAN_NAME, attributes={"policyhook.summarizer": summarizer}
        ) as span:
            yield span

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
            self._decided(span, decision, activation, seconds, content)
        except Exception:
            _logger.warning("policyhook: failed to record telemetry", exc_info=True)

    def _decided(
        self,
        span: Span,
        decision: Decision,
        activation: Mapping[str, Any],
        seconds: float,
        content: str | None,
    ) -> None:
        region, request, summarizer = (
            activation["region"],
            activation["request"],
            activation["summarizer"],
        )
        if span.is_recording():
            span.set_attributes(
                {
                    "policyhook.decision": decision.effect,
                    "policyhook.decision_id": decision.decision_id,
                    "policyhook.mode": decision.mode,
                    "policyhook.policy": decision.policy,
                    "policyhook.rule": decision.rule,
                    "policyhook.trigger": request["trigger"],
                    "policyhook.summarizer": summarizer["name"],
                    "policyhook.region.kind": region["kind"],
                    "policyhook.region.depth": region["depth"],
                    "policyhook.region.sources": len(region["sources"]),
                    "policyhook.region.live_sources": len(region["live_sources"]),
                    "policyhook.region.dead_sources": len(region["dead_sources"]),
                    "policyhook.policy.revision": decision.revision,
                    "policyhook.window.id": activation["window"]["id"],
                }
            )
            if decision.message:
                span.set_attribute("policyhook.message", decision.message)
            if self.capture_content and content is not None:
                span.set_attribute("policyhook.region.text", content)
        attributes = {
            "decision": decision.effect,
            "policy": decision.policy,
            "rule": decision.rule,
            "mode": decision.mode,
            "trigger": request["trigger"],
            "summarizer": summarizer["name"],
            "region_kind": region["kind"],
            "dead_sources": "true" if region["dead_sources"] else "false",
        }
        self.decisions.add(1, attributes)
        self.duration.record(
            seconds,
            {"decision": decision.effect, "mode": decision.mode, "summarizer": summarizer["name"]},
        )
        self.depth.record(
            region["depth"], {"decision": decision.effect, "summarizer": summarizer["name"]}
        )
        for error in decision.errors:
            outcome = "deny" if error in decision.violations else "allow"
            self.errors.add(1, {"policy": error.policy, "rule": error.rule, "outcome": outcome})

    def refused(self, span: Span, error: BaseException) -> None:
        """Mark the span of a refused call. Never raises."""
        try:
            span.set_status(Status(StatusCode.ERROR, str(error)))
            span.set_attribute("error.type", type(error).__name__)
            span.record_exception(error)
        except Exception:
            _logger.warning("policyhook: failed to record telemetry", exc_info=True)

    def summarized(self, span: Span, output: str | None) -> None:
        """Attach the summarizer's output to the span, only when content capture is on."""
        if self.capture_content and output is not None and span.is_recording():
            try:
                span.set_attribute("policyhook.summary.text", output)
            except Exception:
                _logger.warning("policyhook: failed to record telemetry", exc_info=True)

    def reloaded(self, outcome: str, revision: str) -> None:
        """Count one policy reload attempt. Never raises."""
        try:
            self.reloads.add(1, {"outcome": outcome, "revision": revision})
        except Exception:
            _logger.warning("policyhook: failed to record telemetry", exc_info=True)
