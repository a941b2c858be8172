"""CEL behind one small interface: compile once, evaluate many times, errors as exceptions.

This is the only module that imports `celpy`. cel-python keeps process-wide state that is not
thread-safe (its compiled runner passes the activation to generated code through a module global),
so every evaluation holds one process-wide lock. Other backends plug in through `Backend`: the
fast one, Google's C++ runtime, lives in `policyhook.cel_expr` and is chosen by `default_backend`
when installed (`pip install 'policyhook[fast]'`; override with POLICYHOOK_CEL_BACKEND).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


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

    def compile(self, source: str) -> Program: ...

    def context(self, activation: Mapping[str, Any]) -> Any:
        """Convert a plain-data activation once per decision."""

    def bind(self, context: Any, variables: Mapping[str, Any]) -> Any:
        """`context` with the policy's evaluated `variables` (backend values) added."""

    def to_python(self, value: Any) -> Any:
        """A result as a plain Python value (bool, str, int, float, list, dict)."""


@dataclass(frozen=True)
class Reference:
    """A `variable.field` an expression reads, where it stands in the source."""

    variable: str
    field: str | None
    line: int
    column: int


@dataclass(frozen=True)
class Comparison:
    """A comparison whose operands' types can be read off the source: `region.depth > 1.5`."""

    left: str  # a "variable.field" or a literal's CEL type
    right: str
    left_is_field: bool
    right_is_field: bool
    line: int
    column: int


_LITERAL_TYPES = {
    "INT_LIT": "int",
    "UINT_LIT": "uint",
    "FLOAT_LIT": "double",
    "STRING_LIT": "string",
    "MLSTRING_LIT": "string",
    "BYTES_LIT": "bytes",
    "BOOL_LIT": "bool",
    "NULL_LIT": "null_type",
}

_lock = threading.RLock()
_parser_env: celpy.Environment | None = None


def _environment() -> celpy.Environment:
    # One environment for the process: cel-python's parser is a class-level singleton and a
    # compiled-runner environment made after an interpreted one can break it.
    global _parser_env
    if _parser_env is None:
        _parser_env = celpy.Environment(runner_class=celpy.CompiledRunner)
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


def _depth(tree: lark.Tree[Any]) -> int:
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((c, level + 1) for c in node.children if isinstance(c, lark.Tree))
    return deepest


def _ident(member: Any) -> lark.Token | None:
    """The identifier token of a bare `member -> primary -> ident`, if that is what this is."""
    if isinstance(member, lark.Tree) and member.data == "member" and len(member.children) == 1:
        primary = member.children[0]
        if isinstance(primary, lark.Tree) and primary.data == "primary":
            ident = primary.children[0]
            if isinstance(ident, lark.Tree) and ident.data == "ident":
                token = ident.children[0]
                return token if isinstance(token, lark.Token) else None
    return None


def references(tree: lark.Tree[Any]) -> Iterator[Reference]:
    """Every top-level identifier an expression reads, with the field it selects (if any).

    Identifiers bound by macros (`region.sources.all(s, …)`) are left out.
    """
    bound: set[str] = set()
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and str(node.children[1]) in MACROS:
            args = node.children[2]
            if isinstance(args, lark.Tree) and args.children:
                for token in args.children[0].scan_values(lambda v: isinstance(v, lark.Token)):
                    bound.add(str(token))
                    break
    selected: set[int] = set()
    for node in tree.iter_subtrees_topdown():  # type: ignore[no-untyped-call]
        if node.data == "member_dot":
            token = _ident(node.children[0])
            if token is not None and str(token) not in bound:
                selected.add(id(token))
                yield Reference(
                    str(token), str(node.children[1]), token.line or 1, token.column or 1
                )
        elif node.data == "ident":
            token = node.children[0]
            known = isinstance(token, lark.Token) and id(token) not in selected
            if known and str(token) not in bound:
                yield Reference(str(token), None, token.line or 1, token.column or 1)


def comparisons(tree: lark.Tree[Any]) -> Iterator[Comparison]:
    """Comparisons whose both operands are a plain field reference or a literal.

    cel-python's grammar nests the left operand in the operator's node:
    `relation(relation_gt(relation(<left>)), addition(<right>))`. `in` is not a comparison.
    """
    for node in tree.iter_subtrees():
        if node.data != "relation" or len(node.children) != 2:
            continue
        operator = node.children[0]
        if (
            not isinstance(operator, lark.Tree)
            or not operator.data.startswith("relation_")
            or operator.data == "relation_in"
            or len(operator.children) != 1
        ):
            continue
        sides = [_operand(operator.children[0]), _operand(node.children[1])]
        if sides[0] is None or sides[1] is None:
            continue
        (left, left_field, line, col), (right, right_field, _, _) = sides[0], sides[1]
        if left_field or right_field:
            yield Comparison(left, right, left_field, right_field, line, col)


def _operand(node: Any) -> tuple[str, bool, int, int] | None:
    """`("region.depth", True, line, col)` or `("double", False, line, col)` or None."""
    while (
        isinstance(node, lark.Tree)
        and len(node.children) == 1
        and node.data
        in (
            "relation",
            "addition",
            "multiplication",
            "unary",
            "expr",
            "conditionalor",
            "conditionaland",
        )
    ):
        node = node.children[0]
    if not isinstance(node, lark.Tree) or node.data != "member":
        return None
    child = node.children[0]
    if isinstance(child, lark.Tree) and child.data == "member_dot":
        ident = _ident(child.children[0])
        if ident is not None:
            return f"{ident}.{child.children[1]}", True, ident.line or 1, ident.column or 1
        return None
    if isinstance(child, lark.Tree) and child.data == "primary":
        literal = child.children[0]
        if isinstance(literal, lark.Tree) and literal.data == "literal":
            token = literal.children[0]
            if isinstance(token, lark.Token) and token.type in _LITERAL_TYPES:
                return _LITERAL_TYPES[token.type], False, token.line or 1, token.column or 1
    return None


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


class CelPythonBackend:
    """cel-python with its compiled runner (transpiled to Python, ~5x the interpreter's speed)."""

    name = "cel-python"

    def compile(self, source: str) -> Program:
        tree = parse(source)
        with _lock:
            try:
                if _uses_has(tree):
                    # The compiled runner transpiles has() to a Python bool that `!`, `&&` and
                    # `||` then reject ("no such overload"); the interpreter gets it right.
                    return _CelPyProgram(celpy.InterpretedRunner(_environment(), tree))
                return _CelPyProgram(_environment().program(tree))
            except Exception as exc:
                raise CompileError(f"cannot compile: {exc}") from None

    def context(self, activation: Mapping[str, Any]) -> Any:
        return {name: celpy.adapter.json_to_cel(value) for name, value in activation.items()}

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


#: Names a backend explicitly: `cel-python` or `cel-expr-python` (default: the fastest installed).
BACKEND_ENV = "POLICYHOOK_CEL_BACKEND"
CEL_PYTHON = "cel-python"
CEL_EXPR_PYTHON = "cel-expr-python"
BACKENDS = (CEL_PYTHON, CEL_EXPR_PYTHON)
_backends: dict[str, Backend] = {}


def _make(name: str) -> Backend:
    """The shared instance of backend `name` (backends hold no per-call state)."""
    with _lock:
        backend = _backends.get(name)
        if backend is None:
            if name == CEL_EXPR_PYTHON:
                from policyhook.cel_expr import CelExprBackend  # optional: policyhook[fast]

                backend = CelExprBackend()
            else:
                backend = CelPythonBackend()
            _backends[name] = backend
        return backend


def fast_backend_installed() -> bool:
    """Whether `cel-expr-python` (the `policyhook[fast]` extra) can be imported."""
    try:
        import cel_expr_python.cel  # noqa: F401
    except ImportError:
        return False
    return True


def available_backends() -> list[Backend]:
    """One instance of every installed backend, cel-python first."""
    names = [CEL_PYTHON] + ([CEL_EXPR_PYTHON] if fast_backend_installed() else [])
    return [_make(name) for name in names]


def default_backend() -> Backend:
    """The backend named by POLICYHOOK_CEL_BACKEND, else cel-expr-python when installed.

    Both give the same decisions on the same policies (tests/test_backends.py); the C++ one is
    about 20-40 times faster per decision.
    """
    chosen = os.environ.get(BACKEND_ENV, "").strip().lower()
    if not chosen:
        return _make(CEL_EXPR_PYTHON if fast_backend_installed() else CEL_PYTHON)
    if chosen not in BACKENDS:
        raise ValueError(f'"{BACKEND_ENV}" must be one of {", ".join(BACKENDS)}: {chosen!r}')
    if chosen == CEL_EXPR_PYTHON and not fast_backend_installed():
        raise ValueError(
            f'"{BACKEND_ENV}" is {chosen!r} but cel-expr-python is not installed: '
            "pip install 'policyhook[fast]'"
        )
    return _make(chosen)
