"""Loading policies: YAML documents of CEL rules, checked against the schema and type-checked
against the activation at load, so a mistake fails with its file, line and column, never at the
first decision. The format follows Kubernetes ValidatingAdmissionPolicy (see `policyhook._policy`).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from policyhook import _activation as schema
from policyhook import _celcheck as celcheck
from policyhook import _env
from policyhook._backends import default_backend, native_checker
from policyhook._cel import Backend, CompileError
from policyhook._cel import parse as cel_parse
from policyhook._errors import PolicyError, PolicyIssue
from policyhook._hints import did_you_mean
from policyhook._policy import (
    FAILURE_POLICIES,
    MODES,
    REMEDIES,
    Expression,
    FailurePolicy,
    Mode,
    Policy,
    PolicySet,
    Rule,
)

API_VERSION = "policyhook.dev/v1"
KIND = "CompactionPolicy"
#: Set to a true value to run every policy in audit mode (shadow rollout) without editing files.
FORCE_AUDIT_ENV = "POLICYHOOK_FORCE_AUDIT"
_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Located(dict[str, Any]):
    """A YAML mapping that remembers where each key and value stand."""

    lines: dict[str, tuple[int, int]]  # key -> (line, column) of its value, 1-based
    start: tuple[int, int]
    # key -> (folded?, [(line, column, length) of each content line]) for block scalars
    blocks: dict[str, tuple[bool, list[tuple[int, int, int]]]]

    def position(self, key: str, line: int, column: int) -> tuple[int, int]:
        """The file position of `line`:`column` inside the string value of `key`."""
        if key in self.blocks:
            folded, segments = self.blocks[key]
            if not folded and line <= len(segments):
                at, col, _ = segments[line - 1]
                return at, col + column - 1
            offset = column - 1  # folded: content lines were joined by single spaces
            for at, col, length in segments:
                if offset <= length:
                    return at, col + offset
                offset -= length + 1
        base_line, base_column = self.lines.get(key, self.start)
        return base_line + line - 1, base_column + column - 1 if line == 1 else column


#: Bounds on a policy file: its size, and how deep its YAML may nest (a policy needs about 6).
MAX_FILE_BYTES = 1 << 20
MAX_YAML_DEPTH = 32


class LocatingLoader(yaml.SafeLoader):
    """yaml.SafeLoader that records positions, so errors can name a line.

    It also refuses what a policy never needs and an attacker would use: aliases and anchors
    (a few hundred bytes of nested aliases expand to gigabytes) and nesting deeper than
    `MAX_YAML_DEPTH` (thousands of `{a:` exhaust the recursion limit). Both are YAML errors with
    the line they start on, found before anything is expanded.
    """

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in policy files", mark
            )
        if getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, "anchors (&name) are not allowed in policy files", mark
            )
        if isinstance(event, yaml.ScalarEvent) and not event.value.isascii():
            try:
                event.value.encode("utf-8")
            except UnicodeEncodeError as exc:
                code = ord(event.value[exc.start])
                raise yaml.composer.ComposerError(
                    None, None, f"\\u{code:04x} is a lone surrogate, not text", mark
                ) from None
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nesting deeper than {MAX_YAML_DEPTH} levels is not allowed in policy files",
                    mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = Located(
            {str(k): v for k, v in super().construct_mapping(node, deep=True).items()}
        )
        mapping.lines = {}
        mapping.blocks = {}
        mapping.start = (node.start_mark.line + 1, node.start_mark.column + 1)
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
            line, column = value_node.start_mark.line + 1, value_node.start_mark.column + 1
            if isinstance(value_node, yaml.ScalarNode) and value_node.style in ("|", ">"):
                line, column = line + 1, 1  # block scalars start on the next line
                mapping.blocks[str(key)] = (value_node.style == ">", self._block_lines(value_node))
            elif isinstance(value_node, yaml.ScalarNode) and value_node.style in ("'", '"'):
                column += 1
            mapping.lines[str(key)] = (line, column)
        return mapping

    def _block_lines(self, node: yaml.ScalarNode) -> list[tuple[int, int, int]]:
        """(line, column, length) of each content line of a block scalar, 1-based."""
        raw = str(self.buffer).split("\n")
        segments = []
        for index in range(node.start_mark.line + 1, min(node.end_mark.line + 1, len(raw))):
            text = raw[index].rstrip("\0")
            if text.strip():
                indent = len(text) - len(text.lstrip(" "))
                segments.append((index + 1, indent + 1, len(text.strip())))
        return segments


LocatingLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, LocatingLoader.construct_mapping
)

_TOP_KEYS = {"apiVersion", "kind", "metadata", "spec"}
_METADATA_KEYS = {"name", "labels", "annotations"}
_SPEC_KEYS = {
    "description",
    "mode",
    "phase",
    "failurePolicy",
    "matchConditions",
    "variables",
    "rules",
}
#: When a policy decides: `input` before the summarizer runs, `output` on what it returned.
PHASES = ("input", "output")
_NAMED_KEYS = {"name", "expression"}
_RULE_KEYS = {"name", "expression", "message", "messageExpression", "remedy", "remedyExpression"}


def is_test_file(path: Path) -> bool:
    """Policy test files live beside the policies: `*_test.yaml` (as OPA's `*_test.rego`)."""
    return path.stem.endswith("_test") or path.stem.endswith(".test")


def policy_files(path: str | Path) -> list[Path]:
    """The policy files at `path`: the file itself, or a folder's own files (not subfolders).

    A folder is one policy set, as `kubectl apply -f DIR` takes one; subfolders hold other sets.
    """
    root = Path(path)
    try:
        is_dir = root.is_dir()
        exists = is_dir or root.exists() or root.is_symlink()
    except OSError as exc:
        raise PolicyError([PolicyIssue(str(root), str(exc), code="io")]) from None
    if not exists:
        raise PolicyError([PolicyIssue(str(root), "no such file or directory", code="io")])
    if not is_dir:
        return [root]
    found = sorted(
        p for p in root.iterdir() if p.suffix in (".yaml", ".yml") and not is_test_file(p)
    )
    if not found:
        raise PolicyError([PolicyIssue(str(root), "no policy files (*.yaml) found", code="io")])
    return found


def read_policy_file(file: Path) -> str:
    """The text of one policy file: a regular file of at most MAX_FILE_BYTES, in UTF-8.

    Opened without blocking and checked before reading, so a FIFO, a device (/dev/zero) or an
    endless file is a clear error at once instead of a hang.
    """
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise PolicyError([PolicyIssue(str(file), exc.strerror or str(exc), code="io")]) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "not a regular file"
            if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
                kind = "a device"
            elif stat.S_ISSOCK(info.st_mode):
                kind = "a socket"
            message = f"{kind}: only regular files are read as policies"
            raise PolicyError([PolicyIssue(str(file), message, code="io")])
        if info.st_size > MAX_FILE_BYTES:
            message = f"{info.st_size:,} bytes, over the limit of {MAX_FILE_BYTES:,} per file"
            raise PolicyError([PolicyIssue(str(file), message, code="io")])
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise PolicyError([PolicyIssue(str(file), str(exc), code="io")]) from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        message = f"grew past the limit of {MAX_FILE_BYTES:,} bytes while being read"
        raise PolicyError([PolicyIssue(str(file), message, code="io")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        message = f"not UTF-8: byte 0x{data[exc.start]:02x} cannot be decoded"
        raise PolicyError([PolicyIssue(str(file), message, line=line, code="io")]) from None


def read_sources(path: str | Path) -> list[tuple[str, str]]:
    """(file name, text) of every policy file under `path`."""
    return [(str(file), read_policy_file(file)) for file in policy_files(path)]


def revision_of(sources: Iterable[tuple[str, str]], force_audit: bool | None = None) -> str:
    """A short hash of the policy sources: stamped on every decision they make.

    Forced audit (POLICYHOOK_FORCE_AUDIT, read when `force_audit` is None) decides differently
    from the same files, so it is part of the revision: `<hash>+forced-audit`.
    """
    if force_audit is None:
        force_audit = _forced_audit()
    digest = hashlib.sha256()
    for name, text in sorted(sources):
        digest.update(Path(name).name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()[:12] + ("+forced-audit" if force_audit else "")


def _forced_audit() -> bool:
    return _env.flag(FORCE_AUDIT_ENV)


def load(path: str | Path, *, backend: Backend | None = None) -> PolicySet:
    """Load, type-check and compile every policy under `path`; PolicyError lists all problems."""
    return compile_sources(read_sources(path), backend=backend)


def load_default(*, backend: Backend | None = None) -> PolicySet:
    """The embedded default policy (`policies/default.yaml`), for use with no files at hand."""
    text = resources.files("policyhook").joinpath("default_policy.yaml").read_text("utf-8")
    return compile_sources([("<embedded>/default.yaml", text)], backend=backend)


def compile_sources(
    sources: Sequence[tuple[str, str]],
    *,
    backend: Backend | None = None,
    force_audit: bool | None = None,
) -> PolicySet:
    """Compile (file name, YAML text) pairs into a PolicySet, collecting every problem."""
    backend = backend or default_backend()
    if force_audit is None:
        force_audit = _forced_audit()
    issues: list[PolicyIssue] = []
    policies: list[Policy] = []
    where: dict[str, str] = {}
    for file, text in sources:
        if len(text) > MAX_FILE_BYTES:
            message = f"{len(text):,} characters, over the limit of {MAX_FILE_BYTES:,} per file"
            issues.append(PolicyIssue(file, message, code="io"))
            continue
        for policy in _compile_file(file, text, backend, issues):
            if policy.name in where:
                issues.append(
                    PolicyIssue(
                        file,
                        f"policy name {policy.name!r} is already used in {where[policy.name]}",
                        policy=policy.name,
                        code="duplicate",
                    )
                )
                continue
            where[policy.name] = file
            if force_audit and policy.mode == Mode.ENFORCE:
                policy = replace(policy, mode=Mode.AUDIT)
            policies.append(policy)
    if issues:
        raise PolicyError(issues)
    if not policies:
        raise PolicyError([PolicyIssue(sources[0][0] if sources else "<none>", "no policies")])
    return PolicySet(
        tuple(sorted(policies, key=lambda p: p.name)),
        revision_of(sources, force_audit),
        backend,
        tuple(f for f, _ in sources),
    )


def yaml_problem(exc: yaml.YAMLError, text: str) -> tuple[int | None, int | None, str]:
    """(line, column, problem) of a YAML error in `text`, 1-based: a parser's by its mark, a
    character YAML refuses by its position (a ReaderError has no mark)."""
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        character = chr(exc.character) if isinstance(exc.character, int) else exc.character
        return line, column, f"character U+{ord(character):04X} is not allowed in YAML"
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return None, None, problem
    return mark.line + 1, mark.column + 1, problem


def _compile_file(
    file: str, text: str, backend: Backend, issues: list[PolicyIssue]
) -> list[Policy]:
    try:
        documents = list(yaml.load_all(text, Loader=LocatingLoader))  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        line, column, problem = yaml_problem(exc, text)
        issues.append(
            PolicyIssue(file, f"invalid YAML: {problem}", line=line, column=column, code="yaml")
        )
        return []
    policies = []
    for document in documents:
        if document is None:
            continue
        policy = _compile_document(file, document, backend, issues)
        if policy is not None:
            policies.append(policy)
    return policies


class _Checker:
    """Collects the issues of one document, located by the mapping they were found in."""

    def __init__(self, file: str, issues: list[PolicyIssue]) -> None:
        self.file = file
        self.issues = issues
        self.count = 0
        self.policy: str | None = None

    def issue(
        self,
        node: Any,
        key: str | None,
        message: str,
        rule: str | None = None,
        code: str = "schema",
    ) -> None:
        line = column = None
        if isinstance(node, Located):
            line, column = node.lines.get(key, node.start) if key else node.start
        self.count += 1
        self.issues.append(PolicyIssue(self.file, message, line, column, self.policy, rule, code))

    def mapping(
        self,
        node: Any,
        path: str,
        allowed: set[str],
        required: set[str],
        within: tuple[Any, str] | None = None,
    ) -> bool:
        """Whether `node` is a mapping of `allowed` keys with the `required` ones; `within`
        (the mapping holding it, and its key there) locates a value that is not one (a scalar
        or a list remembers no position of its own)."""
        if not isinstance(node, Mapping):
            where, key = within if within is not None else (node, None)
            self.issue(where, key, f"{path} must be a mapping, got {type(node).__name__}")
            return False
        for key in sorted(set(map(str, node)) - allowed):
            tip = did_you_mean(key, allowed, listing="allowed")
            self.issue(node, key, f"unknown key {path}.{key}{tip}")
        for key in sorted(required - set(map(str, node))):
            self.issue(node, None, f"{path}.{key} is required")
        return True

    def string(self, node: Mapping[str, Any], key: str, path: str) -> str | None:
        value = node.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            self.issue(node, key, f"{path}.{key} must be a non-empty string, got {value!r}")
            return None
        return value


def _compile_document(
    file: str, document: Any, backend: Backend, issues: list[PolicyIssue]
) -> Policy | None:
    check = _Checker(file, issues)
    if not check.mapping(document, "document", _TOP_KEYS, _TOP_KEYS):
        return None
    metadata = document.get("metadata")
    name = None
    if check.mapping(metadata, "metadata", _METADATA_KEYS, {"name"}, (document, "metadata")):
        name = check.string(metadata, "name", "metadata")
        if name is not None and not _NAME.match(name):
            check.issue(
                metadata,
                "name",
                f"metadata.name {name!r} must be lowercase letters, digits, "
                "'-', '.' or '_', starting and ending with a letter or digit (at most 63)",
            )
    check.policy = name
    if document.get("apiVersion") not in (None, API_VERSION):
        check.issue(
            document,
            "apiVersion",
            f"apiVersion must be {API_VERSION!r}, got {document.get('apiVersion')!r}",
        )
    if document.get("kind") not in (None, KIND):
        check.issue(document, "kind", f"kind must be {KIND!r}, got {document.get('kind')!r}")
    spec = document.get("spec")
    if not check.mapping(spec, "spec", _SPEC_KEYS, {"rules"}, (document, "spec")):
        return None
    mode = spec.get("mode", Mode.ENFORCE)
    if mode not in MODES:
        check.issue(spec, "mode", f"spec.mode must be one of {', '.join(MODES)}, got {mode!r}")
    failure_policy = spec.get("failurePolicy", FailurePolicy.DENY)
    if failure_policy not in FAILURE_POLICIES:
        check.issue(
            spec,
            "failurePolicy",
            f"spec.failurePolicy must be deny or allow, got {failure_policy!r}",
        )
    phase = spec.get("phase", "input")
    if phase not in PHASES:
        check.issue(spec, "phase", f"spec.phase must be input or output, got {phase!r}")
        phase = "input"
    compiler = _ExpressionCompiler(check, backend, phase)
    conditions = compiler.named_list(spec, "matchConditions", _NAMED_KEYS)
    variables = compiler.named_list(spec, "variables", _NAMED_KEYS)
    rules = compiler.rules(spec)
    description = spec.get("description", "")
    if check.count or name is None:
        return None
    return Policy(
        name=name,
        file=file,
        mode=Mode(mode),
        phase=str(phase),
        failure_policy=FailurePolicy(failure_policy),
        match_conditions=conditions,
        variables=variables,
        rules=rules,
        description=str(description),
    )


class _ExpressionCompiler:
    """Compiles and type-checks the expressions of one policy against the activation schema."""

    def __init__(self, check: _Checker, backend: Backend, phase: str = "input") -> None:
        self.check = check
        self.backend = backend
        # only output-phase policies see `summary` (an input-phase rule over it is a load error)
        self.types = schema.OUTPUT_CEL_TYPES if phase == "output" else schema.CEL_TYPES
        self.variables: dict[str, celcheck.Checked] = {}  # the policy's variables checked so far

    def entries(self, spec: Mapping[str, Any], key: str) -> list[Any]:
        value = spec.get(key, [])
        if value is None:
            return []
        if not isinstance(value, list):
            self.check.issue(spec, key, f"spec.{key} must be a list, got {type(value).__name__}")
            return []
        return value

    def named_list(
        self, spec: Mapping[str, Any], key: str, allowed: set[str]
    ) -> tuple[Expression, ...]:
        compiled: list[Expression] = []
        names: set[str] = set()
        for index, entry in enumerate(self.entries(spec, key)):
            path = f"spec.{key}[{index}]"
            if not self.check.mapping(entry, path, allowed, {"name", "expression"}, (spec, key)):
                continue
            name = self.check.string(entry, "name", path)
            if name is None:
                continue
            if name in names:
                self.check.issue(entry, "name", f"{path}.name {name!r} is used twice")
            if key == "variables" and not _VARIABLE_NAME.match(name):
                self.check.issue(entry, "name", f"{path}.name {name!r} must be an identifier")
            names.add(name)
            variables = self.variables if key == "variables" else {}
            wants = None if key == "variables" else celcheck.BOOL
            expression = self.expression(entry, "expression", path, name, variables, wants, None)
            if expression is not None:
                compiled.append(expression)
                if key == "variables":
                    self.variables[name] = expression.checked
        return tuple(compiled)

    def rules(self, spec: Mapping[str, Any]) -> tuple[Rule, ...]:
        compiled: list[Rule] = []
        names: set[str] = set()
        entries = self.entries(spec, "rules")
        if not entries and isinstance(spec, Mapping) and "rules" in spec:
            self.check.issue(spec, "rules", "spec.rules must list at least one rule")
        for index, entry in enumerate(entries):
            path = f"spec.rules[{index}]"
            if not self.check.mapping(
                entry, path, _RULE_KEYS, {"name", "expression"}, (spec, "rules")
            ):
                continue
            name = self.check.string(entry, "name", path)
            if name is None:
                continue
            if name in names:
                self.check.issue(entry, "name", f"{path}.name {name!r} is used twice", name)
            names.add(name)
            message = entry.get("message", "")
            if not isinstance(message, str):
                self.check.issue(entry, "message", f"{path}.message must be a string", name)
            variables = self.variables
            expression = self.expression(
                entry, "expression", path, name, variables, celcheck.BOOL, name
            )
            message_expression = None
            if "messageExpression" in entry:
                message_expression = self.expression(
                    entry, "messageExpression", path, name, variables, celcheck.STRING, name
                )
            remedy = entry.get("remedy", "")
            if remedy != "" and remedy not in REMEDIES:
                self.check.issue(
                    entry,
                    "remedy",
                    f"{path}.remedy must be one of {', '.join(REMEDIES)}, got {remedy!r}",
                    name,
                )
            remedy_expression = None
            if "remedyExpression" in entry:
                remedy_expression = self.expression(
                    entry, "remedyExpression", path, name, variables, celcheck.STRING, name
                )
            if expression is not None:
                compiled.append(
                    Rule(
                        name,
                        expression,
                        str(message),
                        message_expression,
                        str(remedy) if remedy in REMEDIES else "",
                        remedy_expression,
                    )
                )
        return tuple(compiled)

    def expression(
        self,
        entry: Mapping[str, Any],
        key: str,
        path: str,
        name: str,
        variables: Mapping[str, celcheck.Checked],
        wants: celcheck.CelType | None,
        rule: str | None,
    ) -> Expression | None:
        """Parse, type-check, bound and compile `entry[key]`; None (and an issue) on error."""
        source = self.check.string(entry, key, path)
        if source is None:
            return None
        where = f"{path}.{key}"
        try:
            tree = cel_parse(source)
        except CompileError as exc:
            self._at(entry, key, source, exc.line, exc.column, f"{where}: {exc}", rule, "cel")
            return None
        try:
            checked = celcheck.check(tree, source, self.types, variables)
        except celcheck.CheckError as exc:
            self._at(entry, key, source, exc.line, exc.column, f"{where}: {exc}", rule, "type")
            return None
        if wants is not None and checked.type not in (wants, celcheck.DYN):
            kind = "a bool" if wants == celcheck.BOOL else "a string"
            message = f"{where} must give {kind}, but gives {checked.type}"
            self._at(entry, key, source, 1, 1, message, rule, "type")
            return None
        native = native_checker()
        if native is not None:
            problem = native(source, {n: c.type for n, c in variables.items()})
            if problem is not None:
                self._at(
                    entry,
                    key,
                    source,
                    problem.line,
                    problem.column,
                    f"{where}: {problem}",
                    rule,
                    "type",
                )
                return None
        too_costly = celcheck.over_limits(checked, {})
        if too_costly is not None:
            message = (
                f"{where}: with {celcheck.DECLARED_LIST_SIZE:,} elements in each list this "
                f"expression {too_costly}; iterate over fewer lists (size() and 'in' do not "
                "iterate) or nest fewer macros"
            )
            self._at(entry, key, source, None, None, message, rule, "cost")
            return None
        try:
            program = self.backend.compile(source)
        except CompileError as exc:
            self._at(entry, key, source, exc.line, exc.column, f"{where}: {exc}", rule, "cel")
            return None
        return Expression(source, program, name, checked)

    def _at(
        self,
        entry: Mapping[str, Any],
        key: str,
        source: str,
        line: int | None,
        column: int | None,
        message: str,
        rule: str | None,
        code: str,
    ) -> None:
        """Report an issue at a position inside an expression, with the line and a caret."""
        base_line, base_column = (
            entry.lines.get(key, entry.start) if isinstance(entry, Located) else (None, None)
        )
        snippet = None
        if line is not None and column is not None:
            lines = source.splitlines() or [""]
            text = lines[min(line, len(lines)) - 1]
            snippet = f"    {text}\n    {' ' * (column - 1)}^"
            message += f" (expression line {line}, column {column})"
            if isinstance(entry, Located):
                base_line, base_column = entry.position(key, line, column)
        self.check.count += 1
        self.check.issues.append(
            PolicyIssue(
                self.check.file,
                message,
                base_line,
                base_column,
                self.check.policy,
                rule,
                code,
                snippet,
            )
        )
