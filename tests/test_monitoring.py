"""The monitoring stack (docker-compose.yml, collector/) checked by what runs without Docker.

Docker cannot run on the build machines, so every file `docker compose up` uses is checked here
by the tool that owns its format: the compose-spec JSON schema (check-jsonschema), `promtool` for
the Prometheus config and alert rules (with unit tests that fire every alert), the TypeScript
compiler against `@grafana/schema` for the dashboard, and cross-checks between the files (ports,
hostnames, mounts, datasource uids).

The no-drift check makes real decisions through policyhook with the OpenTelemetry SDK and the
Prometheus exporter, renders the exposition text, and requires every metric and label that the
dashboard and the alert rules query to be one the library really emits.

With CI=true a missing tool (promtool, check-jsonschema, node/npm) fails; elsewhere it skips.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
COLLECTOR = ROOT / "collector"
OTELCOL_CONFIG = COLLECTOR / "otel-collector.yaml"
PROMETHEUS_DIR = COLLECTOR / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULES = PROMETHEUS_DIR / "rules" / "policyhook.rules.yml"
GRAFANA = COLLECTOR / "grafana"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "datasources.yaml"
DASHBOARD_PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "dashboards.yaml"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DEMO_LOOP = COLLECTOR / "demo" / "loop.py"
FIXTURES = Path(__file__).resolve().parent / "monitoring"
RULE_TESTS = FIXTURES / "policyhook.rules.test.yml"
README = ROOT / "README.md"
README_DRAFT = Path("/tmp/readme-monitoring.md")
README_HEADING = re.compile(r"^##\s+Monitoring\b.*$", re.MULTILINE)

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

#: Labels Prometheus or the collector's exporter put on every series, whatever the app sent.
TARGET_LABELS = {"job", "instance"}


def missing(what: str) -> None:
    """A tool or file this check needs is absent: a failure in CI, a skip elsewhere."""
    if IN_CI:
        pytest.fail(f"{what} (CI=true: the test command must install it)")
    pytest.skip(what)


def tool(name: str) -> str:
    """Path of an executable, from PATH or from this interpreter's bin dir (the venv)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        missing(f"{name!r} is not installed")
    assert found is not None
    return found


def run(
    args: list[str], *, cwd: Path = ROOT, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_mapping(path: Path) -> dict[str, Any]:
    document = load_yaml(path)
    assert isinstance(document, dict), f"{path} is not a YAML mapping"
    return document


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_mapping(COMPOSE)


@pytest.fixture(scope="module")
def otelcol() -> dict[str, Any]:
    return load_mapping(OTELCOL_CONFIG)


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    return load_mapping(RULES)


def alert_rules(rules_doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in rules_doc["groups"] for r in g["rules"] if "alert" in r]


def published_ports(service: dict[str, Any]) -> dict[int, int]:
    """host port -> container port, for the short and the long compose syntax."""
    ports: dict[int, int] = {}
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports[int(entry["published"])] = int(entry["target"])
            continue
        parts = str(entry).split("/")[0].split(":")
        ports[int(parts[-2])] = int(parts[-1])
    return ports


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of every bind mount of a service."""
    mounts = []
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            if entry.get("type", "bind") == "bind":
                mounts.append((entry["source"], entry["target"]))
            continue
        source, target = str(entry).split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


def container_path(compose_doc: dict[str, Any], service: str, repo_path: Path) -> str:
    """Where a repository file or folder appears inside a service's container."""
    for source, target in bind_mounts(compose_doc["services"][service]):
        mounted = (ROOT / source).resolve()
        if repo_path.resolve() == mounted:
            return target
        if mounted in repo_path.resolve().parents:
            return target + "/" + repo_path.resolve().relative_to(mounted).as_posix()
    raise AssertionError(f"{repo_path.relative_to(ROOT)} is not mounted into service {service!r}")


def host_port(endpoint: str) -> tuple[str, int]:
    """'0.0.0.0:4317' / 'http://jaeger:16686' -> (host, port)."""
    endpoint = re.sub(r"^[a-z]+://", "", endpoint).rstrip("/")
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


# -- compose ------------------------------------------------------------------------------------


class TestCompose:
    def test_matches_compose_spec_schema(self) -> None:
        """docker-compose.yml validates against the compose-spec JSON schema."""
        result = run(
            [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)]
        )
        assert result.returncode == 0, result.stdout + result.stderr

    def test_every_mounted_file_exists(self, compose: dict[str, Any]) -> None:
        """Every bind-mount source is a file or folder of the repository."""
        mounts = [
            (name, source)
            for name, service in compose["services"].items()
            for source, _ in bind_mounts(service)
        ]
        assert mounts, "no bind mounts found"
        for name, source in mounts:
            path = (ROOT / source).resolve()
            assert path.exists(), f"service {name} mounts {source}, which does not exist"
            assert path == ROOT or ROOT in path.parents, f"{name} mounts {source} outside the repo"

    def test_images_are_pinned(self, compose: dict[str, Any]) -> None:
        """Every image has an explicit version tag, never latest."""
        for name, service in compose["services"].items():
            image = service["image"]
            repo, _, tag = image.rpartition(":")
            assert repo and "/" not in tag, f"{name}: image {image!r} has no tag"
            assert re.fullmatch(r"v?\d+(\.\d+)+(-[a-z0-9.]+)?", tag), (
                f"{name}: image {image!r} is not pinned to a version"
            )

    def test_stack_services(self, compose: dict[str, Any]) -> None:
        """collector, jaeger, prometheus and grafana run by default; demo only under its profile."""
        services = compose["services"]
        images = {name: s["image"].rpartition(":")[0] for name, s in services.items()}
        assert images["collector"] == "otel/opentelemetry-collector-contrib"
        assert images["jaeger"] in ("jaegertracing/jaeger", "jaegertracing/all-in-one")
        assert images["prometheus"] == "prom/prometheus"
        assert images["grafana"] == "grafana/grafana"
        for name in ("collector", "jaeger", "prometheus", "grafana"):
            assert "profiles" not in services[name], f"{name} must start with plain `up`"
        assert services["demo"]["profiles"] == ["demo"]

    def test_demo_exports_to_the_collector(self, compose: dict[str, Any]) -> None:
        """The demo installs the repo, loops `policyhook demo` and exports OTLP to collector:4318."""
        demo = compose["services"]["demo"]
        env = demo["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
        assert env["OTEL_SERVICE_NAME"] == "policyhook-demo"
        assert env["OTEL_METRIC_EXPORT_INTERVAL"] == "5000"
        assert env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") == "http/protobuf"
        script = "\n".join(demo["command"])
        assert 'pip install --quiet --no-cache-dir "/tmp/policyhook[otlp]"' in script
        assert "exec python /tmp/policyhook/collector/demo/loop.py" in script
        assert DEMO_LOOP.exists()
        assert ("./", "/src") in bind_mounts(demo) or (".", "/src") in bind_mounts(demo)
        assert "collector" in demo["depends_on"]
        collector_ports = published_ports(compose["services"]["collector"])
        assert 4318 in collector_ports.values()

    def test_config_files_are_where_the_services_read_them(self, compose: dict[str, Any]) -> None:
        """The collector, Prometheus and Grafana read the mounted files, not image defaults."""
        services = compose["services"]
        config = container_path(compose, "collector", OTELCOL_CONFIG)
        assert f"--config={config}" in services["collector"]["command"]
        prom_config = container_path(compose, "prometheus", PROMETHEUS_CONFIG)
        assert f"--config.file={prom_config}" in services["prometheus"]["command"]
        # rule_files are relative to the config file: the rules dir must sit beside it.
        prom_rules = container_path(compose, "prometheus", RULES)
        assert Path(prom_rules).parent.parent == Path(prom_config).parent
        assert container_path(compose, "grafana", DATASOURCES).startswith(
            "/etc/grafana/provisioning/datasources/"
        )
        assert container_path(compose, "grafana", DASHBOARD_PROVIDERS).startswith(
            "/etc/grafana/provisioning/dashboards/"
        )


# -- collector ----------------------------------------------------------------------------------


def _component_type(name: str) -> str:
    return name.split("/", 1)[0]


class TestCollectorConfig:
    def test_pipelines_name_only_defined_components(self, otelcol: dict[str, Any]) -> None:
        """Every receiver, processor, exporter and extension the service names is defined."""
        service = otelcol["service"]
        for extension in service.get("extensions", []):
            assert extension in otelcol.get("extensions", {}), f"extension {extension} undefined"
        assert service["pipelines"], "no pipelines"
        for pipeline, spec in service["pipelines"].items():
            for kind in ("receivers", "processors", "exporters"):
                for component in spec.get(kind, []):
                    assert component in (otelcol.get(kind) or {}), (
                        f"pipeline {pipeline} names {kind[:-1]} {component}, which is not defined"
                    )
            assert spec.get("receivers") and spec.get("exporters"), pipeline

    def test_every_defined_component_is_used(self, otelcol: dict[str, Any]) -> None:
        """No dead configuration: a defined component that no pipeline uses is a mistake."""
        service = otelcol["service"]
        used = {
            kind: {c for p in service["pipelines"].values() for c in p.get(kind, [])}
            for kind in ("receivers", "processors", "exporters")
        }
        used["extensions"] = set(service.get("extensions", []))
        for kind, names in used.items():
            assert set(otelcol.get(kind) or {}) == names, kind

    def test_required_components(self, otelcol: dict[str, Any]) -> None:
        """OTLP in, memory_limiter first and batch last, traces to Jaeger, metrics to Prometheus."""
        pipelines = otelcol["service"]["pipelines"]
        assert set(pipelines) >= {"traces", "metrics"}
        for name in ("traces", "metrics"):
            spec = pipelines[name]
            assert [_component_type(r) for r in spec["receivers"]] == ["otlp"]
            processors = [_component_type(p) for p in spec["processors"]]
            assert processors[0] == "memory_limiter", f"{name}: memory_limiter must come first"
            assert processors[-1] == "batch", f"{name}: batch must come last"
        assert [_component_type(e) for e in pipelines["traces"]["exporters"]] == ["otlp"]
        assert [_component_type(e) for e in pipelines["metrics"]["exporters"]] == ["prometheus"]
        assert "health_check" in otelcol["service"]["extensions"]
        limiter = otelcol["processors"]["memory_limiter"]
        assert limiter["check_interval"] and limiter["limit_mib"] > limiter["spike_limit_mib"] > 0

    def test_ports_match_compose(self, otelcol: dict[str, Any], compose: dict[str, Any]) -> None:
        """The OTLP, Prometheus-exporter and health ports the collector opens are published."""
        published = set(published_ports(compose["services"]["collector"]).values())
        protocols = otelcol["receivers"]["otlp"]["protocols"]
        assert host_port(protocols["grpc"]["endpoint"]) == ("0.0.0.0", 4317)
        assert host_port(protocols["http"]["endpoint"]) == ("0.0.0.0", 4318)
        exporter = host_port(otelcol["exporters"]["prometheus"]["endpoint"])
        health = host_port(otelcol["extensions"]["health_check"]["endpoint"])
        for host, port in (exporter, health):
            assert host == "0.0.0.0", "listen on all interfaces, or nothing outside can connect"
            assert port in published, f"collector port {port} is not published in compose"
        assert {4317, 4318} <= published

    def test_traces_go_to_the_jaeger_service(
        self, otelcol: dict[str, Any], compose: dict[str, Any]
    ) -> None:
        """The trace exporter targets the compose service jaeger on its OTLP gRPC port."""
        (exporter,) = otelcol["service"]["pipelines"]["traces"]["exporters"]
        host, port = host_port(otelcol["exporters"][exporter]["endpoint"])
        assert host in compose["services"], f"{host} is no compose service"
        assert port == 4317
        jaeger_args = " ".join(compose["services"][host].get("command", []))
        if "grpc.endpoint" in jaeger_args:
            assert "receivers.otlp.protocols.grpc.endpoint=0.0.0.0:4317" in jaeger_args


# -- prometheus ---------------------------------------------------------------------------------


class TestPrometheus:
    def test_promtool_check_config(self) -> None:
        """prometheus.yml is valid and its rule_files glob finds the policyhook rules."""
        result = run(
            [tool("promtool"), "check", "config", PROMETHEUS_CONFIG.name], cwd=PROMETHEUS_DIR
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        assert "SUCCESS: 1 rule files found" in output, output
        assert RULES.relative_to(PROMETHEUS_DIR).as_posix() in output, output

    def test_promtool_check_rules(self) -> None:
        """The alert rules parse and are valid."""
        result = run([tool("promtool"), "check", "rules", str(RULES)])
        assert result.returncode == 0, result.stdout + result.stderr

    def test_promtool_rule_unit_tests(self) -> None:
        """promtool test rules: every alert fires on synthetic series and not on healthy ones."""
        result = run([tool("promtool"), "test", "rules", RULE_TESTS.name], cwd=FIXTURES)
        assert result.returncode == 0, result.stdout + result.stderr

    def test_every_alert_has_a_firing_and_a_quiet_case(self, rules: dict[str, Any]) -> None:
        """The unit tests cover each alert both ways, and each required alert exists."""
        names = {r["alert"] for r in alert_rules(rules)}
        assert names >= {
            "PolicyhookRefusalRateSpike",
            "PolicyhookFailClosedEvaluationErrors",
            "PolicyhookPolicyReloadFailing",
            "PolicyhookDecisionLatencyHigh",
            "PolicyhookAuditWouldDeny",
        }
        cases = [c for t in load_yaml(RULE_TESTS)["tests"] for c in t.get("alert_rule_test", [])]
        fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
        quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
        assert names <= fires, f"alerts never shown firing: {sorted(names - fires)}"
        assert names <= quiet, f"alerts never shown quiet: {sorted(names - quiet)}"
        rule_files = load_yaml(RULE_TESTS)["rule_files"]
        assert [(FIXTURES / f).resolve() for f in rule_files] == [RULES.resolve()]

    def test_alerts_are_documented(self, rules: dict[str, Any]) -> None:
        """Every alert has a severity, a summary and a description."""
        for rule in alert_rules(rules):
            assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]

    def test_scrapes_the_collector_exporter(
        self, otelcol: dict[str, Any], compose: dict[str, Any]
    ) -> None:
        """Prometheus scrapes collector:<exporter port> with honor_labels (job = service name)."""
        config = load_yaml(PROMETHEUS_CONFIG)
        _, port = host_port(otelcol["exporters"]["prometheus"]["endpoint"])
        jobs = [
            job
            for job in config["scrape_configs"]
            for static in job.get("static_configs", [])
            if f"collector:{port}" in static["targets"]
        ]
        assert len(jobs) == 1, f"no scrape job for collector:{port}"
        assert jobs[0].get("honor_labels") is True
        assert "collector" in compose["services"]


# -- grafana ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def datasources() -> dict[str, dict[str, Any]]:
    return {d["uid"]: d for d in load_yaml(DATASOURCES)["datasources"]}


def panels_of(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def load_dashboard(path: Path) -> dict[str, Any]:
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(dashboard, dict), f"{path} is not a JSON object"
    return dashboard


def field_links(panel: dict[str, Any]) -> list[dict[str, Any]]:
    links = list(panel.get("fieldConfig", {}).get("defaults", {}).get("links", []))
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        for prop in override["properties"]:
            if prop["id"] == "links":
                links += prop["value"]
    return links


def jaeger_queries(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Jaeger queries of panels, and of data links that open Explore on Jaeger."""
    queries = [
        t
        for p in panels_of(dashboard)
        for t in p.get("targets", [])
        if t.get("datasource", {}).get("type") == "jaeger"
    ]
    queries += [
        link["internal"]["query"]
        for p in panels_of(dashboard)
        for link in field_links(p)
        if "internal" in link
    ]
    return queries


class TestGrafanaProvisioning:
    def test_datasources(
        self, datasources: dict[str, dict[str, Any]], compose: dict[str, Any]
    ) -> None:
        """Prometheus and Jaeger datasources point at the compose services' ports."""
        doc = load_yaml(DATASOURCES)
        assert doc["apiVersion"] == 1
        types = {d["type"]: d for d in datasources.values()}
        assert set(types) >= {"prometheus", "jaeger"}
        expected = {"prometheus": ("prometheus", 9090), "jaeger": ("jaeger", 16686)}
        for kind, (service, port) in expected.items():
            host, url_port = host_port(types[kind]["url"])
            assert (host, url_port) == (service, port)
            assert service in compose["services"]
        exemplars = types["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
        assert all(e["datasourceUid"] in datasources for e in exemplars)

    def test_dashboard_provider_reads_the_mounted_dashboards(self, compose: dict[str, Any]) -> None:
        """The provider's path is where compose mounts collector/grafana/dashboards."""
        providers = load_yaml(DASHBOARD_PROVIDERS)["providers"]
        assert len(providers) == 1 and providers[0]["type"] == "file"
        mounted = container_path(compose, "grafana", GRAFANA / "dashboards")
        assert providers[0]["options"]["path"] == mounted
        home = compose["services"]["grafana"]["environment"].get(
            "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
        )
        if home:
            assert home in {f"{mounted}/{d.name}" for d in DASHBOARDS}


# -- dashboard ----------------------------------------------------------------------------------


GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "${service}": "policyhook-demo",
    "$service": "policyhook-demo",
    "${summarizer}": ".*",
    "$summarizer": ".*",
}


def substitute(expr: str) -> str:
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VARIABLES[name])
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and variable queries."""
    exprs = [t["expr"] for p in panels_of(dashboard) for t in p.get("targets", []) if "expr" in t]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if isinstance(query, str):
            match = re.fullmatch(r"label_values\((.+),\s*([a-zA-Z_]\w*)\)", query.strip())
            assert match, f"variable {variable['name']}: unsupported query {query!r}"
            exprs.append(f"count by ({match[2]}) ({match[1]})")
    return exprs


def rule_exprs(rules_doc: dict[str, Any]) -> list[str]:
    return [r["expr"] for g in rules_doc["groups"] for r in g["rules"]]


_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
    "atan2",
}
_CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (a small PromQL lexer: enough for our queries)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _CLAUSE.sub(" ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        word, call = match[1], match[2]
        if call or word in _KEYWORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def label_names(expr: str) -> set[str]:
    """Label names used in matchers and in by/on/ignoring/group_* clauses."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    labels = set()
    for block in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", block))
    for _, names in _CLAUSE.findall(text):
        labels |= {n.strip() for n in names.split(",") if n.strip()}
    return labels


def promtool_parse(exprs: list[str], tmp_path: Path) -> None:
    """Parse PromQL with promtool (it has no query linter, but it parses recording rules)."""
    rules_file = tmp_path / "parse.rules.yml"
    rules_file.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "parse",
                        "rules": [
                            {"record": f"policyhook:parse_check_{i}", "expr": expr}
                            for i, expr in enumerate(exprs)
                        ],
                    }
                ]
            }
        ),
        encoding="utf-8",
    )
    result = run([tool("promtool"), "check", "rules", str(rules_file)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", DASHBOARDS, ids=[d.name for d in DASHBOARDS])
class TestDashboard:
    def test_panels_have_datasources_and_unique_ids(
        self, path: Path, datasources: dict[str, dict[str, Any]]
    ) -> None:
        """Every panel and query names a provisioned datasource; panel ids are unique."""
        dashboard = load_dashboard(path)
        assert dashboard["uid"] and dashboard["title"]
        ids = [p["id"] for p in panels_of(dashboard)]
        assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
        for panel in panels_of(dashboard):
            if panel["type"] == "row":
                continue
            ref = panel.get("datasource")
            assert ref and ref["uid"] in datasources, f"panel {panel['title']!r}: {ref}"
            assert ref["type"] == datasources[ref["uid"]]["type"], panel["title"]
            assert panel.get("targets"), f"panel {panel['title']!r} has no query"
            for target in panel["targets"]:
                assert target.get("datasource", ref) == ref, panel["title"]
            assert panel.get("description"), f"panel {panel['title']!r} has no description"
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                assert variable["datasource"]["uid"] in datasources, variable["name"]
        for panel in panels_of(dashboard):
            for link in field_links(panel):
                if "internal" in link:
                    uid = link["internal"]["datasourceUid"]
                    assert uid in datasources, f"panel {panel['title']!r}: link to {uid}"
                    assert datasources[uid]["name"] == link["internal"]["datasourceName"]
                else:
                    assert link["url"], f"panel {panel['title']!r}: link without url"

    def test_panels_do_not_overlap(self, path: Path) -> None:
        """gridPos of the top-level panels tile the 24-column grid without overlapping."""
        cells: dict[tuple[int, int], str] = {}
        for panel in load_dashboard(path)["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                    cells[(x, y)] = panel["title"]

    def test_queries_parse(self, path: Path, tmp_path: Path) -> None:
        """Every PromQL expression of the dashboard parses (promtool), Grafana vars substituted."""
        exprs = dashboard_exprs(load_dashboard(path))
        assert exprs
        promtool_parse([substitute(e) for e in exprs], tmp_path)

    def test_covers_what_an_operator_needs(self, path: Path) -> None:
        """Decisions, refusal ratio, audit, depth, dead sources, latency, reloads, traces."""
        dashboard = load_dashboard(path)
        exprs = "\n".join(dashboard_exprs(dashboard))
        for needle in (
            "sum by (decision, trigger) (rate(policyhook_decisions_total",
            "sum by (policy, rule) (rate(policyhook_decisions_total",
            'decision=~"deny|would_deny"',
            "policyhook_region_depth_bucket",
            'dead_sources="true"',
            "histogram_quantile(0.50,",
            "histogram_quantile(0.95,",
            "histogram_quantile(0.99,",
            "sum by (outcome, revision) (increase(policyhook_policy_reloads_total",
        ):
            assert needle in exprs, needle
        searches = [q for q in jaeger_queries(dashboard) if q.get("queryType") == "search"]
        assert any("policyhook.decision=deny" in q["tags"] for q in searches), "no refusal search"
        assert all(q["service"] in ("$service", "${service}") for q in searches)
        links = json.dumps(dashboard)
        assert "policyhook.decision=deny" in links and "%22policyhook.decision%22" in links

    def test_matches_grafana_schema(self, path: Path, grafana_schema: Path) -> None:
        """tsc type-checks the dashboard against @grafana/schema's Dashboard, strictly."""
        check = grafana_schema / f"check_{path.stem.replace('-', '_')}.ts"
        check.write_text(
            "import type { StrictDashboard } from './grafana_dashboard';\n"
            f"export const checked: StrictDashboard = {path.read_text(encoding='utf-8')};\n",
            encoding="utf-8",
        )
        tsconfig = grafana_schema / f"tsconfig.{check.stem}.json"
        tsconfig.write_text(
            json.dumps(
                {
                    "compilerOptions": {
                        "strict": True,
                        "noEmit": True,
                        "module": "esnext",
                        "moduleResolution": "bundler",
                        "target": "es2022",
                        "skipLibCheck": True,
                        "exactOptionalPropertyTypes": False,
                    },
                    "files": [check.name],
                }
            ),
            encoding="utf-8",
        )
        result = run(
            [str(grafana_schema / "node_modules" / ".bin" / "tsc"), "-p", tsconfig.name],
            cwd=grafana_schema,
        )
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="session")
def grafana_schema() -> Path:
    """A dir with @grafana/schema and typescript installed (npm ci, cached outside the repo)."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        missing("node and npm are not installed")
    assert npm is not None
    lock = (FIXTURES / "package-lock.json").read_bytes()
    key = hashlib.sha256(lock + (FIXTURES / "package.json").read_bytes()).hexdigest()[:12]
    base = os.environ.get("POLICYHOOK_NODE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "policyhook-node"
    )
    workdir = Path(base) / key
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json", "grafana_dashboard.ts"):
        shutil.copyfile(FIXTURES / name, workdir / name)
    installed = workdir / "node_modules" / "@grafana" / "schema" / "package.json"
    if not installed.exists() or not (workdir / "node_modules" / ".bin" / "tsc").exists():
        result = run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=workdir, timeout=300
        )
        if result.returncode != 0:
            missing(f"npm ci of @grafana/schema failed:\n{result.stdout}{result.stderr}")
    return workdir


# -- no drift between what is queried and what the library emits --------------------------------


EMIT_SCRIPT = textwrap.dedent(r'''
    """Make real decisions through policyhook and print the Prometheus exposition text."""
    import json, logging, pathlib, sys, tempfile

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
    assert files.watcher.check(), "reload after removing the broken policy"
    (folder / "bad.yaml").write_text("apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\n"
                                     "metadata: {name: bad}\nspec: {rules: [{name: r, expression: '1 +'}]}\n")
    assert not files.watcher.check(), "a bad policy file must not be put in force"
    files.close()

    sys.stdout.write(generate_latest(registry).decode())
    sys.stdout.write(SPANS_MARKER + "\n")
    json.dump([{"name": span.name, "attributes": dict(span.attributes or {})}
               for span in spans.get_finished_spans()], sys.stdout)
''').replace("SPANS_MARKER", repr("# -- spans --"))


SPANS_MARKER = "# -- spans --"


@pytest.fixture(scope="module")
def emitted() -> tuple[str, list[dict[str, Any]]]:
    """Real decisions through policyhook: (Prometheus exposition text, finished spans)."""
    pytest.importorskip("opentelemetry.exporter.prometheus")
    pytest.importorskip("opentelemetry.sdk")
    if not (ROOT / "policyhook" / "__init__.py").exists():
        pytest.fail("policyhook/ is not there yet: cannot check what the library emits")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
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


# -- the demo service ---------------------------------------------------------------------------


class _OTLPSink:
    """A loopback OTLP/HTTP endpoint that keeps what it is sent (127.0.0.1 only, bounded)."""

    def __init__(self) -> None:
        import gzip
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        received: list[tuple[str, bytes]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                received.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.received = received
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _OTLPSink:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


class TestDemoLoop:
    def test_exports_decisions_over_otlp(self, compose: dict[str, Any]) -> None:
        """collector/demo/loop.py, as compose runs it, exports spans and all metrics via OTLP."""
        pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        demo_env = compose["services"]["demo"]["environment"]
        with _OTLPSink() as sink:
            env = {
                **os.environ,
                **{k: str(v) for k, v in demo_env.items() if k.startswith("OTEL_")},
                "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                "OTEL_METRIC_EXPORT_INTERVAL": "60000",  # one export, at shutdown
                "POLICYHOOK_DEMO_PASSES": "3",
                "POLICYHOOK_DEMO_INTERVAL": "0",
                "PYTHONPATH": os.pathsep.join(
                    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
                ),
            }
            result = subprocess.run(
                [sys.executable, str(DEMO_LOOP)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        metric_names: set[str] = set()
        services: set[str] = set()
        decisions: set[str] = set()
        for path, body in sink.received:
            if path == "/v1/metrics":
                request = ExportMetricsServiceRequest.FromString(body)
                for rm in request.resource_metrics:
                    services |= {
                        a.value.string_value
                        for a in rm.resource.attributes
                        if a.key == "service.name"
                    }
                    metric_names |= {m.name for sm in rm.scope_metrics for m in sm.metrics}
            elif path == "/v1/traces":
                request = ExportTraceServiceRequest.FromString(body)
                for rs in request.resource_spans:
                    for span in (s for ss in rs.scope_spans for s in ss.spans):
                        if span.name == "policyhook.guard":
                            decisions |= {
                                a.value.string_value
                                for a in span.attributes
                                if a.key == "policyhook.decision"
                            }
        assert services == {demo_env["OTEL_SERVICE_NAME"]}
        assert metric_names >= {
            "policyhook.decisions",
            "policyhook.decision.duration",
            "policyhook.region.depth",
            "policyhook.policy.reloads",
        }
        assert decisions >= {"allow", "deny", "would_deny"}, decisions


# -- README section -----------------------------------------------------------------------------


def readme_section() -> str:
    """The monitoring section of README.md, or its draft before the lead pasted it."""
    if README.exists():
        text = README.read_text(encoding="utf-8")
        match = README_HEADING.search(text)
        if match:
            rest = text[match.end() :]
            end = re.search(r"^##\s", rest, re.MULTILINE)
            return text[match.start() : match.end() + (end.start() if end else len(rest))]
    if README_DRAFT.exists() and not IN_CI:  # CI checks what ships: README.md
        return README_DRAFT.read_text(encoding="utf-8")
    if IN_CI:
        pytest.fail(
            "README.md has no '## Monitoring' section (its text: /tmp/readme-monitoring.md)"
        )
    pytest.skip("README.md has no '## Monitoring' section yet")


class TestReadme:
    def test_ports_and_urls_match_compose(self, compose: dict[str, Any]) -> None:
        """Every published port is in the README section, and no port it names is unpublished."""
        section = readme_section()
        published = {port for s in compose["services"].values() for port in published_ports(s)}
        for port in published:
            assert re.search(rf"\b{port}\b", section), f"port {port} is not documented"
        for url_port in re.findall(r"localhost:(\d+)", section):
            assert int(url_port) in published, f"README names localhost:{url_port}, unpublished"
        assert "docker compose up" in section
        assert "docker compose --profile demo up" in section

    def test_every_alert_and_panel_is_explained(self, rules: dict[str, Any]) -> None:
        """The README section names each alert and each dashboard panel."""
        section = readme_section()
        for rule in alert_rules(rules):
            assert rule["alert"] in section, f"alert {rule['alert']} is not explained"
        for path in DASHBOARDS:
            for panel in panels_of(load_dashboard(path)):
                if panel["type"] != "row":
                    assert panel["title"] in section, f"panel {panel['title']!r} not explained"
