"""docker-compose.yml: the compose-spec schema, services, ports, mounts and hostnames."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from monitoring_support import (
    COMPOSE,
    DASHBOARD_PROVIDERS,
    DATASOURCES,
    DEMO_LOOP,
    OTELCOL_CONFIG,
    PROMETHEUS_CONFIG,
    ROOT,
    RULES,
    bind_mounts,
    container_path,
    published_ports,
    run,
    tool,
)


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
