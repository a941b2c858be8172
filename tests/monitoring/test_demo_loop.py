"""collector/demo/loop.py, the compose `demo` profile's load generator, against an OTLP sink."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from monitoring_support import DEMO_LOOP, ROOT
from test_telemetry import OtlpReceiver  # the loopback OTLP/HTTP receiver the telemetry tests use


class TestDemoLoop:
    def test_exports_decisions_over_otlp(self, compose: dict[str, Any], tmp_path: Path) -> None:
        """collector/demo/loop.py, as compose runs it, exports spans and all metrics via OTLP,
        and leaves no file behind (its policy folder is a temporary one)."""
        pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        demo_env = compose["services"]["demo"]["environment"]
        sink = OtlpReceiver()
        try:
            env = {
                **os.environ,
                **{k: str(v) for k, v in demo_env.items() if k.startswith("OTEL_")},
                "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                "OTEL_METRIC_EXPORT_INTERVAL": "60000",  # one export, at shutdown
                "POLICYHOOK_DEMO_PASSES": "3",
                "POLICYHOOK_DEMO_INTERVAL": "0",
                "TMPDIR": str(tmp_path),
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
        finally:
            sink.close()
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert list(tmp_path.iterdir()) == []
        metric_names: set[str] = set()
        services: set[str] = set()
        decisions: set[str] = set()
        for path, body in ((r.path, r.body) for r in sink.requests):
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
