"""Imports run one way, and each third-party engine is imported in one place (issue 11).

Layers, lowest first: a module imports only modules of its own layer or below (an import under
`if TYPE_CHECKING:` only names a type and may point up), and no import cycle exists, counting
type-only and in-function imports too. A new module must be given a layer here, which is the
moment to decide where it belongs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "policyhook"

#: Lowest first. Same-layer imports are allowed; cycles are not.
LAYERS: dict[str, int] = {
    # vocabulary and pure helpers: import nothing of policyhook above them
    "policyhook._errors": 0,
    "policyhook._exit": 0,
    "policyhook._env": 0,
    "policyhook._hints": 0,
    "policyhook._fork": 0,
    "policyhook._index": 0,
    "policyhook._closures": 0,
    "policyhook._shapes": 0,
    "policyhook.grounding": 0,
    "policyhook._cel": 0,
    "policyhook._celcheck": 1,
    # the provenance model and where originals live
    "policyhook._provenance": 2,
    "policyhook.stores": 3,
    "policyhook._postgres": 3,
    "policyhook._redis": 3,
    "policyhook._spool": 3,
    # the policy engine
    "policyhook._activation": 4,
    "policyhook._policy": 4,
    "policyhook.remedies": 4,
    "policyhook._cel_expr": 4,
    "policyhook._backends": 4,
    "policyhook._loader": 4,
    "policyhook._reload": 4,
    # what a decision leaves behind
    "policyhook.decisionlog": 5,
    "policyhook._telemetry": 5,
    # the guard
    "policyhook._hook": 6,
    # built on the guard; `policyhook` (__init__) is the public API the adapters build on
    "policyhook": 7,
    "policyhook.testing": 7,
    "policyhook._tester": 7,
    "policyhook._replay": 7,
    "policyhook._demo": 7,
    "policyhook.otel": 7,
    "policyhook.adapters": 8,
    "policyhook.adapters.claude_code": 8,
    "policyhook.adapters.claude_postcompact": 8,
    "policyhook.adapters.langchain": 8,
    "policyhook.adapters.langmem": 8,
    "policyhook.cli": 10,
}

#: Third-party packages only these modules may import (a library depends on the OTel API only).
ONLY_IN: dict[str, set[str]] = {
    "opentelemetry.sdk": {"policyhook.otel"},
    "opentelemetry.exporter": {"policyhook.otel"},
    "celpy": {"policyhook._cel"},
    "cel_expr_python": {"policyhook._cel_expr", "policyhook._backends"},
    "psycopg": {"policyhook._postgres"},
    "psycopg_pool": {"policyhook._postgres"},
    "redis": {"policyhook._redis"},
    "langchain": {"policyhook.adapters.langchain", "policyhook.adapters.langmem"},
    "langchain_core": {"policyhook.adapters.langchain", "policyhook.adapters.langmem"},
    "langgraph": {"policyhook.adapters.langchain", "policyhook.adapters.langmem"},
    "langmem": {"policyhook.adapters.langmem"},
    "matplotlib": set(),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = PACKAGE.parent / name.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imports(path: Path) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, type-only) for every import in the file, wherever it stands."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If)
        and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for statement in block.body
        for node in ast.walk(statement)
    }
    for node in ast.walk(tree):
        only = id(node) in typing_only
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, only
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            found = [s for s in subs if s.startswith("policyhook") and is_module(s)]
            yield from ((s, node.lineno, only) for s in found)
            if len(found) < len(subs):
                yield node.module, node.lineno, only


def graph(*, type_only: bool) -> dict[str, set[str]]:
    return {
        module_name(p): {
            m
            for m, _, only in imports(p)
            if m.split(".")[0] == "policyhook" and m != module_name(p) and (type_only or not only)
        }
        for p in sorted(PACKAGE.rglob("*.py"))
    }


GRAPH = graph(type_only=True)  # every dependency, for cycles
RUNTIME = graph(type_only=False)  # what runs, for layers


def test_every_module_has_a_layer() -> None:
    """A module nobody placed is a failure: decide its layer here."""
    assert sorted(set(GRAPH) - set(LAYERS)) == []
    assert sorted(set(LAYERS) - set(GRAPH)) == []  # no stale entries


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_go_down(module: str) -> None:
    """No module imports one of a higher layer (cli -> adapters -> hook -> engine -> model)."""
    up = {d: LAYERS[d] for d in RUNTIME[module] if LAYERS.get(d, -1) > LAYERS[module]}
    assert up == {}, f"{module} (layer {LAYERS[module]}) imports higher layers: {up}"


def test_no_import_cycles() -> None:
    """Not even through type-only or in-function imports."""

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            for d in GRAPH.get(stack.pop(), ()):
                if d == goal:
                    return True
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
        return False

    cycles = sorted(
        (a, b) for a in GRAPH for b in GRAPH[a] if a < b and b != "policyhook" and reaches(b, a)
    )
    assert cycles == []


@pytest.mark.parametrize("package", sorted(ONLY_IN))
def test_each_third_party_engine_is_imported_in_one_place(package: str) -> None:
    """The OTel SDK only in otel.py, each CEL runtime in its backend, each driver in its store."""
    found = {
        f"{module_name(p)}:{line}"
        for p in sorted(PACKAGE.rglob("*.py"))
        for name, line, _ in imports(p)
        if (name == package or name.startswith(package + "."))
        and module_name(p) not in ONLY_IN[package]
    }
    assert found == set()
