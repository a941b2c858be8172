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

This module holds the paths and helpers the monitoring tests share."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from servers import missing as _missing

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
#: Labels Prometheus or the collector's exporter put on every series, whatever the app sent.
TARGET_LABELS = {"job", "instance"}


def missing(what: str) -> None:
    """A tool this check needs is absent: a failure in CI, a skip elsewhere."""
    _missing(what, "bash .ci/test installs it")


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
