"""The fast CEL backend: Google's CEL runtime (C++) through `cel-expr-python` (`policyhook[fast]`).

This is the only module that imports `cel_expr_python`. Three things differ from cel-python and
are handled here so that the policy engine sees the same `Backend` behaviour:

- Evaluation errors come back as values (a `Value` of type ERROR, whose Python value is the
  message, a truthy string) instead of being raised: `evaluate` raises `EvaluationError` for them,
  so they reach the policy's failurePolicy exactly as cel-python's exceptions do.
- Expressions are compiled for evaluation without the static type checker
  (`disable_check=True`), so both backends run the same untyped program; type checking happens
  once, at load, for every backend alike (`policyhook._celcheck`, and Google's checker through
  `native_checker` when protobuf is installed to describe the activation's types).
- Values passed back in (`bind`) must be plain Python data or protos: results are converted on
  the way out, and timestamps and durations become their protobuf messages on the way back.

Compiled expressions are immutable and the C++ runtime evaluates them concurrently; an activation
is made per decision and never shared, so no lock is needed (unlike cel-python's compiled runner).
"""

from __future__ import annotations

import datetime
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings

from policyhook import _celcheck
from policyhook._activation import OUTPUT_CEL_TYPES as CEL_TYPES  # incl. `summary` (output phase)
from policyhook._cel import CompileError, EvaluationError, Program, parse, plain

#: The activation's top-level variables, declared as maps (field access is checked at load time).
VARIABLES = ("region", "request", "window", "summarizer", "summary", "variables")

_ERROR = cel.Type.ERROR
_UNKNOWN = cel.Type.UNKNOWN
_POSITION = re.compile(r"<input>:(\d+):(\d+): (.*)")


class _Context:
    """One decision's data, converted by the C++ runtime when an expression reads it.

    The first evaluation passes the data itself (`eval(data=...)`, the cheapest way in: a grant
    is one evaluation); a second one makes a C++ activation, kept for the rest of the decision
    (a refusal is explained expression by expression). Neither is shared between threads."""

    __slots__ = ("_activation", "_env", "_used", "data")

    def __init__(self, env: Any, data: dict[str, Any], *, many: bool = False) -> None:
        self._env = env
        self.data = data
        self._activation: Any = None
        self._used = many  # known to serve many evaluations: an activation from the first

    def evaluate(self, expression: Any) -> Any:
        if not self._used:
            self._used = True
            return expression.eval(data=self.data)
        if self._activation is None:
            self._activation = self._env.Activation(self.data)
        return expression.eval(self._activation)


class _CelExprProgram:
    __slots__ = ("_expression",)

    def __init__(self, expression: Any) -> None:
        self._expression = expression

    def evaluate(self, context: Any) -> Any:
        try:
            value = context.evaluate(self._expression)
            result = value.value()
        except Exception as exc:  # conversion of the activation, or a runtime failure
            raise EvaluationError(f"{type(exc).__name__}: {exc}") from None
        if result is True or result is False:  # the common case: one type test, no more calls
            return result
        if isinstance(result, list | dict):  # never an error (whose value is its message)
            return value.plain_value()
        kind = value.type()
        if kind in (_ERROR, _UNKNOWN):
            raise EvaluationError(str(result))
        return result


class CelExprBackend:
    """cel-expr-python: the official CEL runtime in C++, ~20-40x faster than cel-python."""

    name = "cel-expr-python"
    binds = True

    def __init__(self) -> None:
        declared = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
        self._env = cel.NewEnv(
            variables=dict.fromkeys(VARIABLES, declared),
            # `cel.bind`, for policyhook's whole-policy programs (_policy.whole_program); the
            # loader's checker refuses it in policies, as cel-python has no such function.
            extensions=[ext_bindings.ExtBindings()],
        )

    def compile(self, source: str) -> Program:
        parse(source)  # the same syntax and bounds as every backend, with the same errors
        try:
            return _CelExprProgram(self._env.compile(source, disable_check=True))
        except Exception as exc:
            raise _compile_error(exc) from None

    def context(self, activation: Mapping[str, Any]) -> Any:
        # the engine's cut of the activation is its own (`_policy._read`): no copy of it
        if type(activation) is dict:
            data = activation
        else:  # an `Activation` read whole, say: its variables as dicts
            data = {name: plain(value) for name, value in activation.items()}
        return _Context(self._env, data)

    def bind(self, context: Any, variables: Mapping[str, Any]) -> Any:
        bound = {name: _bindable(value) for name, value in variables.items()}
        # a policy's variables are bound to explain it, expression by expression
        return _Context(self._env, {**context.data, "variables": bound}, many=True)

    def to_python(self, value: Any) -> Any:
        return value  # `evaluate` already returns plain Python values


def _bindable(value: Any) -> Any:
    """A result as an activation accepts it back: timestamps and durations as their protos."""
    if isinstance(value, bool | int | float | str | None):
        return value
    if isinstance(value, datetime.datetime | datetime.timedelta):
        try:  # protobuf is not a dependency of cel-expr-python: without it, an evaluation error
            from google.protobuf import duration_pb2, timestamp_pb2  # type: ignore[import-untyped]
        except ImportError:
            return value
        if isinstance(value, datetime.datetime):
            timestamp = timestamp_pb2.Timestamp()
            timestamp.FromDatetime(value)
            return timestamp
        duration = duration_pb2.Duration()
        duration.FromTimedelta(value)
        return duration
    if isinstance(value, list):
        return [_bindable(v) for v in value]
    if isinstance(value, dict):
        return {k: _bindable(v) for k, v in value.items()}
    return value


def _compile_error(exc: Exception) -> CompileError:
    """`INVALID_ARGUMENT: ERROR: <input>:1:4: Syntax error: …` as a located CompileError."""
    found = _POSITION.search(str(exc))
    if found is None:
        return CompileError(f"cannot compile: {exc}")
    message = found.group(3).split("\n")[0].strip()
    return CompileError(message, int(found.group(1)), int(found.group(2)))


# -- Google's type checker over the activation's declared types ---------------------------------

_PACKAGE = "policyhook.activation"
_SCALARS = {
    "int": cel.Type.INT,
    "uint": cel.Type.UINT,
    "double": cel.Type.DOUBLE,
    "bool": cel.Type.BOOL,
    "string": cel.Type.STRING,
    "bytes": cel.Type.BYTES,
    "null_type": cel.Type.NULL,
    "dyn": cel.Type.DYN,
    "type": cel.Type.TYPE,
    "google.protobuf.Timestamp": cel.Type.TIMESTAMP,
    "google.protobuf.Duration": cel.Type.DURATION,
}
_checker_lock = threading.Lock()
_checker: Callable[[str, Mapping[str, _celcheck.CelType]], CompileError | None] | None = None


def _message(name: str) -> str:
    return f"{_PACKAGE}.{name.capitalize()}"


def _cel_type(t: _celcheck.CelType) -> Any:
    if t.is_struct:
        return cel.Type(_message(t.name))
    if t.name == "list":
        return cel.Type.List(_cel_type(t.params[0]))
    if t.name == "map":
        return cel.Type.Map(_cel_type(t.params[0]), _cel_type(t.params[1]))
    return _SCALARS[t.name]


def _descriptor_pool() -> Any:
    """The activation's variables as proto3 messages, so Google's checker knows every field."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    proto = descriptor_pb2.FileDescriptorProto(
        name="policyhook/activation.proto", package=_PACKAGE, syntax="proto3"
    )
    field_proto = descriptor_pb2.FieldDescriptorProto
    scalar = {
        "string": field_proto.TYPE_STRING,
        "int": field_proto.TYPE_INT64,
        "double": field_proto.TYPE_DOUBLE,
        "bool": field_proto.TYPE_BOOL,
    }
    for variable, declared in CEL_TYPES.items():
        message = proto.message_type.add(name=_message(variable).rsplit(".", 1)[1])
        for number, (name, t) in enumerate(declared.fields, start=1):
            repeated = t.name == "list"
            kind = scalar[t.params[0].name if repeated else t.name]
            label = field_proto.LABEL_REPEATED if repeated else field_proto.LABEL_OPTIONAL
            message.field.add(name=name, number=number, type=kind, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool


def native_checker() -> (
    Callable[[str, Mapping[str, _celcheck.CelType]], CompileError | None] | None
):
    """Google's checker with the activation declared; None without protobuf to declare it."""
    global _checker
    with _checker_lock:
        if _checker is not None:
            return _checker
        try:
            pool = _descriptor_pool()
        except ImportError:
            return None
        envs: dict[tuple[tuple[str, str], ...], Any] = {}
        declared = {name: _cel_type(t) for name, t in CEL_TYPES.items()}

        def check(source: str, variables: Mapping[str, _celcheck.CelType]) -> CompileError | None:
            key = tuple(sorted((name, str(t)) for name, t in variables.items()))
            with _checker_lock:
                env = envs.get(key)
                if env is None:
                    if len(envs) >= 256:  # one per set of variable types seen: bounded
                        envs.clear()
                    qualified = {f"variables.{n}": _cel_type(t) for n, t in variables.items()}
                    env = cel.NewEnv(descriptor_pool=pool, variables={**declared, **qualified})
                    envs[key] = env
            try:
                env.compile(source)
            except Exception as exc:
                return _compile_error(exc)
            return None

        _checker = check
        return _checker
