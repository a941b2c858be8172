"""The README stays true: its example runs, its activation table is the declared one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import policyhook
from policyhook.activation import markdown_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_activation_table_is_generated_from_the_schema() -> None:
    """The README's activation table is exactly activation.markdown_table()."""
    table = README.split("<!-- activation-table -->\n")[1].split("<!-- /activation-table -->")[0]
    assert table.strip() == markdown_table()


def test_example_runs_and_refuses_once_the_source_is_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 10-line example works as written, and refuses after cfg-42 is evicted."""
    monkeypatch.chdir(ROOT)
    example = re.search(r"## Example\n\n```python\n(.*?)```", README, re.S)
    assert example is not None
    code = example.group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 10

    class FakeLLM:
        def invoke(self, prompt: str) -> str:
            return f"summary of {prompt.count(chr(10))} lines, retry ceiling is 7"

    namespace = {
        "llm": FakeLLM(),
        "config_text": "config: retry_ceiling = 7",
        "turns": ["user: keep retrying the deploy"],
        "new_turns": ["user: and notify #ops"],
    }
    exec(compile(code, "README.md", "exec"), namespace)
    guard: policyhook.Guard = namespace["guard"]  # type: ignore[assignment]
    try:
        assert guard.check(namespace["s2"], summarizer="x").depth == 2
        guard.store.evict("cfg-42")
        with pytest.raises(policyhook.UnsafeRecompactionError, match="cfg-42"):
            namespace["summarize"]([namespace["s1"]])  # type: ignore[operator]
    finally:
        guard.close()


def test_two_setup_commands_and_ci_run_the_same_test_command() -> None:
    """The README's two commands exist, and .ci/run runs the README's test command."""
    assert "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/policyhook demo" in README
    assert "```sh\nbash .ci/test\n```" in README
    assert 'exec bash "$(dirname "${BASH_SOURCE[0]}")/test"' in (ROOT / ".ci" / "run").read_text()
