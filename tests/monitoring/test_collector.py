"""collector/otel-collector.yaml: receivers, pipelines and exporters wired as the stack needs."""

from __future__ import annotations

from typing import Any

from monitoring_support import host_port, published_ports


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
