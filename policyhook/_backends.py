"""Which CEL backend decides: the registry of installed backends and the choice between them.

cel-python (`policyhook._cel`) is always installed; cel-expr-python (`policyhook._cel_expr`, the
`fast` extra) is used when importable. Both give the same decisions on every policy that loads
(tests/test_backends.py, tests/test_conformance.py). Set POLICYHOOK_CEL_BACKEND to choose.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from policyhook._cel import Backend, CelPythonBackend, CompileError

if TYPE_CHECKING:
    from policyhook._celcheck import CelType

#: Names a backend explicitly: `cel-python` or `cel-expr-python` (default: the fastest installed).
BACKEND_ENV = "POLICYHOOK_CEL_BACKEND"
CEL_PYTHON = "cel-python"
CEL_EXPR_PYTHON = "cel-expr-python"
BACKENDS = (CEL_PYTHON, CEL_EXPR_PYTHON)

#: Checks one expression given the types of the policy's variables; a located error or None.
NativeChecker = Callable[[str, Mapping[str, "CelType"]], CompileError | None]

_lock = threading.Lock()
_backends: dict[str, Backend] = {}


def _make(name: str) -> Backend:
    """The shared instance of backend `name` (backends hold no per-call state)."""
    with _lock:
        backend = _backends.get(name)
        if backend is None:
            if name == CEL_EXPR_PYTHON:
                from policyhook._cel_expr import CelExprBackend  # optional: policyhook[fast]

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

    Both give the same decisions on the same policies; the C++ one is about 20-40 times faster
    per decision.
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


def native_checker() -> NativeChecker | None:
    """Google's CEL type checker (cel-expr-python with protobuf), or None when not installed.

    The loader runs it after policyhook's own checker, which must reject everything it rejects
    (tests/test_conformance.py): it is the reference, ours is what runs without the extra.
    """
    if not fast_backend_installed():
        return None
    from policyhook._cel_expr import native_checker as make

    return make()
