"""Policies as the engine sees them: compiled, immutable, decided many times.

A `PolicySet` is what `policyhook._loader` makes of the YAML: policies of CEL programs. Deciding
follows Kubernetes ValidatingAdmissionPolicy: `matchConditions` say whether a policy applies,
named `variables` are computed in order, and each rule's `expression` must be true for the call to
be allowed. Deny overrides allow across policies. Reloading builds a new set; none is mutated.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from policyhook import _celcheck
from policyhook._cel import Backend, EvaluationError, Program


class Effect(StrEnum):
    """What a decision does to the call (telemetry and the decision log call it `decision`)."""

    ALLOW = "allow"
    DENY = "deny"
    WOULD_DENY = "would_deny"  # an audit/warn policy refused: the call goes through


class Mode(StrEnum):
    """A policy's `spec.mode`: enforce refuses, audit and warn only record (warn logs louder)."""

    ENFORCE = "enforce"
    AUDIT = "audit"
    WARN = "warn"


class FailurePolicy(StrEnum):
    """A policy's `spec.failurePolicy`: what an expression that cannot be evaluated does."""

    DENY = "deny"
    ALLOW = "allow"


MODES = tuple(Mode)
FAILURE_POLICIES = tuple(FailurePolicy)
#: What a runtime can do instead of a refused call (see `policyhook.remedies`).
REMEDIES = ("rederive", "offload", "pin", "escalate")


# -- decisions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """A rule that did not hold (or could not be evaluated) for one call."""

    policy: str
    rule: str
    message: str
    mode: Mode
    error: str | None = None  # set when the rule failed to evaluate and failurePolicy denied
    remedy: str = ""  # the rule's remedy ("" when it names none: the runtime's fallback)


@dataclass(frozen=True)
class Decision:
    """The outcome of one call: `effect` is allow, deny, or would_deny (audit/warn let it pass)."""

    decision_id: str
    effect: Effect
    revision: str
    region_id: str
    depth: int
    dead_sources: tuple[str, ...]
    policy: str = ""
    rule: str = ""
    message: str = ""
    mode: Mode | Literal[""] = ""  # "" when allowed
    remedy: str = ""  # the deciding rule's remedy: rederive, offload, pin, escalate, or ""
    violations: tuple[Violation, ...] = ()
    errors: tuple[Violation, ...] = ()  # every evaluation error, whatever failurePolicy did
    explanation: tuple[dict[str, Any], ...] = field(default=(), compare=False)

    @property
    def allowed(self) -> bool:
        return self.effect != Effect.DENY


# -- compiled form ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expression:
    source: str
    program: Program
    name: str
    checked: _celcheck.Checked = field(default_factory=lambda: _celcheck.Checked(_celcheck.DYN))

    @property
    def bounded(self) -> bool:
        """Whether its worst case grows with the activation's lists (checked per decision)."""
        return self.checked.dynamic

    def evaluate(self, context: Any, sizes: Mapping[str, int]) -> Any:
        """Evaluate, refusing first (as an error) when the lists make it too expensive."""
        if self.checked.dynamic:
            reason = _celcheck.over_limits(self.checked, sizes)
            if reason is not None:
                raise EvaluationError(f"cost limit: this expression {reason}")
        return self.program.evaluate(context)


@dataclass(frozen=True)
class Rule:
    name: str
    expression: Expression
    message: str
    message_expression: Expression | None
    remedy: str = ""  # what the runtime should do instead, when this rule refuses
    remedy_expression: Expression | None = None


@dataclass(frozen=True)
class Policy:
    name: str
    file: str
    mode: Mode
    failure_policy: FailurePolicy
    match_conditions: tuple[Expression, ...]
    variables: tuple[Expression, ...]
    rules: tuple[Rule, ...]
    description: str = ""
    phase: str = "input"  # "output": decides on the summarizer's output (docs/grounding.md)


@dataclass(frozen=True)
class PolicySet:
    """An immutable, compiled set of policies with the revision (hash of their sources)."""

    policies: tuple[Policy, ...]
    revision: str
    backend: Backend
    files: tuple[str, ...] = ()

    @property
    def checks_output(self) -> bool:
        """Whether any policy decides on the summarizer's output (`spec.phase: output`)."""
        return any(p.phase == "output" for p in self.policies)

    def decide(
        self, activation: Mapping[str, Any], *, explain: bool = False, phase: str = "input"
    ) -> Decision:
        """Decide one call. Deny overrides allow; an enforce denial beats an audit/warn one.

        `phase`: the policies of which phase decide (`output` ones need `summary` in the
        activation).
        """
        unreadable = unrepresentable(activation)
        context = None
        if unreadable is None:
            try:
                context = self.backend.context(activation)
            except Exception as exc:  # a value the backend cannot convert: decided, not raised
                unreadable = f"the activation cannot be converted: {type(exc).__name__}: {exc}"
        sizes = _list_sizes(activation)
        violations: list[Violation] = []
        errors: list[Violation] = []
        explanation: list[dict[str, Any]] = []
        for policy in self.policies:
            if policy.phase != phase:
                continue
            if unreadable is not None:
                report = _unreadable(policy, unreadable, violations, errors)
            else:
                report = _evaluate(
                    policy, self.backend, context, sizes, violations, errors, explain
                )
            if explain:
                explanation.append(report)
        region = activation["region"]
        enforced = [v for v in violations if v.mode == Mode.ENFORCE]
        first = (enforced or violations or [None])[0]  # type: ignore[list-item]
        effect = Effect.ALLOW if first is None else Effect.DENY if enforced else Effect.WOULD_DENY
        return Decision(
            decision_id=uuid.uuid4().hex,
            effect=effect,
            revision=self.revision,
            region_id=str(region["id"]),
            depth=int(region["depth"]),
            dead_sources=tuple(region["dead_sources"]),
            policy=first.policy if first else "",
            rule=first.rule if first else "",
            message=first.message if first else "",
            mode=first.mode if first else "",
            remedy=first.remedy if first else "",
            violations=tuple(violations),
            errors=tuple(errors),
            explanation=tuple(explanation),
        )


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def unrepresentable(activation: Mapping[str, Any]) -> str | None:
    """Why CEL cannot hold some value of `activation` (an int past int64, a lone surrogate).

    Such an activation is not evaluated at all: every policy fails through its failurePolicy
    with this reason, on every backend alike, instead of one backend raising and another
    wrapping or replacing the value.
    """
    for name, fields in activation.items():
        if not isinstance(fields, Mapping):
            continue
        for key, value in fields.items():
            problem = _problem(value)
            if problem is not None:
                return f"{name}.{key}{'' if problem.startswith('[') else ' '}{problem}"
    return None


def _problem(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return None
        shown = str(value) if len(str(value)) <= 24 else f"about 10^{len(str(abs(value))) - 1}"
        return f"is {shown}, outside CEL's int range (-2^63 .. 2^63-1)"
    if isinstance(value, str):
        return None if value.isascii() or _utf8(value) else "holds a lone surrogate"
    if isinstance(value, list | tuple):
        try:
            joined = "\0".join(value)  # the common case, a list of ids: one pass in C
        except TypeError:
            joined = None
        if joined is not None and (joined.isascii() or _utf8(joined)):
            return None
        for index, item in enumerate(value):
            problem = _problem(item)
            if problem is not None:
                return f"[{index}]{'' if problem.startswith('[') else ' '}{problem}"
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unreadable(
    policy: Policy, reason: str, violations: list[Violation], errors: list[Violation]
) -> dict[str, Any]:
    """A policy that cannot run on this activation: an error, decided by its failurePolicy."""
    violation = Violation(
        policy.name, "activation", f"could not evaluate: {reason}", policy.mode, error=reason
    )
    errors.append(violation)
    if policy.failure_policy == FailurePolicy.DENY:
        violations.append(violation)
    return {"policy": policy.name, "mode": policy.mode, "matched": None, "error": reason}


def _list_sizes(activation: Mapping[str, Any]) -> dict[str, int]:
    """`{"region.sources": 3, …}`: what the expressions' cost bounds are functions of."""
    return {
        f"{name}.{key}": len(value)
        for name, fields in activation.items()
        if isinstance(fields, Mapping)
        for key, value in fields.items()
        if isinstance(value, list | tuple)
    }


def _evaluate(
    policy: Policy,
    backend: Backend,
    context: Any,
    sizes: Mapping[str, int],
    violations: list[Violation],
    errors: list[Violation],
    explain: bool,
) -> dict[str, Any]:
    """Evaluate one policy into `violations`/`errors`; returns its explanation when asked."""
    report: dict[str, Any] = {"policy": policy.name, "mode": policy.mode, "matched": True}

    def failed(rule: str, error: str) -> None:
        violation = Violation(
            policy.name, rule, f"could not evaluate: {error}", policy.mode, error=error
        )
        errors.append(violation)
        if policy.failure_policy == FailurePolicy.DENY:
            violations.append(violation)

    for condition in policy.match_conditions:
        try:
            matched = _boolean(backend, condition.evaluate(context, sizes))
        except EvaluationError as exc:
            report.update(matched=None, error=f"matchCondition {condition.name}: {exc}")
            failed(f"matchConditions.{condition.name}", str(exc))
            return report
        if not matched:
            report.update(matched=False, condition=condition.name)
            return report
    values: dict[str, Any] = {}
    bound = context
    for variable in policy.variables:
        try:
            values[variable.name] = variable.evaluate(bound, sizes)
        except EvaluationError as exc:
            report.update(error=f"variable {variable.name}: {exc}")
            failed(f"variables.{variable.name}", str(exc))
            return report
        bound = backend.bind(context, values)
    if explain:
        report["variables"] = {k: backend.to_python(v) for k, v in values.items()}
    results: list[dict[str, Any]] = []
    for rule in policy.rules:
        try:
            holds = _boolean(backend, rule.expression.evaluate(bound, sizes))
        except EvaluationError as exc:
            results.append({"rule": rule.name, "result": None, "error": str(exc)})
            failed(rule.name, str(exc))
            continue
        results.append({"rule": rule.name, "result": holds})
        if not holds:
            violations.append(
                Violation(
                    policy.name,
                    rule.name,
                    _message(rule, backend, bound, sizes),
                    policy.mode,
                    remedy=_remedy(rule, backend, bound, sizes),
                )
            )
    report["rules"] = results
    return report


def _boolean(backend: Backend, value: Any) -> bool:
    result = backend.to_python(value)
    if not isinstance(result, bool):
        raise EvaluationError(f"expression gave {type(result).__name__} {result!r}, not a bool")
    return result


def _message(rule: Rule, backend: Backend, context: Any, sizes: Mapping[str, int]) -> str:
    """The rule's messageExpression, falling back to its message when that errors or is empty."""
    if rule.message_expression is not None:
        try:
            text = backend.to_python(rule.message_expression.evaluate(context, sizes))
            if isinstance(text, str) and text.strip():
                return text
        except EvaluationError:
            pass
    return rule.message or f"rule {rule.name!r} does not hold"


def _remedy(rule: Rule, backend: Backend, context: Any, sizes: Mapping[str, int]) -> str:
    """The rule's remedyExpression when it names a remedy, else its `remedy` ("" for none).

    A remedy only says what to do instead of a refused call, never whether to refuse, so an
    expression that errors or names no remedy falls back quietly: the refusal stands either way.
    """
    if rule.remedy_expression is not None:
        try:
            name = backend.to_python(rule.remedy_expression.evaluate(context, sizes))
            if name in REMEDIES:
                return str(name)
        except EvaluationError:
            pass
    return rule.remedy
