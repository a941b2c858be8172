"""The compose `demo` service: the `policyhook demo` scenario in a loop, in one process.

`policyhook demo` in a shell loop would start a new process, and so new metric series (a new
service.instance.id), every few seconds: each series would be born and frozen within one scrape,
and Prometheus' rate() would see nothing. This keeps one process, one MeterProvider and one
TracerProvider, set up by `policyhook.otel.configure` from the standard OTEL_* variables (the
`otlp` extra) — policyhook itself uses only the OpenTelemetry API and joins them.

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
import shutil
import sys
import tempfile
import time
from pathlib import Path

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


def main() -> int:
    interval = float(os.environ.get("POLICYHOOK_DEMO_INTERVAL", "2"))
    passes = int(os.environ.get("POLICYHOOK_DEMO_PASSES", "0"))
    from policyhook.otel import configure

    telemetry = configure(service_name="policyhook-demo")  # OTEL_SERVICE_NAME wins

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
        telemetry.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
