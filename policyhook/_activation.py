"""The CEL activation: the policy author's contract, declared once here.

The loader type-checks every expression against `SCHEMA` (as `CEL_TYPES`), the guard builds
activations with `build`, and docs/policies.md's table is generated from `markdown_table` — so
the three cannot drift.
Activations are plain data (str, int, float, bool, lists): never region text.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from policyhook import _celcheck
from policyhook._hints import did_you_mean
from policyhook._provenance import Region


@dataclass(frozen=True)
class Field:
    """One field of an activation variable, with its CEL type."""

    name: str
    type: str  # a CEL type name: string, int, double, bool, list(string)
    doc: str


SCHEMA: Mapping[str, tuple[Field, ...]] = {
    "region": (
        Field("id", "string", "content-addressed id of the region about to be summarized"),
        Field("kind", "string", '"original" (depth 0) or "summary"'),
        Field("depth", "int", "summarization passes behind it: max(input depths) + 1"),
        Field("sources", "list(string)", "every source id it transitively rests on"),
        Field("live_sources", "list(string)", "sources the store can give back now"),
        Field("dead_sources", "list(string)", "sources no store holds any more"),
        Field("source_kinds", "list(string)", 'kinds of its sources, e.g. "config_read"'),
        Field("tokens", "int", "estimated tokens (chars / 4 unless a counter is given)"),
        Field("chars", "int", "length in characters"),
    ),
    "request": (
        Field("trigger", "string", '"automatic" (budget pressure) or "manual" (user asked)'),
        Field("budget_pressure", "double", "how full the window is, 0..1"),
        Field("attempt", "int", "1 for the first try of this compaction, 2 for a retry, …"),
    ),
    "window": (
        Field("id", "string", "the window / session id the ledger tracks"),
        Field("tokens", "int", "tokens in the window now (0 when the runtime does not say)"),
        Field("budget", "int", "the window's token budget (0 when unknown)"),
        Field("max_depth", "int", "deepest summary known in this window"),
    ),
    "summarizer": (
        Field("name", "string", "name given to the decorator"),
        Field("lossless", "bool", "declared lossless (exact eviction with a backing store)"),
        Field("idempotent", "bool", "declared idempotent over its own output"),
    ),
}

TRIGGERS = ("automatic", "manual")


def field_type(variable: str, name: str) -> str | None:
    """The CEL type of `variable.name`, or None when no such field is declared."""
    return next((f.type for f in SCHEMA.get(variable, ()) if f.name == name), None)


#: The activation's variables as CEL types (structs with typed fields), for the type checker.
CEL_TYPES: Mapping[str, _celcheck.CelType] = {
    variable: _celcheck.struct(variable, {f.name: _celcheck.parse_type(f.type) for f in fields})
    for variable, fields in SCHEMA.items()
}

#: What output-phase policies (`spec.phase: output`) see besides the variables above: the facts
#: of the summarizer's output and the live sources stating them (docs/grounding.md). Counts,
#: kinds and ratios only; no fact's text.
SUMMARY: tuple[Field, ...] = (
    Field("facts", "int", "checkable facts in the output (numbers with their context, ids, …)"),
    Field("grounded", "int", "facts a live source of the input states"),
    Field("ungrounded", "int", "facts no source states"),
    Field("unverifiable", "int", "facts only dead sources state"),
    Field("dropped", "int", "key facts of the live sources (`key: value`, ids) the output lost"),
    Field("key_facts", "int", "key facts of the live sources"),
    Field("kinds", "list(string)", 'kinds of the facts: "number", "identifier", "path", …'),
    Field("ungrounded_kinds", "list(string)", "kinds of the ungrounded facts"),
    Field("unverifiable_kinds", "list(string)", "kinds of the unverifiable facts"),
    Field("dropped_kinds", "list(string)", "kinds of the dropped facts"),
    Field("grounded_ratio", "double", "grounded / facts (1.0 without facts)"),
    Field("ungrounded_ratio", "double", "ungrounded / facts (0.0 without facts)"),
    Field("dropped_ratio", "double", "dropped / key_facts (0.0 without key facts)"),
)
#: The activation of an output-phase policy, as CEL types.
OUTPUT_CEL_TYPES: Mapping[str, _celcheck.CelType] = {
    **CEL_TYPES,
    "summary": _celcheck.struct("summary", {f.name: _celcheck.parse_type(f.type) for f in SUMMARY}),
}


def build(
    region: Region,
    live: Collection[str],
    *,
    trigger: str,
    budget_pressure: float,
    attempt: int,
    window_id: str,
    window_tokens: int,
    window_budget: int,
    window_max_depth: int,
    summarizer: str,
    lossless: bool,
    idempotent: bool,
    tokens: int | None = None,
) -> dict[str, dict[str, Any]]:
    """The activation for one decision, as plain data."""
    sources = sorted(region.sources)
    if not live:
        live_sources, dead_sources = [], list(sources)
    elif isinstance(live, set | frozenset) and live >= region.sources:  # the usual: none gone
        live_sources, dead_sources = list(sources), []
    else:
        live_sources = [s for s in sources if s in live]
        dead_sources = [s for s in sources if s not in live]
    return {
        "region": {
            "id": region.id,
            "kind": region.kind,
            "depth": region.depth,
            "sources": sources,
            "live_sources": live_sources,
            "dead_sources": dead_sources,
            "source_kinds": sorted(region.source_kinds),
            "tokens": region.chars // 4 if tokens is None else tokens,
            "chars": region.chars,
        },
        "request": {
            "trigger": trigger,
            "budget_pressure": float(budget_pressure),
            "attempt": attempt,
        },
        "window": {
            "id": window_id,
            "tokens": window_tokens,
            "budget": window_budget,
            "max_depth": window_max_depth,
        },
        "summarizer": {"name": summarizer, "lossless": lossless, "idempotent": idempotent},
    }


_PY_TYPES: Mapping[str, tuple[type, ...]] = {
    "string": (str,),
    "int": (int,),
    "double": (float, int),
    "bool": (bool,),
    "list(string)": (list, tuple),
}


def validate(activation: Mapping[str, Any], where: str = "input") -> dict[str, dict[str, Any]]:
    """Check an activation read from a file (eval, test, replay) field by field.

    Missing fields are errors: a policy test that leaves out a field would otherwise be decided
    on a value its author never chose.
    """
    problems: list[str] = []
    unknown = sorted(set(activation) - set(SCHEMA))
    problems += [f"{where}: unknown variable {v!r}" for v in unknown]
    result: dict[str, dict[str, Any]] = {}
    for variable, fields in SCHEMA.items():
        given = activation.get(variable)
        if not isinstance(given, Mapping):
            problems.append(f"{where}: {variable!r} must be a mapping of its fields")
            continue
        names = {f.name for f in fields}
        for extra in sorted(set(given) - names):
            tip = did_you_mean(extra, names)
            problems.append(f"{where}: {variable}.{extra} is not a field{tip}")
        for f in fields:
            if f.name not in given:
                problems.append(f"{where}: {variable}.{f.name} ({f.type}) is missing")
                continue
            value = given[f.name]
            ok = isinstance(value, _PY_TYPES[f.type]) and (
                f.type == "bool" or not isinstance(value, bool)
            )
            if ok and f.type == "list(string)":
                ok = all(isinstance(v, str) for v in value)
            if not ok:
                problems.append(f"{where}: {variable}.{f.name} must be {f.type}, got {value!r}")
        result[variable] = dict(given)
    if problems:
        raise ValueError("\n".join(problems))
    result["request"]["budget_pressure"] = float(result["request"]["budget_pressure"])
    return result


def summary(grounding: Mapping[str, Any]) -> dict[str, Any]:
    """The `summary` variable from `Grounding.summary()`: the declared fields only."""
    return {f.name: grounding[f.name] for f in SUMMARY}


def markdown_table() -> str:
    """The activation reference in docs/policies.md, generated from `SCHEMA`."""
    rows = ["| variable | field | type | meaning |", "|---|---|---|---|"]
    for variable, fields in SCHEMA.items():
        rows += [f"| `{variable}` | `{f.name}` | {f.type} | {f.doc} |" for f in fields]
    return "\n".join(rows)
