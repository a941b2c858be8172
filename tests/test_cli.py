"""The `policyhook` command through its real console-script entry point."""

from __future__ import annotations

import json
import os
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
    """`policyhook demo` runs on embedded defaults and shows passes 3-4 refused, then
    remedied."""
    result = cli("demo", "--no-otlp")
    assert result.returncode == 0, result.stderr
    assert "pass 3 refused" in result.stdout
    assert "never entered" in result.stdout
    assert "pass 4's summary refused (grounded-numbers)" in result.stdout  # and remedied


class TestCheck:
    def test_ok(self) -> None:
        """check on the shipped policies succeeds and names the revision."""
        result = cli("check", str(ROOT / "policies"))
        assert result.returncode == 0
        assert "2 policies ok, revision" in result.stdout  # the default and grounded-numbers

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
        """A failing case prints expected vs actual and the run exits 1; an unmatched policy fails."""
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
        assert "reason:   policy 'default' did not match this input" in result.stdout
        assert "write `matched: false`" in result.stdout
        assert result.stdout.strip().splitlines()[-1] == "1 passed, 2 failed"

    def test_unmatched_policy_passes_only_when_the_case_says_so(self, tmp_path: Path) -> None:
        """`matched: false` passes when the policy is out of scope and fails when it matched."""
        (tmp_path / "default.yaml").write_text((ROOT / "policies" / "default.yaml").read_text())
        (tmp_path / "default_test.yaml").write_text(
            "apiVersion: policyhook.dev/v1\nkind: PolicyTest\nmetadata: {name: t}\n"
            f"defaults: {json.dumps(ACTIVATION)}\n"
            "cases:\n"
            "  - name: out of scope\n    input: {summarizer: {lossless: true}}\n"
            "    expect: {decision: allow, policy: default, matched: false}\n"
            "  - name: in scope after all\n    input: {}\n"
            "    expect: {decision: deny, policy: default, matched: false}\n"
        )
        result = cli("test", str(tmp_path), "--format", "json")
        assert result.returncode == 1
        report = json.loads(result.stdout)
        assert (report["passed"], report["failed"]) == (1, 1)
        failed = report["cases"][1]
        assert failed["name"] == "in scope after all" and failed["status"] == "failed"
        assert failed["reason"] == "policy 'default' matched; the case expects it not to"
        assert failed["actual"]["matched"] is True

    def test_a_broken_match_condition_turns_the_shipped_tests_red(self, tmp_path: Path) -> None:
        """A typo that disables the default policy fails its allow cases too, not only its denials."""
        text = (ROOT / "policies" / "default.yaml").read_text()
        condition = '"!summarizer.lossless && !summarizer.idempotent"'
        broken = text.replace(condition, '"summarizer.lossless && !summarizer.lossless"')
        assert broken != text  # type-checks, and never matches
        (tmp_path / "default.yaml").write_text(broken)
        (tmp_path / "default_test.yaml").write_text(
            (ROOT / "policies" / "default_test.yaml").read_text()
        )
        result = cli("test", str(tmp_path), "--format", "json")
        assert result.returncode == 1
        report = json.loads(result.stdout)
        passed = [c["name"] for c in report["cases"] if c["status"] == "passed"]
        assert passed == [  # the output policy (grounded-numbers) has the same condition
            "lossless summarizers are out of scope",
            "idempotent summarizers are out of scope",
            "lossless summarizers' outputs are out of scope",
        ]
        assert report["failed"] == len(report["cases"]) - 3 >= 6

    @pytest.mark.parametrize(
        ("expect", "message"),
        [
            (
                "{decision: allow, matched: false}",
                "expect.matched must be true or false, with policy",
            ),
            (
                "{decision: allow, policy: default, matched: maybe}",
                "expect.matched must be true or false",
            ),
            (
                "{decision: allow, policy: default, matched: false, rule: live-sources}",
                "no rule of an unmatched policy runs",
            ),
        ],
    )
    def test_malformed_matched_exits_2(self, tmp_path: Path, expect: str, message: str) -> None:
        """`matched` needs a policy, a boolean, and no rule when false: else exit 2 naming the line."""
        (tmp_path / "default.yaml").write_text((ROOT / "policies" / "default.yaml").read_text())
        (tmp_path / "x_test.yaml").write_text(
            "apiVersion: policyhook.dev/v1\nkind: PolicyTest\nmetadata: {name: t}\n"
            f"defaults: {json.dumps(ACTIVATION)}\n"
            f"cases:\n  - name: c\n    input: {{}}\n    expect: {expect}\n"
        )
        result = cli("test", str(tmp_path))
        assert result.returncode == 2
        assert "x_test.yaml:" in result.stderr and message in result.stderr
        assert "Traceback" not in result.stderr

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

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("cases:\n  - name: c\x0b\n", "x_test.yaml:5: invalid YAML: character U+000B is not"),
            ("cases:\n  - name: c\n   expect: x\n", "x_test.yaml:6: invalid YAML: "),
        ],
    )
    def test_invalid_yaml_in_a_test_file_names_its_line(
        self, tmp_path: Path, text: str, message: str
    ) -> None:
        """A character YAML refuses (a ReaderError has no mark: it named no line) or a parse
        error: exit 2, one message naming file and line."""
        (tmp_path / "default.yaml").write_text((ROOT / "policies" / "default.yaml").read_text())
        (tmp_path / "x_test.yaml").write_text(
            "apiVersion: policyhook.dev/v1\nkind: PolicyTest\nmetadata: {name: t}\n" + text
        )
        result = cli("test", str(tmp_path))
        assert result.returncode == 2
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


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
        # the depth-2 pass, and the refusal: still live-sources, but now by the strict policy
        assert report["changed"] == 2
        assert report["examples"][0]["new"] == {
            "decision": "deny",
            "policy": "strict",
            "rule": "automatic-depth-ceiling",
            "revision": report["revision"],
        }
        assert report["examples"][0]["old"]["policy"] == ""
        assert [report["examples"][1][side]["policy"] for side in ("old", "new")] == [
            "default",
            "strict",
        ]

    def test_a_new_deciding_policy_is_a_change(self, log: Path, tmp_path: Path) -> None:
        """Same effect and rule from another policy counts as changed: replay compares the policy too."""
        renamed = (
            (ROOT / "policies" / "default.yaml")
            .read_text()
            .replace("name: default", "name: default-v2")
        )
        (tmp_path / "default.yaml").write_text(renamed)
        result = cli("replay", str(tmp_path), str(log), "--format", "json", "--fail-on-change")
        assert result.returncode == 1
        report = json.loads(result.stdout)
        assert report["transitions"] == {"allow -> allow": 3, "deny -> deny": 1}
        assert report["changed"] == 1
        example = report["examples"][0]
        assert (example["old"]["policy"], example["new"]["policy"]) == ("default", "default-v2")
        assert example["old"]["rule"] == example["new"]["rule"] == "live-sources"

    def test_same_policies_change_nothing(self, log: Path) -> None:
        """Replaying under the policies that made the log changes nothing."""
        result = cli("replay", str(ROOT / "policies"), str(log), "--fail-on-change")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "0 would change" in result.stdout

    def test_fail_on_change(self, log: Path) -> None:
        """--fail-on-change exits 1 when any decision would change."""
        result = cli("replay", str(ROOT / "policies" / "strict"), str(log), "--fail-on-change")
        assert result.returncode == 1

    def test_a_torn_log_line_is_skipped_and_reported(self, log: Path) -> None:
        """A line torn by a crash is named with its number; the whole records are replayed."""
        with log.open("a") as f:
            f.write("{not json\n")
        result = cli("replay", str(ROOT / "policies"), str(log))
        assert result.returncode == 0, result.stderr
        assert "replayed 4 decisions" in result.stdout
        assert f"1 lines could not be read (skipped):\n    {log}:5: not a JSON" in result.stdout
        result = cli("replay", str(ROOT / "policies"), str(log), "--format", "json")
        report = json.loads(result.stdout)
        assert (report["total"], report["unreadable"]) == (4, 1)
        assert report["unreadable_lines"][0].startswith(f"{log}:5: not a JSON record")


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


class TestExitCodes:
    @pytest.mark.parametrize(
        "args",
        [
            ("check", "{missing}"),
            ("eval", "{missing}", "--input", "{activation}"),
            ("test", "{missing}"),
            ("replay", "{missing}", "{activation}"),
            ("check", "{missing}", "--format", "json"),
        ],
        ids=["check", "eval", "test", "replay", "check-json"],
    )
    def test_missing_policy_path_exits_2_everywhere(
        self, tmp_path: Path, args: tuple[str, ...]
    ) -> None:
        """A policy path that does not exist is unreadable input (2) for every command, never 1."""
        activation = tmp_path / "in.json"
        activation.write_text(json.dumps(ACTIVATION))
        missing = tmp_path / "nowhere"
        result = cli(*(a.format(missing=missing, activation=activation) for a in args))
        assert result.returncode == 2, result.stdout + result.stderr
        assert str(missing) in result.stdout + result.stderr
        assert "Traceback" not in result.stderr

    def test_missing_decision_log_exits_2(self, tmp_path: Path) -> None:
        """replay of a log that does not exist names it and exits 2."""
        result = cli("replay", str(ROOT / "policies"), str(tmp_path / "none.jsonl"))
        assert result.returncode == 2
        assert "none.jsonl: no such decision log" in result.stderr

    def test_unknown_option_exits_2(self) -> None:
        """argparse's usage errors are exit 2 too."""
        assert cli("check", "--frobnicate", str(ROOT / "policies")).returncode == 2

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            (
                json.dumps(ACTIVATION).replace(
                    '"budget_pressure": 0.9', '"budget_pressure": 1e400'
                ),
                "request.budget_pressure: inf is not a finite number",
            ),
            ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ],
        ids=["1e400", "deep"],
    )
    def test_eval_of_unreadable_numbers_and_nesting_is_one_line(
        self, tmp_path: Path, text: str, message: str
    ) -> None:
        """eval with budget_pressure 1e400 or deeply nested JSON: one line on stderr, exit 2."""
        path = tmp_path / "in.json"
        path.write_text(text)
        result = cli("eval", str(ROOT / "policies"), "--input", str(path))
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [f"policyhook eval: {path}: {message}"] or (
            message in result.stderr and len(result.stderr.strip().splitlines()) == 1
        )
        assert result.stdout == ""

    def test_check_text_output_of_a_lone_surrogate(self, tmp_path: Path) -> None:
        """A policy holding a \\ud800 escape is one line naming file:line:col, exit 2, no traceback."""
        path = tmp_path / "sur.yaml"
        path.write_text(
            "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\nmetadata: {name: sur}\n"
            'spec:\n  rules:\n    - name: r\n      expression: "region.kind == \\"\\ud800\\""\n'
        )
        result = cli("check", str(path))
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stdout.splitlines() == [
            f"{path}:7:19: yaml: invalid YAML: \\ud800 is a lone surrogate, not text"
        ]
        assert result.stderr == ""

    def test_invalid_yaml_exits_2_and_policy_errors_exit_1(self, tmp_path: Path) -> None:
        """A policy file that does not parse is unreadable input (2); a parsed one with errors, 1."""
        (tmp_path / "a.yaml").write_text("apiVersion: [unclosed\n")
        result = cli("check", str(tmp_path / "a.yaml"))
        assert result.returncode == 2 and ": yaml: " in result.stdout
        (tmp_path / "b.yaml").write_text(
            "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\nmetadata: {name: b}\n"
            "spec:\n  rules:\n    - name: r\n      expression: region.deph > 1\n"
        )
        assert cli("check", str(tmp_path / "b.yaml")).returncode == 1
        assert cli("check", str(tmp_path)).returncode == 1  # one of each: a problem found

    def test_broken_pipe_exits_quietly(self) -> None:
        """A reader that goes away ends the command without a usage error or a traceback."""
        read, write = os.pipe()
        os.close(read)
        try:
            result = subprocess.run(
                [POLICYHOOK, "test", "-v", str(ROOT / "policies")],
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            os.close(write)
        assert result.stderr == ""
        assert result.returncode == 141

    def test_documented_exit_codes_are_the_defined_ones(self) -> None:
        """docs/cli.md lists exactly the codes policyhook._exit defines."""
        from policyhook._exit import Exit

        doc = (ROOT / "docs" / "cli.md").read_text()
        table = doc.split("<!-- exit-codes -->\n")[1].split("<!-- /exit-codes -->")[0]
        codes = {int(line.split("|")[1].strip(" *")) for line in table.splitlines()[2:] if line}
        assert codes == {int(code) for code in Exit}


class TestInit:
    @pytest.mark.parametrize("name", ["default", "strict", "audit-rollout"])
    def test_writes_a_set_whose_tests_pass(self, tmp_path: Path, name: str) -> None:
        """init writes the shipped set with its tests; check and test pass on it as written."""
        target = tmp_path / "new" / "policies"
        result = cli("init", str(target), "--set", name)
        assert result.returncode == 0, result.stderr
        shipped = ROOT / "policies" if name == "default" else ROOT / "policies" / name
        expected = sorted(p.name for p in shipped.glob("*.yaml"))
        assert sorted(p.name for p in target.iterdir()) == expected
        for file in target.iterdir():
            assert file.read_bytes() == (shipped / file.name).read_bytes()
        assert cli("check", str(target)).returncode == 0
        tested = cli("test", str(target))
        assert tested.returncode == 0, tested.stdout
        assert tested.stdout.strip().endswith(" passed, 0 failed")

    def test_never_overwrites(self, tmp_path: Path) -> None:
        """A folder already holding one of the files is left as it is, with exit 2 naming it."""
        (tmp_path / "default.yaml").write_text("mine\n")
        result = cli("init", str(tmp_path))
        assert result.returncode == 2
        assert f"{tmp_path / 'default.yaml'}: already there; nothing written" in result.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["default.yaml"]
        assert (tmp_path / "default.yaml").read_text() == "mine\n"

    def test_target_that_is_a_file_or_unknown_set_exits_2(self, tmp_path: Path) -> None:
        """init into a file, or of a set that is not shipped, is a usage error."""
        file = tmp_path / "f"
        file.write_text("")
        result = cli("init", str(file))
        assert result.returncode == 2 and "is not a folder" in result.stderr
        result = cli("init", str(tmp_path / "x"), "--set", "lenient")
        assert result.returncode == 2 and "invalid choice: 'lenient'" in result.stderr
        assert not (tmp_path / "x").exists()


def test_forced_audit_is_part_of_the_revision(tmp_path: Path) -> None:
    """POLICYHOOK_FORCE_AUDIT changes the revision, so decision logs tell forced-audit decisions apart."""
    path = tmp_path / "in.json"
    path.write_text(json.dumps(ACTIVATION))

    def decide(**env: str) -> dict[str, str]:
        result = subprocess.run(
            [POLICYHOOK, "eval", str(ROOT / "policies"), "--input", str(path), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env={**os.environ, **env},
        )
        decision: dict[str, str] = json.loads(result.stdout)
        return decision

    normal, forced = decide(POLICYHOOK_FORCE_AUDIT=""), decide(POLICYHOOK_FORCE_AUDIT="true")
    assert (normal["decision"], forced["decision"]) == ("deny", "would_deny")
    assert forced["revision"] == normal["revision"] + "+forced-audit"


class TestClaudeHookOptions:
    """The hooks' options are parsed in the CLI layer and answered in Claude Code's protocol."""

    SESSION = "5d1a6f0e-3b7c-4c55-9a11-0c2f4e8b9d01"  # of tests/fixtures/claude/*.jsonl

    def hook(
        self, command: str, hook_input: dict[str, str], *options: str, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [POLICYHOOK, command, *options],
            input=json.dumps(hook_input),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, **env},
        )

    def precompact_input(self, transcript: str, trigger: str = "manual") -> dict[str, str]:
        return {
            "session_id": self.SESSION,
            "transcript_path": str(ROOT / "tests" / "fixtures" / "claude" / f"{transcript}.jsonl"),
            "hook_event_name": "PreCompact",
            "trigger": trigger,
            "custom_instructions": "",
        }

    @pytest.mark.parametrize(
        ("options", "env", "error"),
        [
            (("--on-auto-refusal", "sometimes"), {}, "invalid choice: 'sometimes'"),
            (
                (),
                {"POLICYHOOK_CLAUDE_ON_AUTO_REFUSAL": "sometimes"},
                "(from $POLICYHOOK_CLAUDE_ON_AUTO_REFUSAL): invalid choice: 'sometimes'",
            ),
            ((), {"POLICYHOOK_CLAUDE_TIME_BUDGET": "soon"}, "not a number: 'soon'"),
            (("--store-synchronous", "OFF"), {}, "invalid choice: 'OFF'"),
            (
                (),
                {"POLICYHOOK_CLAUDE_STORE_SYNCHRONOUS": "off"},
                "--store-synchronous (from $POLICYHOOK_CLAUDE_STORE_SYNCHRONOUS): invalid "
                "choice: 'off' (choose from 'NORMAL', 'FULL')",
            ),
            (("--store",), {}, "expected one argument"),
        ],
    )
    def test_precompact_usage_error_is_a_fail_closed_block(
        self, tmp_path: Path, options: tuple[str, ...], env: dict[str, str], error: str
    ) -> None:
        """A bad option or option variable: exit 0 and a block saying why, never argparse's 2."""
        state = {"POLICYHOOK_CLAUDE_STORE": str(tmp_path / "s.sqlite"), **env}
        result = self.hook("claude-precompact", self.precompact_input("fresh"), *options, **state)
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert set(answer) == {"decision", "reason"} and answer["decision"] == "block"
        assert answer["reason"].startswith("policyhook could not decide")
        assert "bad command line: argument " in answer["reason"]
        assert error in answer["reason"] and error in result.stderr
        assert not (tmp_path / "s.sqlite").exists()  # nothing was opened

    def test_precompact_defaults_come_from_the_environment(self, tmp_path: Path) -> None:
        """$POLICYHOOK_CLAUDE_STORE and $POLICYHOOK_CLAUDE_ON_AUTO_REFUSAL stand in for options."""
        store = tmp_path / "env.sqlite"
        env = {"POLICYHOOK_CLAUDE_STORE": str(store), "POLICYHOOK_GROUNDING_DIR": str(tmp_path)}
        refused = self.precompact_input("resumed", trigger="auto")
        pinned = self.hook("claude-precompact", refused, **env)
        assert pinned.returncode == 0 and "systemMessage" in json.loads(pinned.stdout)
        assert store.is_file()
        env["POLICYHOOK_CLAUDE_ON_AUTO_REFUSAL"] = "block"
        blocked = self.hook("claude-precompact", refused, **env)
        answer = json.loads(blocked.stdout)
        assert answer["decision"] == "block"
        assert answer["reason"].startswith("policyhook kept the context as it is")

    @pytest.mark.parametrize(
        ("options", "env", "level"),
        [
            ((), {}, 1),
            (("--store-synchronous", "FULL"), {}, 2),
            ((), {"POLICYHOOK_CLAUDE_STORE_SYNCHRONOUS": "FULL"}, 2),
            (("--store-synchronous", "NORMAL"), {"POLICYHOOK_CLAUDE_STORE_SYNCHRONOUS": "FULL"}, 1),
        ],
    )
    def test_precompact_store_synchronous_is_the_stores(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        options: tuple[str, ...],
        env: dict[str, str],
        level: int,
    ) -> None:
        """--store-synchronous FULL (or its variable) is SQLite's on the hook's store
        connection: an archived original survives a power loss (the hook takes no URL)."""
        import io

        from policyhook import cli as policyhook_cli
        from policyhook.adapters import claude_code
        from policyhook.stores import SQLiteStore

        levels: list[int] = []

        class Recording(SQLiteStore):
            def close(self) -> None:
                levels.append(self._db.execute("PRAGMA synchronous").fetchone()[0])
                super().close()

        monkeypatch.setattr(claude_code, "SQLiteStore", Recording)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(self.precompact_input("fresh"))))
        state = ("--store", str(tmp_path / "s.sqlite"), "--state-dir", str(tmp_path))
        code = policyhook_cli.main(["claude-precompact", *state, *options])
        assert code == 0 and levels == [level]

    def test_postcompact_usage_error_is_a_non_blocking_error(self, tmp_path: Path) -> None:
        """claude-postcompact runs after the compaction: a bad option exits 1, the reason on
        stderr (Claude Code shows it), never 2."""
        start = {"session_id": "s", "hook_event_name": "SessionStart", "source": "compact"}
        result = self.hook("claude-postcompact", start, "--state-dir")
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr.startswith("policyhook claude-postcompact: bad command line:")
        assert "--state-dir: expected one argument" in result.stderr

    def test_postcompact_state_dir_comes_from_the_environment(self, tmp_path: Path) -> None:
        """$POLICYHOOK_GROUNDING_DIR is where a failed check is noted for the next window."""
        post = {
            "session_id": "s",
            "transcript_path": str(tmp_path / "missing.jsonl"),
            "hook_event_name": "PostCompact",
            "trigger": "auto",
            "compact_summary": "retries capped at 5",
        }
        result = self.hook("claude-postcompact", post, POLICYHOOK_GROUNDING_DIR=str(tmp_path))
        assert result.returncode == 1 and "cannot read transcript" in result.stderr
        (state,) = tmp_path.glob("*.json")
        assert "cannot read transcript" in json.loads(state.read_text())["pending"]["error"]

    @pytest.mark.parametrize(
        ("command", "option"),
        [("claude-precompact", "--time-budget"), ("claude-postcompact", "--state-dir")],
    )
    def test_help_exits_0(self, command: str, option: str) -> None:
        result = cli(command, "--help")
        assert result.returncode == 0 and option in result.stdout
