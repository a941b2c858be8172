"""The policy format and engine: every load error with its message, and decision semantics."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from policyhook import PolicyError
from policyhook import _policy as engine
from policyhook._cel import MAX_EXPRESSION_CHARS
from policyhook._loader import compile_sources, load
from policyhook._policy import Decision, PolicySet

Compile = Callable[..., PolicySet]


def policy(
    rules: str,
    *,
    name: str = "p",
    spec: str = "",
) -> str:
    return (
        "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\n"
        f"metadata:\n  name: {name}\nspec:\n{spec}  rules:\n{rules}"
    )


RULE_OK = "    - name: ok\n      expression: region.depth < 10\n"


def activation(**region: Any) -> dict[str, Any]:
    base = {
        "id": "r1",
        "kind": "summary",
        "depth": 1,
        "sources": ["a"],
        "live_sources": ["a"],
        "dead_sources": [],
        "source_kinds": ["config_read"],
        "tokens": 10,
        "chars": 40,
    }
    return {
        "region": {**base, **region},
        "request": {"trigger": "automatic", "budget_pressure": 0.5, "attempt": 1},
        "window": {"id": "w", "tokens": 0, "budget": 0, "max_depth": 1},
        "summarizer": {"name": "s", "lossless": False, "idempotent": False},
    }


def load_error(compile_policy: Compile, text: str) -> str:
    with pytest.raises(PolicyError) as raised:
        compile_policy(text, name="p.yaml")
    return str(raised.value)


class TestLoadErrors:
    def test_invalid_yaml_names_file_and_line(self, compile_policy: Compile) -> None:
        """Broken YAML reports file:line:column and the parser's problem."""
        text = policy(RULE_OK) + "  bad: [unclosed\n"
        message = load_error(compile_policy, text)
        assert message.startswith("p.yaml:10:")
        assert "invalid YAML" in message

    def test_duplicate_yaml_key(self, compile_policy: Compile) -> None:
        """A key given twice is an error, not a silent override."""
        message = load_error(
            compile_policy, policy(RULE_OK, spec="  mode: audit\n  mode: enforce\n")
        )
        assert "duplicate key 'mode'" in message

    def test_bad_cel_names_file_policy_rule_and_position(self, compile_policy: Compile) -> None:
        """A CEL syntax error names file, line/column in the file, policy, rule and shows a caret."""
        rules = "    - name: broken\n      expression: region.depth >= \n"
        message = load_error(compile_policy, policy(rules))
        assert "p.yaml:8:" in message
        assert "policy 'p' rule 'broken'" in message
        assert "expression line 1, column" in message
        assert "^" in message

    def test_block_scalar_positions_point_into_the_file(self, compile_policy: Compile) -> None:
        """An error on the second line of a block-scalar expression is located on that file line."""
        rules = "    - name: multi\n      expression: >-\n        region.depth > 1\n        && regoin.kind == 'x'\n"
        message = load_error(compile_policy, policy(rules))
        assert message.startswith("p.yaml:10:12:")  # `regoin` on the block's second line
        assert "unknown variable 'regoin' (did you mean 'region'?)" in message

    def test_unknown_field_with_hint(self, compile_policy: Compile) -> None:
        """A misspelt field fails at load with the closest declared name."""
        rules = "    - name: typo\n      expression: size(region.dead_source) == 0\n"
        message = load_error(compile_policy, policy(rules))
        assert "region has no field 'dead_source' (did you mean 'dead_sources'?)" in message

    def test_undefined_variable(self, compile_policy: Compile) -> None:
        """variables.x must be defined (before use) in the same policy."""
        rules = "    - name: v\n      expression: variables.missing\n"
        spec = "  variables:\n    - name: present\n      expression: 'true'\n"
        message = load_error(compile_policy, policy(rules, spec=spec))
        assert "variables.missing is not defined" in message

    def test_variable_used_before_definition(self, compile_policy: Compile) -> None:
        """A variable may only use variables defined above it."""
        spec = (
            "  variables:\n    - name: a\n      expression: variables.b\n"
            "    - name: b\n      expression: 'true'\n"
        )
        assert "variables.b is not defined" in load_error(
            compile_policy, policy(RULE_OK, spec=spec)
        )

    @pytest.mark.parametrize(
        ("expression", "expected"),
        [
            (
                "request.budget_pressure > 0",
                "cannot compare request.budget_pressure (double) with int (int); CEL does not compare int, uint and double",
            ),
            ('region.depth == "2"', "cannot compare region.depth (int) with string (string)"),
            (
                "summarizer.lossless == 1",
                "cannot compare summarizer.lossless (bool) with int (int)",
            ),
        ],
    )
    def test_incompatible_comparison(
        self, compile_policy: Compile, expression: str, expected: str
    ) -> None:
        """Comparisons the engine can type are checked at load, not at 3 a.m."""
        rules = f"    - name: cmp\n      expression: '{expression}'\n"
        assert expected in load_error(compile_policy, policy(rules))

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            (
                policy(RULE_OK, spec="  mdoe: audit\n"),
                "unknown key spec.mdoe (did you mean 'mode'?)",
            ),
            (
                policy(RULE_OK + "      mesage: x\n"),
                "unknown key spec.rules[0].mesage (did you mean 'message'?)",
            ),
            (policy(RULE_OK) + "extra: 1\n", "unknown key document.extra"),
            (
                policy(RULE_OK, spec="  mode: enforcing\n"),
                "spec.mode must be one of enforce, audit, warn",
            ),
            (
                policy(RULE_OK, spec="  failurePolicy: ignore\n"),
                "spec.failurePolicy must be deny or allow",
            ),
            (policy(RULE_OK, name="Bad_Name!"), "metadata.name 'Bad_Name!' must be lowercase"),
            (
                policy(RULE_OK).replace("policyhook.dev/v1", "v2"),
                "apiVersion must be 'policyhook.dev/v1'",
            ),
            (
                policy(RULE_OK).replace("CompactionPolicy", "Policy"),
                "kind must be 'CompactionPolicy'",
            ),
            (policy("    - expression: 'true'\n"), "spec.rules[0].name is required"),
            (policy("    - name: x\n"), "spec.rules[0].expression is required"),
            (policy(RULE_OK + RULE_OK), "spec.rules[1].name 'ok' is used twice"),
            (
                policy("    []\n").replace("rules:\n    []", "rules: []"),
                "spec.rules must list at least one rule",
            ),
            (
                policy("    - name: x\n      expression: 42\n"),
                "spec.rules[0].expression must be a non-empty string",
            ),
            (
                "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\nmetadata: {}\nspec: {rules: []}\n",
                "metadata.name is required",
            ),
            ("- just a list\n", "document must be a mapping"),
            (
                policy(RULE_OK, spec="  matchConditions: {a: b}\n"),
                "spec.matchConditions must be a list",
            ),
            (
                policy(RULE_OK, spec="  matchConditions:\n    - expression: 'true'\n"),
                "spec.matchConditions[0].name is required",
            ),
            (
                policy(
                    RULE_OK,
                    spec="  matchConditions:\n    - {name: a, expression: 'true', when: x}\n",
                ),
                "unknown key spec.matchConditions[0].when",
            ),
            (
                policy(
                    RULE_OK,
                    spec="  variables:\n    - {name: a, expression: 'true'}\n    - {name: a, expression: 'true'}\n",
                ),
                "spec.variables[1].name 'a' is used twice",
            ),
            (
                policy(
                    RULE_OK, spec="  variables:\n    - {name: not-an-ident, expression: 'true'}\n"
                ),
                "must be an identifier",
            ),
            (policy(RULE_OK + "      message: [1]\n"), "spec.rules[0].message must be a string"),
            (
                policy(RULE_OK).replace("  name: p\n", "  name: p\n  owner: me\n"),
                "unknown key metadata.owner",
            ),
            (
                policy(RULE_OK, spec="  rules: 3\n").replace("  rules:\n" + RULE_OK, ""),
                "spec.rules must be a list",
            ),
            (
                "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\nmetadata: {name: p}\nspec: 3\n",
                "spec must be a mapping",
            ),
        ],
    )
    def test_schema_errors(self, compile_policy: Compile, text: str, expected: str) -> None:
        """Each schema violation is an error with a message saying what is wrong (unknown keys too)."""
        assert expected in load_error(compile_policy, text)

    @pytest.mark.parametrize(
        ("text", "position", "message"),
        [
            (  # a space lost after `name:` (found by tests/test_fuzz.py at 10x its budget)
                policy(RULE_OK).replace("  name: p\n", "  name:p\n"),
                "p.yaml:4:3:",
                "metadata must be a mapping, got str",
            ),
            (
                "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\nmetadata: {name: p}\nspec: 3\n",
                "p.yaml:4:7:",
                "spec must be a mapping, got int",
            ),
            (
                policy("    - just a string\n"),
                "p.yaml:7:5:",
                "spec.rules[0] must be a mapping, got str",
            ),
            (
                policy(RULE_OK, spec="  variables:\n    - 42\n"),
                "p.yaml:7:5:",
                "spec.variables[0] must be a mapping, got int",
            ),
        ],
    )
    def test_a_scalar_where_a_mapping_belongs_is_named_with_its_line(
        self, compile_policy: Compile, text: str, position: str, message: str
    ) -> None:
        """A scalar or list remembers no position of its own: the error names where it stands,
        by the key holding it (it had no line at all, so an editor could not jump to it)."""
        error = load_error(compile_policy, text)
        assert error.startswith(position) and message in error, error

    def test_every_error_is_listed(self, compile_policy: Compile) -> None:
        """All problems are reported together, sorted by position, not just the first."""
        rules = (
            "    - name: a\n      expression: region.nope\n"
            "    - name: b\n      expression: window.tokenz > 1\n"
        )
        message = load_error(compile_policy, policy(rules, spec="  mode: loud\n"))
        assert message.startswith("3 errors occurred:")
        assert message.index("spec.mode") < message.index("nope") < message.index("tokenz")

    def test_duplicate_policy_names_across_files(self, backend: Any) -> None:
        """Policy names are unique across the whole set."""
        with pytest.raises(PolicyError, match=r"policy name 'p' is already used in a\.yaml"):
            compile_sources(
                [("a.yaml", policy(RULE_OK)), ("b.yaml", policy(RULE_OK))], backend=backend
            )

    def test_expression_size_is_bounded(self, compile_policy: Compile) -> None:
        """An over-long expression is refused at load."""
        long = " || ".join(["region.depth == 1"] * 300)
        assert len(long) > MAX_EXPRESSION_CHARS
        message = load_error(
            compile_policy, policy(f"    - name: big\n      expression: '{long}'\n")
        )
        assert f"over {MAX_EXPRESSION_CHARS}" in message

    def test_nesting_is_bounded(self, compile_policy: Compile) -> None:
        """Deeply nested parentheses are refused at load."""
        deep = "(" * 60 + "true" + ")" * 60
        message = load_error(
            compile_policy, policy(f"    - name: deep\n      expression: '{deep}'\n")
        )
        assert "nests" in message

    def test_missing_path(self, tmp_path: Path) -> None:
        """Loading a path that does not exist says so."""
        with pytest.raises(PolicyError, match="no such file or directory"):
            load(tmp_path / "nope")

    def test_empty_folder(self, tmp_path: Path) -> None:
        """A folder without policy files is an error, not an empty (allow-all) set."""
        with pytest.raises(PolicyError, match=r"no policy files \(\*.yaml\) found"):
            load(tmp_path)


class TestTypeCheck:
    """Expressions are type-checked against the activation at load, the same with every backend."""

    @pytest.mark.parametrize(
        ("expression", "expected"),
        [
            ("sizee(region.sources) > 0", "unknown function 'sizee' (did you mean 'size'?)"),
            ("region.sources.alll(s, true)", "unknown method 'alll' (did you mean 'all'?)"),
            ("region.depth + 1", "spec.rules[0].expression must give a bool, but gives int"),
            ("region.kind", "must give a bool, but gives string"),
            ("size(region.sources) > 0.5", "cannot compare size(region.sources) (int) with double"),
            ("region.depth == 1.0", "cannot compare region.depth (int) with double (double)"),
            ("region.depth + 1.5 > 2.0", "no '+' for region.depth (int) and double (double)"),
            ('region.depth + "x" == "x"', "no '+' for region.depth (int) and string (string)"),
            ("region.nope == 1", "region has no field 'nope'"),
            ("has(region.nope)", "region has no field 'nope'"),
            ("region.depth.x == 1", "region.depth (int) has no fields"),
            ("region.sources[1.0] == 'a'", "a list index must be an int"),
            ("region.sources.all(s, s)", "the condition of all() needs a bool"),
            ("region.sources.all(s, s > 1)", "cannot compare s (string) with int (int)"),
            ("'a' in region.depth", "'in' needs a list or map on its right"),
            ("1 in region.sources", "cannot look for int (int) in region.sources"),
            ("region.depth > 1 ? 'a' : 1", "the branches of ?: have different types"),
            ("!region.depth", "! needs a bool, got region.depth (int)"),
            ("region.depth && true", "&& needs a bool"),
            ("region.kind.startsWith(1)", "no overload of startsWith() takes (string, int)"),
            ("int(region.sources) > 0", "no overload of int() takes (list(string))"),
            ("dyn(region.depth) < 1.5", "has no static type"),
            (
                "string(request.budget_pressure) == '0.5'",
                "string() of a double is written differently",
            ),
            ("[1, 'a'][0] == 1", "has no static type"),
            ("Foo{a: 1} == null", "message construction"),
            ("variables == null", "use variables.<name>"),
            ("region.sources.map(s, 1).all(x, x == 's')", "cannot compare x (int) with string"),
        ],
    )
    def test_type_errors_fail_at_load(
        self, compile_policy: Compile, expression: str, expected: str
    ) -> None:
        """Unknown names, non-bool rules and overload mismatches are load errors with a caret."""
        rules = f"    - name: typed\n      expression: {expression!r}\n"
        message = load_error(compile_policy, policy(rules))
        assert expected in message
        assert message.startswith("p.yaml:8:") and "rule 'typed'" in message and "^" in message

    def test_message_expression_must_be_a_string(self, compile_policy: Compile) -> None:
        """A messageExpression that is not a string fails at load, not at the first refusal."""
        rules = RULE_OK + "      messageExpression: region.depth\n"
        message = load_error(compile_policy, policy(rules))
        assert "spec.rules[0].messageExpression must give a string, but gives int" in message

    def test_match_condition_must_be_a_bool(self, compile_policy: Compile) -> None:
        """A matchCondition that is not a bool fails at load."""
        spec = "  matchConditions:\n    - name: scope\n      expression: region.depth\n"
        message = load_error(compile_policy, policy(RULE_OK, spec=spec))
        assert "spec.matchConditions[0].expression must give a bool, but gives int" in message

    def test_variables_carry_their_types(self, compile_policy: Compile) -> None:
        """A variable's type comes from its expression and is checked where it is used."""
        spec = "  variables:\n    - name: gone\n      expression: size(region.dead_sources)\n"
        rules = "    - name: r\n      expression: variables.gone > 0.5\n"
        message = load_error(compile_policy, policy(rules, spec=spec))
        assert "cannot compare variables.gone (int) with double (double)" in message

    @pytest.mark.parametrize(
        "expression",
        [
            "size(region.sources) > 0 && region.sources.all(s, s in region.live_sources)",
            "region.sources.map(s, size(s)).all(n, n > 0)",
            "region.sources.filter(s, s.startsWith('cfg')).size() <= 3",
            "request.budget_pressure > 0.5 || double(window.tokens) / 2.0 < 1.0",
            "{'a': region.depth}['a'] == region.depth && 'a' in {'a': 1}",
            "has(region.depth) && region.kind.matches('^s') == true",
            "timestamp('2026-01-01T00:00:00Z').getFullYear() == 2026",
            "duration('90s') > duration('1m') && string(1u) == '1'",
            "[[1, 2], [3]].all(l, l.all(x, x > 0)) && size([]) == 0",
            "region.sources.exists(region, region == 'a') || true",
        ],
    )
    def test_well_typed_expressions_load(self, compile_policy: Compile, expression: str) -> None:
        """Well-typed expressions of every kind load on every backend."""
        compile_policy(policy(f"    - name: ok\n      expression: {expression!r}\n"))


class TestDecisions:
    def test_multiple_documents_and_deny_overrides(self, compile_policy: Compile) -> None:
        """Several documents per file; one denying policy overrides any number allowing."""
        text = (
            policy(RULE_OK, name="allows")
            + "\n---\n"
            + policy(
                "    - name: shallow\n      expression: region.depth == 0\n      message: too deep\n",
                name="denies",
            )
        )
        decision = compile_policy(text).decide(activation())
        assert (decision.effect, decision.policy, decision.rule, decision.message) == (
            "deny",
            "denies",
            "shallow",
            "too deep",
        )

    def test_enforced_denial_beats_audit(self, compile_policy: Compile) -> None:
        """When audit and enforce policies both refuse, the decision is the enforced deny."""
        deny = "    - name: never\n      expression: 'false'\n"
        text = (
            policy(deny, name="a-audit", spec="  mode: audit\n")
            + "\n---\n"
            + policy(deny, name="b-enforce")
        )
        decision = compile_policy(text).decide(activation())
        assert (decision.effect, decision.policy) == ("deny", "b-enforce")
        assert [v.policy for v in decision.violations] == ["a-audit", "b-enforce"]

    @pytest.mark.parametrize("mode", ["audit", "warn"])
    def test_audit_and_warn_would_deny(self, compile_policy: Compile, mode: str) -> None:
        """audit and warn policies never deny: their refusals are would_deny with the mode."""
        decision = compile_policy(
            policy("    - name: never\n      expression: 'false'\n", spec=f"  mode: {mode}\n")
        ).decide(activation())
        assert (decision.effect, decision.mode, decision.allowed) == ("would_deny", mode, True)

    def test_match_conditions_scope_a_policy(self, compile_policy: Compile) -> None:
        """A policy whose matchConditions are not all true does not apply."""
        spec = "  matchConditions:\n    - name: deep\n      expression: region.depth > 5\n"
        compiled = compile_policy(
            policy("    - name: never\n      expression: 'false'\n", spec=spec)
        )
        assert compiled.decide(activation(depth=1)).effect == "allow"
        assert compiled.decide(activation(depth=6)).effect == "deny"

    def test_variables_and_message_expression(self, compile_policy: Compile) -> None:
        """Variables feed rules and messageExpression, which builds the refusal message."""
        spec = "  variables:\n    - name: dead\n      expression: size(region.dead_sources)\n"
        rules = (
            "    - name: live\n      expression: variables.dead == 0\n"
            "      message: static\n"
            "      messageExpression: string(variables.dead) + ' dead source(s)'\n"
        )
        decision = compile_policy(policy(rules, spec=spec)).decide(
            activation(dead_sources=["a", "b"])
        )
        assert decision.message == "2 dead source(s)"

    def test_message_expression_error_falls_back(self, compile_policy: Compile) -> None:
        """A messageExpression that errors falls back to the static message."""
        rules = (
            "    - name: never\n      expression: 'false'\n      message: static message\n"
            "      messageExpression: region.sources[5]\n"
        )
        assert compile_policy(policy(rules)).decide(activation()).message == "static message"

    @pytest.mark.parametrize(
        ("expression", "reason"),
        [
            ('region.sources[3] == "a"', "index"),
            ("10 / (region.depth - 1) > 1", "divide by zero"),
        ],
    )
    def test_evaluation_errors_fail_closed(
        self, compile_policy: Compile, expression: str, reason: str
    ) -> None:
        """A rule that errors (or is not boolean) denies under the default failurePolicy."""
        decision = compile_policy(
            policy(f"    - name: e\n      expression: '{expression}'\n")
        ).decide(activation())
        assert (decision.effect, decision.rule) == ("deny", "e")
        assert reason in decision.message.lower()
        assert decision.errors and decision.errors[0].error

    def test_failure_policy_allow(self, compile_policy: Compile) -> None:
        """failurePolicy: allow lets an erroring rule pass, but the error is still reported."""
        text = policy(
            "    - name: e\n      expression: region.sources[3] == 'a'\n",
            spec="  failurePolicy: allow\n",
        )
        decision = compile_policy(text).decide(activation())
        assert decision.effect == "allow"
        assert len(decision.errors) == 1 and not decision.violations

    def test_match_condition_error_follows_failure_policy(self, compile_policy: Compile) -> None:
        """An erroring matchCondition is decided by failurePolicy, naming the condition."""
        spec = "  matchConditions:\n    - name: bad\n      expression: region.sources[9] == 'x'\n"
        decision = compile_policy(policy(RULE_OK, spec=spec)).decide(activation())
        assert (decision.effect, decision.rule) == ("deny", "matchConditions.bad")

    def test_variable_error_follows_failure_policy(self, compile_policy: Compile) -> None:
        """An erroring variable is decided by failurePolicy, naming the variable."""
        spec = "  variables:\n    - name: bad\n      expression: region.sources[9]\n"
        decision = compile_policy(policy(RULE_OK, spec=spec)).decide(activation())
        assert (decision.effect, decision.rule) == ("deny", "variables.bad")

    def test_explain_reports_match_variables_and_rules(self, compile_policy: Compile) -> None:
        """explain=True shows each policy's match result, variable values and rule results."""
        spec = "  variables:\n    - name: n\n      expression: size(region.sources)\n"
        rules = "    - name: some\n      expression: variables.n > 0\n    - name: none\n      expression: variables.n == 0\n"
        report = (
            compile_policy(policy(rules, spec=spec))
            .decide(activation(), explain=True)
            .explanation[0]
        )
        assert report["matched"] is True
        assert report["variables"] == {"n": 1}
        assert report["rules"] == [
            {"rule": "some", "result": True},
            {"rule": "none", "result": False},
        ]

    def test_revision_changes_with_the_sources(self, compile_policy: Compile) -> None:
        """The revision is a hash of the policy text: same text, same revision; edit, new one."""
        a, b = compile_policy(policy(RULE_OK)), compile_policy(policy(RULE_OK))
        c = compile_policy(policy(RULE_OK.replace("10", "11")))
        assert a.revision == b.revision != c.revision
        assert a.decide(activation()).revision == a.revision

    def test_force_audit_switch(self, compile_policy: Compile) -> None:
        """force_audit turns enforce policies into audit ones (shadow rollout)."""
        compiled = compile_policy(
            policy("    - name: never\n      expression: 'false'\n"), force_audit=True
        )
        assert compiled.decide(activation()).effect == "would_deny"


def outcome(decision: Decision) -> tuple[Any, ...]:
    """Everything a decision says but its random id and the explanation."""
    violations = [
        (v.policy, v.rule, v.mode, v.message, v.error, v.remedy) for v in decision.violations
    ]
    errors = [(e.policy, e.rule, e.error) for e in decision.errors]
    return (decision.effect, decision.policy, decision.rule, decision.message, violations, errors)


VARIABLES = (
    "  variables:\n"
    "    - name: gone\n      expression: region.dead_sources\n"
    "    - name: some\n      expression: size(variables.gone) > 0\n"
)
SOURCES = [f"s{i}" for i in range(6_000)]


class TestOneProgramPerPolicy:
    """`decide` runs each policy as one program first, and its expressions one by one only to
    say which rule refused or failed: the outcome must be what they give one by one."""

    @pytest.mark.parametrize(
        ("spec", "rules", "region"),
        [
            (VARIABLES, "    - name: r\n      expression: '!variables.some'\n", {}),
            (
                VARIABLES,
                "    - name: r\n      expression: '!variables.some'\n",
                {"dead_sources": ["a"]},
            ),
            # a variable no rule reads still fails its policy (the runtime binds lazily)
            ("  variables:\n    - name: bad\n      expression: region.sources[9]\n", RULE_OK, {}),
            # a matchCondition that does not hold hides the rules' errors
            (
                "  matchConditions:\n    - name: deep\n      expression: region.depth > 5\n",
                "    - name: e\n      expression: region.sources[9] == 'x'\n",
                {},
            ),
            (
                "  matchConditions:\n    - name: deep\n      expression: region.depth > 5\n",
                "    - name: e\n      expression: region.sources[9] == 'x'\n",
                {"depth": 6},
            ),
            ("", "    - name: d\n      expression: dyn(region.depth)\n", {}),  # not a bool
            # a rule that is not a bool beside one that holds: `&&` of them is no grant
            (
                "",
                "    - name: d\n      expression: dyn(region.depth)\n"
                "    - name: t\n      expression: region.depth >= 0\n",
                {},
            ),
            # every rule is evaluated: an error after a refusal is reported too
            (
                "  failurePolicy: allow\n",
                "    - name: never\n      expression: 'false'\n"
                "    - name: e\n      expression: region.sources[9] == 'x'\n",
                {},
            ),
            # a comment ends an expression's line, not the program
            ("", "    - name: c\n      expression: region.depth < 10 // shallow enough\n", {}),
            # 6,000 sources: each rule is within the iteration limit, the two together are not
            (
                "",
                "    - name: a\n      expression: region.sources.all(s, s != 'x')\n"
                "    - name: b\n      expression: region.sources.all(s, s != 'y')\n",
                {"sources": SOURCES},
            ),
            # 10,001 sources: over the cost limit, an error before anything is evaluated
            (
                "",
                "    - name: a\n      expression: region.sources.all(s, s != 'x')\n",
                {"sources": [f"s{i}" for i in range(10_001)]},
            ),
        ],
    )
    def test_same_outcome_as_one_by_one(
        self, compile_policy: Compile, spec: str, rules: str, region: dict[str, Any]
    ) -> None:
        """Allowed, refused, failed, unmatched: the same decision as with explain=True."""
        compiled = compile_policy(policy(rules, spec=spec))
        act = activation(**region)
        assert outcome(compiled.decide(act)) == outcome(compiled.decide(act, explain=True))

    @pytest.mark.parametrize("dead", [[], ["a"]])
    def test_decisions_are_whole_dataclasses(
        self, compile_policy: Compile, dead: list[str]
    ) -> None:
        """A decision is the object its constructor makes from the same fields: equal, same
        hash and repr, every field set (decide builds it without the per-field __setattr__)."""
        rules = "    - name: live\n      expression: size(region.dead_sources) == 0\n"
        decision = compile_policy(policy(rules)).decide(activation(dead_sources=dead))
        fields = {f.name: getattr(decision, f.name) for f in dataclasses.fields(decision)}
        rebuilt = Decision(**fields)
        assert vars(decision) == vars(rebuilt)
        assert (decision, hash(decision), repr(decision)) == (rebuilt, hash(rebuilt), repr(rebuilt))

    def test_an_allowed_call_is_one_evaluation(
        self, compile_policy: Compile, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Where the backend binds variables (cel-expr-python), a grant evaluates no expression
        one by one; a refusal does, for its rule and message."""
        one_by_one: list[str] = []
        evaluate = engine._evaluate

        def counted(policy: Any, *args: Any) -> dict[str, Any]:
            one_by_one.append(policy.name)
            return evaluate(policy, *args)

        monkeypatch.setattr(engine, "_evaluate", counted)
        rules = "    - name: live\n      expression: '!variables.some  // no source is gone'\n      message: dead\n"
        compiled = compile_policy(policy(rules, spec=VARIABLES))
        assert compiled.decide(activation()).effect == "allow"
        assert one_by_one == ([] if compiled.backend.binds else ["p"])
        one_by_one.clear()
        refused = compiled.decide(activation(dead_sources=["a"]))
        assert (refused.effect, refused.rule, refused.message) == ("deny", "live", "dead")
        assert one_by_one == ["p"]


class TestOnlyWhatIsReadIsConverted:
    """`decide` converts for the backend only the fields the set's expressions read
    (`PolicySet.reads`); every decision must be the one the whole activation gives."""

    @pytest.mark.parametrize(
        ("source", "expected"),
        [
            ('region.kind == "x" && has(region.depth)', {"region": {"depth", "kind"}}),
            ("size(region) > 0 && region.kind == 'a'", {"region": None}),
            ("region['kind'] == 'a'", {"region": None}),
            ("[region][0].kind == 'a'", {"region": None}),
            ("region.a.b", {"region": {"a"}}),
            (".region.sources.all(s, s in region.live_sources)",
             {"region": {"live_sources", "sources"}, "s": None}),
            ("variables.x && summarizer.name.startsWith('a')",
             {"summarizer": {"name"}, "variables": {"x"}}),
        ],
    )  # fmt: skip
    def test_fields_read(self, source: str, expected: dict[str, set[str] | None]) -> None:
        """A name used other than as `name.field` is read whole (None)."""
        from policyhook._cel import fields_read

        read = {k: None if v is None else set(v) for k, v in fields_read(source).items()}
        assert read == expected

    def test_the_default_set_reads_a_few_fields(self, backend: Any) -> None:
        """The embedded default converts 7 of the activation's 19 fields (and its rules,
        messages and output policy read nothing else)."""
        from policyhook._loader import load_default

        assert dict(load_default(backend=backend).reads) == {
            "region": ("dead_sources", "depth", "kind", "sources"),
            "summarizer": ("idempotent", "lossless"),
            "summary": ("ungrounded_kinds",),
        }

    @pytest.mark.parametrize(
        ("spec", "rules", "region"),
        [
            ("", "    - name: has\n      expression: has(region.chars)\n", {}),
            ("", "    - name: listed\n      expression: \"[region][0].id == 'r1'\"\n", {}),
            # the message and the remedy read fields no rule reads
            (
                "",
                "    - name: live\n      expression: size(region.dead_sources) == 0\n"
                "      messageExpression: region.id + ' in ' + window.id\n"
                "      remedyExpression: \"region.chars > 10 ? 'offload' : 'pin'\"\n",
                {"dead_sources": ["a"]},
            ),
            # a variable holding the whole region, read field by field later
            (
                "  variables:\n    - name: r\n      expression: region\n",
                "    - name: via\n      expression: variables.r.tokens == 10\n",
                {},
            ),
            # a macro variable named like the activation's variable
            (
                "",
                "    - name: m\n      expression: region.sources.all(region, region != 'x')\n",
                {},
            ),
        ],
    )
    def test_same_decision_as_the_whole_activation(
        self,
        compile_policy: Compile,
        monkeypatch: pytest.MonkeyPatch,
        spec: str,
        rules: str,
        region: dict[str, Any],
    ) -> None:
        """Rules, messages and remedies see every field they read, with its value."""
        compiled = compile_policy(policy(rules, spec=spec))
        act = activation(**region)
        cut = compiled.decide(act)
        monkeypatch.setattr(engine, "_read", lambda activation, reads: dict(activation))
        whole = compiled.decide(act)
        assert (outcome(cut), cut.remedy) == (outcome(whole), whole.remedy)
        assert cut.effect == ("deny" if region else "allow"), cut


def test_shipped_policy_tests_pass_under_every_backend(backend: Any) -> None:
    """Every case of policies/**/*_test.yaml gives its expected decision under each CEL backend."""
    from policyhook.testing import run_tests

    root = Path(__file__).resolve().parent.parent / "policies"
    results = run_tests(root, backend=backend)
    assert len(results) >= 15
    assert [(r.file, r.name, r.actual) for r in results if r.status != "passed"] == []


def finishes(work: Callable[[], Any], seconds: float = 20.0) -> Any:
    """Run `work` in a thread; fail (instead of hanging the suite) if it does not return."""
    import threading

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


BOMB = "".join(
    f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n"
    for i in range(9)
)


class TestHostileFiles:
    @pytest.mark.parametrize(
        "field",
        ["description", "message", "mode", "name", "expression", "apiVersion", "failurePolicy"],
    )
    def test_alias_bomb_is_refused_with_its_line(self, compile_policy: Compile, field: str) -> None:
        """A billion-laughs alias bomb in any field is a PolicyError naming the line, not a hang."""
        text = (
            "apiVersion: policyhook.dev/v1\nkind: CompactionPolicy\nmetadata: {name: p}\n"
            "spec:\n  description: d\n  mode: enforce\n  failurePolicy: deny\n"
            "  rules:\n    - {name: r, expression: 'true', message: m}\n"
        )
        text = {
            "description": text.replace("description: d", "description: *x8"),
            "message": text.replace("message: m", "message: *x8"),
            "mode": text.replace("mode: enforce", "mode: *x8"),
            "name": text.replace("name: p", "name: *x8"),
            "expression": text.replace("expression: 'true'", "expression: *x8"),
            "apiVersion": text.replace("apiVersion: policyhook.dev/v1", "apiVersion: *x8"),
            "failurePolicy": text.replace("failurePolicy: deny", "failurePolicy: *x8"),
        }[field]
        with pytest.raises(PolicyError) as raised:
            finishes(lambda: compile_policy(BOMB + text, name="p.yaml"))
        message = str(raised.value)
        assert message.startswith("p.yaml:1:") and "anchors (&name) are not allowed" in message

    def test_alias_alone_is_refused(self, compile_policy: Compile) -> None:
        """An alias is refused where it stands, even to an anchor that was never defined."""
        text = policy(RULE_OK, spec="  description: *nowhere\n")
        message = load_error(compile_policy, text)
        assert message.startswith("p.yaml:6:16:") and "aliases (*name) are not allowed" in message

    @pytest.mark.parametrize("opening", ["{a: ", "[", "- "])
    def test_deep_nesting_is_refused(self, compile_policy: Compile, opening: str) -> None:
        """Thousands of nested mappings or lists are a PolicyError, never a RecursionError."""
        closing = {"{a: ": "}", "[": "]", "- ": ""}[opening]
        text = opening * 3000 + "x" + closing * 3000
        with pytest.raises(PolicyError, match="nesting deeper than 32 levels is not allowed"):
            finishes(lambda: compile_policy(text, name="p.yaml"))

    def test_lone_surrogate_escape_is_refused(self, compile_policy: Compile) -> None:
        """A "\\ud800" escape in a policy string is an error with its line, not bad text later."""
        message = load_error(compile_policy, policy(RULE_OK + '      message: "cut \\ud83d"\n'))
        assert message.startswith("p.yaml:9:") and "\\ud83d is a lone surrogate" in message

    def test_oversized_text_is_refused(self, compile_policy: Compile) -> None:
        """A policy text over the size limit is refused before it is parsed."""
        from policyhook._loader import MAX_FILE_BYTES

        text = policy(RULE_OK) + "#" * MAX_FILE_BYTES
        assert "over the limit of 1,048,576 per file" in load_error(compile_policy, text)


class TestPolicyFiles:
    def test_fifo_in_a_folder_is_an_error_not_a_hang(self, tmp_path: Path) -> None:
        """A FIFO named *.yaml in a policy folder is a clear error at once (nobody writes to it)."""
        (tmp_path / "a.yaml").write_text(policy(RULE_OK))
        os.mkfifo(tmp_path / "b.yaml")
        with pytest.raises(PolicyError, match=r"b\.yaml: io: a FIFO: only regular files"):
            finishes(lambda: load(tmp_path), seconds=5)

    def test_fifo_as_the_path_is_an_error(self, tmp_path: Path) -> None:
        """A FIFO given as the policy path itself is refused the same way."""
        os.mkfifo(tmp_path / "p.yaml")
        with pytest.raises(PolicyError, match="a FIFO"):
            finishes(lambda: load(tmp_path / "p.yaml"), seconds=5)

    def test_device_is_an_error(self) -> None:
        """/dev/zero is never read (it would fill memory): it is not a regular file."""
        with pytest.raises(PolicyError, match="/dev/zero: io: a device"):
            finishes(lambda: load("/dev/zero"), seconds=5)

    def test_oversized_file_is_refused_unread(self, tmp_path: Path) -> None:
        """A policy file over 1 MiB is refused from its size."""
        (tmp_path / "big.yaml").write_text(policy(RULE_OK) + "#" * (1 << 20))
        with pytest.raises(PolicyError, match="over the limit of 1,048,576 per file"):
            load(tmp_path)

    def test_invalid_utf8_names_the_line(self, tmp_path: Path) -> None:
        """Bytes that are not UTF-8 are an error naming file and line."""
        (tmp_path / "p.yaml").write_bytes(policy(RULE_OK).encode() + b"# caf\xe9\n")
        with pytest.raises(PolicyError, match=r"p\.yaml:9: io: not UTF-8: byte 0xe9"):
            load(tmp_path)

    def test_symlink_to_a_regular_file_is_read(self, tmp_path: Path) -> None:
        """A symlink to a policy file is followed (only what it points to must be regular)."""
        (tmp_path / "real.txt").write_text(policy(RULE_OK))
        folder = tmp_path / "set"
        folder.mkdir()
        (folder / "p.yaml").symlink_to(tmp_path / "real.txt")
        assert [p.name for p in load(folder).policies] == ["p"]


class TestDecisionIds:
    """Decision ids name one decision across a fleet's logs and spans."""

    def test_unique_in_a_process_and_apart_in_a_forked_child(self) -> None:
        """32 hex digits each, never twice in a process; a forked child's ids share nothing
        with its parent's (it makes its own random prefix)."""
        policies = load(Path(__file__).parent.parent / "policyhook" / "default_policy.yaml")
        activation = {
            "region": {"id": "r", "kind": "original", "depth": 0, "sources": [],
                       "live_sources": [], "dead_sources": [], "source_kinds": [],
                       "tokens": 0, "chars": 0},
            "request": {"trigger": "manual", "budget_pressure": 0.0, "attempt": 1},
            "window": {"id": "w", "tokens": 0, "budget": 0, "max_depth": 0},
            "summarizer": {"name": "s", "lossless": False, "idempotent": False},
        }  # fmt: skip
        ids = [policies.decide(activation).decision_id for _ in range(1_000)]
        assert len(set(ids)) == 1_000
        assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
        if not hasattr(os, "fork"):
            pytest.skip("no os.fork here")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its next id, then out without running the parent's cleanup
            os.write(write, policies.decide(activation).decision_id.encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        child = os.read(read, 64).decode()
        os.close(read)
        parent = policies.decide(activation).decision_id
        assert len(child) == 32 and child[:16] != parent[:16]
        assert child not in ids
