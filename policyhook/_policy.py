"""Policies as the engine sees them: compiled, immutable, decided many times.

A `PolicySet` is what `policyhook._loader` makes of the YAML: policies of CEL programs. Deciding
follows Kubernetes ValidatingAdmissionPolicy: `matchConditions` say whether a policy applies,
named `variables` are computed in order, and each rule's `expression` must be true for the call to
be allowed. Deny overrides allow across policies. Reloading builds a new set; none is mutated.
"""

from __future__ import annotations

import itertools
import operator
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Literal

from policyhook import _celcheck
from policyhook._activation import (
    INT64_MAX,
    INT64_MIN,
    LISTS,
    SCALAR_ATTRIBUTES,
    SCHEMA,
    SUMMARY,
    Activation,
    Binding,
    attribute,
    unrepresentable_value,
)
from policyhook._cel import (
    Backend,
    CompileError,
    EvaluationError,
    Program,
    fields_read,
    flatten,
    identifiers,
)


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


#: The activation's list sizes by `variable.field` ("region.sources": 3), for the cost bounds;
#: None when no list is longer than the loader assumed (`_celcheck.DECLARED_LIST_SIZE`): every
#: expression was within the limits at that size when it was loaded, and its bounds only grow
#: with the sizes, so there is nothing to check.
Sizes = Mapping[str, int] | None

#: Every list of every activation at 10^12 items: an expression within the limits there is
#: within them at any size (its bounds only grow with the sizes).
_HUGE: Mapping[str, int] = MappingProxyType(
    {
        f"{variable}.{f.name}": 10**12
        for variable, fields in (*SCHEMA.items(), ("summary", SUMMARY))
        for f in fields
        if f.type.startswith("list")
    }
)

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

    @classmethod
    def _made(cls, fields: dict[str, Any]) -> Decision:
        """`Decision(**fields)` given a dict of every field, which it keeps as its `__dict__`:
        the same object as the constructor's (equal, same hash and repr), without the frozen
        dataclass's `__setattr__` call per field (`decide` makes one per call)."""
        decision = object.__new__(cls)
        object.__setattr__(decision, "__dict__", fields)
        return decision


class _Ids:
    """Decision ids, 32 hex digits, without a system call per decision: a random 64-bit
    prefix per process (made again in a forked child, so two never share one) and a count."""

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._count = itertools.count(1)  # `next` on it is atomic: threads never share an id

    def next(self) -> str:
        return f"{self._prefix}{next(self._count):016x}"


_ids = _Ids()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.renew)


#: Every field of an allowing `Decision` but the five each decision sets: copied by `decide`.
_ALLOWED: dict[str, Any] = {
    "decision_id": "",
    "effect": Effect.ALLOW,
    "revision": "",
    "region_id": "",
    "depth": 0,
    "dead_sources": (),
    "policy": "",
    "rule": "",
    "message": "",
    "mode": "",
    "remedy": "",
    "violations": (),
    "errors": (),
    "explanation": (),
}


# -- compiled form ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expression:
    source: str
    program: Program
    name: str
    checked: _celcheck.Checked = field(default_factory=lambda: _celcheck.Checked(_celcheck.DYN))
    #: Whether its worst case stays within the limits at any list size (`size(region.sources)`
    #: costs the same at any k): then nothing is checked per decision. Made once, here.
    unlimited: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        within = not self.checked.dynamic or _celcheck.over_limits(self.checked, _HUGE) is None
        object.__setattr__(self, "unlimited", within)

    @property
    def bounded(self) -> bool:
        """Whether its worst case grows with the activation's lists (checked per decision)."""
        return self.checked.dynamic

    def over_limits(self, sizes: Sizes) -> str | None:
        """Why lists of these sizes make it too expensive to evaluate; None when they do not."""
        if sizes is None or self.unlimited:
            return None
        return _celcheck.over_limits(self.checked, sizes)

    def evaluate(self, context: Any, sizes: Sizes) -> Any:
        """Evaluate, refusing first (as an error) when the lists make it too expensive."""
        reason = self.over_limits(sizes)
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

    @property
    def deciding(self) -> tuple[Expression, ...]:
        """Its matchConditions, variables and rules: what decides a call (not the messages)."""
        return (*self.match_conditions, *self.variables, *(r.expression for r in self.rules))


def whole_program(policy: Policy, backend: Backend) -> Program | None:
    """`policy` as one program, so that a call it allows costs one evaluation.

    The program gives `true` when the policy allows the call with no error: a matchCondition
    (tested in order) does not hold, or every rule holds. Its rules are joined with CEL's `&&`,
    which is `true` only when every operand is `true` (a `false` or an error anywhere gives
    `false` or an error, never `true`; so does an operand that is not a bool), so one `true`
    stands for the whole outcome and anything else sends `decide` to `_evaluate`, expression by
    expression. The variables are bound by CEL's `cel.bind` (each map holds the variables so
    far, as `_evaluate` binds them); the last operand, `size(variables) == n`, makes the runtime
    evaluate every variable, as `_evaluate` does, though it binds them lazily.
    None when the backend cannot bind (cel-python has no `cel.bind`) or the whole is over the
    expression bounds: then `_evaluate` decides alone.
    """
    if policy.variables and not backend.binds:
        return None
    results = [_grouped(rule.expression.source) for rule in policy.rules]
    if policy.variables:
        results.append(f"size(variables) == {len(policy.variables)}")
    body = " && ".join(results) or "true"
    maps: list[str] = []
    for index, variable in enumerate(policy.variables):
        entries = [f'"{v.name}": variables.{v.name}' for v in policy.variables[:index]]
        entries.append(f'"{variable.name}": {_grouped(variable.source)}')
        maps.append("{" + ", ".join(entries) + "}")
    for bound in reversed(maps):
        body = f"cel.bind(variables, {bound}, {body})"
    for condition in reversed(policy.match_conditions):
        body = f"{_grouped(condition.source)} ? ({body}) : true"
    try:
        return backend.compile(body)
    except CompileError:
        return None


def _grouped(source: str) -> str:
    """`source` in parentheses, on lines of its own (a `//` comment ends at the line's end)."""
    return f"(\n{source}\n)"


@dataclass(frozen=True)
class PolicySet:
    """An immutable, compiled set of policies with the revision (hash of their sources)."""

    policies: tuple[Policy, ...]
    revision: str
    backend: Backend
    files: tuple[str, ...] = ()
    #: `whole_program` of each policy, in order; made once, with the set.
    programs: tuple[Program | None, ...] = field(init=False, repr=False, compare=False)
    #: Whether any policy decides on the summarizer's output (`spec.phase: output`).
    checks_output: bool = field(init=False, repr=False, compare=False)
    #: What the set's expressions read of the activation (`fields_read`, all expressions
    #: together): each variable with its fields, None for a variable read whole.
    reads: tuple[tuple[str, tuple[str, ...] | None], ...] = field(
        init=False, repr=False, compare=False
    )
    #: The policies of each phase, with their whole programs, what they read (`_reads`), and
    #: the same policies flattened for `Activation`s with what they bind (`_flattened`).
    _phases: Mapping[str, _Phase] = field(init=False, repr=False, compare=False)
    #: Per phase, the values its whole programs showed allow (`_Allowed`): a cache, the one
    #: mutable part of a set, which only ever skips evaluating what was shown to allow.
    _allowed: Mapping[str, _Allowed] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        programs = tuple(whole_program(policy, self.backend) for policy in self.policies)
        object.__setattr__(self, "programs", programs)
        object.__setattr__(self, "checks_output", any(p.phase == "output" for p in self.policies))
        object.__setattr__(self, "reads", _reads(self.policies))
        members: dict[str, tuple[tuple[Policy, Program | None], ...]] = {}
        for policy, program in zip(self.policies, programs, strict=True):
            members[policy.phase] = (*members.get(policy.phase, ()), (policy, program))
        phases = {
            phase: (
                pairs,
                _reads(tuple(p for p, _ in pairs)),
                _flattened(tuple(p for p, _ in pairs), self.backend),
            )
            for phase, pairs in members.items()
        }
        object.__setattr__(self, "_phases", MappingProxyType(phases))  # never changed
        allowed = {}
        for phase, (_, _, flat) in phases.items():
            read = None if flat is None else _deciding_attributes(*flat)
            if read is not None:
                allowed[phase] = _Allowed(read)
        object.__setattr__(self, "_allowed", MappingProxyType(allowed))

    def decide(
        self, activation: Mapping[str, Any], *, explain: bool = False, phase: str = "input"
    ) -> Decision:
        """Decide one call. Deny overrides allow; an enforce denial beats an audit/warn one.

        `phase`: the policies of which phase decide (`output` ones need `summary` in the
        activation).

        Every value of the activation is checked (`_inspect`), but only what the expressions
        read is converted for the backend (`reads`): the conversion is most of an evaluation's
        cost. A policy's whole program (`whole_program`) runs first: when it shows the policy
        allows the call, with no error, that is the policy's whole outcome. Otherwise (a
        refusal, an error, an explanation asked for) `_evaluate` runs its expressions one by
        one, to say which rule refused and why.
        """
        members, reading, flat = self._phases.get(phase, _NO_PHASE)
        context = None
        sizes: Sizes
        key: tuple[Any, ...] | None = None  # the values deciding reads, when they can be kept
        if flat is not None and type(activation) is Activation:
            allowed = self._allowed.get(phase)
            if (  # every scalar of its declared type (so convertible), no cost bound to check
                allowed is not None
                and activation.problem is None
                and activation.longest <= _celcheck.DECLARED_LIST_SIZE
                and not explain
            ):
                key = allowed.key(activation)
                if key in allowed.seen:  # shown to allow: nothing to bind or run
                    return self._decided(activation, [], [], [])
            members, binding = flat
            unreadable, data = binding.bind(activation)
            sizes = (
                activation.sizes() if activation.longest > _celcheck.DECLARED_LIST_SIZE else None
            )
        else:
            unreadable, sizes = _inspect(activation)
            data = _read(activation, reading) if unreadable is None else {}
        if unreadable is None:
            try:
                context = self.backend.context(data)
            except Exception as exc:  # a value the backend cannot convert: decided, not raised
                unreadable = f"the activation cannot be converted: {type(exc).__name__}: {exc}"
        violations: list[Violation] = []
        errors: list[Violation] = []
        explanation: list[dict[str, Any]] = []
        shown = True  # every policy's whole program showed it allows
        for policy, program in members:
            if unreadable is not None:
                report = _unreadable(policy, unreadable, violations, errors)
            elif not explain and _allows(policy, program, self.backend, context, sizes):
                continue
            else:
                report = _evaluate(
                    policy, self.backend, context, sizes, violations, errors, explain
                )
            shown = False
            if explain:
                explanation.append(report)
        if shown and key is not None and unreadable is None:
            self._allowed[phase].remember(key)
        return self._decided(activation, violations, errors, explanation)

    def _decided(
        self,
        activation: Mapping[str, Any],
        violations: list[Violation],
        errors: list[Violation],
        explanation: list[dict[str, Any]],
    ) -> Decision:
        """The `Decision` on `activation` given what its policies found."""
        fields = _ALLOWED.copy()
        fields["decision_id"] = _ids.next()
        fields["revision"] = self.revision
        if type(activation) is Activation:
            fields["region_id"] = str(activation.region_id)
            fields["depth"] = int(activation.region_depth)
            fields["dead_sources"] = activation.dead_sources()
        else:
            region = activation["region"]
            fields["region_id"] = str(region["id"])
            fields["depth"] = int(region["depth"])
            fields["dead_sources"] = tuple(region["dead_sources"])
        if errors:
            fields["errors"] = tuple(errors)
        if explanation:
            fields["explanation"] = tuple(explanation)
        if violations:
            enforced = [v for v in violations if v.mode == Mode.ENFORCE]
            first = (enforced or violations)[0]
            fields["effect"] = Effect.DENY if enforced else Effect.WOULD_DENY
            fields["policy"] = first.policy
            fields["rule"] = first.rule
            fields["message"] = first.message
            fields["mode"] = first.mode
            fields["remedy"] = first.remedy
            fields["violations"] = tuple(violations)
        return Decision._made(fields)


class _Allowed:
    """The values a phase's deciding expressions read of an `Activation` (`attributes`) for
    which every whole program of the phase gave `true`: its policies allow any activation
    with the same values, without binding or evaluating anything again.

    Why it is exact: a whole program (`whole_program`) is a pure function of the data it is
    given (CEL has no side effects, no clock, no randomness), and the deciding expressions
    read only these items of it (message and remedy expressions, which may read more, run
    only on a refusal). Used only for phases that bind no list and no variable whole (every
    item bound is one of these scalars or another), for activations whose scalars all have
    their declared types (`Activation.problem` None: so the values compare exactly, `True`
    never meets `1`; the one double is keyed by its bits, `-0.0` is not `0.0`) and no list
    past the cost-bound size. Kept only when every whole program showed the allow (no error,
    no refusal, no explanation asked). A refusal is evaluated every time. Made with the
    policy set, so a reload starts empty; bounded (cleared past `_ALLOWED_KEPT`).
    """

    __slots__ = ("_double", "_get", "attributes", "seen")

    def __init__(self, attributes: tuple[str, ...]) -> None:
        self.attributes = attributes
        self._get = operator.attrgetter(*attributes) if attributes else None
        #: Where the double is among them (keyed by its bits), or -1.
        self._double = next(
            (i for i, a in enumerate(attributes) if SCALAR_ATTRIBUTES.get(a) is float), -1
        )
        self.seen: dict[Any, bool] = {}

    def key(self, activation: Activation) -> Any:
        """What identifies `activation` here: the values read (as one value, or a tuple)."""
        if self._get is None:
            return ()
        read: Any = self._get(activation)
        if self._double < 0:
            return read
        if len(self.attributes) == 1:
            return float(read).hex()
        values = list(read)
        values[self._double] = float(values[self._double]).hex()
        return tuple(values)

    def remember(self, key: Any) -> None:
        if len(self.seen) >= _ALLOWED_KEPT:
            self.seen.clear()
        self.seen[key] = True


#: How many allowed keys each phase keeps.
_ALLOWED_KEPT = 1_024


def _deciding_attributes(members: _Members, binding: Binding) -> tuple[str, ...] | None:
    """The `Activation` attributes that `members`' deciding expressions (matchConditions,
    variables, rules: what their whole programs are made of) read, each item i of `binding`'s
    list found as `<name>[i]` in the flattened sources (a string literal that looks like one
    only adds an item); None when the binding holds a list or a variable bound whole (not
    kept: what the backend converts there is not checked per decision by `problem`)."""
    if binding.whole or any(a not in SCALAR_ATTRIBUTES for a in binding.attributes):
        return None
    read = re.compile(re.escape(binding.name) + r"\[(\d+)\]")
    indices = sorted(
        {
            int(index)
            for policy, _ in members
            for expression in policy.deciding
            for index in read.findall(expression.source)
        }
    )
    return tuple(binding.attributes[i] for i in indices)


def _reads(policies: tuple[Policy, ...]) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    """What `policies` read of an activation: each variable the expressions name (in any
    phase, deciding or messages), with the fields selected from it, or None when one of them
    uses it whole."""
    read: dict[str, set[str] | None] = {}
    for policy in policies:
        expressions = [*policy.deciding]
        for rule in policy.rules:
            expressions += [e for e in (rule.message_expression, rule.remedy_expression) if e]
        for expression in expressions:
            for name, fields in fields_read(expression.source).items():
                if name == "variables":  # the policy's own, bound by the engine
                    continue
                if fields is None or read.get(name, set()) is None:
                    read[name] = None
                else:
                    read[name] = read.get(name, set()) | fields  # type: ignore[operator]
    return tuple(
        (name, None if fields is None else tuple(sorted(fields)))
        for name, fields in sorted(read.items())
    )


#: What one phase's policies read (`_reads` of them), as `_read` takes it.
_Reading = tuple[tuple[str, tuple[str, ...] | None], ...]
#: A phase's policies with their whole programs.
_Members = tuple[tuple[Policy, Program | None], ...]
#: A phase: its policies, what they read, and the same flattened (`_flattened`).
_Phase = tuple[_Members, _Reading, tuple[_Members, Binding] | None]
_NO_PHASE: _Phase = ((), (), None)


def _flattened(policies: tuple[Policy, ...], backend: Backend) -> tuple[_Members, Binding] | None:
    """`policies` compiled again over flat identifiers (`_cel.flatten`), for `Activation`s,
    with the `Binding` that gives them their data; None when some expression reads what an
    `Activation` lacks (`summary`), or a flattened program does not compile (then the
    mapping's path decides, as for any activation).

    Why: converting maps of every field read, and lists of k ids to count them, is most of
    a decision's cost (and all of it that grows with a rolling chain). The flat programs
    decide exactly as the originals do on the activation's mapping (tests/test_activation.py
    checks it over random policies): each select is replaced by an item of one list holding
    the same value (`Binding`), `size()` of a list by its size, `has()` of a field by `true`
    (an `Activation` holds every field), and a list that is only the right operand of `in`
    keeps its items in any order. A variable used whole (`[region][0]`, a macro variable
    named like it) is bound whole, as the mapping gives it, and not rewritten.
    """
    sources = [e.source for p in policies for e in _expressions(p)]
    read: dict[str, set[str] | None] = {}
    for source in sources:
        for name, fields in fields_read(source).items():
            if fields is None or read.get(name, set()) is None:
                read[name] = None
            else:
                read[name] = read.get(name, set()) | fields  # type: ignore[operator]
    if any(name not in SCHEMA and name != "variables" and fields is not None
           for name, fields in read.items()) or "summary" in read:  # fmt: skip
        return None  # a variable of another phase (`summary`), read by field
    roots = {
        name
        for name, fields in read.items()
        if name in SCHEMA and fields is not None
        and all(attribute(name, f, "value") is not None for f in fields)
    }  # fmt: skip
    whole = tuple(sorted(name for name in read if name in SCHEMA and name not in roots))
    taken = frozenset().union(*(identifiers(source) for source in sources))
    prefix = "_"
    while any(i.startswith(prefix) for i in taken):
        prefix += "_"
    values = prefix + "v"
    items: dict[str, int] = {}  # attribute -> its index in the list of values

    def named(variable: str, field: str, use: str) -> str:
        attr = attribute(variable, field, use)
        assert attr is not None  # roots select declared fields only
        return f"{values}[{items.setdefault(attr, len(items))}]"

    def flat(expression: Expression) -> Expression:
        source, _ = flatten(expression.source, roots, LISTS, named)
        return Expression(source, backend.compile(source), expression.name, expression.checked)

    def flat_or_none(expression: Expression | None) -> Expression | None:
        return None if expression is None else flat(expression)

    lean: list[tuple[Policy, Program | None]] = []
    try:
        for policy in policies:
            rules = tuple(
                replace(
                    rule,
                    expression=flat(rule.expression),
                    message_expression=flat_or_none(rule.message_expression),
                    remedy_expression=flat_or_none(rule.remedy_expression),
                )
                for rule in policy.rules
            )
            flattened = replace(
                policy,
                match_conditions=tuple(flat(e) for e in policy.match_conditions),
                variables=tuple(flat(e) for e in policy.variables),
                rules=rules,
            )
            lean.append((flattened, whole_program(flattened, backend)))
    except CompileError:
        return None
    return tuple(lean), Binding(values, tuple(items), whole)


def _expressions(policy: Policy) -> list[Expression]:
    """Every expression of `policy`: what decides, and its rules' messages and remedies."""
    found = [*policy.deciding]
    for rule in policy.rules:
        found += [e for e in (rule.message_expression, rule.remedy_expression) if e]
    return found


def _read(activation: Mapping[str, Any], reading: _Reading) -> dict[str, Any]:
    """The part of `activation` that `reading` names: what the backend has to convert.

    A variable the expressions use whole, or that is not a mapping, is passed as it is; a
    field the activation lacks stays absent (reading it is the same error as before).
    """
    given: dict[str, Any] = {}
    for name, fields in reading:
        value = activation.get(name, _ABSENT)
        if value is _ABSENT:
            continue
        if fields is None or (type(value) is not dict and not isinstance(value, Mapping)):
            given[name] = value
            continue
        cut = given[name] = {}
        for f in fields:  # a loop, not a comprehension: no function call per variable (3.11)
            if f in value:
                cut[f] = value[f]
    return given


_ABSENT: Any = object()


def _allows(
    policy: Policy, program: Program | None, backend: Backend, context: Any, sizes: Sizes
) -> bool:
    """Whether `program`, the policy's whole program, shows that the policy allows the call with
    no error (it gives `true`). False when it cannot tell (no such program, an expression over
    the cost limits, an error, a rule that does not hold)."""
    if program is None:
        return False
    if sizes is not None and any(e.over_limits(sizes) for e in policy.deciding):
        return False
    try:
        result = program.evaluate(context)
    except EvaluationError:
        return False
    return result is True or backend.to_python(result) is True


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
            problem = unrepresentable_value(value)
            if problem is not None:
                return f"{name}.{key}{'' if problem.startswith('[') else ' '}{problem}"
    return None


def _inspect(activation: Mapping[str, Any]) -> tuple[str | None, Sizes]:
    """`unrepresentable(activation)`, and the list sizes when some list is longer than the
    loader assumed (see `Sizes`).

    One quick walk covers what activations hold (ASCII strings, bools, doubles, ints within
    int64, lists of strings); `unrepresentable` looks closer only when something else is seen.
    """
    texts: list[Any] = []
    longest = 0
    usual = True
    for fields in activation.values():
        if type(fields) is not dict and not isinstance(fields, Mapping):  # ABC check: slow
            continue
        for value in fields.values():
            kind = type(value)
            if kind is str:
                texts.append(value)
            elif kind is list or kind is tuple:
                texts += value
                if len(value) > longest:
                    longest = len(value)
            elif kind is int:
                if not INT64_MIN <= value <= INT64_MAX:
                    usual = False
            elif kind is not bool and kind is not float:
                usual = False
    if not usual or not _ascii(texts):
        problem = unrepresentable(activation)
        if problem is not None:
            return problem, None
    return None, _list_sizes(activation) if longest > _celcheck.DECLARED_LIST_SIZE else None


def _ascii(texts: list[Any]) -> bool:
    """Whether every item is an ASCII string (one pass in C)."""
    try:
        return "".join(texts).isascii()
    except TypeError:  # not all strings
        return False


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
    sizes: Sizes,
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


def _message(rule: Rule, backend: Backend, context: Any, sizes: Sizes) -> str:
    """The rule's messageExpression, falling back to its message when that errors or is empty."""
    if rule.message_expression is not None:
        try:
            text = backend.to_python(rule.message_expression.evaluate(context, sizes))
            if isinstance(text, str) and text.strip():
                return text
        except EvaluationError:
            pass
    return rule.message or f"rule {rule.name!r} does not hold"


def _remedy(rule: Rule, backend: Backend, context: Any, sizes: Sizes) -> str:
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
