"""No drift: every metric and label the dashboard and alert rules query is one the library emits.

Real decisions are made through policyhook with the OpenTelemetry SDK and the Prometheus
exporter; the exposition text is rendered and compared with every query."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import urllib.parse
from typing import Any

import pytest
from monitoring_support import (
    DASHBOARDS,
    ROOT,
    RULE_TESTS,
    TARGET_LABELS,
    alert_rules,
    dashboard_exprs,
    jaeger_queries,
    label_names,
    load_dashboard,
    load_yaml,
    metric_names,
    rule_exprs,
)

EMIT_SCRIPT = textwrap.dedent(r'''
    """Make real decisions through policyhook and print the Prometheus exposition text."""
    import io, json, logging, pathlib, sys, tempfile

    from opentelemetry import metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    registry = CollectorRegistry()  # not the process-wide REGISTRY: only what policyhook emits
    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)]))
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(tracer_provider)
    logging.disable(logging.CRITICAL)

    import policyhook

    # The default policy: a grant on original evidence, a refusal once its source is dead.
    guard = policyhook.Guard()

    @guard(summarizer="conv")
    def summarize(text: str) -> str:
        return "S:" + text[:40]

    guard.record_source("retry_ceiling: 7 (config)", kind="config_read", source_id="cfg-1")
    s1 = summarize("retry_ceiling: 7 (config) and some turns")
    guard.store.evict("cfg-1")
    try:
        summarize(s1 + " more")
        sys.exit("expected UnsafeRecompactionError on a summary of a dead source")
    except policyhook.UnsafeRecompactionError:
        pass

    # Policies from files: an audit policy (would_deny), a rule that fails to evaluate with
    # failurePolicy deny (evaluation errors), then a good and a bad hot reload.
    folder = pathlib.Path(tempfile.mkdtemp())
    (folder / "audit.yaml").write_text("""
    apiVersion: policyhook.dev/v1
    kind: CompactionPolicy
    metadata: {name: audit-depth}
    spec:
      mode: audit
      rules:
        - name: originals-only
          expression: region.depth == 0
          message: only original evidence may be summarized
    """)
    (folder / "broken.yaml").write_text("""
    apiVersion: policyhook.dev/v1
    kind: CompactionPolicy
    metadata: {name: fails-closed}
    spec:
      failurePolicy: deny
      matchConditions:
        - name: only-the-broken-summarizer
          expression: summarizer.name == "broken"
      rules:
        - name: divides-by-zero
          expression: 1 / (region.depth - region.depth) == 1
    """)
    files = policyhook.Guard.from_path(folder, reload_interval=0)

    @files(summarizer="files")
    def summarize_files(text: str) -> str:
        return "F:" + text[:40]

    @files(summarizer="broken")
    def summarize_broken(text: str) -> str:
        return "B:" + text[:40]

    evidence = "tool output: the build took 312 seconds on runner 7"
    files.record_source(evidence, kind="tool_output", source_id="t-1")
    f1 = summarize_files(evidence)  # all of it recorded evidence: no dead source
    summarize_files(f1 + " again")  # depth 1: the audit policy would deny, the call goes through
    try:
        summarize_broken(evidence)  # the broken rule errors and fails closed
        sys.exit("expected the failing rule to refuse the call (failurePolicy: deny)")
    except policyhook.UnsafeRecompactionError:
        pass
    (folder / "broken.yaml").unlink()
    assert files.reload(), "reload after removing the broken policy"
    (folder / "bad.yaml").write_text("apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\n"
                                     "metadata: {name: bad}\nspec: {rules: [{name: r, expression: '1 +'}]}\n")
    assert not files.reload(), "a bad policy file must not be put in force"
    files.close()

    # The Claude Code hook on a transcript it cannot read: blocked, undecided (calls counted).
    from policyhook.adapters import claude_code
    empty = folder / "empty.jsonl"
    empty.write_text("")
    hook_input = {"session_id": "s", "transcript_path": str(empty),
                  "hook_event_name": "PreCompact", "trigger": "auto"}
    answer = io.StringIO()
    options = claude_code.Options(store=folder / "s.sqlite", state_dir=folder / "state")
    claude_code.run(options, io.StringIO(json.dumps(hook_input)), answer)
    assert '"block"' in answer.getvalue(), answer.getvalue()

    sys.stdout.write(generate_latest(registry).decode())
    sys.stdout.write(SPANS_MARKER + "\n")
    json.dump([{"name": span.name, "attributes": dict(span.attributes or {})}
               for span in spans.get_finished_spans()], sys.stdout)
''').replace("SPANS_MARKER", repr("# -- spans --"))


SPANS_MARKER = "# -- spans --"


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    """Real decisions through policyhook: (Prometheus exposition text, finished spans)."""
    pytest.importorskip("opentelemetry.exporter.prometheus")
    pytest.importorskip("opentelemetry.sdk")
    if not (ROOT / "policyhook" / "__init__.py").exists():
        pytest.fail("policyhook/ is not there yet: cannot check what the library emits")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TMPDIR": str(tmp_path_factory.mktemp("emit")),  # the script's policy folder: pytest's
    }
    result = subprocess.run(
        [sys.executable, "-c", EMIT_SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text, _, spans = result.stdout.partition(SPANS_MARKER + "\n")
    return text, json.loads(spans)


@pytest.fixture(scope="module")
def exposition(emitted: tuple[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """{Prometheus family name: {'type', 'samples': {sample names}, 'labels': {label names}}}."""
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(emitted[0]):
        entry = families.setdefault(
            family.name, {"type": family.type, "samples": set(), "labels": set(), "values": {}}
        )
        for sample in family.samples:
            entry["samples"].add(sample.name)
            entry["labels"] |= set(sample.labels)
            key = (sample.name, tuple(sorted(sample.labels.items())))
            entry["values"][key] = sample.value
    return families


def emitted_series(families: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """Every series name in the exposition (with _total/_bucket/...) -> its label names."""
    series: dict[str, set[str]] = {}
    for family in families.values():
        for sample in family["samples"]:
            series.setdefault(sample, set()).update(family["labels"])
    return series


EXPECTED_FAMILIES = {
    # OTel name -> (Prometheus family, type, sample names, label names)
    "policyhook.decisions": (
        "policyhook_decisions",
        "counter",
        {"policyhook_decisions_total"},
        {
            "decision",
            "mode",
            "policy",
            "rule",
            "trigger",
            "summarizer",
            "region_kind",
            "dead_sources",
        },
    ),
    "policyhook.decision.duration": (
        "policyhook_decision_duration_seconds",
        "histogram",
        {f"policyhook_decision_duration_seconds_{s}" for s in ("bucket", "sum", "count")},
        {"decision", "mode", "summarizer"},
    ),
    "policyhook.region.depth": (
        "policyhook_region_depth",
        "histogram",
        {f"policyhook_region_depth_{s}" for s in ("bucket", "sum", "count")},
        {"decision", "summarizer"},
    ),
    "policyhook.evaluation.errors": (
        "policyhook_evaluation_errors",
        "counter",
        {"policyhook_evaluation_errors_total"},
        {"policy", "rule", "outcome"},
    ),
    "policyhook.policy.reloads": (
        "policyhook_policy_reloads",
        "counter",
        {"policyhook_policy_reloads_total"},
        {"outcome", "revision"},
    ),
}


class TestNoDrift:
    def test_library_emits_the_documented_names(
        self, exposition: dict[str, dict[str, Any]]
    ) -> None:
        """Each metric appears under its Prometheus name, type, suffixes and labels."""
        for otel_name, (family, kind, samples, labels) in EXPECTED_FAMILIES.items():
            assert family in exposition, (
                f"{otel_name} not emitted as {family}: {sorted(exposition)}"
            )
            assert exposition[family]["type"] == kind, otel_name
            assert exposition[family]["samples"] == samples, otel_name
            emitted = (
                exposition[family]["labels"]
                - {"le"}
                - {
                    label
                    for label in exposition[family]["labels"]
                    if label.startswith("otel_scope_")
                }
            )
            assert emitted == labels, f"{otel_name}: labels {sorted(emitted)}"

    def test_scenario_produced_every_label_value_the_alerts_use(
        self, exposition: dict[str, dict[str, Any]]
    ) -> None:
        """The real decisions produced allow, deny, would_deny, fail-closed errors and reloads."""

        def values(family: str, label: str) -> set[str]:
            return {
                str(dict(k[1])[label]) for k in exposition[family]["values"] if label in dict(k[1])
            }

        assert values("policyhook_decisions", "decision") >= {"allow", "deny", "would_deny"}
        assert values("policyhook_decisions", "dead_sources") >= {"true", "false"}
        assert values("policyhook_decisions", "region_kind") >= {"original", "summary"}
        assert "deny" in values("policyhook_evaluation_errors", "outcome")
        assert values("policyhook_policy_reloads", "outcome") == {"success", "failure"}
        assert "undecided" in values("policyhook_calls", "outcome")
        assert "" in values("policyhook_decisions", "rule"), "allowed without a rule: rule=''"

    @pytest.mark.parametrize("source", ["dashboard", "alert rules"])
    def test_every_queried_metric_and_label_is_emitted(
        self, source: str, exposition: dict[str, dict[str, Any]], rules: dict[str, Any]
    ) -> None:
        """Metric names and labels queried by the dashboards / alert rules are really emitted."""
        if source == "dashboard":
            exprs = [e for d in DASHBOARDS for e in dashboard_exprs(load_dashboard(d))]
        else:
            exprs = rule_exprs(rules)
        series = emitted_series(exposition)
        queried: set[str] = set()
        for expr in exprs:
            names = metric_names(expr)
            assert names, f"no metric in {expr!r}"
            queried |= names
            unknown = names - set(series)
            assert not unknown, f"{source} queries {sorted(unknown)}, never emitted; in {expr!r}"
            allowed = set().union(*(series[n] for n in names)) | TARGET_LABELS
            extra = label_names(expr) - allowed
            assert not extra, f"{source} uses labels {sorted(extra)} not on {names}: {expr!r}"
        assert queried, source

    def test_trace_searches_use_real_span_attributes(
        self, emitted: tuple[str, list[dict[str, Any]]]
    ) -> None:
        """Jaeger searches and links of the dashboards name the real span and its attributes."""
        guard_spans = [s for s in emitted[1] if s["name"] == "policyhook.guard"]
        assert guard_spans, f"no policyhook.guard span among {[s['name'] for s in emitted[1]]}"
        attributes = set().union(*(s["attributes"] for s in guard_spans))
        documented = {
            "policyhook.decision",
            "policyhook.mode",
            "policyhook.policy",
            "policyhook.rule",
            "policyhook.trigger",
            "policyhook.summarizer",
            "policyhook.region.depth",
            "policyhook.region.sources",
            "policyhook.region.live_sources",
            "policyhook.region.dead_sources",
            "policyhook.policy.revision",
            "policyhook.decision_id",
        }
        assert documented <= attributes, f"missing span attributes {documented - attributes}"
        decisions = {s["attributes"].get("policyhook.decision") for s in guard_spans}
        assert decisions >= {"allow", "deny", "would_deny"}
        for path in DASHBOARDS:
            for query in jaeger_queries(load_dashboard(path)):
                assert query.get("operation", "policyhook.guard") == "policyhook.guard"
                for key, value in re.findall(r'([\w.]+)=("[^"]*"|\S+)', query.get("tags", "")):
                    assert key in attributes, f"Jaeger search on {key}, not a span attribute"
                    if key == "policyhook.decision":
                        assert value in decisions, value
            for tags in re.findall(r"tags=([^&\"]+)", json.dumps(load_dashboard(path))):
                for key, value in json.loads(urllib.parse.unquote(tags)).items():
                    assert key in attributes and (
                        key != "policyhook.decision" or value in decisions
                    ), (key, value)

    def test_rule_unit_tests_use_real_series(self, exposition: dict[str, dict[str, Any]]) -> None:
        """The synthetic series of the promtool tests have real metric names and label names."""
        series = emitted_series(exposition)
        for case in load_yaml(RULE_TESTS)["tests"]:
            for item in case["input_series"]:
                match = re.fullmatch(r"([a-zA-Z_:][\w:]*)\{(.*)\}", item["series"])
                assert match, item["series"]
                name, labels = match[1], set(re.findall(r"(\w+)=", match[2]))
                assert name in series, f"{case['name']}: {name} is never emitted"
                extra = labels - series[name] - TARGET_LABELS
                assert not extra, f"{case['name']}: {name} has no labels {sorted(extra)}"

    def test_latency_alert_threshold_is_a_bucket_boundary(
        self, exposition: dict[str, dict[str, Any]], rules: dict[str, Any]
    ) -> None:
        """histogram_quantile can only resolve the latency alert if its threshold is a bucket."""
        (rule,) = [r for r in alert_rules(rules) if r["alert"] == "PolicyhookDecisionLatencyHigh"]
        match = re.search(r"\)\s*>\s*([0-9.]+)\s*$", rule["expr"].strip())
        assert match, f"no threshold in {rule['expr']!r}"
        threshold = float(match[1])
        bounds = {
            float(dict(k[1])["le"])
            for k in exposition["policyhook_decision_duration_seconds"]["values"]
            if k[0].endswith("_bucket")
        }
        assert threshold in bounds, f"{threshold} not among buckets {sorted(bounds)}"
        assert len([b for b in bounds if b < threshold]) >= 5, "too few buckets below threshold"
        depth = {
            float(dict(k[1])["le"])
            for k in exposition["policyhook_region_depth"]["values"]
            if k[0].endswith("_bucket")
        }
        assert {0.0, 1.0, 2.0, 3.0} <= depth, f"depth buckets too coarse: {sorted(depth)}"
