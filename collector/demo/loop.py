"""The compose `demo` service: the `policyhook demo` scenario in a loop, in one process.

`policyhook demo` in a shell loop would start a new process, and so new metric series (a new
service.instance.id), every few seconds: each series would be born and frozen within one scrape,
and Prometheus' rate() would see nothing. This keeps one process, one MeterProvider and one
TracerProvider set up from the standard OTEL_* variables with the OTLP/HTTP exporters (the `otlp`
extra) — policyhook itself uses only the OpenTelemetry API and joins them.

Each pass runs the demo scenario twice: under the embedded default policy (grants, and the
laundering pass refused) and under an audit-mode policy from files (the same refusals reported as
would_deny, the call going through). Every 20 passes the policy file changes (a successful hot
reload, new revision); every 60 passes a broken file is written for one pass (a failed reload
that keeps the last good revision), so every panel and alert of the dashboard has data.

Environment: POLICYHOOK_DEMO_INTERVAL (seconds between passes, default 2), POLICYHOOK_DEMO_PASSES
(stop after that many passes, default 0 = run until stopped), POLICYHOOK_STORE (a store URL such
as postgresql://... or redis://...: every pass of every worker shares that store; the compose
`fleet` profile runs two workers on one).
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

AUDIT_POLICY = """\
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata:
  name: shadow-live-sources
spec:
  description: "Shadow rollout of the default rule (edit {edit}): no summary of dead sources."
  mode: audit
  rules:
    - name: live-sources
      expression: region.kind != "summary" || size(region.dead_sources) == 0
      message: re-summarizing a summary whose sources are no longer in any store
"""
BROKEN_POLICY = """\
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata:
  name: broken
spec:
  rules:
    - name: unfinished
      expression: region.depth <=
"""


def setup_telemetry() -> tuple[TracerProvider, MeterProvider]:
    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "policyhook-demo"}
    )
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    meter_provider = MeterProvider(
        resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]
    )
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    return tracer_provider, meter_provider


def main() -> int:
    interval = float(os.environ.get("POLICYHOOK_DEMO_INTERVAL", "2"))
    passes = int(os.environ.get("POLICYHOOK_DEMO_PASSES", "0"))
    tracer_provider, meter_provider = setup_telemetry()

    import policyhook  # after the providers: nothing depends on it, but it reads clearly
    from policyhook._demo import run
    from policyhook.stores import open_store

    url = os.environ.get("POLICYHOOK_STORE")
    store = open_store(url) if url else None  # None: each guard keeps its own, in memory

    folder = Path(tempfile.mkdtemp(prefix="policyhook-demo-"))
    audit, broken = folder / "shadow.yaml", folder / "broken.yaml"
    audit.write_text(AUDIT_POLICY.format(edit=0), encoding="utf-8")
    reloader = policyhook.Guard.from_path(folder, reload_interval=0)  # reloads counted here
    number = 0
    try:
        while passes <= 0 or number < passes:
            number += 1
            out = sys.stdout if number == 1 else io.StringIO()
            if broken.exists():
                broken.unlink()
                reloader.reload()  # success: back to a good set
            if number % 20 == 1:
                audit.write_text(AUDIT_POLICY.format(edit=number), encoding="utf-8")
                reloader.reload()  # success: new revision
            run(out, policyhook.Guard(store=store))  # enforced default policy: the refusal raises
            shadow = policyhook.Guard.from_path(folder, reload_interval=0, store=store)
            try:
                run(out, shadow)  # audit mode: the same refusal becomes would_deny
            finally:
                shadow.close()
            if number % 60 == 2:
                broken.write_text(BROKEN_POLICY, encoding="utf-8")
                reloader.reload()  # failure: the last good revision stays in force
            if number == 1:
                print(
                    f"policyhook demo loop: a pass every {interval}s, exporting to "
                    f"{os.environ.get('OTEL_EXPORTER_OTLP_ENDPOINT', 'the OTLP default')}",
                    flush=True,
                )
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        reloader.close()
        tracer_provider.shutdown()
        meter_provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
