"""One call to set up OpenTelemetry export for a process that has none: `configure()`.

`configure_from_environment()` is the same for commands that export only when the environment
names an endpoint (`policyhook demo`, the Claude Code hooks). This module is the one place that
reads the OTLP environment and builds exporters.

The guard itself uses only the OpenTelemetry API (`policyhook._telemetry`) and joins whatever the
host application configured. This module is for hosts that configured nothing: it builds the SDK's
TracerProvider (BatchSpanProcessor) and MeterProvider (PeriodicExportingMetricReader), both
exporting over OTLP, and makes them global. It is the only module of the package that imports the
SDK, lazily, so the SDK stays an optional dependency (`pip install "policyhook[otlp]"`).

A collector that is down must never slow a summarize call nor stall the process on its way out.
Spans and metric points are handed to background threads, so calls never wait on the network. What
bounds the rest, in opentelemetry-sdk 1.45: each OTLP export gives up after `export_timeout`
seconds (retries with backoff 1 s, 2 s, ... only while they fit in it); the providers' own shutdown
waits up to 30 s, and the SDK's exit hook runs it, so here the exit hooks are replaced by
`Setup.shutdown`, which waits at most `export_timeout + 1` seconds and then shuts the exporters
down under the still-running flush (that interrupts their backoff) and returns.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

_logger = logging.getLogger(__name__)

PROTOCOLS = ("http/protobuf", "grpc")
#: Setting any of these asks a short-lived command (the demo, the Claude Code hooks) to export.
ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
_INSTALL_HINT = 'policyhook.otel needs the OpenTelemetry SDK: pip install "policyhook[otlp]"'


@dataclass
class Setup:
    """What `configure` set up: the two providers, and a bounded `shutdown` for both."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    protocol: str
    export_timeout: float
    #: Exporters, shut down directly when a flush overruns the shutdown bound.
    exporters: tuple[Any, ...] = ()
    is_global: bool = False
    _done: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def force_flush(self, timeout: float | None = None) -> bool:
        """Export what is buffered now; False when that did not finish within `timeout` s."""
        limit = self.export_timeout + 1.0 if timeout is None else timeout
        return _bounded(
            [
                lambda: self.tracer_provider.force_flush(int(limit * 1000)),
                lambda: self.meter_provider.force_flush(int(limit * 1000)),
            ],
            limit,
            "flush",
        )

    def shutdown(self, timeout: float | None = None) -> bool:
        """Flush and stop both providers, taking at most `timeout` s (default export_timeout + 1).

        With the collector down the last batches are dropped, with a warning, rather than waited
        for. Safe to call twice; also registered to run at interpreter exit. Returns False when
        the bound was hit.
        """
        with self._lock:
            if self._done:
                return True
            self._done = True
        limit = self.export_timeout + 1.0 if timeout is None else timeout
        finished = _bounded(
            [
                self.tracer_provider.shutdown,
                lambda: self.meter_provider.shutdown(timeout_millis=limit * 1000),
            ],
            limit,
            "shutdown",
        )
        if not finished:
            for exporter in self.exporters:  # interrupts retry backoff; later exports fail fast
                try:
                    exporter.shutdown()
                except Exception:
                    _logger.debug("policyhook: exporter shutdown failed", exc_info=True)
            _logger.warning(
                "policyhook: telemetry export did not finish within %.1fs (collector down?); "
                "dropping what was not exported",
                limit,
            )
        return finished


def _bounded(steps: list[Callable[[], object]], limit: float, what: str) -> bool:
    """Run `steps` in parallel daemon threads; True when all finished within `limit` seconds."""

    def run(step: Callable[[], object]) -> None:
        try:
            step()
        except Exception:
            _logger.warning("policyhook: telemetry %s failed", what, exc_info=True)

    threads = [
        threading.Thread(target=run, args=(step,), name=f"policyhook-otel-{what}", daemon=True)
        for step in steps
    ]
    deadline = time.monotonic() + limit
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)


def configure(
    service_name: str | None = None,
    *,
    protocol: str | None = None,
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    resource_attributes: Mapping[str, str] | None = None,
    export_timeout: float = 2.0,
    metric_export_interval: float | None = None,
    traces: bool | None = None,
    metrics: bool | None = None,
    set_global: bool = True,
) -> Setup:
    """Set up OTLP export of spans and metrics; returns a `Setup` whose `shutdown()` to call.

    Arguments override the standard OpenTelemetry environment variables, which apply otherwise:

    - `protocol`: "http/protobuf" (default) or "grpc"; else OTEL_EXPORTER_OTLP_PROTOCOL.
    - `endpoint`: the collector's base URL, e.g. "http://collector:4318" ("/v1/traces" and
      "/v1/metrics" are added for HTTP); else OTEL_EXPORTER_OTLP_ENDPOINT and its per-signal
      forms, else localhost:4318 (HTTP) or localhost:4317 (gRPC).
    - `headers`: sent with every export; else OTEL_EXPORTER_OTLP_HEADERS.
    - `service_name` is a default: OTEL_SERVICE_NAME, or service.name in
      OTEL_RESOURCE_ATTRIBUTES, wins, so an operator can rename a service without code.
      `resource_attributes` are merged under OTEL_RESOURCE_ATTRIBUTES likewise.
    - `metric_export_interval` (seconds); else OTEL_METRIC_EXPORT_INTERVAL (ms), else 60 s.
    - `traces` / `metrics`: False exports no spans / no metrics (a trace-only backend such as
      Phoenix); else OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER=none, else both are exported.
    - `export_timeout` (seconds) bounds every export and, plus one second, `shutdown()`.
      OTEL_EXPORTER_OTLP_TIMEOUT is not read: bounding the wait is this helper's point.
    - `set_global`: make the providers global, so every guard without explicit providers (and
      every other instrumented library) uses them. If the host already set global providers,
      they are kept, a warning says so, and the returned providers are for explicit use.
    """
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc

    protocol = _protocol(protocol)
    if not 0 < export_timeout < math.inf:  # (NaN passes `<= 0`)
        raise ValueError(f'"export_timeout" must be > 0 seconds: {export_timeout!r}')
    if metric_export_interval is not None and not 0 < metric_export_interval < math.inf:
        raise ValueError(
            f'"metric_export_interval" must be > 0 seconds: {metric_export_interval!r}'
        )
    defaults = dict(resource_attributes or {})
    service_name = service_name or defaults.pop(SERVICE_NAME, None)
    environment = Resource.create()  # OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME, SDK's own
    if service_name and not _service_name_from_env():
        environment = environment.merge(Resource({SERVICE_NAME: service_name}))
    resource = Resource(defaults).merge(environment)  # the environment wins over defaults

    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    readers = []
    exporters: list[Any] = []
    if _enabled(traces, "OTEL_TRACES_EXPORTER"):
        span_exporter = _exporter("traces", protocol, endpoint, headers, export_timeout)
        exporters.append(span_exporter)
        tracer_provider.add_span_processor(
            BatchSpanProcessor(span_exporter, export_timeout_millis=export_timeout * 1000)
        )
    if _enabled(metrics, "OTEL_METRICS_EXPORTER"):
        metric_exporter = _exporter("metrics", protocol, endpoint, headers, export_timeout)
        exporters.append(metric_exporter)
        interval = metric_export_interval * 1000 if metric_export_interval is not None else None
        readers.append(
            PeriodicExportingMetricReader(
                metric_exporter,
                export_interval_millis=interval,
                export_timeout_millis=export_timeout * 1000,
            )
        )
    meter_provider = MeterProvider(
        resource=resource, metric_readers=readers, shutdown_on_exit=False
    )
    setup = Setup(
        tracer_provider,
        meter_provider,
        protocol,
        export_timeout,
        exporters=tuple(exporters),
    )
    if set_global:
        setup.is_global = _make_global(tracer_provider, meter_provider)
    atexit.register(setup.shutdown)
    return setup


def endpoint_from_environment() -> str | None:
    """The first OTLP endpoint variable set (its name), or None: the operator asked for none."""
    return next((name for name in ENDPOINT_VARIABLES if os.environ.get(name, "").strip()), None)


def configure_from_environment(service_name: str) -> Setup | None:
    """`configure(service_name)` when the environment names an OTLP endpoint, else None.

    For commands that export only when asked: a process run by another (a hook, the demo) is
    configured by its environment, and with no endpoint set it must not try localhost. Raises
    what `configure` raises (ImportError without the SDK); the caller decides whether that is
    an error or a note.
    """
    if endpoint_from_environment() is None:
        return None
    return configure(service_name=service_name)


def _protocol(protocol: str | None) -> str:
    chosen = (
        protocol or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip() or "http/protobuf"
    ).lower()
    if chosen == "http":
        chosen = "http/protobuf"
    if chosen not in PROTOCOLS:
        raise ValueError(f'"protocol" must be one of {", ".join(PROTOCOLS)}: {chosen!r}')
    return chosen


def _enabled(argument: bool | None, variable: str) -> bool:
    if argument is not None:
        return argument
    return os.environ.get(variable, "otlp").strip().lower() != "none"


def _service_name_from_env() -> bool:
    if os.environ.get("OTEL_SERVICE_NAME", "").strip():
        return True
    pairs = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    return any(p.split("=", 1)[0].strip() == "service.name" for p in pairs if "=" in p)


def _exporter(
    signal: str,
    protocol: str,
    endpoint: str | None,
    headers: Mapping[str, str] | None,
    timeout: float,
) -> Any:
    """The OTLP exporter of `signal` ("traces" | "metrics"), giving up after `timeout` s."""
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc import metric_exporter as grpc_metrics
            from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc_traces

            grpc_class = (
                grpc_traces.OTLPSpanExporter
                if signal == "traces"
                else grpc_metrics.OTLPMetricExporter
            )
            grpc_headers = dict(headers) if headers is not None else None
            return grpc_class(endpoint=endpoint, headers=grpc_headers, timeout=timeout)
        from opentelemetry.exporter.otlp.proto.http import metric_exporter as http_metrics
        from opentelemetry.exporter.otlp.proto.http import trace_exporter as http_traces
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc

    http_class = (
        http_traces.OTLPSpanExporter if signal == "traces" else http_metrics.OTLPMetricExporter
    )
    url = f"{endpoint.rstrip('/')}/v1/{signal}" if endpoint else None
    return http_class(endpoint=url, headers=headers, timeout=timeout)


def _make_global(tracer_provider: TracerProvider, meter_provider: MeterProvider) -> bool:
    """Install both providers globally unless the host already did; True when installed."""
    current_tracer = trace.get_tracer_provider()
    current_meter = metrics.get_meter_provider()
    tracer_free = isinstance(current_tracer, trace.ProxyTracerProvider)
    meter_free = type(current_meter).__name__ == "_ProxyMeterProvider"
    if tracer_free:
        trace.set_tracer_provider(tracer_provider)
    if meter_free:
        metrics.set_meter_provider(meter_provider)
    if not (tracer_free and meter_free):
        _logger.warning(
            "policyhook: global OpenTelemetry providers were already set; kept them. Pass "
            "tracer_provider= and meter_provider= from configure() to Guard(...) to use these."
        )
    return tracer_free and meter_free
