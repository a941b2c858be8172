"""Type checking and cost bounds of CEL expressions over the activation, at load time.

Works on cel-python's parse tree (a lark tree) so that it runs without the `fast` extra; where
cel-expr-python is installed the loader also runs Google's checker and the two must agree
(tests/test_conformance.py). The rules are CEL's standard checker's, made stricter where the
backends' runtimes disagree: a value of unknown type (`dyn`) cannot be compared, tested with `in`
or used in arithmetic (cel-expr-python compares 1 == 1.0 as true, cel-python raises), and no
function outside the standard library both backends implement is known.

Every expression also gets two bounds, as functions of the activation's list sizes: how many
comprehension iterations it can run (cel-expr-python refuses past `MAX_ITERATIONS`) and its cost
(iterations plus elements scanned by `in`, `==` and `+` on lists). The engine checks both before
evaluating, on every backend alike, and the loader rejects expressions over the limits at the
declared bounds (`DECLARED_LIST_SIZE`), as Kubernetes does for ValidatingAdmissionPolicy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import lark

from policyhook._hints import did_you_mean

#: cel-expr-python's runtime stops an evaluation at 10,000 comprehension iterations; the same
#: bound holds on cel-python so both decide the same.
MAX_ITERATIONS = 9_999
#: Cost units (iterations + elements scanned) per evaluation, as Kubernetes' static limit.
MAX_COST = 10_000_000
#: The list size the loader assumes when it estimates a rule's worst case.
DECLARED_LIST_SIZE = 1_000

Sizes = Mapping[str, int]
Bound = Callable[[Sizes], int]


@dataclass(frozen=True)
class CelType:
    """A CEL type: `int`, `list(string)`, `map(string, int)`, or an activation struct."""

    name: str
    params: tuple[CelType, ...] = ()
    fields: tuple[tuple[str, CelType], ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        if self.params:
            return f"{self.name}({', '.join(map(str, self.params))})"
        return self.name

    def field(self, name: str) -> CelType | None:
        return next((t for n, t in self.fields if n == name), None)

    @property
    def is_struct(self) -> bool:
        return bool(self.fields) or self.name in _STRUCTS


INT, UINT, DOUBLE = CelType("int"), CelType("uint"), CelType("double")
BOOL, STRING, BYTES = CelType("bool"), CelType("string"), CelType("bytes")
NULL, DYN, TYPE = CelType("null_type"), CelType("dyn"), CelType("type")
TIMESTAMP, DURATION = CelType("google.protobuf.Timestamp"), CelType("google.protobuf.Duration")
_STRUCTS: set[str] = set()


def list_of(element: CelType) -> CelType:
    return CelType("list", (element,))


def map_of(key: CelType, value: CelType) -> CelType:
    return CelType("map", (key, value))


def struct(name: str, fields: Mapping[str, CelType]) -> CelType:
    """An activation variable: a message-like type whose fields are known."""
    _STRUCTS.add(name)
    return CelType(name, (), tuple(fields.items()))


def parse_type(text: str) -> CelType:
    """`list(string)` -> CelType; the activation schema writes its types this way."""
    text = text.strip()
    if text.startswith("list(") and text.endswith(")"):
        return list_of(parse_type(text[5:-1]))
    if text.startswith("map(") and text.endswith(")"):
        key, _, value = text[4:-1].partition(",")
        return map_of(parse_type(key), parse_type(value))
    return {
        "int": INT,
        "uint": UINT,
        "double": DOUBLE,
        "bool": BOOL,
        "string": STRING,
        "bytes": BYTES,
        "timestamp": TIMESTAMP,
        "duration": DURATION,
        "dyn": DYN,
    }[text]


class CheckError(Exception):
    """A type or cost error at a 1-based position in the expression."""

    def __init__(self, message: str, line: int | None, column: int | None) -> None:
        self.line = line
        self.column = column
        super().__init__(message)


@dataclass(frozen=True)
class Shape:
    """An upper bound on a value's element count, and on its elements' (for nested lists)."""

    count: Bound
    element: Shape | None = None


def _const(n: int) -> Bound:
    return lambda sizes: n


_ZERO = _const(0)
_ONE = _const(1)


def _add(*bounds: Bound) -> Bound:
    bounds = tuple(b for b in bounds if b is not _ZERO)
    if not bounds:
        return _ZERO
    if len(bounds) == 1:
        return bounds[0]
    return lambda sizes: sum(b(sizes) for b in bounds)


@dataclass(frozen=True)
class Checked:
    """What the checker knows of an expression: its type and its worst cases."""

    type: CelType
    iterations: Bound = _ZERO
    cost: Bound = _ONE
    shape: Shape | None = None
    dynamic: bool = False  # depends on the activation's list sizes


_NUMBERS = (INT, UINT, DOUBLE)
_ORDERED = (*_NUMBERS, STRING, BYTES, BOOL, TIMESTAMP, DURATION)
_CONVERSIONS: Mapping[str, tuple[tuple[CelType, ...], CelType]] = {
    "int": ((INT, UINT, DOUBLE, STRING, TIMESTAMP), INT),
    "uint": ((INT, UINT, DOUBLE, STRING), UINT),
    "double": ((INT, UINT, DOUBLE, STRING), DOUBLE),
    "string": ((INT, UINT, DOUBLE, BOOL, STRING, BYTES, TIMESTAMP, DURATION), STRING),
    "bytes": ((STRING, BYTES), BYTES),
    "bool": ((BOOL, STRING), BOOL),
    "timestamp": ((STRING, TIMESTAMP), TIMESTAMP),
    "duration": ((STRING, DURATION), DURATION),
}
_STRING_MEMBERS = ("contains", "startsWith", "endsWith", "matches")
_TIME_GETTERS = (
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
)
_DURATION_GETTERS = ("getHours", "getMinutes", "getSeconds", "getMilliseconds")
MACROS = ("all", "exists", "exists_one", "map", "filter")
FUNCTIONS = tuple(sorted({*_CONVERSIONS, "size", "dyn", "matches", "has"}))
_MEMBERS = tuple(sorted({"size", *_STRING_MEMBERS, *_TIME_GETTERS, *MACROS}))
_LITERALS = {
    "INT_LIT": INT,
    "UINT_LIT": UINT,
    "FLOAT_LIT": DOUBLE,
    "STRING_LIT": STRING,
    "MLSTRING_LIT": STRING,
    "BYTES_LIT": BYTES,
    "BOOL_LIT": BOOL,
    "NULL_LIT": NULL,
}
_PASS = {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication"}


def _first_token(node: Any) -> lark.Token | None:
    if isinstance(node, lark.Token):
        return node
    if isinstance(node, lark.Tree):
        for child in node.children:
            token = _first_token(child)
            if token is not None:
                return token
    return None


def _last_token(node: Any) -> lark.Token | None:
    if isinstance(node, lark.Token):
        return node
    if isinstance(node, lark.Tree):
        for child in reversed(node.children):
            token = _last_token(child)
            if token is not None:
                return token
    return None


def _same(a: CelType, b: CelType) -> bool:
    """Whether two types unify (dyn matches anything, inside lists and maps too)."""
    if a == DYN or b == DYN:
        return True
    if a.name != b.name or len(a.params) != len(b.params):
        return False
    return all(_same(x, y) for x, y in zip(a.params, b.params, strict=True))


def _join(a: CelType, b: CelType) -> CelType | None:
    if a == b:
        return a
    if a == DYN:
        return b
    if b == DYN:
        return a
    if a.name == b.name and a.name in ("list", "map") and _same(a, b):
        return CelType(
            a.name, tuple(_join(x, y) or DYN for x, y in zip(a.params, b.params, strict=True))
        )
    return None


def _has_dyn(t: CelType) -> bool:
    return t == DYN or any(_has_dyn(p) for p in t.params)


class Checker:
    """Checks one expression against the activation's variables and a policy's `variables`."""

    def __init__(
        self,
        source: str,
        activation: Mapping[str, CelType],
        variables: Mapping[str, Checked],
    ) -> None:
        self.source = source
        self.activation = activation
        self.variables = variables
        self.scopes: list[dict[str, Checked]] = []

    # -- reporting --------------------------------------------------------------------------

    def fail(self, node: Any, message: str) -> CheckError:
        token = _first_token(node)
        if token is None:
            return CheckError(message, None, None)
        return CheckError(message, token.line or 1, token.column or 1)

    def text(self, node: Any) -> str:
        """The source of `node` (lark drops closing brackets from the tree: they are re-added)."""
        first, last = _first_token(node), _last_token(node)
        if first is None or last is None or first.start_pos is None or last.end_pos is None:
            return "expression"
        end = last.end_pos
        text = self.source[first.start_pos : end]
        while end < len(self.source):
            opened = sum(text.count(o) - text.count(c) for o, c in ("()", "[]", "{}"))
            rest = self.source[end:]
            stripped = rest.lstrip()
            if opened <= 0 or not stripped or stripped[0] not in ")]}":
                break
            end += len(rest) - len(stripped) + 1
            text = self.source[first.start_pos : end]
        return text

    def describe(self, node: Any, checked: Checked) -> str:
        """`region.depth (int)`, or `int (int)` for a literal, for error messages."""
        inner = node
        while isinstance(inner, lark.Tree) and len(inner.children) == 1:
            if inner.data == "literal":
                return f"{checked.type} ({checked.type})"
            inner = inner.children[0]
        return f"{self.text(node)} ({checked.type})"

    # -- walk -------------------------------------------------------------------------------

    def check(self, node: Any) -> Checked:
        if not isinstance(node, lark.Tree):
            raise self.fail(node, f"unexpected token {node!r}")
        data = node.data
        children = node.children
        if data in _PASS and len(children) == 1:
            return self.check(children[0])
        method = getattr(self, f"_{data}", None)
        if method is None:
            raise self.fail(node, f"{data.replace('_', ' ')} is not supported")
        result: Checked = method(node)
        return result

    def _expr(self, node: lark.Tree[Any]) -> Checked:
        condition, yes, no = (self.check(c) for c in node.children)
        self.expect_bool(node.children[0], condition, "the condition of ?:")
        joined = _join(yes.type, no.type)
        if joined is None:
            raise self.fail(
                node.children[1],
                f"the branches of ?: have different types: {yes.type} and {no.type}",
            )
        return Checked(
            joined,
            _add(condition.iterations, yes.iterations, no.iterations),
            _add(condition.cost, yes.cost, no.cost, _ONE),
            yes.shape if yes.shape is not None else no.shape,
            condition.dynamic or yes.dynamic or no.dynamic,
        )

    def _logical(self, node: lark.Tree[Any], operator: str) -> Checked:
        left, right = (self.check(c) for c in node.children)
        for child, checked in zip(node.children, (left, right), strict=True):
            self.expect_bool(child, checked, f"{operator}")
        return self.combine(BOOL, left, right)

    def _conditionalor(self, node: lark.Tree[Any]) -> Checked:
        return self._logical(node, "||")

    def _conditionaland(self, node: lark.Tree[Any]) -> Checked:
        return self._logical(node, "&&")

    def expect_bool(self, node: Any, checked: Checked, where: str) -> None:
        if checked.type not in (BOOL, DYN):
            raise self.fail(node, f"{where} needs a bool, got {self.describe(node, checked)}")

    def combine(self, result: CelType, *parts: Checked, cost: Bound = _ONE) -> Checked:
        return Checked(
            result,
            _add(*(p.iterations for p in parts)),
            _add(*(p.cost for p in parts), cost),
            None,
            any(p.dynamic for p in parts),
        )

    def _binary(self, node: lark.Tree[Any]) -> tuple[str, Any, Any, Checked, Checked]:
        operator_node, right_node = node.children
        operator = operator_node.data.split("_", 1)[1]
        left_node = operator_node.children[0]
        return operator, left_node, right_node, self.check(left_node), self.check(right_node)

    def no_dyn(self, node: Any, checked: Checked, operator: str) -> None:
        if _has_dyn(checked.type):
            raise self.fail(
                node,
                f"{self.describe(node, checked)} has no static type, so '{operator}' on it "
                "could give different results on the two CEL backends; convert it first "
                "(int(), double(), string()) or give the list or map one element type",
            )

    def _relation(self, node: lark.Tree[Any]) -> Checked:
        operator, left_node, right_node, left, right = self._binary(node)
        symbol = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "in": "in"}[
            operator
        ]
        for child, checked in ((left_node, left), (right_node, right)):
            self.no_dyn(child, checked, symbol)
        if operator == "in":
            container = right.type
            if container.name == "list" or container.name == "map":
                element = container.params[0]
            else:
                raise self.fail(
                    right_node,
                    "'in' needs a list or map on its right, got "
                    + self.describe(right_node, right),
                )
            if not _same(left.type, element):
                raise self.fail(
                    left_node,
                    f"cannot look for {self.describe(left_node, left)} in "
                    f"{self.describe(right_node, right)}",
                )
            scan = self.count(right) if container.name == "list" else _ONE
            return self.combine(BOOL, left, right, cost=scan)
        comparable = _same(left.type, right.type) or (
            operator in ("eq", "ne")
            and NULL in (left.type, right.type)
            and self.nullable(left, right)
        )
        if operator not in ("eq", "ne") and comparable and left.type not in _ORDERED:
            comparable = False
        if not comparable:
            hint = ""
            if {left.type, right.type} <= set(_NUMBERS):
                hint = (
                    "; CEL does not compare int, uint and double with each other: write 1.0 "
                    "for a double, 1 an int, 1u a uint, or convert with int()/double()"
                )
            raise self.fail(
                left_node,
                f"cannot compare {self.describe(left_node, left)} with "
                f"{self.describe(right_node, right)}{hint}",
            )
        scan = _ONE
        if left.type.name in ("list", "map"):
            scan = _add(self.count(left), self.count(right))
        return self.combine(BOOL, left, right, cost=scan)

    @staticmethod
    def nullable(left: Checked, right: Checked) -> bool:
        other = right.type if left.type == NULL else left.type
        return other == NULL or other.is_struct

    def _addition(self, node: lark.Tree[Any]) -> Checked:
        operator, left_node, right_node, left, right = self._binary(node)
        symbol = "+" if operator == "add" else "-"
        for child, checked in ((left_node, left), (right_node, right)):
            if checked.type.name != "list":
                self.no_dyn(child, checked, symbol)
        lt, rt = left.type, right.type
        result: CelType | None = None
        if operator == "add":
            if lt == rt and lt in (*_NUMBERS, STRING, BYTES):
                result = lt
            elif lt.name == "list" and rt.name == "list":
                result = _join(lt, rt)
            elif {lt, rt} == {TIMESTAMP, DURATION}:
                result = TIMESTAMP
            elif lt == rt == DURATION:
                result = DURATION
        else:
            if lt == rt and lt in _NUMBERS:
                result = lt
            elif lt == rt == TIMESTAMP:
                result = DURATION
            elif lt == TIMESTAMP and rt == DURATION:
                result = TIMESTAMP
            elif lt == rt == DURATION:
                result = DURATION
        if result is None:
            raise self.fail(node, self.no_overload(symbol, left_node, left, right_node, right))
        if result.name == "list":
            shape = self.list_shape(left, right)
            checked = self.combine(result, left, right, cost=shape.count)
            return Checked(checked.type, checked.iterations, checked.cost, shape, checked.dynamic)
        return self.combine(result, left, right)

    def list_shape(self, left: Checked, right: Checked) -> Shape:
        count = _add(self.count(left), self.count(right))
        elements = [s.element for s in (left.shape, right.shape) if s is not None and s.element]
        element = None
        if len(elements) == 2:
            a, b = elements
            element = Shape(lambda sizes: max(a.count(sizes), b.count(sizes)))
        return Shape(count, element)

    def no_overload(
        self, symbol: str, left_node: Any, left: Checked, right_node: Any, right: Checked
    ) -> str:
        hint = ""
        if {left.type, right.type} <= set(_NUMBERS):
            hint = "; CEL does not mix int, uint and double: convert one side with int()/double()"
        return (
            f"no '{symbol}' for {self.describe(left_node, left)} and "
            f"{self.describe(right_node, right)}{hint}"
        )

    def _multiplication(self, node: lark.Tree[Any]) -> Checked:
        operator, left_node, right_node, left, right = self._binary(node)
        symbol = {"mul": "*", "div": "/", "mod": "%"}[operator]
        for child, checked in ((left_node, left), (right_node, right)):
            self.no_dyn(child, checked, symbol)
        allowed = (INT, UINT) if operator == "mod" else _NUMBERS
        if left.type != right.type or left.type not in allowed:
            raise self.fail(node, self.no_overload(symbol, left_node, left, right_node, right))
        return self.combine(left.type, left, right)

    def _unary(self, node: lark.Tree[Any]) -> Checked:
        if len(node.children) == 1:
            return self.check(node.children[0])
        operator, operand_node = node.children
        operand = self.check(operand_node)
        if operator.data == "unary_not":
            self.expect_bool(operand_node, operand, "!")
            return self.combine(BOOL, operand)
        self.no_dyn(operand_node, operand, "-")
        if operand.type not in (INT, DOUBLE):
            raise self.fail(node, f"no unary '-' for {self.describe(operand_node, operand)}")
        return self.combine(operand.type, operand)

    def _member(self, node: lark.Tree[Any]) -> Checked:
        return self.check(node.children[0])

    def _primary(self, node: lark.Tree[Any]) -> Checked:
        return self.check(node.children[0])

    def _paren_expr(self, node: lark.Tree[Any]) -> Checked:
        return self.check(node.children[0])

    def _literal(self, node: lark.Tree[Any]) -> Checked:
        token = node.children[0]
        result = _LITERALS.get(token.type) if isinstance(token, lark.Token) else None
        if result is None:
            raise self.fail(node, f"unknown literal {token!s}")
        shape = Shape(_const(len(str(token)))) if result in (STRING, BYTES) else None
        return Checked(result, shape=shape)

    def _list_lit(self, node: lark.Tree[Any]) -> Checked:
        items = [self.check(c) for c in node.children[0].children] if node.children else []
        element = DYN
        if items:
            joined: CelType | None = items[0].type
            for item in items[1:]:
                joined = _join(joined, item.type) if joined is not None else None
            element = joined if joined is not None else DYN
        inner = [i.shape for i in items if i.shape is not None]
        element_shape = None
        if inner and len(inner) == len(items):
            counts = [s.count for s in inner]
            element_shape = Shape(lambda sizes: max(c(sizes) for c in counts))
        checked = self.combine(list_of(element), *items)
        return Checked(
            checked.type,
            checked.iterations,
            checked.cost,
            Shape(_const(len(items)), element_shape),
            checked.dynamic,
        )

    def _map_lit(self, node: lark.Tree[Any]) -> Checked:
        entries = node.children[0].children if node.children else []
        keys = [self.check(c) for c in entries[0::2]]
        values = [self.check(c) for c in entries[1::2]]
        for key_node, key in zip(entries[0::2], keys, strict=True):
            if key.type not in (INT, UINT, BOOL, STRING, DYN):
                raise self.fail(
                    key_node, f"a map key must be int, uint, bool or string, got {key.type}"
                )
        types = []
        for group in (keys, values):
            joined: CelType | None = group[0].type if group else DYN
            for item in group[1:]:
                joined = _join(joined, item.type) if joined is not None else None
            types.append(joined if joined is not None else DYN)
        checked = self.combine(map_of(types[0], types[1]), *keys, *values)
        return Checked(
            checked.type,
            checked.iterations,
            checked.cost,
            Shape(_const(len(keys))),
            checked.dynamic,
        )

    def _member_object(self, node: lark.Tree[Any]) -> Checked:
        raise self.fail(node, "message construction (Type{...}) is not supported")

    def _dot_ident(self, node: lark.Tree[Any]) -> Checked:
        return self.identifier(node, str(node.children[0]), scoped=False)

    def _ident(self, node: lark.Tree[Any]) -> Checked:
        return self.identifier(node, str(node.children[0]), scoped=True)

    def identifier(self, node: Any, name: str, scoped: bool) -> Checked:
        if scoped:
            for scope in reversed(self.scopes):
                if name in scope:
                    return scope[name]
        if name in self.activation:
            declared = self.activation[name]
            return Checked(declared)
        if name == "variables":
            raise self.fail(node, "use variables.<name> to read one of the policy's variables")
        known = [*self.activation, "variables"]
        tip = did_you_mean(name, known, listing="known")
        raise self.fail(node, f"unknown variable {name!r}{tip}")

    def _member_dot(self, node: lark.Tree[Any]) -> Checked:
        target_node, name_token = node.children
        name = str(name_token)
        if self.is_root(target_node, "variables"):
            if name in self.variables:
                return self.variables[name]
            tip = did_you_mean(name, list(self.variables), listing="defined before this point")
            raise self.fail(node, f"variables.{name} is not defined{tip}")
        target = self.check(target_node)
        return self.select(node, target_node, target, name, test=False)

    def is_root(self, node: Any, name: str) -> bool:
        """Whether `node` is the bare top-level identifier `name` (not a macro's variable)."""
        while isinstance(node, lark.Tree) and node.data in ("member", "primary"):
            node = node.children[0]
        if not isinstance(node, lark.Tree) or node.data not in ("ident", "dot_ident"):
            return False
        if str(node.children[0]) != name:
            return False
        return node.data == "dot_ident" or not any(name in s for s in self.scopes)

    def select(
        self, node: Any, target_node: Any, target: Checked, name: str, test: bool
    ) -> Checked:
        t = target.type
        result: CelType | None
        if t.is_struct:
            result = t.field(name)
            if result is None:
                owner = self.text(target_node)
                fields = [n for n, _ in t.fields]
                tip = did_you_mean(name, fields, listing="fields")
                raise self.fail(node, f"{owner} has no field {name!r}{tip}")
        elif t.name == "map" and t.params[0] in (STRING, DYN):
            result = t.params[1]
        elif t == DYN:
            result = DYN
        else:
            raise self.fail(
                node, f"{self.describe(target_node, target)} has no fields (selecting {name!r})"
            )
        if test:
            return self.combine(BOOL, target)
        shape = None
        if target.shape is None and t.is_struct and result.name == "list":
            root = self.text(target_node)
            key = f"{root}.{name}"
            shape = Shape(lambda sizes: sizes.get(key, DECLARED_LIST_SIZE))
            return Checked(result, target.iterations, _add(target.cost, _ONE), shape, True)
        return Checked(result, target.iterations, _add(target.cost, _ONE), shape, target.dynamic)

    def _member_index(self, node: lark.Tree[Any]) -> Checked:
        target_node, index_node = node.children
        target, index = self.check(target_node), self.check(index_node)
        t = target.type
        if t.name == "list":
            if index.type not in (INT, DYN):
                raise self.fail(
                    index_node,
                    f"a list index must be an int, got {self.describe(index_node, index)}",
                )
            self.no_dyn(index_node, index, "[]")
            result = t.params[0]
        elif t.name == "map":
            self.no_dyn(index_node, index, "[]")
            if not _same(index.type, t.params[0]):
                raise self.fail(
                    index_node,
                    f"a key of {self.describe(target_node, target)} must be {t.params[0]}, "
                    f"got {self.describe(index_node, index)}",
                )
            result = t.params[1]
        elif t == DYN:
            result = DYN
        else:
            raise self.fail(node, f"{self.describe(target_node, target)} cannot be indexed")
        element = target.shape.element if target.shape is not None else None
        checked = self.combine(result, target, index)
        return Checked(result, checked.iterations, checked.cost, element, checked.dynamic)

    def args(self, node: Any) -> list[Any]:
        return list(node.children) if node is not None else []

    def _ident_arg(self, node: lark.Tree[Any]) -> Checked:
        name = str(node.children[0])
        arg_nodes = self.args(node.children[1] if len(node.children) > 1 else None)
        return self.call(node, name, None, None, arg_nodes)

    def _dot_ident_arg(self, node: lark.Tree[Any]) -> Checked:
        return self._ident_arg(node)

    def _member_dot_arg(self, node: lark.Tree[Any]) -> Checked:
        target_node, name_token = node.children[0], node.children[1]
        arg_nodes = self.args(node.children[2] if len(node.children) > 2 else None)
        name = str(name_token)
        if name in MACROS:
            return self.macro(node, target_node, name, arg_nodes)
        return self.call(node, name, target_node, self.check(target_node), arg_nodes)

    def call(
        self,
        node: Any,
        name: str,
        target_node: Any,
        target: Checked | None,
        arg_nodes: list[Any],
    ) -> Checked:
        if name == "has" and target is None:
            return self.has(node, arg_nodes)
        known = _MEMBERS if target is not None else FUNCTIONS
        if name not in known:
            tip = did_you_mean(name, known)
            kind = "method" if target is not None else "function"
            raise self.fail(node, f"unknown {kind} {name!r}{tip}")
        args = [self.check(a) for a in arg_nodes]
        parts = [*([target] if target is not None else []), *args]
        types = [p.type for p in parts]
        nodes = [*([target_node] if target is not None else []), *arg_nodes]
        if name != "dyn":
            for part_node, part in zip(nodes, parts, strict=True):
                if part.type == DYN:
                    self.no_dyn(part_node, part, f"{name}()")
        if name == "string" and types == [DOUBLE]:
            raise self.fail(
                node,
                "string() of a double is written differently by the two CEL backends "
                "('100.0' or '100'): format an int (string(int(x))) or compare the number",
            )
        result = self.overload(name, target is not None, types)
        if result is None:
            given = ", ".join(str(t) for t in types)
            raise self.fail(node, f"no overload of {name}() takes ({given})")
        if name == "dyn":
            return Checked(
                DYN, parts[0].iterations, parts[0].cost, parts[0].shape, parts[0].dynamic
            )
        return self.combine(result, *parts)

    @staticmethod
    def overload(name: str, member: bool, types: list[CelType]) -> CelType | None:
        if name == "size" and len(types) == 1:
            return INT if types[0].name in ("string", "bytes", "list", "map") else None
        if member:
            receiver, rest = types[0], types[1:]
            if name in _STRING_MEMBERS:
                return BOOL if receiver == STRING and rest == [STRING] else None
            if receiver == TIMESTAMP and name in _TIME_GETTERS and rest in ([], [STRING]):
                return INT
            if receiver == DURATION and name in _DURATION_GETTERS and not rest:
                return INT
            return None
        if name == "matches":
            return BOOL if types == [STRING, STRING] else None
        if name == "dyn" and len(types) == 1:
            return DYN
        if name in _CONVERSIONS and len(types) == 1:
            accepted, result = _CONVERSIONS[name]
            return result if types[0] in accepted else None
        return None

    def has(self, node: Any, arg_nodes: list[Any]) -> Checked:
        inner = arg_nodes[0] if len(arg_nodes) == 1 else None
        while isinstance(inner, lark.Tree) and inner.data in (*_PASS, "unary", "member"):
            if len(inner.children) != 1:
                break
            inner = inner.children[0]
        if not isinstance(inner, lark.Tree) or inner.data != "member_dot":
            raise self.fail(node, "has() takes one field selection, as in has(x.field)")
        target_node, name_token = inner.children
        name = str(name_token)
        if self.is_root(target_node, "variables"):
            raise self.fail(node, "has(variables.x) is always true: variables are always set")
        target = self.check(target_node)
        return self.select(inner, target_node, target, name, test=True)

    def macro(self, node: Any, target_node: Any, name: str, arg_nodes: list[Any]) -> Checked:
        target = self.check(target_node)
        t = target.type
        expected = (2, 3) if name == "map" else (2,)
        if len(arg_nodes) not in expected:
            raise self.fail(node, f"{name}() takes a variable and an expression")
        variable = self.macro_variable(arg_nodes[0])
        if variable is None:
            raise self.fail(arg_nodes[0], f"the first argument of {name}() must be a name")
        if t.name == "list" or t.name == "map":
            element = t.params[0]
        else:
            raise self.fail(
                node,
                f"{name}() iterates over a list or map, not {self.describe(target_node, target)}",
            )
        count = self.count(target)
        element_shape = target.shape.element if target.shape is not None else None
        self.scopes.append({variable: Checked(element, shape=element_shape)})
        try:
            bodies = [self.check(a) for a in arg_nodes[1:]]
        finally:
            self.scopes.pop()
        if name in ("all", "exists", "exists_one"):
            self.expect_bool(arg_nodes[1], bodies[0], f"the condition of {name}()")
            result = BOOL
        elif name == "filter":
            self.expect_bool(arg_nodes[1], bodies[0], "the condition of filter()")
            result = list_of(element)
        else:
            if len(bodies) == 2:
                self.expect_bool(arg_nodes[1], bodies[0], "the condition of map()")
            result = list_of(bodies[-1].type)
        body_iterations = _add(*(b.iterations for b in bodies))
        body_cost = _add(*(b.cost for b in bodies))

        def iterations(sizes: Sizes) -> int:
            return target.iterations(sizes) + count(sizes) * (1 + body_iterations(sizes))

        def cost(sizes: Sizes) -> int:
            return target.cost(sizes) + count(sizes) * (1 + body_cost(sizes))

        shape = None
        if result.name == "list":
            shape = Shape(count, bodies[-1].shape if name == "map" else element_shape)
        return Checked(result, iterations, cost, shape, True)

    @staticmethod
    def macro_variable(node: Any) -> str | None:
        while isinstance(node, lark.Tree) and len(node.children) == 1:
            if node.data == "ident":
                return str(node.children[0])
            node = node.children[0]
        return None

    def count(self, checked: Checked) -> Bound:
        if checked.shape is not None:
            return checked.shape.count
        return _const(DECLARED_LIST_SIZE)


def check(
    tree: lark.Tree[Any],
    source: str,
    activation: Mapping[str, CelType],
    variables: Mapping[str, Checked],
) -> Checked:
    """The type and bounds of one parsed expression; raises CheckError."""
    return Checker(source, activation, variables).check(tree)


def over_limits(checked: Checked, sizes: Sizes) -> str | None:
    """Why `checked` may not run over lists of these sizes, or None when it may."""
    iterations = checked.iterations(sizes)
    if iterations > MAX_ITERATIONS:
        return (
            f"may iterate {iterations:,} times over these lists, over the limit of "
            f"{MAX_ITERATIONS:,} per evaluation"
        )
    cost = checked.cost(sizes)
    if cost > MAX_COST:
        return f"may cost {cost:,} units over these lists, over the limit of {MAX_COST:,}"
    return None
