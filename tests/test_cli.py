"""The `policyhook` command through its real console-script entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from policyhook import Guard, UnsafeRecompactionError

ROOT = Path(__file__).resolve().parent.parent
POLICYHOOK = str(Path(sys.executable).parent / "policyhook")
ACTIVATION = {
    "region": {
        "id": "r1",
        "kind": "summary",
        "depth": 2,
        "sources": ["cfg"],
        "live_sources": [],
        "dead_sources": ["cfg"],
        "source_kinds": ["config_read"],
        "tokens": 10,
        "chars": 40,
    },
    "request": {"trigger": "automatic", "budget_pressure": 0.9, "attempt": 1},
    "window": {"id": "w", "tokens": 0, "budget": 0, "max_depth": 2},
    "summarizer": {"name": "s", "lossless": False, "idempotent": False},
}


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [POLICYHOOK, *args], capture_output=True, text=True, input=stdin, timeout=60, check=False
    )


def test_demo_exits_zero_and_shows_the_refusal() -> None:
    """`policyhook demo` runs on embedded defaults and shows passes 3-4 refused."""
    result = cli("demo", "--no-otlp")
    assert result.returncode == 0, result.stderr
    assert "pass 3 refused" in result.stdout
    assert "never entered" in result.stdout


class TestCheck:
    def test_ok(self) -> None:
        """check on the shipped policies succeeds and names the revision."""
        result = cli("check", str(ROOT / "policies"))
        assert result.returncode == 0
        assert "1 policies ok, revision" in result.stdout

    def test_lists_every_error_and_exits_1(self, tmp_path: Path) -> None:
        """check reports all errors with file:line and exits 1; --format json too."""
        bad = tmp_path / "bad.yaml"
        bad.write_text(
            "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\nmetadata: {name: bad}\n"
            "spec:\n  mode: loud\n  rules:\n    - name: r\n      expression: region.deph > 1\n"
        )
        result = cli("check", str(bad))
        assert result.returncode == 1
        assert result.stdout.startswith("2 errors occurred:")
        assert f"{bad}:5:9: schema: policy 'bad': spec.mode must be one of" in result.stdout
        assert "did you mean 'depth'?" in result.stdout
        as_json = json.loads(cli("check", str(bad), "--format", "json").stdout)
        assert as_json["ok"] is False
        assert [(e["line"], e["code"]) for e in as_json["errors"]] == [(5, "schema"), (8, "type")]


class TestEval:
    def test_explain(self, tmp_path: Path) -> None:
        """eval decides one activation; --explain shows match, variables and each rule."""
        path = tmp_path / "in.json"
        path.write_text(json.dumps(ACTIVATION))
        result = cli("eval", str(ROOT / "policies"), "--input", str(path), "--explain")
        assert result.returncode == 0, result.stderr
        assert "decision: deny by default/live-sources" in result.stdout
        assert "variables.resummarizing = true" in result.stdout
        assert "rule live-sources: false" in result.stdout
        assert "rule resolvable-sources: true" in result.stdout

    def test_json_from_stdin_yaml(self) -> None:
        """eval reads YAML on stdin ('-') and answers in JSON."""
        import yaml

        result = cli(
            "eval",
            str(ROOT / "policies"),
            "--input",
            "-",
            "--format",
            "json",
            stdin=yaml.safe_dump(ACTIVATION),
        )
        assert json.loads(result.stdout)["decision"] == "deny"

    def test_bad_input_exits_2_naming_the_field(self, tmp_path: Path) -> None:
        """An activation with a wrong field is a usage error naming the field."""
        broken = json.loads(json.dumps(ACTIVATION))
        broken["region"]["depht"] = broken["region"].pop("depth")
        path = tmp_path / "in.json"
        path.write_text(json.dumps(broken))
        result = cli("eval", str(ROOT / "policies"), "--input", str(path))
        assert result.returncode == 2
        assert "region.depht is not a field (did you mean 'depth'?)" in result.stderr
        assert "region.depth (int) is missing" in result.stderr


class TestTest:
    def test_shipped_policy_tests_pass(self) -> None:
        """`policyhook test policies/` runs every *_test.yaml against its folder's policies."""
        result = cli("test", str(ROOT / "policies"))
        assert result.returncode == 0, result.stdout
        last = result.stdout.strip().splitlines()[-1]
        assert last.endswith("passed, 0 failed")
        assert int(last.split()[0]) >= 15

    def test_failures_show_expected_and_actual(self, tmp_path: Path) -> None:
        """A failing case prints expected vs actual and the run exits 1; skips are counted."""
        (tmp_path / "default.yaml").write_text((ROOT / "policies" / "default.yaml").read_text())
        (tmp_path / "default_test.yaml").write_text(
            "apiVersion: policyhook.dev/v1\nkind: PolicyTest\nmetadata: {name: t}\n"
            f"defaults: {json.dumps(ACTIVATION)}\n"
            "cases:\n"
            "  - name: wrong on purpose\n    input: {}\n    expect: {decision: allow}\n"
            "  - name: right\n    input: {}\n    expect: {decision: deny, rule: live-sources}\n"
            "  - name: out of scope\n    input: {summarizer: {lossless: true}}\n"
            "    expect: {decision: deny, policy: default}\n"
        )
        result = cli("test", str(tmp_path))
        assert result.returncode == 1
        assert "FAILED: " in result.stdout and "wrong on purpose" in result.stdout
        assert "expected: decision=allow" in result.stdout
        assert "actual:   decision=deny policy=default rule=live-sources" in result.stdout
        assert result.stdout.strip().splitlines()[-1] == "1 passed, 1 failed, 1 skipped"

    def test_malformed_test_file_exits_2(self, tmp_path: Path) -> None:
        """A test file with a bad case names file and line and exits 2."""
        (tmp_path / "default.yaml").write_text((ROOT / "policies" / "default.yaml").read_text())
        (tmp_path / "x_test.yaml").write_text(
            "apiVersion: policyhook.dev/v1\nkind: PolicyTest\nmetadata: {name: t}\n"
            "cases:\n  - name: c\n    input: {}\n    expect: {decision: maybe}\n"
        )
        result = cli("test", str(tmp_path))
        assert result.returncode == 2
        assert "x_test.yaml:7: cases[0].expect.decision must be one of" in result.stderr


class TestReplay:
    @pytest.fixture
    def log(self, tmp_path: Path) -> Path:
        """A decision log from real guarded calls: 3 allowed and 1 refused under the default."""
        path = tmp_path / "decisions.jsonl"
        guard = Guard(decision_log=path)
        guard.record_source("config: retry_ceiling = 7 for deploys", "config_read", "cfg")
        summarize = guard(
            lambda t: f"summary level {t.count('summary') + 1} of the config", summarizer="s"
        )
        s1 = summarize("config: retry_ceiling = 7 for deploys")
        s2 = summarize(s1)
        summarize(s2)
        guard.store.evict("cfg")
        with pytest.raises(UnsafeRecompactionError):
            summarize(s2)
        guard.close()
        return path

    def test_reports_what_would_change(self, log: Path) -> None:
        """Replaying under the strict set shows allow -> deny for the depth-2 pass, with examples."""
        result = cli("replay", str(ROOT / "policies" / "strict"), str(log), "--format", "json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["total"] == 4
        assert report["transitions"] == {"allow -> allow": 2, "allow -> deny": 1, "deny -> deny": 1}
        assert report["changed"] == 1  # the depth-2 pass; the refusal stays live-sources
        assert report["examples"][0]["new"] == {
            "decision": "deny",
            "rule": "automatic-depth-ceiling",
            "revision": report["revision"],
        }

    def test_same_policies_change_nothing(self, log: Path) -> None:
        """Replaying under the policies that made the log changes nothing."""
        result = cli("replay", str(ROOT / "policies"), str(log), "--fail-on-change")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "0 would change" in result.stdout

    def test_fail_on_change(self, log: Path) -> None:
        """--fail-on-change exits 1 when any decision would change."""
        result = cli("replay", str(ROOT / "policies" / "strict"), str(log), "--fail-on-change")
        assert result.returncode == 1

    def test_bad_log_line_exits_2(self, log: Path) -> None:
        """A corrupt line is reported with its number."""
        with log.open("a") as f:
            f.write("{not json\n")
        result = cli("replay", str(ROOT / "policies"), str(log))
        assert result.returncode == 2
        assert f"{log}:5: not a JSON record" in result.stderr


class TestDemoExport:
    @pytest.fixture
    def no_sdk(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make the OTLP setup behave as without the `otlp` extra installed."""
        from policyhook import otel

        def missing(**_: object) -> None:
            raise ImportError(
                'policyhook.otel needs the OpenTelemetry SDK: pip install "policyhook[otlp]"'
            )

        monkeypatch.setattr(otel, "configure", missing)

    def test_endpoint_in_env_without_sdk_still_runs(
        self, no_sdk: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An OTLP endpoint in the environment never makes the demo need the SDK or a server."""
        from policyhook.cli import main

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        assert main(["demo"]) == 0
        out, err = capsys.readouterr()
        assert "never entered" in out
        assert "not exporting to $OTEL_EXPORTER_OTLP_ENDPOINT" in err and "policyhook[otlp]" in err

    def test_explicit_otlp_without_sdk_is_a_usage_error(
        self, no_sdk: None, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--otlp without the SDK exits 2 and says what to install."""
        from policyhook.cli import main

        assert main(["demo", "--otlp"]) == 2
        assert 'pip install "policyhook[otlp]"' in capsys.readouterr().err


def test_version_is_the_installed_distribution_version() -> None:
    """`policyhook --version` and `policyhook.__version__` both give the package metadata version."""
    from importlib.metadata import version

    import policyhook

    assert policyhook.__version__ == version("policyhook")
    result = cli("--version")
    assert (result.returncode, result.stdout) == (0, f"policyhook {version('policyhook')}\n")
