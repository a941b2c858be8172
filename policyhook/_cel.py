"""CEL behind one small interface: compile once, evaluate many times, errors as exceptions.

This module holds the interface every backend implements and the reference backend,
cel-python, a required dependency; it is the only module that imports `celpy`. cel-python keeps
process-wide state that is not thread-safe (its compiled runner passes the activation to
generated code through a module global), so every evaluation holds one process-wide lock. The
fast backend, Google's C++ runtime, lives in `policyhook._cel_expr`; `policyhook._backends`
chooses between them.
"""

from __future__ import annotations

import datetime
import functools
import logging
import math
import operator
import sys
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

# cel-python logs every evaluation error at ERROR level before raising it; we report errors
# ourselves (decision, span, metric), so its duplicate line is noise in the host's logs.
logging.getLogger("celpy").setLevel(logging.CRITICAL)

#: Bounds that keep one policy from making every decision expensive.
MAX_EXPRESSION_CHARS = 4096
MAX_NESTING = 400  # parse-tree depth; a plain comparison is ~10 deep, each parenthesis adds ~12


class CompileError(ValueError):
    """An expression that does not parse or breaks a bound; `line`/`column` are 1-based."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        self.line = line
        self.column = column
        super().__init__(message)


class EvaluationError(RuntimeError):
    """An expression that failed at evaluation time (missing key, no such overload, …)."""


class Program(Protocol):
    def evaluate(self, context: Any) -> Any:
        """Evaluate against a context made by `Backend.context`; raises EvaluationError."""


class Backend(Protocol):
    """What the policy engine needs from a CEL runtime."""

    name: str
    #: Whether CEL's `cel.bind` works, so a policy with variables can run as one program.
    binds: bool

    def compile(self, source: str) -> Program: ...

    def context(self, activation: Mapping[str, Any]) -> Any:
        """Convert a plain-data activation once per decision."""

    def bind(self, context: Any, variables: Mapping[str, Any]) -> Any:
        """`context` with the policy's evaluated `variables` (backend values) added."""

    def to_python(self, value: Any) -> Any:
        """A result as a plain Python value (bool, str, int, float, list, dict)."""


_lock = threading.RLock()
_parser_env: celpy.Environment | None = None


def _environment() -> celpy.Environment:
    # One environment for the process: cel-python's parser is a class-level singleton and a
    # compiled-runner environment made after an interpreted one can break it. Its constructor
    # raises the process's recursion limit to 2,500; the host's limit is put back (MAX_NESTING
    # keeps our expressions shallow enough for the default limit).
    global _parser_env
    if _parser_env is None:
        limit = sys.getrecursionlimit()
        try:
            _parser_env = celpy.Environment(runner_class=celpy.CompiledRunner)
        finally:
            sys.setrecursionlimit(limit)
    return _parser_env


def parse(source: str) -> lark.Tree[Any]:
    """Parse and bound-check one expression."""
    if len(source) > MAX_EXPRESSION_CHARS:
        raise CompileError(f"expression is {len(source)} characters, over {MAX_EXPRESSION_CHARS}")
    with _lock:
        try:
            tree = _environment().compile(source)
        except CELParseError as exc:
            first = str(exc).splitlines()[0] if str(exc) else "syntax error"
            raise CompileError(first, exc.line, exc.column) from None
        except RecursionError:
            raise CompileError(f"expression nests deeper than {MAX_NESTING} levels") from None
    depth = _depth(tree)
    if depth > MAX_NESTING:
        raise CompileError(f"expression nests {depth} levels deep, over {MAX_NESTING}")
    return tree


def _selects(tree: lark.Tree[Any]) -> Iterator[tuple[lark.Tree[Any], lark.Tree[Any], str]]:
    """`(select node, root identifier node, field)` for every `name.field` select in `tree`."""
    for node in tree.iter_subtrees():
        if node.data != "member_dot":
            continue
        target, field = node.children
        primary = target.children[0] if isinstance(target, lark.Tree) else None
        if not (isinstance(primary, lark.Tree) and primary.data == "primary"):
            continue
        root = primary.children[0]
        if isinstance(root, lark.Tree) and root.data in ("ident", "dot_ident"):
            yield node, root, str(field)


@functools.lru_cache(maxsize=4096)  # a pure function of its text; a reload re-reads the same
def fields_read(source: str) -> Mapping[str, frozenset[str] | None]:
    """The top-level names `source` reads, each with the fields selected from it (`region.kind`
    gives `{"region": {"kind"}}`), or None where the name is used whole (`size(region)`,
    `region["kind"]`, `[region]`): then every field may matter.

    Sound by construction: a name counts as read field by field only where every use of it is
    a `name.field` select, so an activation cut down to these fields evaluates exactly as the
    whole one. Macro variables and names the activation lacks are listed too; callers keep the
    names they know.
    """
    tree = parse(source)
    read: dict[str, set[str] | None] = {}
    selected: set[int] = set()  # the ident nodes that are the root of a `name.field` select
    for _, root, field in _selects(tree):
        selected.add(id(root))
        fields = read.setdefault(str(root.children[0]), set())
        if fields is not None:
            fields.add(field)
    for node in tree.iter_subtrees():
        if node.data in ("ident", "dot_ident") and id(node) not in selected:
            read[str(node.children[0])] = None  # used whole
    return MappingProxyType({n: None if f is None else frozenset(f) for n, f in read.items()})


#: How `flatten` found a select used: for its value, for its size only (`size(x)`,
#: `x.size()`), or only as the right operand of `in` (where its order cannot matter).
USES = ("value", "size", "in")
#: Nodes of one child that only wrap an expression (each level of CEL's grammar).
_WRAPPERS = frozenset(
    [
        "expr",
        "conditionalor",
        "conditionaland",
        "relation",
        "addition",
        "multiplication",
        "unary",
        "member",
    ]
)


def identifiers(source: str) -> frozenset[str]:
    """Every identifier `source` names (variables, macro variables, fields, functions)."""
    tree = parse(source)
    found = tree.scan_values(lambda v: isinstance(v, lark.Token) and v.type == "IDENT")
    return frozenset(str(token) for token in found)


def flatten(
    source: str,
    roots: Collection[str],
    lists: Collection[tuple[str, str]],
    name: Callable[[str, str, str], str],
) -> tuple[str, frozenset[tuple[str, str, str]]]:
    """`source` with each `root.field` select (`root` in `roots`) replaced by the identifier
    `name(root, field, use)`, and what it then reads: `(root, field, use)` for each.

    Why: a runtime converts a map per variable and a list element by element on every call;
    an identifier bound to a plain value costs neither. A select of a list field (`lists`)
    inside `size(...)` or `.size()` becomes one identifier for the size, so k source ids need
    not be converted to count them; one that is only the right operand of `in` may be bound
    in any order. `has(root.field)` becomes `true`: the caller flattens only activations that
    hold every field (`_activation.Activation`). Every other use of a select reads its value,
    in the order the activation gives. The caller must flatten only roots that `fields_read`
    finds used field by field (a root used whole is not rewritten here), and choose names no
    identifier of the source already is (`identifiers`).
    """
    tree = parse(source)
    parents: dict[int, lark.Tree[Any]] = {}
    for node in tree.iter_subtrees():
        for child in node.children:
            if isinstance(child, lark.Tree):
                parents[id(child)] = node
    edits: list[tuple[int, int, str]] = []
    reads: set[tuple[str, str, str]] = set()
    for node, root, field in _selects(tree):
        variable = str(root.children[0])
        if variable not in roots:
            continue
        key = (variable, field)
        top = node  # the outermost node that is this select alone
        while (up := parents.get(id(top))) is not None and up.data in _WRAPPERS:
            if len(up.children) != 1:
                break
            top = up
        up = parents.get(id(top))
        call = parents.get(id(up)) if up is not None and up.data == "exprlist" else None
        span, use, text = node, "value", ""
        if call is not None and call.data == "ident_arg" and len(up.children) == 1:  # type: ignore[union-attr]
            function = str(call.children[0])
            if function == "has":
                span, text = call, "true"
            elif function == "size" and key in lists:
                span, use = call, "size"
        elif (
            up is not None
            and up.data == "member_dot_arg"
            and len(up.children) == 2
            and str(up.children[1]) == "size"
            and key in lists
        ):
            span, use = up, "size"
        elif (
            up is not None
            and up.data == "relation"
            and len(up.children) == 2
            and up.children[1] is top
            and isinstance(up.children[0], lark.Tree)
            and up.children[0].data == "relation_in"
            and key in lists
        ):
            use = "in"
        if span.meta.empty:
            raise CompileError(f"cannot flatten {source!r}: no position for {key}")
        if not text:
            text = name(variable, key[1], use)
            reads.add((*key, use))
        edits.append((span.meta.start_pos, span.meta.end_pos, text))
    edited, end = [], len(source)
    for start, stop, text in sorted(edits, reverse=True):
        if stop > end:  # nested selects never overlap: a select's root is an identifier
            raise CompileError(f"cannot flatten {source!r}: overlapping selects")
        edited.append(source[stop:end])
        edited.append(text)
        end = start
    edited.append(source[:end])
    return "".join(reversed(edited)), frozenset(reads)


def plain(value: Any) -> Any:
    """`value` with a read-only mapping (an `Activation`'s variable) as the dict a runtime
    converts; anything else as it is."""
    return dict(value) if isinstance(value, MappingProxyType) else value


def _depth(tree: lark.Tree[Any]) -> int:
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((c, level + 1) for c in node.children if isinstance(c, lark.Tree))
    return deepest


class _CelPyProgram:
    __slots__ = ("_runner",)

    def __init__(self, runner: Any) -> None:
        self._runner = runner

    def evaluate(self, context: Any) -> Any:
        with _lock:
            try:
                return self._runner.evaluate(context)
            except CELEvalError as exc:
                raise EvaluationError(_reason(exc)) from None
            except Exception as exc:  # a cel-python internal failure is still an error value
                raise EvaluationError(f"{type(exc).__name__}: {exc}") from None


def _reason(exc: BaseException) -> str:
    """cel-python nests the real reason in args: ('evaluation error', cls, (reason, cls, args))."""
    args: Any = exc.args
    while isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], tuple):
        if not args[2]:
            break
        inner = args[2]
        if isinstance(inner[0], str) and len(inner) >= 2 and isinstance(inner[1], type):
            args = inner
            continue
        if isinstance(inner[0], str):
            return f"{args[0]}: {inner[0]}"
        break
    return str(args[0]) if isinstance(args, tuple) and args else str(exc)


def _uses_has(tree: lark.Tree[Any]) -> bool:
    return any(
        node.data == "ident_arg" and str(node.children[0]) == "has" for node in tree.iter_subtrees()
    )


def _index(container: Any, index: Any) -> Any:
    """CEL's `_[_]`: a negative list index is an error, as in CEL (Python would count back)."""
    if isinstance(container, list) and isinstance(index, int) and index < 0:
        raise IndexError(f"index {index} out of range")
    return operator.getitem(container, index)


def _add(left: Any, right: Any) -> Any:
    """CEL's `_+_`: joined strings and lists stay CEL values (cel-python returns a bare str, on
    which `.contains()` then fails)."""
    result = operator.add(left, right)
    if type(result) is str:
        return celtypes.StringType(result)
    if type(result) is list:
        return celtypes.ListType(result)
    return result


def _divide(left: Any, right: Any) -> Any:
    """CEL's `_/_`: IEEE 754 for doubles (cel-python gives +inf for -1.0/0.0 and 0.0/0.0)."""
    if isinstance(left, float) and isinstance(right, float) and right == 0.0:
        if left != left or left == 0.0:
            return celtypes.DoubleType(math.nan)
        return celtypes.DoubleType(math.copysign(math.inf, left) * math.copysign(1.0, right))
    return operator.truediv(left, right)


def _int(value: Any) -> Any:
    """CEL's `int()`: a double must lie strictly inside int64's range (as in cel-expr-python)."""
    if isinstance(value, float) and not -(2.0**63) < value < 2.0**63:
        raise ValueError("double out of int64 range")
    return celtypes.IntType(value)


def _uint(value: Any) -> Any:
    """CEL's `uint()`: a double must lie in [0, 2^64) (cel-python truncates -0.5 to 0)."""
    if isinstance(value, float) and not 0.0 <= value < 2.0**64:
        raise ValueError("double out of uint64 range")
    return celtypes.UintType(value)


def _string(value: Any) -> Any:
    """CEL's `string()`: a bool is "true"/"false", a duration and a timestamp keep their
    fraction (0, 3 or 6 digits) and a timestamp is written in UTC, as protobuf's JSON form and
    cel-expr-python give them (cel-python writes Python's "True", drops fractions, so -1.5s is
    "-1s", and keeps the timestamp's offset)."""
    if isinstance(value, celtypes.BoolType):
        return celtypes.StringType("true" if value else "false")
    if isinstance(value, celtypes.DurationType):
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        seconds, fraction = divmod(abs(micros), 1_000_000)
        sign = "-" if micros < 0 else ""
        return celtypes.StringType(f"{sign}{seconds}{_fraction(fraction)}s")
    if isinstance(value, celtypes.TimestampType):
        utc = value.astimezone(datetime.UTC) if value.tzinfo else value
        return celtypes.StringType(
            f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:"
            f"{utc.second:02d}{_fraction(utc.microsecond)}Z"
        )
    return celtypes.StringType(value)


def _fraction(micros: int) -> str:
    """Protobuf JSON's fraction of a second: none, milliseconds or microseconds."""
    if micros == 0:
        return ""
    return f".{micros // 1000:03d}" if micros % 1000 == 0 else f".{micros:06d}"


#: cel-python functions replaced where cel-python departs from CEL (and from cel-expr-python).
_FUNCTIONS: dict[str, Any] = {
    "_[_]": _index,
    "_+_": _add,
    "_/_": _divide,
    "int": _int,
    "uint": _uint,
    "string": _string,
}

# The compiled runner calls functions by `module.qualname` from celpy.evaluation's namespace:
# ours are added there under names of their own (nothing of cel-python's is replaced).
for _function in _FUNCTIONS.values():
    _function.__module__ = "celpy.evaluation"
    _function.__name__ = _function.__qualname__ = f"_policyhook{_function.__name__}"
    setattr(celpy.evaluation, _function.__name__, _function)


class CelPythonBackend:
    """cel-python with its compiled runner (transpiled to Python, ~5x the interpreter's speed)."""

    name = "cel-python"
    binds = False  # cel-python has no bindings extension

    def compile(self, source: str) -> Program:
        tree = parse(source)
        with _lock:
            try:
                if _uses_has(tree):
                    # The compiled runner transpiles has() to a Python bool that `!`, `&&` and
                    # `||` then reject ("no such overload"); the interpreter gets it right.
                    runner = celpy.InterpretedRunner(_environment(), tree, _FUNCTIONS)
                    return _CelPyProgram(runner)
                return _CelPyProgram(_environment().program(tree, _FUNCTIONS))
            except Exception as exc:
                raise CompileError(f"cannot compile: {exc}") from None

    def context(self, activation: Mapping[str, Any]) -> Any:
        return {name: celpy.adapter.json_to_cel(plain(value)) for name, value in activation.items()}

    def bind(self, context: Any, variables: Mapping[str, Any]) -> Any:
        bound = {celtypes.StringType(k): v for k, v in variables.items()}
        return {**context, "variables": celtypes.MapType(bound)}

    def to_python(self, value: Any) -> Any:
        if isinstance(value, celtypes.BoolType):
            return bool(value)
        if isinstance(value, celtypes.StringType):
            return str(value)
        if isinstance(value, celtypes.DoubleType):
            return float(value)
        if isinstance(value, celtypes.IntType | celtypes.UintType):
            return int(value)
        if isinstance(value, celtypes.ListType):
            return [self.to_python(v) for v in value]
        if isinstance(value, celtypes.MapType):
            return {str(k): self.to_python(v) for k, v in value.items()}
        return value
