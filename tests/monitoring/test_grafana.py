"""Grafana: provisioning, and the dashboard type-checked against @grafana/schema."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from monitoring_support import (
    DASHBOARD_PROVIDERS,
    DASHBOARDS,
    DATASOURCES,
    FIXTURES,
    GRAFANA,
    container_path,
    dashboard_exprs,
    field_links,
    host_port,
    jaeger_queries,
    load_dashboard,
    load_yaml,
    missing,
    panels_of,
    promtool_parse,
    run,
    substitute,
)


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
