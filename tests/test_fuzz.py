"""Property-based fuzzing (hypothesis, fixed example budgets) of the two inputs operators write:
policy YAML (the loader) and `policyhook eval` activations. Whatever they are given, they answer
with a policy set or a located PolicyError, and with an exit code and the problems named, never a
traceback, a hang or another exception.
"""

from __future__ import annotations

import io
import json
import string
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import deep
import pytest
import yaml
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st

import policyhook
from policyhook import cli
from policyhook._loader import compile_sources
from policyhook._tester import PolicyTestError, run_tests

BUDGET = deep.suite(150, None, HealthCheck.function_scoped_fixture)
POLICY = (Path(__file__).resolve().parent.parent / "policies" / "default.yaml").read_text()
POLICY_TEST = (
    Path(__file__).resolve().parent.parent / "policies" / "default_test.yaml"
).read_text()

#: Scalars and fragments a policy author (or a broken editor) writes.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(
        [
            "region.depth > 1",
            "size(region.dead_sources) == 0",
            'request.trigger == "manual"',
            "region.sources.all(s, s != '')",
            "sizee(region.sources)",
            "region.depth +",
            "enforce",
            "audit",
            "deny",
            "pin",
            "\ud800",
        ]
    ),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "apiVersion",
                    "kind",
                    "metadata",
                    "name",
                    "spec",
                    "rules",
                    "expression",
                    "message",
                    "mode",
                    "failurePolicy",
                    "variables",
                    "matchConditions",
                    "remedy",
                    "phase",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=25,
)


def mutate(text: str, at: int, insert: str) -> str:
    position = at % (len(text) + 1)
    return text[:position] + insert + text[position:]


class TestLoaderFuzz:
    @BUDGET
    @given(documents)
    def test_any_yaml_document_loads_or_is_a_located_policy_error(self, document: Any) -> None:
        """A structurally random document is a PolicySet or a PolicyError naming the file."""
        text = yaml.safe_dump(
            {"apiVersion": "policyhook.dev/v1", "kind": "CompactionPolicy", "spec": document},
            allow_unicode=True,
        )
        try:
            compile_sources([("fuzz.yaml", text)])
        except policyhook.PolicyError as error:
            assert error.issues and all(i.file == "fuzz.yaml" for i in error.issues)

    @BUDGET
    @given(
        st.integers(min_value=0), st.text(alphabet=string.printable + "{}[]&*!|>'\"\\", max_size=12)
    )
    @example(at=194070027, insert="0")  # `name:0 grounded-numbers`: metadata a str, no line
    def test_any_edit_of_the_default_policy_loads_or_is_a_policy_error(
        self, at: int, insert: str
    ) -> None:
        """Text typed anywhere into the shipped default: a set, or a PolicyError with a line."""
        try:
            compile_sources([("default.yaml", mutate(POLICY, at, insert))])
        except policyhook.PolicyError as error:
            assert all(i.file == "default.yaml" for i in error.issues)
            assert any(i.line is not None for i in error.issues)

    @BUDGET
    @given(
        st.integers(min_value=0), st.text(alphabet=string.printable + "{}[]&*!|>'\"\\", max_size=12)
    )
    @example(at=132, insert="\x0bC,")  # a character YAML refuses: its error named no line
    def test_any_edit_of_the_default_policy_tests_runs_or_is_an_error_with_a_line(
        self, tmp_path_factory: pytest.TempPathFactory, at: int, insert: str
    ) -> None:
        """Text typed anywhere into the shipped policy tests: they run (passing or failing), or
        a PolicyTestError names the test file and a line, never another exception."""
        folder = tmp_path_factory.mktemp("tests")
        (folder / "default.yaml").write_text(POLICY)
        (folder / "default_test.yaml").write_text(mutate(POLICY_TEST, at, insert))
        try:
            results = run_tests(folder / "default.yaml")
        except PolicyTestError as error:
            assert str(error).startswith(f"{folder / 'default_test.yaml'}:")
            assert not str(error).startswith(f"{folder / 'default_test.yaml'}:?:"), str(error)
        else:
            assert results


def run_eval(tmp_path: Path, document: str) -> tuple[int, str, str]:
    activation = tmp_path / "activation.json"
    activation.write_text(document, encoding="utf-8", errors="surrogatepass")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(
            [
                "eval",
                str(Path(__file__).resolve().parent.parent / "policies"),
                "--input",
                str(activation),
                "--format",
                "json",
            ]
        )
    return code, out.getvalue(), err.getvalue()


activations = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "region",
                    "request",
                    "window",
                    "summarizer",
                    "depth",
                    "sources",
                    "live_sources",
                    "dead_sources",
                    "kind",
                    "trigger",
                    "budget_pressure",
                    "attempt",
                    "id",
                    "x",
                ]
            ),
            inner,
            max_size=6,
        ),
    ),
    max_leaves=30,
)


class TestEvalFuzz:
    @BUDGET
    @given(activations)
    def test_any_activation_is_decided_or_refused_in_one_line(
        self, tmp_path_factory: pytest.TempPathFactory, document: Any
    ) -> None:
        """eval on any JSON: exit 0 with a decision, or exit 2 naming the file and each problem."""
        tmp = tmp_path_factory.mktemp("eval")
        code, out, err = run_eval(tmp, json.dumps(document, allow_nan=True))
        if code == 0:
            assert json.loads(out)["decision"] in ("allow", "deny", "would_deny")
        else:
            assert code == 2 and out == ""
            assert err.strip() and "Traceback" not in err
            assert all("activation.json" in line for line in err.splitlines())
