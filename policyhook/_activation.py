"""The CEL activation: the policy author's contract, declared once here.

The loader type-checks every expression against `SCHEMA` (as `CEL_TYPES`), activations are
`Activation`s (made by `build`, or by the guard directly with `dead_of`), and docs/policies.md's
table is generated from `markdown_table` — so the three cannot drift.
Activations are plain data (str, int, float, bool, lists): never region text.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from policyhook import _celcheck
from policyhook._hints import did_you_mean
from policyhook._provenance import Region, sources_of


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
        Field("max_depth", "int", "deepest summary known in this window, the region included"),
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


#: The list fields of `region`: what `Activation` keeps as sets and sorts only when asked.
LISTS = frozenset(("region", f.name) for f in SCHEMA["region"] if f.type == "list(string)")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Activation(Mapping[str, Mapping[str, Any]]):
    """One decision's activation as `build` makes it: what the guard decides on.

    Why not a dict: at a rolling chain's k-th pass the region rests on k sources, and sorting
    and listing them (k log k) costs more than the rest of the call. Here they stay the
    region's sets, and the policy engine binds only what its compiled policies read, in the
    form they read it (`Binding`): a policy reading `size(region.dead_sources)` gets an int.
    Read as a mapping (listeners, telemetry, the decision log), it is the plain data it always
    was, each variable a read-only dict made on first use, lists sorted. Every scalar is
    checked once, here (`problem`); list items where they are bound (`Binding.bind`).
    """

    __slots__ = (
        *(f"{variable}_{f.name}" for variable, fields in SCHEMA.items() for f in fields
          if (variable, f.name) not in LISTS),
        *(f"region_{name}_size" for _, name in sorted(LISTS)),
        "dead", "_live", "_region", "kind_set", "problem", "longest",
        "_sorted", "_views",
    )  # fmt: skip

    def __init__(
        self,
        region: Region,
        dead: frozenset[str],
        tokens: Any,
        trigger: Any,
        budget_pressure: Any,
        attempt: Any,
        window_id: Any,
        window_tokens: Any,
        window_budget: Any,
        window_max_depth: Any,
        summarizer: Any,
        lossless: Any,
        idempotent: Any,
    ) -> None:
        self._region = region  # its sources made into a set only when read (`source_set`)
        kinds = self.kind_set = region.source_kinds
        self.dead = dead
        # all live: the region's own set, when it has one made (else made when read)
        self._live: frozenset[str] | None = None if dead else region.__dict__.get("sources")
        region_id = self.region_id = region.id
        depth = self.region_depth = region.depth
        chars = self.region_chars = region.chars
        self.region_kind = "original" if depth == 0 else "summary"  # `Region.kind`
        self.region_tokens = tokens
        count = self.region_sources_size = len(sources_of(region))
        gone = self.region_dead_sources_size = len(dead)
        self.region_live_sources_size = count - gone
        self.region_source_kinds_size = len(kinds)
        self.request_trigger = trigger
        self.request_budget_pressure = budget_pressure
        self.request_attempt = attempt
        self.window_id = window_id
        self.window_tokens = window_tokens
        self.window_budget = window_budget
        self.window_max_depth = window_max_depth
        self.summarizer_name = summarizer
        self.summarizer_lossless = lossless
        self.summarizer_idempotent = idempotent
        self.longest = count if count >= len(kinds) else len(kinds)
        self._sorted: dict[str, list[str]] = {}
        self._views: dict[str, Mapping[str, Any]] = {}
        usual = (  # what the guard makes: checked in one expression, not field by field
            type(depth) is type(tokens) is type(chars) is type(attempt) is int
            and type(window_tokens) is type(window_budget) is type(window_max_depth) is int
            # all within 0..INT64_MAX, in one test (a negative one: `_scalar_problem` decides)
            and 0
            <= depth | tokens | chars | attempt | window_tokens | window_budget | window_max_depth
            <= INT64_MAX
            and type(region_id) is type(trigger) is type(window_id) is type(summarizer) is str
            and (region_id + trigger + window_id + summarizer).isascii()
            and type(budget_pressure) is float
            and type(lossless) is type(idempotent) is bool
        )
        self.problem = None if usual else _scalar_problem(self)

    # -- the list fields, made when read ---------------------------------------------------------

    def _ordered(self, name: str, items: frozenset[str]) -> list[str]:
        """`items` sorted, made once per activation (as `build` always made the lists)."""
        made = self._sorted.get(name)
        if made is None:
            made = self._sorted[name] = sorted(items)
        return made

    @property
    def source_set(self) -> frozenset[str]:
        """The region's sources, as a set (a rolling chain's k ids: made when first read)."""
        return self._region.sources

    @property
    def live_set(self) -> frozenset[str]:
        """The live sources, as a set (made when first read: a difference of k ids)."""
        if self._live is None:
            self._live = self.source_set - self.dead if self.dead else self.source_set
        return self._live

    @property
    def region_sources(self) -> list[str]:
        return self._ordered("sources", self.source_set)

    @property
    def region_live_sources(self) -> list[str]:
        return self._ordered("live_sources", self.live_set)

    @property
    def region_dead_sources(self) -> list[str]:
        return self._ordered("dead_sources", self.dead)

    @property
    def region_source_kinds(self) -> list[str]:
        return self._ordered("source_kinds", self.kind_set)

    # for `x in region.F` only: the order cannot matter, so no sort
    @property
    def region_sources_in(self) -> list[str]:
        return self._sorted.get("sources") or list(self.source_set)

    @property
    def region_live_sources_in(self) -> list[str]:
        return self._sorted.get("live_sources") or list(self.live_set)

    @property
    def region_dead_sources_in(self) -> list[str]:
        return self._sorted.get("dead_sources") or list(self.dead)

    @property
    def region_source_kinds_in(self) -> list[str]:
        return self._sorted.get("source_kinds") or list(self.kind_set)

    def dead_sources(self) -> tuple[str, ...]:
        """The dead sources, sorted (what a `Decision` names)."""
        return tuple(self.region_dead_sources) if self.dead else ()

    # -- as a mapping ----------------------------------------------------------------------------

    def __getitem__(self, variable: str) -> Mapping[str, Any]:
        view = self._views.get(variable)
        if view is None:
            made = self.plain(variable)
            for name, value in made.items():
                if type(value) is list:
                    made[name] = list(value)  # the reader's own copy
            view = self._views[variable] = MappingProxyType(made)
        return view

    def plain(self, variable: str) -> dict[str, Any]:
        """`variable`'s fields as a new dict (its lists are this activation's: not to be
        changed), as a backend takes a variable read whole."""
        fields = SCHEMA[variable]  # KeyError for a variable it does not have, as a dict
        return {f.name: getattr(self, f"{variable}_{f.name}") for f in fields}

    def __contains__(self, variable: object) -> bool:
        return variable in SCHEMA

    def __iter__(self) -> Iterator[str]:
        return iter(SCHEMA)

    def __len__(self) -> int:
        return len(SCHEMA)

    def __repr__(self) -> str:
        return f"Activation({dict((k, dict(v)) for k, v in self.items())!r})"

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Copied and pickled by its values (immutable), with fresh caches."""
        state = {k: getattr(self, k) for k in self.__slots__ if k not in ("_sorted", "_views")}
        state["_live"] = None if self.dead else self.source_set
        return _restored, (state,)

    def sizes(self) -> dict[str, int]:
        """`{"region.sources": k, …}`: the list sizes the cost bounds are functions of."""
        return {f"region.{name}": getattr(self, f"region_{name}_size") for _, name in LISTS}


def _restored(state: Mapping[str, Any]) -> Activation:
    activation = object.__new__(Activation)
    for key, value in state.items():
        setattr(activation, key, value)
    activation._sorted, activation._views = {}, {}
    return activation


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
) -> Activation:
    """The activation for one decision (see `Activation`). Values CEL cannot hold are not
    raised here but kept as `problem`, so every policy fails through its failurePolicy."""
    dead = dead_of(region.sources, live)
    pressure = budget_pressure
    if type(pressure) is not float and isinstance(pressure, int) and not isinstance(pressure, bool):
        pressure = float(pressure)
    return Activation(
        region,
        dead,
        region.chars // 4 if tokens is None else tokens,
        trigger,
        pressure,
        attempt,
        window_id,
        window_tokens,
        window_budget,
        window_max_depth,
        summarizer,
        lossless,
        idempotent,
    )


def dead_of(sources: frozenset[str], live: Collection[str]) -> frozenset[str]:
    """The sources not `live`: one pass in C, nothing sorted or listed (`build`'s, and the
    guard's, which makes its `Activation` directly)."""
    if not live:
        return sources
    if live is sources:  # a store that says "all of them" with the region's own set: O(1)
        return frozenset()
    if isinstance(live, set | frozenset):
        return sources - live
    return sources.difference(live)


#: The scalar fields of `Activation`, with the Python type each must have.
_SCALARS: tuple[tuple[str, str, type], ...] = tuple(
    (variable, f.name, {"string": str, "int": int, "double": float, "bool": bool}[f.type])
    for variable, fields in SCHEMA.items()
    for f in fields
    if (variable, f.name) not in LISTS
)

#: The Python type of every scalar attribute of an `Activation` (the list sizes included):
#: what each holds when `problem` is None.
SCALAR_ATTRIBUTES: Mapping[str, type] = MappingProxyType(
    {
        **{f"{variable}_{name}": kind for variable, name, kind in _SCALARS},
        **{f"region_{name}_size": int for _, name in sorted(LISTS)},
    }
)


def _scalar_problem(activation: Activation) -> str | None:
    """Why a scalar of `activation` cannot be evaluated (a wrong type, an int past int64, a
    lone surrogate), named by its field; None when all can (the usual: one pass)."""
    for variable, name, kind in _SCALARS:
        value = getattr(activation, f"{variable}_{name}")
        if type(value) is not kind:
            return f"{variable}.{name} must be {kind.__name__}, got {value!r}"
        problem = unrepresentable_value(value)
        if problem is not None:
            return f"{variable}.{name} {problem}"
    return None


def unrepresentable_value(value: Any) -> str | None:
    """Why CEL cannot hold `value` (an int past int64, a string with a lone surrogate, a list
    holding one), or None. Lists are named by the index of the first such item."""
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
            problem = unrepresentable_value(item)
            if problem is not None:
                return f"[{index}]{'' if problem.startswith('[') else ' '}{problem}"
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Binding:
    """What one phase's compiled policies read of an `Activation`, and in which form
    (`_cel.flatten`); made once, with the policy set.

    `bind` gives the data a backend converts: one list (`name`) of the plain values read, each
    expression reading item i where it selected a field (`_cel.flatten`), beside any variable
    read whole. A runtime converts one list of values for much less than as many variables
    (cel-expr-python: 6 values in a list ~3,700 instructions, as 6 variables ~17,000), and far
    less than the maps of every field with their k-long lists.
    """

    name: str  # the CEL identifier of the list of values
    attributes: tuple[str, ...]  # the `Activation` attribute of each item
    whole: tuple[str, ...] = ()  # variables bound whole, as the mapping gives them
    _get: Any = field(init=False, repr=False, compare=False)
    #: (index in `attributes`, field) of each list bound item by item: what `bind` checks.
    _lists: tuple[tuple[int, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        getter = operator.attrgetter(*self.attributes) if len(self.attributes) > 1 else None
        object.__setattr__(self, "_get", getter)
        lists = tuple(
            (index, name.removeprefix("region_").removesuffix("_in"))
            for index, name in enumerate(self.attributes)
            if name.startswith("region_")
            and ("region", name.removeprefix("region_").removesuffix("_in")) in LISTS
        )
        object.__setattr__(self, "_lists", lists)

    def bind(self, activation: Activation) -> tuple[str | None, dict[str, Any]]:
        """The data for one decision, and why it cannot be evaluated (None when it can)."""
        if self._get is not None:
            values = list(self._get(activation))
        else:
            values = [getattr(activation, a) for a in self.attributes]  # 0 or 1
        data: dict[str, Any] = {self.name: values}
        for variable in self.whole:
            data[variable] = activation.plain(variable)
        problem = activation.problem
        if problem is None:
            for index, name in self._lists:  # items are checked where they are read
                found = unrepresentable_value(values[index])
                if found is not None:
                    problem = f"region.{name}{'' if found.startswith('[') else ' '}{found}"
                    break
            for variable in self.whole if problem is None else ():
                problem = _whole_problem(variable, data[variable])
                if problem is not None:
                    break
        return problem, data


def _whole_problem(variable: str, fields: Mapping[str, Any]) -> str | None:
    for name, value in fields.items():
        if type(value) is list and value:
            found = unrepresentable_value(value)
            if found is not None:
                return f"{variable}.{name}{'' if found.startswith('[') else ' '}{found}"
    return None


def attribute(variable: str, field: str, use: str) -> str | None:
    """The `Activation` attribute that holds `variable.field` as `use` reads it (`_cel.USES`),
    or None when the activation has no such field."""
    if field_type(variable, field) is None:
        return None
    if use == "value" or (variable, field) not in LISTS:
        return f"{variable}_{field}"
    return f"{variable}_{field}_{use}"


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
