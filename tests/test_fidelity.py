"""The fidelity harness's invariants, in its quick (CI) size: each can fail.

benchmarks/fidelity.py plants facts in a seeded conversation and compacts it repeatedly under
each condition; these tests assert what the harness demonstrates (docs/fidelity.md).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fidelity

QUICK = fidelity.Config(turns=60)
MODES = ("faithful", "lossy", "confabulating")


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str], fidelity.Run]:
    return {(r.condition, r.summarizer): r for r in fidelity.runs(QUICK)}


def wrong(run: fidelity.Run) -> int:
    return sum(p.wrong for p in run.passes)


class TestHarness:
    def test_the_same_seed_gives_the_same_run(self) -> None:
        """A seed fixes the conversation, the planted facts and every summarizer decision."""
        assert fidelity.run("gate", "confabulating", QUICK) == fidelity.run(
            "gate", "confabulating", QUICK
        )
        other = fidelity.Config(seed=QUICK.seed + 1, turns=QUICK.turns)
        assert fidelity.transcript(1, 8, 20, 300) != fidelity.transcript(2, 8, 20, 300)
        assert fidelity.run("no-gate", "lossy", other) != fidelity.run("no-gate", "lossy", QUICK)

    def test_a_run_leaves_no_file_behind(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The grounding conditions load their policies from a temporary folder, then drop it."""
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        fidelity.run("gate+grounding", "lossy", fidelity.Config(turns=10))
        assert list(tmp_path.iterdir()) == []

    def test_the_ungated_baseline_loses_and_invents_facts(
        self, results: dict[tuple[str, str], fidelity.Run]
    ) -> None:
        """Without the gate the lossy summarizer loses facts and the confabulating one states
        wrong values: the harness detects both (or it could not show what the gate saves)."""
        assert results["no-gate", "lossy"].passes[-1].recall < 0.95
        assert wrong(results["no-gate", "confabulating"]) > 0
        assert results["no-gate", "faithful"].passes[-1].recall == 1.0  # the control


class TestWhatTheGateSaves:
    @pytest.mark.parametrize("condition", ["gate+grounding", "everything"])
    @pytest.mark.parametrize("mode", MODES)
    def test_with_grounding_no_wrong_fact_is_accepted(
        self, results: dict[tuple[str, str], fidelity.Run], condition: str, mode: str
    ) -> None:
        """Output-phase grounding refuses every summary stating a value no source states."""
        assert wrong(results[condition, mode]) == 0

    @pytest.mark.parametrize("condition", ["gate+remedies", "everything"])
    @pytest.mark.parametrize("mode", MODES)
    def test_remedies_keep_the_window_in_budget(
        self, results: dict[tuple[str, str], fidelity.Run], condition: str, mode: str
    ) -> None:
        """A refusal answered by its remedy never leaves the window over the budget."""
        run = results[condition, mode]
        assert run.passes and max(p.tokens for p in run.passes) <= QUICK.budget

    def test_refusing_alone_strands_the_agent(
        self, results: dict[tuple[str, str], fidelity.Run]
    ) -> None:
        """The gate without remedies is safe but the window outgrows its budget: why remedies."""
        assert max(p.tokens for p in results["gate", "faithful"].passes) > QUICK.budget

    @pytest.mark.parametrize("mode", MODES)
    def test_everything_keeps_every_planted_fact(
        self, results: dict[tuple[str, str], fidelity.Run], mode: str
    ) -> None:
        """Gate + remedies + grounding: every fact stays in the window or behind its pointer
        (recall >= 95% at every pass), where the ungated baseline loses them."""
        assert min(p.recall for p in results["everything", mode].passes) >= 0.95

    def test_through_the_real_langchain_middleware(self) -> None:
        """The same invariants through a real create_agent with GuardedSummarizationMiddleware."""
        pytest.importorskip("langchain.agents")
        run = fidelity.run_langchain("confabulating", QUICK)
        assert run.passes and run.passes[-1].refusals > 0
        assert wrong(run) == 0
        assert min(p.recall for p in run.passes) >= 0.95
        assert max(p.tokens for p in run.passes) <= QUICK.budget
        assert len(run.refused_regions) == len(set(run.refused_regions))  # never the same twice

    def test_through_the_real_langmem_summarize_messages(self) -> None:
        """And through langmem's running summary: max_tokens holds, no fact lost or changed."""
        pytest.importorskip("langmem")
        run = fidelity.run_langmem("confabulating", QUICK)
        assert run.passes and run.passes[-1].refusals > 0
        assert wrong(run) == 0
        assert min(p.recall for p in run.passes) >= 0.95
        assert max(p.tokens for p in run.passes) <= QUICK.budget
        assert len(run.refused_regions) == len(set(run.refused_regions))

    def test_a_chat_model_of_your_own_can_summarize(self) -> None:
        """--langchain-model: any chat model takes the summarizer's place (here a scripted one
        that states a value no source states: grounding refuses it, the remedy pins instead)."""
        pytest.importorskip("langchain.agents")
        from langchain_core.language_models.fake_chat_models import FakeListChatModel

        model = FakeListChatModel(responses=["Summary: retry_ceiling_0: 99."] * 200)
        run = fidelity.run_langchain("confabulating", QUICK, summary_model=model)
        assert run.condition == "everything (LangChain, your model)"
        assert run.passes and wrong(run) == 0 and run.passes[-1].refusals > 0


def test_report_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command prints the markdown table and writes the PNG plot."""
    pytest.importorskip("matplotlib")
    png = tmp_path / "fidelity.png"
    assert fidelity.main(["--quick", "--plot", str(png)]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| summarizer | condition |") and "everything (LangChain)" in table
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_table_is_the_last_full_run() -> None:
    """The README's fidelity table, and docs/fidelity.md's whole one, are what a full run of
    the harness prints (seed 7)."""
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    docs = (root / "docs" / "fidelity.md").read_text(encoding="utf-8").splitlines()
    rows = fidelity.table(list(fidelity.runs(fidelity.Config()))).splitlines()[2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    for c in cells:
        if c[0] in ("lossy", "confabulating"):
            assert f"| {c[0]} | {c[1]} | {c[3]} | {c[5]} | {c[6]} |" in readme, c
    shown = [line for line in docs if line.startswith(("| faithful", "| lossy", "| confab"))]
    assert shown[: len(rows)] == rows  # (then the adapters' rows, which this run leaves out)
