"""Prometheus config and alert rules: promtool check, and promtool unit tests firing every alert."""

from __future__ import annotations

from typing import Any

from monitoring_support import (
    FIXTURES,
    PROMETHEUS_CONFIG,
    PROMETHEUS_DIR,
    RULE_TESTS,
    RULES,
    alert_rules,
    host_port,
    load_yaml,
    run,
    tool,
)


class TestPrometheus:
    def test_promtool_check_config(self) -> None:
        """prometheus.yml is valid and its rule_files glob finds the policyhook rules."""
        result = run(
            [tool("promtool"), "check", "config", PROMETHEUS_CONFIG.name], cwd=PROMETHEUS_DIR
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        assert "SUCCESS: 1 rule files found" in output, output
        assert RULES.relative_to(PROMETHEUS_DIR).as_posix() in output, output

    def test_promtool_check_rules(self) -> None:
        """The alert rules parse and are valid."""
        result = run([tool("promtool"), "check", "rules", str(RULES)])
        assert result.returncode == 0, result.stdout + result.stderr

    def test_promtool_rule_unit_tests(self) -> None:
        """promtool test rules: every alert fires on synthetic series and not on healthy ones."""
        result = run([tool("promtool"), "test", "rules", RULE_TESTS.name], cwd=FIXTURES)
        assert result.returncode == 0, result.stdout + result.stderr

    def test_every_alert_has_a_firing_and_a_quiet_case(self, rules: dict[str, Any]) -> None:
        """The unit tests cover each alert both ways, and each required alert exists."""
        names = {r["alert"] for r in alert_rules(rules)}
        assert names >= {
            "PolicyhookRefusalRateSpike",
            "PolicyhookFailClosedEvaluationErrors",
            "PolicyhookPolicyReloadFailing",
            "PolicyhookDecisionLatencyHigh",
            "PolicyhookAuditWouldDeny",
            "PolicyhookUndecidedCalls",
        }
        cases = [c for t in load_yaml(RULE_TESTS)["tests"] for c in t.get("alert_rule_test", [])]
        fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
        quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
        assert names <= fires, f"alerts never shown firing: {sorted(names - fires)}"
        assert names <= quiet, f"alerts never shown quiet: {sorted(names - quiet)}"
        rule_files = load_yaml(RULE_TESTS)["rule_files"]
        assert [(FIXTURES / f).resolve() for f in rule_files] == [RULES.resolve()]

    def test_alerts_are_documented(self, rules: dict[str, Any]) -> None:
        """Every alert has a severity, a summary and a description."""
        for rule in alert_rules(rules):
            assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]

    def test_scrapes_the_collector_exporter(
        self, otelcol: dict[str, Any], compose: dict[str, Any]
    ) -> None:
        """Prometheus scrapes collector:<exporter port> with honor_labels (job = service name)."""
        config = load_yaml(PROMETHEUS_CONFIG)
        _, port = host_port(otelcol["exporters"]["prometheus"]["endpoint"])
        jobs = [
            job
            for job in config["scrape_configs"]
            for static in job.get("static_configs", [])
            if f"collector:{port}" in static["targets"]
        ]
        assert len(jobs) == 1, f"no scrape job for collector:{port}"
        assert jobs[0].get("honor_labels") is True
        assert "collector" in compose["services"]
