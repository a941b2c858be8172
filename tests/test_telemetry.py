"""Spans and metrics of every decision, checked exactly with the SDK's in-memory exporter/reader.

Also: the hook uses the API only, telemetry failures never break a call, no content leaks unless
capture is on, and `policyhook.otel.configure` exports over OTLP as the OTEL_* variables say
(against a small in-process OTLP/HTTP receiver).
"""

from __future__ import annotations

import ast
import asyncio
import gzip
import http.server
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags

import policyhook
from policyhook import decisionlog, otel
from policyhook._loader import compile_sources
from policyhook._policy import PolicySet
from policyhook._telemetry import (
    DECISION_DURATION,
    DECISIONS,
    EVALUATION_ERRORS,
    POLICY_RELOADS,
    REGION_DEPTH,
    SPAN_NAME,
    SUMMARIZE_SPAN_NAME,
)

EVIDENCE = "retry ceiling is 7, read from the deployment config at startup (cfg-42)"
SECRET = "sk-live-4f9a0c1e2b3d4c5e6f7a8b9c0d1e2f3a"

#: Documented attributes: the README's tables list exactly these.
SPAN_ATTRIBUTES = {
    "policyhook.decision",
    "policyhook.decision_id",
    "policyhook.mode",
    "policyhook.policy",
    "policyhook.rule",
    "policyhook.trigger",
    "policyhook.summarizer",
    "policyhook.region.kind",
    "policyhook.region.depth",
    "policyhook.region.sources",
    "policyhook.region.live_sources",
    "policyhook.region.dead_sources",
    "policyhook.policy.revision",
    "policyhook.window.id",
    "policyhook.outcome",
}
DECISION_METRIC_ATTRIBUTES = {
    "decision",
    "policy",
    "rule",
    "mode",
    "trigger",
    "summarizer",
    "region_kind",
    "dead_sources",
}


def policy_yaml(name: str, expression: str, *, mode: str = "enforce", failure: str = "deny") -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: policyhook.dev/v1
        kind: CompactionPolicy
        metadata:
          name: {name}
        spec:
          mode: {mode}
          failurePolicy: {failure}
          rules:
            - name: {name}-rule
              expression: '{expression}'
              message: {name} says no
        """
    )


@dataclass
class Otel:
    """SDK providers wired to in-memory exporter/reader, and guards that use them."""

    spans_out: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)
    reader: InMemoryMetricReader = field(default_factory=InMemoryMetricReader)

    def __post_init__(self) -> None:
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans_out))
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def guard(
        self, policies: PolicySet | str | Path | None = None, **options: Any
    ) -> policyhook.Guard:
        return policyhook.Guard(
            policies,
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            **options,
        )

    def spans(self, name: str = SPAN_NAME) -> list[ReadableSpan]:
        return [s for s in self.spans_out.get_finished_spans() if s.name == name]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        found += [(dict(p.attributes or {}), p) for p in m.data.data_points]
        return found

    def total(self, metric: str, **attributes: str) -> float:
        """Counter sum, or histogram count, over the points whose attributes include these."""
        return sum(
            float(p.value if hasattr(p, "value") else p.count)
            for a, p in self.points(metric)
            if attributes.items() <= a.items()
        )


@pytest.fixture
def telemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Otel]:
    monkeypatch.delenv("POLICYHOOK_CAPTURE_CONTENT", raising=False)
    monkeypatch.delenv("POLICYHOOK_FORCE_AUDIT", raising=False)
    o = Otel()
    yield o
    o.tracer_provider.shutdown()
    o.meter_provider.shutdown()


def summarizer(guard: policyhook.Guard, name: str = "conversation-summary") -> Any:
    @guard(summarizer=name)
    def summarize(text: str) -> str:
        return f"digest of: {text[:20]}; retries are capped."

    return summarize


def summary_with_dead_sources(guard: policyhook.Guard, summarize: Any) -> str:
    """A depth-1 summary whose only source has been evicted: re-summarizing it is refused."""
    guard.record_source(EVIDENCE, kind="config_read", source_id="cfg-42")
    first: str = summarize(EVIDENCE)
    guard.store.evict("cfg-42")
    return first


class TestScopeAndApi:
    def test_scope_is_policyhook_with_the_package_version(self, telemetry: Otel) -> None:
        """Spans and metrics come from instrumentation scope `policyhook` at the installed version."""
        summarizer(telemetry.guard())("some original turn of the conversation")
        (span,) = telemetry.spans()
        assert span.instrumentation_scope is not None
        assert span.instrumentation_scope.name == "policyhook"
        assert span.instrumentation_scope.version == version("policyhook")
        data = telemetry.reader.get_metrics_data()
        assert data is not None
        scopes = {
            s.scope.name: s.scope.version for r in data.resource_metrics for s in r.scope_metrics
        }
        assert scopes == {"policyhook": version("policyhook")}

    def test_only_the_setup_helper_imports_the_sdk(self) -> None:
        """In the package's source, opentelemetry.sdk / .exporter are imported by otel.py only."""
        package = Path(policyhook.__file__).parent
        importers = set()
        for path in package.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(
                    n.startswith(("opentelemetry.sdk", "opentelemetry.exporter")) for n in names
                ):
                    importers.add(path.relative_to(package).as_posix())
        assert importers == {"otel.py"}

    def test_package_never_loads_the_sdk_outside_the_setup_helper(self) -> None:
        """Importing policyhook and guarding calls, with no provider, loads no opentelemetry.sdk module."""
        code = textwrap.dedent(
            """
            import sys
            import policyhook, policyhook.testing, policyhook.decisionlog, policyhook.otel
            import policyhook.cli, policyhook._demo, policyhook._tester, policyhook._replay, policyhook._reload
            guard = policyhook.Guard()
            @guard(summarizer="s")
            def summarize(text):
                return "a summary of it"
            assert summarize("original text of a turn") == "a summary of it"
            loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk"))
            print(loaded)
            """
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        assert out.stdout.strip() == "[]", out.stdout + out.stderr

    def test_a_guard_without_providers_never_writes_on_the_callers_span(
        self, telemetry: Otel
    ) -> None:
        """No provider for the guard: the caller's recording span gets no policyhook attribute."""
        summarize = summarizer(policyhook.Guard())
        caller = telemetry.tracer_provider.get_tracer("agent-runtime")
        with caller.start_as_current_span("compact-window"):
            summarize("an original turn")
        (outer,) = telemetry.spans("compact-window")
        assert dict(outer.attributes or {}) == {} and outer.events == ()
        assert outer.status.status_code == StatusCode.UNSET

    def test_joins_the_global_providers_when_given_none(self, telemetry: Otel) -> None:
        """A guard built without providers uses the global ones the host set (via the API)."""
        code = textwrap.dedent(
            """
            from opentelemetry import trace
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )
            import policyhook
            out = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(out))
            guard = policyhook.Guard()           # made before the host sets its provider
            trace.set_tracer_provider(provider)
            @guard(summarizer="s")
            def summarize(text):
                return "a summary of it"
            summarize("original text of a turn")
            print(sorted(s.name for s in out.get_finished_spans()))
            """
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        assert out.stdout.strip() == str(sorted([SPAN_NAME, SUMMARIZE_SPAN_NAME])), out.stderr


class TestWithoutAProvider:
    """With the OTel API and no provider, a call builds no span and no metric point; one set
    later is joined from the next call on."""

    def test_no_metric_point_is_built_while_no_provider_is_set(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No global provider, none given: the instruments are never called, and a provider
        given to another guard does not change that."""
        # as in a process whose host set none (another test may have set them here)
        monkeypatch.setattr(metrics._internal, "_METER_PROVIDER", None)
        monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
        guard = policyhook.Guard()
        called: list[str] = []
        for name, method in (("decisions", "add"), ("duration", "record"), ("depth", "record"),
                             ("calls", "add")):  # fmt: skip
            instrument = getattr(guard._telemetry, name)
            monkeypatch.setattr(instrument, method, lambda *a, n=name, **k: called.append(n))
        summarizer(guard)("an original turn")
        Otel().guard()  # another guard's own provider is not the global one
        summarizer(guard)("another original turn")
        assert called == []

    def test_a_meter_provider_set_later_counts_from_the_next_call(self) -> None:
        """Guard made, one call with no provider, then the host sets one: the next call is
        counted, exactly once, with its attributes."""
        code = textwrap.dedent(
            """
            from opentelemetry import metrics
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
            import policyhook
            guard = policyhook.Guard()
            @guard(summarizer="s")
            def summarize(text):
                return "a summary of it"
            summarize("original text of a turn")      # no provider yet: nothing to count
            reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            summarize("another original text")
            counted = {}
            for rm in reader.get_metrics_data().resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        for p in m.data.data_points:
                            counted[m.name] = (
                                getattr(p, "value", None) or p.count, p.attributes["summarizer"])
            print(sorted(counted.items()))
            """
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        assert out.stdout.strip() == str(
            sorted(
                {
                    "policyhook.calls": (1, "s"),
                    DECISIONS: (1, "s"),
                    DECISION_DURATION: (1, "s"),
                    REGION_DEPTH: (1, "s"),
                }.items()
            )
        ), out.stderr

    @pytest.mark.parametrize("api", [trace, metrics._internal])
    def test_an_api_that_keeps_its_provider_elsewhere_is_asked(
        self, api: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without the API's global to read, `_unset` asks the public getter: unset while it
        gives the proxy, set once it gives anything else."""
        from policyhook import _telemetry

        name = "_TRACER_PROVIDER" if api is trace else "_METER_PROVIDER"
        proxy = trace.ProxyTracerProvider() if api is trace else metrics.get_meter_provider()
        real = Otel()
        monkeypatch.delattr(api, name)
        assert type(proxy).__name__.endswith(("ProxyTracerProvider", "ProxyMeterProvider"))
        assert _telemetry._unset(api, name, lambda: proxy) is True
        assert _telemetry._unset(api, name, lambda: real.meter_provider) is False


class TestMetricAttributes:
    def test_made_once_per_distinct_set_and_bounded(
        self, telemetry: Otel, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The same values give the same attribute dict; the cache forgets past its bound,
        and what is counted is unchanged."""
        from policyhook import _telemetry

        guard = telemetry.guard()
        summarize = summarizer(guard)
        made = guard._telemetry._attributes_of
        first = made(DECISIONS, "allow", "", "", "", "automatic", "s", "original", "false")
        assert made(DECISIONS, "allow", "", "", "", "automatic", "s", "original", "false") is first
        assert first == {
            "decision": "allow", "policy": "", "rule": "", "mode": "", "trigger": "automatic",
            "summarizer": "s", "region_kind": "original", "dead_sources": "false",
        }  # fmt: skip
        monkeypatch.setattr(_telemetry, "_MAX_ATTRIBUTE_SETS", 2)
        for i in range(5):
            summarize(f"original turn {i}")
            assert len(guard._telemetry._attributes) <= 2
        assert telemetry.total(DECISIONS, decision="allow") == 5
        assert telemetry.total("policyhook.calls", outcome="summarized") == 5


class TestSpans:
    def test_one_span_per_call_with_the_documented_attributes(self, telemetry: Otel) -> None:
        """A granted call makes one policyhook.guard span carrying every documented attribute."""
        guard = telemetry.guard()
        summarize = summarizer(guard)
        with policyhook.request(trigger="manual", window="session-7"):
            summarize("an original turn that the store has never seen")
        (span,) = telemetry.spans()
        attributes = dict(span.attributes or {})
        assert set(attributes) == SPAN_ATTRIBUTES
        assert attributes["policyhook.decision"] == "allow"
        assert attributes["policyhook.mode"] == ""
        assert attributes["policyhook.trigger"] == "manual"
        assert attributes["policyhook.summarizer"] == "conversation-summary"
        assert attributes["policyhook.region.kind"] == "original"
        assert attributes["policyhook.region.depth"] == 0
        assert attributes["policyhook.window.id"] == "session-7"
        assert attributes["policyhook.policy.revision"] == guard.policies.revision
        assert span.kind == trace.SpanKind.INTERNAL
        assert span.status.status_code == StatusCode.UNSET

    def test_refusal_marks_the_span_and_shares_the_decision_id(
        self, telemetry: Otel, tmp_path: Path
    ) -> None:
        """A refusal: status ERROR, error.type, exception event; one decision id in span, error, log."""
        guard = telemetry.guard(decision_log=tmp_path / "decisions.jsonl")
        summarize = summarizer(guard)
        stale = summary_with_dead_sources(guard, summarize)
        with pytest.raises(policyhook.UnsafeRecompactionError) as refused:
            summarize(stale)
        guard.close()
        span = telemetry.spans()[-1]
        attributes = dict(span.attributes or {})
        assert attributes["policyhook.decision"] == "deny"
        assert attributes["policyhook.mode"] == "enforce"
        assert attributes["policyhook.policy"] == "default"
        assert attributes["policyhook.rule"] == "live-sources"
        assert attributes["policyhook.region.kind"] == "summary"
        assert attributes["policyhook.region.depth"] == 1
        assert attributes["policyhook.region.sources"] == 1
        assert attributes["policyhook.region.live_sources"] == 0
        assert attributes["policyhook.region.dead_sources"] == 1
        assert attributes["error.type"] == "UnsafeRecompactionError"
        assert attributes["policyhook.message"] == refused.value.message
        assert span.status.status_code == StatusCode.ERROR
        (event,) = span.events
        assert event.name == "exception"
        assert str((event.attributes or {})["exception.type"]).endswith("UnsafeRecompactionError")
        assert not [s for s in telemetry.spans(SUMMARIZE_SPAN_NAME) if s.parent == span.context]
        records = [r for _, r in decisionlog.read(tmp_path / "decisions.jsonl")]
        assert records[-1]["decision_id"] == refused.value.decision_id
        assert attributes["policyhook.decision_id"] == refused.value.decision_id

    def test_caller_span_guard_span_summarize_span_nest(self, telemetry: Otel) -> None:
        """caller's span → policyhook.guard → policyhook.summarize, in one trace."""
        summarize = summarizer(telemetry.guard())
        caller = telemetry.tracer_provider.get_tracer("agent-runtime")
        with caller.start_as_current_span("compact-window") as outer:
            summarize("an original turn of the conversation")
        (guard_span,) = telemetry.spans()
        (work,) = telemetry.spans(SUMMARIZE_SPAN_NAME)
        assert guard_span.parent is not None and work.parent is not None
        assert guard_span.parent.span_id == outer.get_span_context().span_id
        assert work.parent.span_id == guard_span.context.span_id
        assert {guard_span.context.trace_id, work.context.trace_id} == {
            outer.get_span_context().trace_id
        }
        assert dict(work.attributes or {}) == {"policyhook.summarizer": "conversation-summary"}

    def test_async_summarizer_is_traced_the_same_way(self, telemetry: Otel) -> None:
        """An async summarizer gets the same guard → summarize nesting, covering the awaited work."""
        guard = telemetry.guard()

        @guard(summarizer="async-summary")
        async def summarize(text: str) -> str:
            await asyncio.sleep(0.01)
            return "an async summary of the turn"

        assert asyncio.run(summarize("an original turn")) == "an async summary of the turn"
        (guard_span,) = telemetry.spans()
        (work,) = telemetry.spans(SUMMARIZE_SPAN_NAME)
        assert work.parent is not None and work.parent.span_id == guard_span.context.span_id
        assert work.end_time is not None and work.start_time is not None
        assert work.end_time - work.start_time >= 10_000_000  # the await is inside the span

    def test_summarizer_error_is_recorded_on_its_span_and_reraised_unchanged(
        self, telemetry: Otel
    ) -> None:
        """The summarizer's exception: event on policyhook.summarize, same object re-raised."""
        guard = telemetry.guard()
        failure = ConnectionError("model endpoint unreachable")

        @guard(summarizer="flaky")
        def summarize(text: str) -> str:
            raise failure

        with pytest.raises(ConnectionError) as raised:
            summarize("an original turn")
        assert raised.value is failure
        (work,) = telemetry.spans(SUMMARIZE_SPAN_NAME)
        (guard_span,) = telemetry.spans()
        assert work.status.status_code == StatusCode.ERROR
        assert [e.name for e in work.events] == ["exception"]
        assert dict(work.attributes or {})["error.type"] == "ConnectionError"
        assert guard_span.status.status_code == StatusCode.ERROR
        assert dict(guard_span.attributes or {})["error.type"] == "ConnectionError"
        assert dict(guard_span.attributes or {})["policyhook.decision"] == "allow"
        assert guard_span.events == ()  # recorded once, where it happened

    def test_check_is_traced_like_a_call_without_running_anything(self, telemetry: Otel) -> None:
        """guard.check() makes one guard span and no summarize span."""
        guard = telemetry.guard()
        decision = guard.check("an original turn", summarizer="dry-run")
        (span,) = telemetry.spans()
        assert dict(span.attributes or {})["policyhook.decision_id"] == decision.decision_id
        assert telemetry.spans(SUMMARIZE_SPAN_NAME) == []


class TestMetrics:
    def test_counts_equal_calls_per_decision(self, telemetry: Otel) -> None:
        """policyhook.decisions, duration and depth count exactly the calls made, by decision."""
        guard = telemetry.guard()
        summarize = summarizer(guard)
        stale = summary_with_dead_sources(guard, summarize)  # 1 allow
        for i in range(4):
            summarize(f"original turn number {i} of the conversation")
        for _ in range(3):
            with pytest.raises(policyhook.UnsafeRecompactionError):
                summarize(stale)
        assert telemetry.total(DECISIONS, decision="allow") == 5
        assert telemetry.total(DECISIONS, decision="deny") == 3
        assert telemetry.total(DECISIONS) == 8
        assert telemetry.total(DECISION_DURATION, decision="deny", mode="enforce") == 3
        assert telemetry.total(DECISION_DURATION) == 8
        assert telemetry.total(REGION_DEPTH) == 8
        (deny_attributes, _) = next(
            (a, p) for a, p in telemetry.points(DECISIONS) if a["decision"] == "deny"
        )
        assert deny_attributes == {
            "decision": "deny",
            "policy": "default",
            "rule": "live-sources",
            "mode": "enforce",
            "trigger": "automatic",
            "summarizer": "conversation-summary",
            "region_kind": "summary",
            "dead_sources": "true",
        }
        depths = {a["decision"]: p.sum for a, p in telemetry.points(REGION_DEPTH)}
        assert depths == {"allow": 0, "deny": 3}

    def test_metric_attributes_are_the_documented_low_cardinality_ones(
        self, telemetry: Otel
    ) -> None:
        """No region id, decision id or window id in metric attributes: only the documented keys."""
        summarize = summarizer(telemetry.guard())
        for i in range(3):
            with policyhook.request(window=f"session-{i}"):
                summarize(f"original turn number {i}")
        assert {frozenset(a) for a, _ in telemetry.points(DECISIONS)} == {
            frozenset(DECISION_METRIC_ATTRIBUTES)
        }
        assert len(telemetry.points(DECISIONS)) == 1  # three windows, three regions: one series
        assert {frozenset(a) for a, _ in telemetry.points(DECISION_DURATION)} == {
            frozenset({"decision", "mode", "summarizer"})
        }
        assert {frozenset(a) for a, _ in telemetry.points(REGION_DEPTH)} == {
            frozenset({"decision", "summarizer"})
        }

    def test_evaluation_errors_are_counted_by_what_failure_policy_did(
        self, telemetry: Otel
    ) -> None:
        """Evaluation errors count by what failurePolicy did: allow, would_deny (audit), deny."""
        broken = "region.depth / (region.depth - region.depth) >= 0"  # division by zero
        policies = compile_sources(
            [
                ("open.yaml", policy_yaml("fail-open", broken, failure="allow")),
                ("closed.yaml", policy_yaml("fail-closed", broken, mode="audit")),
            ]
        )
        summarize = summarizer(telemetry.guard(policies))
        summarize("an original turn")
        summarize("another original turn")
        assert telemetry.total(EVALUATION_ERRORS, policy="fail-open", outcome="allow") == 2
        # audit mode: failurePolicy deny would have refused, but the calls went through
        assert telemetry.total(EVALUATION_ERRORS, policy="fail-closed", outcome="would_deny") == 2
        enforced = compile_sources([("closed.yaml", policy_yaml("enforced", broken))])
        with pytest.raises(policyhook.UnsafeRecompactionError):
            summarizer(telemetry.guard(enforced))("an original turn")
        assert telemetry.total(EVALUATION_ERRORS, policy="enforced", outcome="deny") == 1
        assert {frozenset(a) for a, _ in telemetry.points(EVALUATION_ERRORS)} == {
            frozenset({"policy", "rule", "outcome"})
        }
        assert telemetry.total(DECISIONS, decision="would_deny", rule="fail-closed-rule") == 2

    def test_policy_reloads_are_counted_by_outcome(self, telemetry: Otel, tmp_path: Path) -> None:
        """A good reload counts outcome=success, a broken file outcome=failure (old set kept)."""
        folder = tmp_path / "policies"
        folder.mkdir()
        (folder / "a.yaml").write_text(policy_yaml("first", "true"))
        guard = telemetry.guard(folder, reload_interval=0)
        try:
            first = guard.policies.revision
            (folder / "a.yaml").write_text(policy_yaml("second", "true"))
            assert guard.reload()
            second = guard.policies.revision
            (folder / "a.yaml").write_text("spec: [not, a, policy")
            assert not guard.reload()
            assert guard.policies.revision == second != first
        finally:
            guard.close()
        assert telemetry.total(POLICY_RELOADS, outcome="success", revision=second) == 1
        assert telemetry.total(POLICY_RELOADS, outcome="failure", revision=second) == 1
        assert telemetry.total(POLICY_RELOADS) == 2


class TestDecisionValues:
    @pytest.mark.parametrize("mode", ["audit", "warn"])
    def test_shadow_modes_let_the_call_through_as_would_deny(
        self, telemetry: Otel, mode: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """audit/warn: the summarizer runs; span and counter say would_deny with the mode."""
        policies = compile_sources([("p.yaml", policy_yaml("shadow", "false", mode=mode))])
        summarize = summarizer(telemetry.guard(policies))
        with caplog.at_level(logging.INFO, logger="policyhook"):
            assert summarize("an original turn").startswith("digest of")
        (span,) = telemetry.spans()
        attributes = dict(span.attributes or {})
        assert attributes["policyhook.decision"] == "would_deny"
        assert attributes["policyhook.mode"] == mode
        assert span.status.status_code == StatusCode.UNSET
        assert len(telemetry.spans(SUMMARIZE_SPAN_NAME)) == 1
        assert telemetry.total(DECISIONS, decision="would_deny", mode=mode) == 1
        assert telemetry.total(DECISIONS, decision="deny") == 0
        level = logging.WARNING if mode == "warn" else logging.INFO
        assert [r.levelno for r in caplog.records if "would refuse" in r.getMessage()] == [level]


WARN_ALWAYS = compile_sources([("w.yaml", policy_yaml("warn-always", "false", mode="warn"))])


class TestContent:
    def run_with_secret(self, telemetry: Otel, log: Path, **options: Any) -> list[str]:
        """Summarize input and output holding SECRET, allow and deny; returns decision-log lines."""
        guard = telemetry.guard(decision_log=log, **options)

        @guard(summarizer="leaky")
        def summarize(text: str) -> str:
            return f"summary keeping the key {SECRET} and the retry ceiling"

        guard.record_source(f"{EVIDENCE} api_key={SECRET}", kind="config_read", source_id="cfg")
        stale = summarize(f"{EVIDENCE} api_key={SECRET}")
        guard.store.evict("cfg")
        with pytest.raises(policyhook.UnsafeRecompactionError):
            summarize(stale)
        guard.close()
        return log.read_text().splitlines()

    def telemetry_strings(self, telemetry: Otel) -> list[str]:
        def pairs(attributes: Mapping[str, object] | None) -> list[str]:
            """key=value, bytes decoded: text is searched for as it was written."""
            return [
                f"{k}={v.decode('utf-8', 'replace') if isinstance(v, bytes) else v}"
                for k, v in (attributes or {}).items()
            ]

        strings = []
        for span in telemetry.spans_out.get_finished_spans():
            strings += [span.name, str(span.status.description)]
            strings += pairs(span.attributes)
            for event in span.events:
                strings += pairs(event.attributes)
            strings += pairs(span.resource.attributes)
        for metric in (DECISIONS, DECISION_DURATION, REGION_DEPTH):
            strings += [json.dumps(a) for a, _ in telemetry.points(metric)]
        return strings

    def test_no_content_anywhere_by_default(
        self, telemetry: Otel, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """By default the secret is in no span attribute/event, metric, decision-log line or log."""
        with caplog.at_level(logging.DEBUG):
            lines = self.run_with_secret(telemetry, tmp_path / "log.jsonl")
            warned = summarizer(telemetry.guard(WARN_ALWAYS))  # logs its would-be refusal
            warned(f"{EVIDENCE} api_key={SECRET}")
        strings = self.telemetry_strings(telemetry)
        assert len(telemetry.spans_out.get_finished_spans()) == 5  # the test saw real spans
        assert len(lines) == 2 and caplog.records
        assert not [s for s in strings if SECRET in s]
        assert not [line for line in lines if SECRET in line]
        assert not [r for r in caplog.records if SECRET in r.getMessage()]
        assert not [s for s in strings if "retry ceiling" in s]  # no text at all, not just keys

    def test_capture_content_puts_region_and_summary_text_on_spans(
        self, telemetry: Otel, tmp_path: Path
    ) -> None:
        """Guard(capture_content=True): input on every guard span, output on the granted one."""
        lines = self.run_with_secret(telemetry, tmp_path / "log.jsonl", capture_content=True)
        granted, refused = telemetry.spans()
        assert SECRET in str(dict(granted.attributes or {})["policyhook.region.text"])
        assert SECRET in str(dict(granted.attributes or {})["policyhook.summary.text"])
        assert SECRET in str(dict(refused.attributes or {})["policyhook.region.text"])
        assert not [line for line in lines if SECRET in line]  # the decision log never has text

    def test_capture_content_from_the_environment(
        self, telemetry: Otel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """POLICYHOOK_CAPTURE_CONTENT=true turns capture on; an explicit False wins over it."""
        monkeypatch.setenv("POLICYHOOK_CAPTURE_CONTENT", "true")
        self.run_with_secret(telemetry, tmp_path / "on.jsonl")
        captured = [s for s in self.telemetry_strings(telemetry) if SECRET in s]
        assert captured and all(s.startswith("policyhook.") and "text=" in s for s in captured)
        telemetry.spans_out.clear()
        self.run_with_secret(telemetry, tmp_path / "off.jsonl", capture_content=False)
        assert len(telemetry.spans_out.get_finished_spans()) == 3
        assert not [s for s in self.telemetry_strings(telemetry) if SECRET in s]


class TestConcurrency:
    def test_eight_threads_spans_equal_calls_equal_counter(
        self, telemetry: Otel, tmp_path: Path
    ) -> None:
        """8 threads: one span per call, counter sum == calls, all decision ids distinct."""
        guard = telemetry.guard(decision_log=tmp_path / "log.jsonl")
        summarize = summarizer(guard)
        stale = summary_with_dead_sources(guard, summarize)
        telemetry.spans_out.clear()
        base = telemetry.total(DECISIONS)
        per_thread, refusals = 25, []
        barrier = threading.Barrier(8)
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                barrier.wait()
                for i in range(per_thread):
                    if i % 5 == 0:
                        try:
                            summarize(stale)
                        except policyhook.UnsafeRecompactionError as refusal:
                            refusals.append(refusal.decision_id)
                    else:
                        summarize(f"thread {n} turn {i}: original content")
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        guard.close()
        assert errors == []
        calls = 8 * per_thread
        spans = telemetry.spans()
        assert len(spans) == calls
        assert telemetry.total(DECISIONS) - base == calls
        assert telemetry.total(DECISIONS, decision="deny") == len(refusals) == 8 * 5
        ids = [dict(s.attributes or {})["policyhook.decision_id"] for s in spans]
        assert len(set(ids)) == calls
        assert set(refusals) <= set(ids)
        assert len(telemetry.spans(SUMMARIZE_SPAN_NAME)) == calls - len(refusals)


# -- telemetry that fails ---------------------------------------------------------------------


class Broken(RuntimeError):
    """Raised by the broken providers below."""


class RaisingTracer(trace.Tracer):
    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        raise Broken("tracer is broken")

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise Broken("tracer is broken")


class ExplodingSpan(NonRecordingSpan):
    """A span that claims to record and raises on every write, and on end."""

    def is_recording(self) -> bool:
        return True

    def set_attributes(self, *args: Any, **kwargs: Any) -> None:
        raise Broken("span is broken")

    set_attribute = set_status = record_exception = end = set_attributes


class ExplodingSpanTracer(trace.Tracer):
    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return ExplodingSpan(SpanContext(1, 2, False, TraceFlags(1)))

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return trace.use_span(self.start_span(), end_on_exit=True)


class TracerProviderOf(trace.TracerProvider):
    def __init__(self, tracer: trace.Tracer | None) -> None:
        self.tracer = tracer

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        if self.tracer is None:
            raise Broken("provider is broken")
        return self.tracer


class RaisingInstrument:
    def add(self, *args: Any, **kwargs: Any) -> None:
        raise Broken("instrument is broken")

    record = add


class RaisingMeter(metrics.NoOpMeter):
    def create_counter(self, *args: Any, **kwargs: Any) -> Any:
        return RaisingInstrument()

    create_histogram = create_counter


class MeterProviderOf(metrics.MeterProvider):
    def __init__(self, meter: metrics.Meter | None) -> None:
        self.meter = meter

    def get_meter(self, *args: Any, **kwargs: Any) -> metrics.Meter:
        if self.meter is None:
            raise Broken("provider is broken")
        return self.meter


BROKEN: dict[str, dict[str, Any]] = {
    "tracer-raises": {"tracer_provider": TracerProviderOf(RaisingTracer())},
    "span-raises": {"tracer_provider": TracerProviderOf(ExplodingSpanTracer())},
    "tracer-provider-raises": {"tracer_provider": TracerProviderOf(None)},
    "instruments-raise": {"meter_provider": MeterProviderOf(RaisingMeter("x"))},
    "meter-provider-raises": {"meter_provider": MeterProviderOf(None)},
}


class TestTelemetryFailures:
    @pytest.mark.parametrize("broken", list(BROKEN))
    def test_calls_and_refusals_survive_broken_telemetry(
        self, broken: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
    ) -> None:
        """A raising provider/tracer/span/instrument: grants return, refusals still raise, it is logged."""
        with caplog.at_level(logging.WARNING, logger="policyhook"):
            guard = policyhook.Guard(decision_log=tmp_path / "log.jsonl", **BROKEN[broken])
            summarize = summarizer(guard)
            stale = summary_with_dead_sources(guard, summarize)
            assert summarize("an original turn").startswith("digest of")
            with pytest.raises(policyhook.UnsafeRecompactionError):
                summarize(stale)
        guard.close()
        warnings = [r for r in caplog.records if r.name == "policyhook.telemetry"]
        assert warnings and all(r.levelno == logging.WARNING for r in warnings)
        assert all("failed to" in r.getMessage() and r.exc_info for r in warnings)
        assert len(list(decisionlog.read(tmp_path / "log.jsonl"))) == 3

    def test_summarizer_error_is_unchanged_under_a_broken_span(self) -> None:
        """Even when recording fails, the summarizer's own exception reaches the caller as is."""
        guard = policyhook.Guard(tracer_provider=TracerProviderOf(ExplodingSpanTracer()))
        failure = TimeoutError("model timed out")

        @guard(summarizer="flaky")
        def summarize(text: str) -> str:
            raise failure

        with pytest.raises(TimeoutError) as raised:
            summarize("an original turn")
        assert raised.value is failure


# -- policyhook.otel.configure --------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class OtlpReceiver:
    """A minimal OTLP/HTTP receiver on 127.0.0.1 that keeps every request it gets."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.requests.append(Received(self.path, headers, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every span received."""
        found = []
        for r in self.requests:
            if r.path == "/v1/traces":
                request = ExportTraceServiceRequest.FromString(r.body)
                for rs in request.resource_spans:
                    resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                    found += [(resource, s) for ss in rs.scope_spans for s in ss.spans]
        return found

    def metric_names(self) -> set[str]:
        names = set()
        for r in self.requests:
            if r.path == "/v1/metrics":
                request = ExportMetricsServiceRequest.FromString(r.body)
                for rm in request.resource_metrics:
                    names |= {m.name for sm in rm.scope_metrics for m in sm.metrics}
        return names

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    return monkeypatch


class TestConfigure:
    def test_exports_spans_and_metrics_over_otlp_http_by_default(
        self, receiver: OtlpReceiver, clean_otel_env: pytest.MonkeyPatch
    ) -> None:
        """configure(): HTTP/protobuf to <endpoint>/v1/traces and /v1/metrics, with service.name."""
        setup = otel.configure("checkout-agent", endpoint=receiver.endpoint, set_global=False)
        assert setup.protocol == "http/protobuf"
        summarize = summarizer(
            policyhook.Guard(
                tracer_provider=setup.tracer_provider, meter_provider=setup.meter_provider
            )
        )
        summarize("an original turn")
        assert setup.shutdown()
        assert {r.path for r in receiver.requests} == {"/v1/traces", "/v1/metrics"}
        assert {r.headers["content-type"] for r in receiver.requests} == {"application/x-protobuf"}
        spans = receiver.spans()
        assert sorted(s.name for _, s in spans) == sorted([SPAN_NAME, SUMMARIZE_SPAN_NAME])
        assert {res["service.name"] for res, _ in spans} == {"checkout-agent"}
        assert {DECISIONS, DECISION_DURATION, REGION_DEPTH} <= receiver.metric_names()

    def test_standard_environment_variables_are_honoured(
        self, receiver: OtlpReceiver, clean_otel_env: pytest.MonkeyPatch
    ) -> None:
        """OTEL_EXPORTER_OTLP_ENDPOINT/HEADERS, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and
        OTEL_METRIC_EXPORT_INTERVAL configure the export; the service_name argument is a default."""
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        clean_otel_env.setenv(
            "OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=blue,authorization=Bearer t0k"
        )
        clean_otel_env.setenv("OTEL_SERVICE_NAME", "from-env")
        clean_otel_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,team=agents")
        clean_otel_env.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
        setup = otel.configure(
            "from-code",
            resource_attributes={"team": "default-team", "extra": "yes"},
            set_global=False,
        )
        try:
            summarize = summarizer(
                policyhook.Guard(
                    tracer_provider=setup.tracer_provider, meter_provider=setup.meter_provider
                )
            )
            summarize("an original turn")
            deadline = time.monotonic() + 5
            while "/v1/metrics" not in {r.path for r in receiver.requests}:
                assert time.monotonic() < deadline, "no periodic metric export within 5 s"
                time.sleep(0.05)
        finally:
            setup.shutdown()
        assert {r.headers.get("x-tenant") for r in receiver.requests} == {"blue"}
        assert {r.headers.get("authorization") for r in receiver.requests} == {"Bearer t0k"}
        (resource, _), *_ = receiver.spans()
        assert resource["service.name"] == "from-env"
        assert resource["deployment.environment"] == "ci"
        assert resource["team"] == "agents"  # the environment wins over code defaults
        assert resource["extra"] == "yes"

    def test_grpc_is_selected_by_argument_or_environment(
        self, clean_otel_env: pytest.MonkeyPatch
    ) -> None:
        """protocol="grpc" or OTEL_EXPORTER_OTLP_PROTOCOL=grpc picks the gRPC exporters."""
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        by_argument = otel.configure(
            protocol="grpc", endpoint="http://127.0.0.1:1", set_global=False
        )
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        by_environment = otel.configure(endpoint="http://127.0.0.1:1", set_global=False)
        for setup in (by_argument, by_environment):
            assert setup.protocol == "grpc"
            assert isinstance(setup.exporters[0], OTLPSpanExporter)
            assert setup.shutdown(timeout=5)

    def test_bad_arguments_are_named(self, clean_otel_env: pytest.MonkeyPatch) -> None:
        """A bad protocol or timeout is a ValueError naming the parameter and its value."""
        with pytest.raises(ValueError, match=r'"protocol" must be one of .*: \'http/json\''):
            otel.configure(protocol="http/json", set_global=False)
        with pytest.raises(ValueError, match=r'"export_timeout" must be > 0 seconds: 0'):
            otel.configure(export_timeout=0, set_global=False)
        for bad in (float("nan"), float("inf")):  # (NaN passes `<= 0`)
            with pytest.raises(ValueError, match=rf'"export_timeout" must be > 0 seconds: {bad}'):
                otel.configure(export_timeout=bad, set_global=False)
            with pytest.raises(ValueError, match=r'"metric_export_interval" must be > 0 seconds'):
                otel.configure(metric_export_interval=bad, set_global=False)

    def test_configure_sets_global_providers_the_guard_joins(self, receiver: OtlpReceiver) -> None:
        """With set_global (default) a Guard made without providers exports through configure()."""
        code = textwrap.dedent(
            """
            import policyhook
            from policyhook.otel import configure
            setup = configure(service_name="policyhook-demo")
            guard = policyhook.Guard()
            @guard(summarizer="s")
            def summarize(text):
                return "a summary of it"
            summarize("original text of a turn")
            assert setup.is_global
            assert setup.shutdown()
            """
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
        spans = receiver.spans()
        assert sorted(s.name for _, s in spans) == sorted([SPAN_NAME, SUMMARIZE_SPAN_NAME])
        assert {res["service.name"] for res, _ in spans} == {"policyhook-demo"}

    @pytest.mark.parametrize("variable", otel.ENDPOINT_VARIABLES)
    def test_from_environment_only_when_an_endpoint_is_named(
        self, clean_otel_env: pytest.MonkeyPatch, variable: str
    ) -> None:
        """Each endpoint variable asks for export; none set, or a blank one, asks for none."""
        calls: list[str] = []
        made: Any = object()  # what configure() returned

        def configure(service_name: str) -> Any:
            calls.append(service_name)
            return made

        clean_otel_env.setattr(otel, "configure", configure)
        assert otel.configure_from_environment("hook") is None
        clean_otel_env.setenv(variable, "  ")
        assert otel.configure_from_environment("hook") is None
        clean_otel_env.setenv(variable, "http://127.0.0.1:4318")
        assert otel.endpoint_from_environment() == variable
        assert otel.configure_from_environment("hook") is made
        assert calls == ["hook"]

    def test_shutdown_twice_is_harmless(self, receiver: OtlpReceiver) -> None:
        """A second shutdown() (e.g. the atexit hook after an explicit one) returns at once."""
        setup = otel.configure(endpoint=receiver.endpoint, set_global=False)
        assert setup.shutdown()
        started = time.monotonic()
        assert setup.shutdown()
        assert time.monotonic() - started < 0.1
