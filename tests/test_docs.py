"""The README and docs/ stay true: the example runs, the demo output is the demo's, tables are
generated from the code, every name an operator depends on is documented, and links resolve."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from monitoring_support import (
    DASHBOARDS,
    RULES,
    alert_rules,
    load_dashboard,
    load_mapping,
    panels_of,
    published_ports,
)
from test_telemetry import DECISION_METRIC_ATTRIBUTES, SPAN_ATTRIBUTES

import policyhook
from policyhook import _telemetry as telemetry
from policyhook._activation import markdown_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = ROOT / "docs"


def doc(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def between(text: str, marker: str) -> str:
    """The text between `<!-- marker -->` and `<!-- /marker -->`."""
    return text.split(f"<!-- {marker} -->\n")[1].split(f"<!-- /{marker} -->")[0]


class TestReadme:
    def test_is_short(self) -> None:
        """The README stays a front page (at most 200 lines); the reference lives in docs/."""
        assert len(README.splitlines()) <= 200

    def test_two_setup_commands_and_ci_run_the_same_test_command(self) -> None:
        """The README's two commands exist, and .ci/run runs the README's test command."""
        assert (
            "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/policyhook demo"
            in README
        )
        assert "```sh\nbash .ci/test\n```" in README
        assert (
            'exec bash "$(dirname "${BASH_SOURCE[0]}")/test"' in (ROOT / ".ci" / "run").read_text()
        )

    def test_example_runs_and_refuses_once_the_source_is_evicted(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The 10-line example works as written, and refuses after cfg-42 is evicted."""
        monkeypatch.chdir(ROOT)
        example = re.search(r"## Example\n\n```python\n(.*?)```", README, re.S)
        assert example is not None
        code = example.group(1)
        assert len([line for line in code.splitlines() if line.strip()]) <= 10

        class FakeLLM:
            def invoke(self, prompt: str) -> str:
                return "summary: retry ceiling is 7"

        namespace = {
            "llm": FakeLLM(),
            "config_text": "config: retry_ceiling = 7",
            "turns": ["user: keep retrying the deploy"],
            "new_turns": ["user: and notify #ops"],
        }
        exec(compile(code, "README.md", "exec"), namespace)
        guard: policyhook.Guard = namespace["guard"]  # type: ignore[assignment]
        try:
            assert guard.check(namespace["s2"], summarizer="x").depth == 2
            guard.store.evict("cfg-42")
            with pytest.raises(policyhook.UnsafeRecompactionError, match="cfg-42"):
                namespace["summarize"]([namespace["s1"]])  # type: ignore[operator]
        finally:
            guard.close()

    def test_demo_output_is_what_the_demo_prints(self) -> None:
        """The README's demo block is the demo's real output (revision hashes aside)."""
        shown = between(README, "demo-output").strip().removeprefix("```text\n").removesuffix("```")
        printed = subprocess.run(
            [sys.executable, "-m", "policyhook.cli", "demo", "--no-otlp"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout

        def normal(text: str) -> str:
            return re.sub(r"revision [0-9a-f]+", "revision …", text).strip()

        assert normal(shown) == normal(printed)


class TestReference:
    def test_activation_table_is_generated_from_the_schema(self) -> None:
        """docs/policies.md's activation table is exactly activation.markdown_table()."""
        assert between(doc("policies.md"), "activation-table").strip() == markdown_table()

    def test_every_span_attribute_and_metric_is_documented(self) -> None:
        """docs/telemetry.md names every span attribute, metric and metric attribute emitted."""
        text = doc("telemetry.md")
        names = {telemetry.SPAN_NAME, telemetry.SUMMARIZE_SPAN_NAME, *SPAN_ATTRIBUTES}
        names |= {
            v
            for k, v in vars(telemetry).items()
            if k.isupper()
            and isinstance(v, str)
            and v.startswith("policyhook.")
            and not k.endswith("_ATTRIBUTE")
        }
        for name in sorted(names):
            short = name.rsplit(".", 1)[-1]
            assert name in text or f".{short}`" in text, f"{name} is not documented"
        for attribute in DECISION_METRIC_ATTRIBUTES:
            assert f"`{attribute}`" in text, f"metric attribute {attribute} is not documented"

    def test_monitoring_page_matches_compose_alerts_and_panels(self) -> None:
        """docs/monitoring.md names every published port, alert and dashboard panel, no others."""
        import yaml

        text = doc("monitoring.md")
        compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
        services = compose["services"].values()
        published = {port for s in services for port in published_ports(s)}
        # The fleet profile's stores are documented with the stores (tests/test_fleet_compose.py).
        fleet = {
            p for s in services if "fleet" in s.get("profiles", ()) for p in published_ports(s)
        }
        for port in published - fleet:
            assert re.search(rf"\b{port}\b", text), f"port {port} is not documented"
        for url_port in re.findall(r"localhost:(\d+)", text):
            assert int(url_port) in published, f"docs name localhost:{url_port}, unpublished"
        assert "docker compose up" in text
        assert "docker compose --profile demo up" in text
        for rule in alert_rules(load_mapping(RULES)):
            assert rule["alert"] in text, f"alert {rule['alert']} is not explained"
        for path in DASHBOARDS:
            for panel in panels_of(load_dashboard(path)):
                if panel["type"] != "row":
                    assert panel["title"] in text, f"panel {panel['title']!r} not explained"

    @pytest.mark.parametrize(
        "page",
        [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted(DOCS.glob("*.md"))],
        ids=lambda p: str(p.relative_to(ROOT)),
    )
    def test_relative_links_resolve(self, page: Path) -> None:
        """Every relative link of the README and docs/ points at a file of the repository."""
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"
