"""End to end against real servers on 127.0.0.1: what operators will actually read.

- Prometheus (Debian's `prometheus`) scrapes the app's metrics, exposed by
  opentelemetry-exporter-prometheus; the counts are read back with its HTTP query API.
- Phoenix (arize-phoenix, in its own venv made by .ci/setup-servers) receives spans over
  OTLP/HTTP from `policyhook.otel.configure`; they are read back with its REST API.
- A collector that is down (closed port) or hangs (accepts, never answers) slows neither the
  calls nor shutdown.

Servers missing: skipped locally, failed with CI=true. Run `.ci/setup-servers` to install them.
"""

from __future__ import annotations

import os
import socket
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, start_http_server
from servers import REPO, Server, executable, free_port, get_json, http_ok, start, wait_for
from test_telemetry import DECISION_METRIC_ATTRIBUTES, summarizer
from test_telemetry import summary_with_dead_sources as stale_summary

import policyhook
from policyhook import otel
from policyhook._loader import compile_sources
from policyhook._provenance import Entry, FactRecord
from policyhook._telemetry import SPAN_NAME, SUMMARIZE_SPAN_NAME


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="policyhook-e2e-") as path:
        yield Path(path)


# -- Prometheus -----------------------------------------------------------------------------


class App:
    """The application's side: a MeterProvider whose metrics prometheus_client serves."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reader = PrometheusMetricReader(registry=self.registry)
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.port = free_port()
        self.http, self.thread = start_http_server(
            self.port, addr="127.0.0.1", registry=self.registry
        )

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.meter_provider.shutdown()


@pytest.fixture(scope="module")
def app() -> Iterator[App]:
    a = App()
    yield a
    a.close()


@pytest.fixture(scope="module")
def prometheus(app: App, workdir: Path) -> Iterator[Server]:
    binary = executable(
        "prometheus", "Prometheus", "apt-get install prometheus (or run .ci/setup-servers)"
    )
    config = workdir / "prometheus.yml"
    config.write_text(
        textwrap.dedent(
            f"""\
            global:
              scrape_interval: 1s
            scrape_configs:
              - job_name: policyhook
                scrape_interval: 500ms
                static_configs:
                  - targets: ["127.0.0.1:{app.port}"]
            """
        )
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start(
        "prometheus",
        [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        url=url,
        ready=http_ok(f"{url}/-/ready"),
        log=workdir / "prometheus.log",
        timeout=60,
    )
    yield server
    server.stop()
    print(server.log_tail())  # shown by pytest only when a test failed


def query(prometheus: Server, promql: str) -> float | None:
    """The single value of an instant PromQL query, or None when it has no result."""
    answer = get_json(f"{prometheus.url}/api/v1/query", {"query": promql})
    assert answer["status"] == "success", answer
    result = answer["data"]["result"]
    return float(result[0]["value"][1]) if result else None


class TestPrometheus:
    def test_refusals_read_back_through_prometheus(self, prometheus: Server, app: App) -> None:
        """policyhook_decisions_total{decision="deny"} in Prometheus equals the refusals made."""
        guard = policyhook.Guard(meter_provider=app.meter_provider)
        summarize = summarizer(guard, "prometheus-e2e")  # its own series, whatever runs first
        stale = stale_summary(guard, summarize)
        refusals = 0
        for i in range(12):
            if i % 3 == 0:
                with pytest.raises(policyhook.UnsafeRecompactionError):
                    summarize(stale)
                refusals += 1
            else:
                summarize(f"original turn {i} of the conversation")
        ours = 'summarizer="prometheus-e2e"'
        promql = (
            f'sum(policyhook_decisions_total{{decision="deny",{ours}}})',
            f'sum(policyhook_decisions_total{{decision="allow",{ours}}})',
            f"sum(policyhook_decision_duration_seconds_count{{{ours}}})",
        )
        expected = (refusals, 12 - refusals + 1, 13)  # +1: the summary made before eviction

        def scraped() -> tuple[float | None, ...]:
            return tuple(query(prometheus, q) for q in promql)

        wait_for(
            f"Prometheus to scrape (deny, allow, all) = {expected}",
            lambda: scraped() == expected,
            timeout=30,
            explain=lambda: f"last scrape: {scraped()}\n{prometheus.log_tail()}",
        )
        assert refusals == 4
        labels = get_json(
            f"{prometheus.url}/api/v1/series",
            {"match[]": f'policyhook_decisions_total{{decision="deny",{ours}}}'},
        )["data"]
        assert {k for k in labels[0] if not k.startswith(("otel_", "__"))} >= {
            *DECISION_METRIC_ATTRIBUTES,
            "job",
            "instance",
        }
        assert labels[0]["rule"] == "live-sources" and labels[0]["mode"] == "enforce"

    def test_every_metric_has_its_documented_prometheus_name(
        self, prometheus: Server, app: App, tmp_path: Path
    ) -> None:
        """All seven instruments reach Prometheus under the names dashboards query."""
        broken = "region.depth / (region.depth - region.depth) >= 0"
        policies = compile_sources(
            [
                (
                    "p.yaml",
                    textwrap.dedent(
                        f"""\
                        apiVersion: policyhook.dev/v1
                        kind: CompactionPolicy
                        metadata: {{name: fail-open}}
                        spec:
                          failurePolicy: allow
                          rules:
                            - name: divide
                              expression: '{broken}'
                              message: cannot happen
                        """
                    ),
                )
            ]
        )
        summarizer(policyhook.Guard(policies, meter_provider=app.meter_provider))("a turn")
        full = _DiskFull()
        summarizer(policyhook.Guard(store=full, meter_provider=app.meter_provider))("a turn")
        folder = tmp_path / "policies"
        folder.mkdir()
        policy = (
            "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\nmetadata: {name: %s}\n"
            "spec: {rules: [{name: r, expression: 'true', message: m}]}\n"
        )
        (folder / "q.yaml").write_text(policy % "first")
        watched = policyhook.Guard(folder, meter_provider=app.meter_provider, reload_interval=0)
        (folder / "q.yaml").write_text(policy % "second")
        assert watched.reload()  # success
        (folder / "q.yaml").write_text("spec: [broken")
        assert not watched.reload()  # failure, "second" stays in force
        watched.close()
        expected = {
            "policyhook_decisions_total",
            "policyhook_decision_duration_seconds_bucket",
            "policyhook_decision_duration_seconds_count",
            "policyhook_decision_duration_seconds_sum",
            "policyhook_region_depth_bucket",
            "policyhook_region_depth_count",
            "policyhook_region_depth_sum",
            "policyhook_evaluation_errors_total",
            "policyhook_policy_reloads_total",
            "policyhook_calls_total",
            "policyhook_store_errors_total",
        }

        def names() -> set[str]:
            values = get_json(f"{prometheus.url}/api/v1/label/__name__/values")["data"]
            return {v for v in values if v.startswith("policyhook_")}

        counts = (
            'sum(policyhook_evaluation_errors_total{policy="fail-open",outcome="allow"})',
            'sum(policyhook_policy_reloads_total{outcome="success"})',
            'sum(policyhook_policy_reloads_total{outcome="failure"})',
        )

        def scraped() -> tuple[set[str], tuple[float | None, ...]]:
            return names(), tuple(query(prometheus, q) for q in counts)

        wait_for(
            "all policyhook metrics in Prometheus, with 1 error, 1 good and 1 failed reload",
            lambda: scraped() == (expected, (1, 1, 1)),
            timeout=30,
            explain=lambda: f"last scrape: {scraped()}\n{prometheus.log_tail()}",
        )


# -- Phoenix --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def phoenix(workdir: Path) -> Iterator[Server]:
    binary = executable(
        os.environ.get("POLICYHOOK_PHOENIX") or REPO / ".venv-phoenix" / "bin" / "phoenix",
        "Phoenix (arize-phoenix)",
        "run .ci/setup-servers, or set POLICYHOOK_PHOENIX to a phoenix executable",
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHON"))}
    env |= {
        "PHOENIX_WORKING_DIR": str(workdir / "phoenix"),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    server = start(
        "phoenix",
        [str(binary), "serve"],
        url=url,
        ready=http_ok(f"{url}/healthz"),
        log=workdir / "phoenix.log",
        env=env,
        timeout=120,
    )
    yield server
    server.stop()
    print(server.log_tail())  # shown by pytest only when a test failed


class TestPhoenix:
    def test_spans_reach_a_real_otlp_trace_store(self, phoenix: Server) -> None:
        """configure() → OTLP/HTTP → Phoenix: the spans, their nesting and attributes read back."""
        project = f"policyhook-e2e-{uuid.uuid4().hex[:8]}"
        setup = otel.configure(
            "policyhook-e2e",
            endpoint=phoenix.url,
            resource_attributes={"openinference.project.name": project},
            metrics=False,  # Phoenix stores traces only
            set_global=False,
        )
        guard = policyhook.Guard(tracer_provider=setup.tracer_provider)
        summarize = summarizer(guard)
        caller = setup.tracer_provider.get_tracer("agent-runtime")
        with caller.start_as_current_span("agent.compact") as outer:
            stale = stale_summary(guard, summarize)
            with pytest.raises(policyhook.UnsafeRecompactionError) as refused:
                summarize(stale)
        assert setup.shutdown(timeout=10)

        def spans() -> list[dict[str, Any]]:
            try:
                found = get_json(f"{phoenix.url}/v1/projects/{project}/spans", {"limit": "100"})
            except OSError:  # 404 until the project's first span is stored
                return []
            return list(found["data"]) if len(found["data"]) == 4 else []

        stored = wait_for("4 spans in Phoenix", spans, timeout=30, explain=phoenix.log_tail)
        by_name: dict[str, list[dict[str, Any]]] = {}
        for span in stored:
            by_name.setdefault(span["name"], []).append(span)
        assert sorted(by_name) == sorted(["agent.compact", SPAN_NAME, SUMMARIZE_SPAN_NAME])
        root = by_name["agent.compact"][0]
        trace_id = f"{outer.get_span_context().trace_id:032x}"
        assert {s["context"]["trace_id"] for s in stored} == {trace_id}
        granted, denied = sorted(
            by_name[SPAN_NAME], key=lambda s: s["attributes"]["policyhook.decision"]
        )
        (work,) = by_name[SUMMARIZE_SPAN_NAME]
        assert granted["parent_id"] == denied["parent_id"] == root["context"]["span_id"]
        assert work["parent_id"] == granted["context"]["span_id"]
        assert granted["attributes"]["policyhook.decision"] == "allow"
        assert granted["status_code"] == "UNSET"
        attributes = denied["attributes"]
        assert attributes["policyhook.decision"] == "deny"
        assert attributes["policyhook.decision_id"] == refused.value.decision_id
        assert attributes["policyhook.rule"] == "live-sources"
        assert attributes["policyhook.mode"] == "enforce"
        assert attributes["policyhook.region.depth"] == 1
        assert attributes["policyhook.region.dead_sources"] == 1
        assert attributes["error.type"] == "UnsafeRecompactionError"
        assert denied["status_code"] == "ERROR"
        assert [e["name"] for e in denied["events"]] == ["exception"]
        assert work["attributes"]["policyhook.summarizer"] == "conversation-summary"


# -- a collector that is down ---------------------------------------------------------------


@pytest.fixture
def hanging_collector() -> Iterator[str]:
    """An endpoint that accepts connections and never answers (a stuck collector)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def hundred_calls(setup: otel.Setup) -> float:
    """Seconds taken by 100 guarded calls (a fifth of them refused) exporting through `setup`."""
    guard = policyhook.Guard(
        tracer_provider=setup.tracer_provider, meter_provider=setup.meter_provider
    )
    summarize = summarizer(guard)
    stale = stale_summary(guard, summarize)
    started = time.monotonic()
    for i in range(100):
        if i % 5 == 0:
            with pytest.raises(policyhook.UnsafeRecompactionError):
                summarize(stale)
        else:
            summarize(f"original turn {i} of the conversation")
    return time.monotonic() - started


class TestCollectorDown:
    @pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
    def test_closed_port_slows_neither_calls_nor_shutdown(
        self, protocol: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Export to a closed port: 100 calls stay prompt and shutdown() returns in seconds."""
        setup = otel.configure(
            "collector-down",
            protocol=protocol,
            endpoint=f"http://127.0.0.1:{free_port()}",
            metric_export_interval=0.2,  # metric exports fail while the calls run
            set_global=False,
        )
        elapsed = hundred_calls(setup)
        time.sleep(0.5)  # let the exporters get into their retry backoff
        started = time.monotonic()
        setup.shutdown()
        shutdown = time.monotonic() - started
        assert elapsed < 5.0, f"100 calls took {elapsed:.2f}s with the collector down"
        assert shutdown < 10.0, f"shutdown took {shutdown:.2f}s with the collector down"
        failed = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
        assert failed, "no export was attempted: the test proved nothing"

    def test_hanging_collector_is_cut_off_at_the_shutdown_bound(
        self, hanging_collector: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A collector that never answers: calls stay prompt; shutdown() gives up at its bound."""
        setup = otel.configure(
            "collector-hangs",
            endpoint=hanging_collector,
            export_timeout=5.0,  # each export would wait 5 s; the SDK's shutdown up to 30 s
            set_global=False,
        )
        elapsed = hundred_calls(setup)
        started = time.monotonic()
        finished = setup.shutdown(timeout=1.0)
        shutdown = time.monotonic() - started
        assert elapsed < 5.0, f"100 calls took {elapsed:.2f}s with the collector hanging"
        assert not finished
        assert shutdown < 3.0, f"shutdown(timeout=1.0) took {shutdown:.2f}s"
        assert "did not finish within 1.0s" in caplog.text


class _DiskFull(policyhook.MemoryStore):
    """A store whose disk is full: every summary it is given fails to be written."""

    def put_summary(self, entry: Entry, text: str, facts: Sequence[FactRecord] = ()) -> Entry:
        raise OSError(28, "No space left on device")
