"""Grounding: the fact extractor, the matcher, and its accuracy on hand-written and real summaries."""

from __future__ import annotations

import gzip
import json
import re
import sys
import threading
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from policyhook.adapters.claude_postcompact import history_sources
from policyhook.grounding import (
    KINDS,
    CheckerUnavailable,
    Fact,
    FactIndex,
    Grounding,
    check,
    cite,
    extract,
    nli_judge,
)

FIXTURES = Path(__file__).parent / "fixtures" / "grounding"
CORRUPTIONS = ("changed", "unit", "id", "invented", "dropped")


def facts(text: str, kind: str | None = None) -> list[Fact]:
    return [f for f in extract(text) if kind is None or f.kind == kind]


def values(text: str, kind: str) -> list[str]:
    return [f.value for f in facts(text, kind)]


def index(**sources: str) -> FactIndex:
    idx = FactIndex()
    for sid, text in sources.items():
        idx.add(sid, text)
    return idx


class TestExtract:
    def test_number_carries_its_key(self) -> None:
        """`retry_ceiling: 7` is the number 7 with the context words retry and ceiling."""
        (n,) = facts("retry_ceiling: 7", "number")
        assert n.value == "7"
        assert {"retry", "ceil"} <= n.context
        assert n.assigned

    def test_number_carries_words_after_it(self) -> None:
        """`7 retries` puts the word after the number in its context."""
        (n,) = facts("7 retries", "number")
        assert n.value == "7" and "retry" in n.context

    @pytest.mark.parametrize(
        ("text", "value"),
        [
            ("items: 1,000", "1000"),
            ("items: 1e3", "1000"),
            ("items: 1000.0", "1000"),
            ("items: seven", "7"),
            ("items: 1k", "1000"),
            ("ratio: 0.25", "0.25"),
            ("timeout: 5s", "5 s"),
            ("timeout: 5 seconds", "5 s"),
            ("timeout: 5000ms", "5 s"),
            ("timeout: 2 minutes", "120 s"),
            ("size: 2 MB", "2000000 B"),
            ("rollout: 25%", "25 %"),
            ("timeout_seconds: 30", "30 s"),
            ("limit: 600 requests per minute", "10 /s"),
            ("throughput: 2,300 req/s", "2300 /s"),
        ],
    )
    def test_numbers_are_normalised(self, text: str, value: str) -> None:
        """Numbers written differently compare equal: separators, exponents, words, units."""
        assert values(text, "number") == [value]

    def test_bare_number_is_no_fact(self) -> None:
        """A number with no word and no unit beside it cannot be checked, so it is not reported."""
        assert facts("5", "number") == []
        assert facts("x = (5)", "number") == []

    def test_list_markers_are_not_numbers(self) -> None:
        """The summarizer's own numbering (`1.` at a line start, `(2)`) is no fact."""
        text = "1. Primary request\n   2) Files\n(3) more\n## 4. Pending"
        assert facts(text, "number") == []

    def test_range_end_shares_the_context_of_its_start(self) -> None:
        """`timeouts 5-30s`: the end of a range is a timeout too."""
        a, b = facts("timeouts 5-30s", "number")
        assert "timeout" in a.context and "timeout" in b.context

    @pytest.mark.parametrize(
        "text",
        [
            "**Message 3 (User)**: realign",
            "My Response 1: created tasks",
            "REVIEW.md Section 4 identified",
            "Phase 10 items 10.1-10.4",
            "all previous phases (1-8) with bugs",
            "read lines 1-200, then 200-700, was reading more",
            "added the import at line 3",
            "§4.1-4.2: canonical ranges",
            "9 items:\n- 2.1: Upstash Redis\n- 2.2: R2 Storage",
            "### 10.4 Add mathrsfs",
        ],
    )
    def test_references_are_not_checked(self, text: str) -> None:
        """A number after a label noun (or a section's number) points, it does not measure:
        the summarizer's own `Message 3` is no claim a source must state (docs/grounding.md)."""
        assert [f.text for f in facts(text, "number")] == (["9"] if "9 items" in text else [])

    def test_references_in_sources_still_ground(self) -> None:
        """A source's `### 10.2 AppArmor Profile` grounds a summary's `10.2 (AppArmor)`."""
        idx = index(plan="### 10.2 AppArmor Profile\nDeny shell access.")
        assert check("items done: 10.2 (AppArmor)", idx).ungrounded == ()
        assert check("items done: 10.3 (AppArmor)", idx).ungrounded

    def test_counts_stated_by_shape(self) -> None:
        """A file read whose gutter ends at 1274 states "1274 lines"; a message enumerating
        `1.` to `4.` states four questions; other counts are not stated."""
        gutter = "".join(f"{n:>6}\u2192line {n}\n" for n in range(1, 1275))
        asked = "I need to be sure when you answer these. 1. What? 2. Why? 3. How? 4. When?"
        idx = index(read=gutter, user=asked)
        assert check("the review (complete - 1274 lines)", idx).ungrounded == ()
        assert check("the review (complete - 1275 lines)", idx).ungrounded
        assert check("Gave answers to all 4 questions", idx).ungrounded == ()
        assert check("Gave answers to all 5 questions", idx).ungrounded

    def test_unitless_durations_of_1000_or_more_are_milliseconds(self) -> None:
        """`AbortSignal.timeout(3000)` grounds "3s timeout"; `timeout: 30` grounds no "30ms"."""
        idx = index(code="fetch(url, { signal: AbortSignal.timeout(3000) })", cfg="timeout: 30")
        assert check("health check with 3s timeout", idx).ungrounded == ()
        assert check("health check with 5s timeout", idx).ungrounded
        assert check("timeout 30ms", idx).ungrounded

    def test_lists_of_same_unit_share_context(self) -> None:
        """`retries at 0, 5min, 30min`: every member is a retry interval."""
        ns = facts("Razorpay retries at 0, 5min, 30min, 1h", "number")
        assert [n.value for n in ns] == ["0", "300 s", "1800 s", "3600 s"]
        assert all("retry" in n.context for n in ns)

    def test_a_number_ends_the_context_of_the_one_before(self) -> None:
        """`retries 7, timeout 30s`: the timeout's words are not the retries'."""
        a, b = facts("retries 7; timeout 30s", "number")
        assert "timeout" not in a.context and "retry" not in b.context

    @pytest.mark.parametrize(
        ("text", "kind", "value"),
        [
            ("see https://example.com/a/b.", "url", "https://example.com/a/b"),
            (
                "id bf5915c6-75c2-4612-ab44-c094d5efe7ed",
                "uuid",
                "bf5915c6-75c2-4612-ab44-c094d5efe7ed",
            ),
            ("on 2026-02-18T03:44:33Z", "date", "2026-02-18"),
            ("on March 14, 2025", "date", "2025-03-14"),
            ("on 14 Mar 2025", "date", "2025-03-14"),
            ("edit apps/web/lib/compile.ts:58", "path", "apps/web/lib/compile.ts"),
            ("read /var/log/app.log", "path", "/var/log/app.log"),
            ("open docs/REVIEW.md", "path", "docs/REVIEW.md"),
            ("open README.md", "path", "README.md"),
            ("release v2.4.1", "version", "2.4.1"),
            ("commit 3e9f358", "hash", "3e9f358"),
            ("ticket PROJ-1182", "ticket", "PROJ-1182"),
            ("issue #543", "ticket", "#543"),
            ("set retry_ceiling", "identifier", "retry_ceiling"),
            ("call maxRetries", "identifier", "maxRetries"),
            ("open FigureGallery", "identifier", "FigureGallery"),
            ("run with --dry-run", "identifier", "--dry-run"),
            ("name seccomp-latex-profile", "identifier", "seccomp-latex-profile"),
            ("latency at p99", "identifier", "p99"),
        ],
    )
    def test_self_identifying_facts(self, text: str, kind: str, value: str) -> None:
        """Identifiers, paths, URLs, versions, dates, hashes, UUIDs and tickets are found."""
        assert value in values(text, kind)

    def test_words_are_not_identifiers(self) -> None:
        """Plain words, hyphenated English and slash-joined words are no identifiers or paths."""
        text = "A long-running, end-to-end and belt-and-suspenders approach; and/or cost-benefit."
        assert [f for f in extract(text) if f.kind != "number"] == []

    def test_quotes_split_at_elisions(self) -> None:
        """A quote with `[...]` or `...` in it is checked as the parts actually quoted."""
        qs = values('He said "fix the retry loop ... then ship [details elided] it today"', "quote")
        assert qs == ["fix the retry loop", "then ship", "it today"]

    def test_code_spans_are_quotes(self) -> None:
        """A code span of several words is checked verbatim, like a quotation."""
        assert values("ran `SELECT id FROM datasets`", "quote") == ["select id from datasets"]

    def test_same_fact_twice_is_one_fact(self) -> None:
        """Each distinct fact is reported once, at its first position."""
        fs = facts("retry ceiling is 7. Again: retry ceiling is 7.")
        assert len(fs) == 1 and fs[0].start == 17

    @pytest.mark.parametrize(
        "text",
        [
            "a" * 200_000,
            "1" * 200_000,
            "/" * 50_000 + "x",
            "-" * 50_000,
            "a-" * 50_000,
            "a/" * 50_000,
            "1." * 50_000,
            "\ud800 retry_ceiling: 7 \udfff",
            "",
        ],
    )
    def test_hostile_input_is_read(self, text: str) -> None:
        """Degenerate input (one long token, lone surrogates, empty) is read, never a crash."""
        assert isinstance(extract(text), tuple)

    def test_kinds_are_the_documented_ones(self) -> None:
        """Every fact's kind is one of KINDS (what policies see in `summary.kinds`); `claim`
        comes only from a heavier checker (TestHeavierChecker)."""
        text = (
            'retry_ceiling: 7, see https://x.io, v1.2.3 on 2025-01-02, 3e9f358 #12 "a b c" '
            "/etc/hosts bf5915c6-75c2-4612-ab44-c094d5efe7ed"
        )
        assert {f.kind for f in extract(text)} == set(KINDS) - {"claim"}


class TestCheck:
    CONFIG = "# config/agent.yaml\nretry_ceiling: 7\nbackoff_seconds: 2\n"
    TURN = "The deploy step keeps timing out. Keep retrying it, but respect config/agent.yaml."

    def seed(self) -> FactIndex:
        return index(**{"cfg-42": self.CONFIG, "turn-1": self.TURN})

    def test_seed_pass_1_is_grounded(self) -> None:
        """Pass 1 of the seed ("retry ceiling is 7 (from config)") rests on cfg-42."""
        g = check("Retry ceiling is 7 (from config/agent.yaml).", self.seed())
        assert g.ungrounded == () and g.unverifiable == ()
        (seven,) = [f for f in g.facts if f.kind == "number"]
        assert g.sources[seven] == {"cfg-42"}

    def test_seed_pass_2_drops_the_ceiling(self) -> None:
        """Pass 2 ("retries are capped") loses the number: reported as dropped, not ungrounded."""
        g = check("Retries are capped.", self.seed())
        assert g.ungrounded == ()
        assert [(f.kind, f.value) for f in g.dropped] == [("number", "7"), ("number", "2 s")]

    def test_seed_pass_3_confabulation_is_ungrounded(self) -> None:
        """Pass 3's "retries capped at 5" is checked as (retries, 5): no source says it."""
        g = check("Retries capped at 5.", self.seed())
        assert [(f.kind, f.value) for f in g.ungrounded] == [("number", "5")]
        assert "number 'Retries capped 5'" in g.describe()

    def test_a_bare_5_elsewhere_grounds_nothing(self) -> None:
        """A 5 in a long history, next to other words, does not ground "retries capped at 5"."""
        idx = self.seed()
        idx.add("tool-3", "Build finished in 5 steps; 5 files changed; port 5 open.")
        g = check("Retries capped at 5.", idx)
        assert len(g.ungrounded) == 1

    def test_the_same_number_next_to_the_same_words_grounds(self) -> None:
        """A source stating 5 of retries grounds it, whichever words say so."""
        idx = self.seed()
        idx.add("tool-3", "max_retries = 5")
        g = check("Retries capped at 5.", idx)
        assert g.ungrounded == () and set(g.sources.values()) == {frozenset({"tool-3"})}

    def test_swapped_unit_is_ungrounded(self) -> None:
        """`5ms` where the source says `5s` is a different fact."""
        idx = index(cfg="timeout: 5s")
        assert check("timeout 5ms", idx).ungrounded
        assert check("timeout 5000ms", idx).ungrounded == ()
        assert check("timeout 5", idx).ungrounded == ()  # leaving the unit out is no claim

    def test_invented_unit_is_ungrounded(self) -> None:
        """`30s` where the source says a unitless 30 claims a unit no source gives."""
        assert check("timeout 30s", index(cfg="timeout: 30")).ungrounded

    def test_mistyped_identifier_and_path(self) -> None:
        """Identifiers and paths are checked verbatim (after normalisation)."""
        idx = index(src="def retry_ceiling(): ...\nopen('/srv/app/config/agent.yaml')")
        assert check("retry_ceiling in config/agent.yaml", idx).ungrounded == ()
        g = check("retry_celing in config/agents.yaml", idx)
        assert {f.kind for f in g.ungrounded} == {"identifier", "path"}

    def test_abbreviated_hash_is_grounded(self) -> None:
        """A 7-character hash is grounded by the full hash it abbreviates, not by a neighbour."""
        idx = index(log="commit 9fceb02d0ae598e95dc970b74767f19372d61af8")
        assert check("commit 9fceb02", idx).ungrounded == ()
        assert check("commit 9fceb20", idx).ungrounded

    def test_dead_source_makes_a_fact_unverifiable(self) -> None:
        """A fact only dead sources state is unverifiable, not grounded and not ungrounded."""
        g = check("Retry ceiling is 7.", self.seed(), live={"turn-1"})
        assert g.ungrounded == () and [f.value for f in g.unverifiable] == ["7"]
        assert g.dead[g.unverifiable[0]] == {"cfg-42"}
        assert g.summary()["unverifiable"] == 1

    def test_provenance_carries_across_passes(self) -> None:
        """A fact of pass 2 that only pass 1 stated inherits pass 1's sources for it."""
        sources = self.seed()
        first = check("Retry ceiling is 7 (from config).", sources)
        carried = FactIndex()
        carried.add_facts(first.provenance())
        empty = FactIndex()  # pass 2 sees no originals, only the summary
        g = check("The retry ceiling stays 7.", empty, live={"cfg-42"}, carried=carried)
        assert g.ungrounded == () and list(g.sources.values()) == [frozenset({"cfg-42"})]
        dead = check("The retry ceiling stays 7.", empty, live=set(), carried=carried)
        assert [f.value for f in dead.unverifiable] == ["7"]
        invented = check("Retries capped at 5.", empty, live={"cfg-42"}, carried=carried)
        assert invented.ungrounded

    def test_pinned_facts_must_be_kept(self) -> None:
        """A pinned fact the output lost is dropped."""
        g = check("Deploys retry.", index(turn="deploy"), pinned=["retry_ceiling: 7"])
        assert {f.value for f in g.dropped} >= {"7", "retry_ceiling"}

    def test_what_a_source_carries_verbatim_is_not_dropped(self) -> None:
        """`must_keep`: a source's facts outside it (what reaches the summary anyway) are never
        dropped, yet still ground what the output states."""
        text = "note: release v2.4.1 shipped\n[carried] retry_ceiling: 7, commit 3f9a2c1e5b7d"
        carried_from = text.index("[carried]")
        kept = text[:carried_from] + " " * (len(text) - carried_from)
        whole, part = FactIndex(), FactIndex()
        whole.add("s", text)
        part.add("s", text, must_keep=kept)
        assert {f.value for f in check("Nothing said.", whole).dropped} == {
            "2.4.1", "7", "3f9a2c1e5b7d"
        }  # fmt: skip
        assert [f.value for f in check("Nothing said.", part).dropped] == ["2.4.1"]
        restated = check("The retry ceiling is 7.", part)
        assert restated.ungrounded == () and restated.sources

    def test_summary_activation_has_counts_and_no_text(self) -> None:
        """The `summary` activation is counts, kinds and ratios: no fact's text or value."""
        g = check("Retries capped at 5; see config/agent.yaml.", self.seed())
        s = g.summary()
        assert s["facts"] == 2 and s["grounded"] == 1 and s["ungrounded"] == 1
        assert s["ungrounded_kinds"] == ["number"] and s["kinds"] == ["number", "path"]
        assert s["counts"]["number"] == 1 and s["ungrounded_counts"]["path"] == 0
        assert s["grounded_ratio"] == 0.5 and s["ungrounded_ratio"] == 0.5
        assert s["dropped"] == 2 and s["key_facts"] == 2 and s["dropped_ratio"] == 1.0
        flat = json.dumps(s)
        assert "agent.yaml" not in flat and "capped" not in flat and '"5"' not in flat

    def test_empty_output(self) -> None:
        """An output with no facts is fully grounded (ratio 1.0) and drops every key fact."""
        s = check("", self.seed()).summary()
        assert s["facts"] == 0 and s["grounded_ratio"] == 1.0 and s["ungrounded_ratio"] == 0.0

    def test_bad_input_is_a_clear_error(self) -> None:
        """Non-text input names what was wrong."""
        with pytest.raises(TypeError, match="output must be str, got bytes"):
            check(b"5", FactIndex())  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="source id and text must be str: str, NoneType"):
            FactIndex().add("s", None)  # type: ignore[arg-type]

    def test_threads_check_while_sources_are_added(self) -> None:
        """Checks and additions from several threads never crash or lose a source."""
        idx = self.seed()
        errors: list[BaseException] = []

        def add(n: int) -> None:
            try:
                for i in range(200):
                    idx.add(f"s{n}-{i}", f"retry_ceiling: {i}\nworker_{n}_{i} done")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def run() -> None:
            try:
                for _ in range(200):
                    check("Retry ceiling is 7; worker_1_5 done.", idx)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=f, args=a) for f, a in ((add, (1,)), (add, (2,)))]
        threads += [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(idx) == 402
        assert check("worker_2_199 done", idx).ungrounded == ()


class TestCite:
    def test_renders_source_refs_after_grounded_facts(self) -> None:
        """Citations go right after each grounded fact; ungrounded ones get none."""
        idx = index(**{"cfg-42": "retry_ceiling: 7"})
        text = "Retry ceiling 7, timeout 30s."
        assert cite(text, check(text, idx)) == "Retry ceiling 7 [cfg-42], timeout 30s."

    def test_many_sources_are_capped(self) -> None:
        """At most `limit` ids are shown, then a count of the rest."""
        idx = index(a="retry_ceiling: 7", b="retry ceiling 7", c="retries: 7", d="7 retries")
        assert cite("7 retries", check("7 retries", idx), limit=2) == "7 [a, b, +2] retries"


def load_corpus() -> list[dict[str, Any]]:
    data = json.loads((FIXTURES / "corpus.json").read_text(encoding="utf-8"))
    cases: list[dict[str, Any]] = data["cases"]
    return cases


def corpus_index(case: dict[str, Any]) -> FactIndex:
    return index(**case["sources"])


def flagged(kind: str, g: Grounding) -> bool:
    return bool(g.dropped) if kind == "dropped" else bool(g.ungrounded)


#: Corruptions the check misses, by design: a dropped fact that is no `key: value`, version,
#: hash, UUID or ticket (a test count, a quoted budget) is not a key fact (docs/grounding.md).
KNOWN_MISSES = {("test-results", "dropped"), ("quoted-instruction", "dropped")}


class TestCorpus:
    @pytest.mark.parametrize("case", load_corpus(), ids=lambda c: c["id"])
    def test_faithful_summary_is_never_refused(self, case: dict[str, Any]) -> None:
        """Every fact of a faithful summary is grounded: zero false refusals."""
        g = check(case["faithful"], corpus_index(case))
        assert g.ungrounded == (), g.describe()
        assert g.unverifiable == ()

    @pytest.mark.parametrize(
        ("case", "kind"),
        [(c, k) for c in load_corpus() for k in CORRUPTIONS],
        ids=lambda v: v["id"] if isinstance(v, dict) else v,
    )
    def test_corruption_is_caught(self, case: dict[str, Any], kind: str) -> None:
        """Changed numbers, swapped units, mistyped ids, invented and dropped facts are found."""
        g = check(case["corrupted"][kind], corpus_index(case))
        assert flagged(kind, g) == ((case["id"], kind) not in KNOWN_MISSES), g.describe()

    def test_every_case_has_every_corruption(self) -> None:
        """The corpus is complete: one corrupted summary per kind per case."""
        for case in load_corpus():
            assert set(case["corrupted"]) == set(CORRUPTIONS), case["id"]


def real_session(name: str, tmp: Path) -> tuple[FactIndex, str]:
    """Everything the summarizer was shown (one source per original before the compaction
    boundary, plus the hook context the compaction agent's own transcript keeps) and the
    summary, read as `policyhook claude-postcompact` reads them."""
    path, session, summary = materialise(name, tmp)
    idx = FactIndex()
    for source_id, text in history_sources(path, session, summary):
        idx.add(source_id, text)
    return idx, summary


def materialise(name: str, tmp: Path) -> tuple[Path, str, str]:
    """A fixture session written out as Claude Code lays it down: `<id>.jsonl` and, beside it,
    `<id>/subagents/agent-acompact-*.jsonl`; returns (path, session id, summary)."""
    data = gzip.decompress((FIXTURES / f"{name}.jsonl.gz").read_bytes())
    (entry,) = [e for e in map(json.loads, data.splitlines()) if e.get("isCompactSummary")]
    session = entry["sessionId"]
    path = tmp / f"{session}.jsonl"
    path.write_bytes(data)
    for agent in FIXTURES.glob(f"{name}.agent-acompact-*.jsonl"):
        folder = tmp / session / "subagents"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / agent.name.removeprefix(f"{name}.")).write_bytes(agent.read_bytes())
    return path, session, entry["message"]["content"]


#: Every finding on the real summaries, each explained in docs/grounding.md ("Real summaries":
#: A, not in the transcript; B, Claude Code's own text; C, counts the summarizer made; E, a
#: comparison restated; G, a quote that is no quote; H, slash-joined words).
REAL_FINDINGS = {
    "apollo-23": {
        ("number", "1443"): 1,  # A: the Read of Mitigation_plan.md has no tool_result on disk
        ("number", "9"): 2,  # A: "Phase 2 with 9 items", from that same unrecorded read
        ("quote", '"Infrastructure Foundation"'): 1,  # A
        ("ticket", "I-4"): 1,  # A
        ("path", "/Users/devs/.claude/plans/snazzy-frolicking-iverson.md"): 1,  # B: plan mode
        ("number", "2"): 1,  # C: "launched 2 explore agents", a count of its own tool calls
    },
    "apollo-32": {
        (
            "path",
            "/Users/devs/.claude/projects/-Users-devs-Downloads-Apollo/"
            "d97ae08b-ea44-4fc7-90fa-e493a3e73a14.jsonl",
        ): 1,  # B: the transcript path Claude Code appends
    },
    "spotter-8463": {
        ("number", "Three"): 1,  # C: "Three have been worked on so far"
        ("number", "24"): 1,  # C: "All 24 existing tests preserved" (49 run, 25 added)
        ("number", "25"): 1,  # C: "Added 25 new tests"
        ("path", "compiled/tested/committed"): 1,  # H: three words joined by slashes
        ("quote", "`bd close spotter-fum.3`"): 1,  # G: a command it means to run, not one run
        ("quote", "`length(x) > 0`"): 1,  # G: the code it changed, paraphrased
        ("number", "4"): 1,  # E: "(4 > max 2)" for the linter's "max depth is 2, was 4"
        (
            "path",
            "/home/USER/.claude/projects/-home-USER-projects-spotter-worktrees-spotter-fum/"
            "8463c716-a2ea-4c14-9efa-87158ebd9f20.jsonl",
        ): 1,  # B
    },
    "spotter-ae4a": {
        ("number", "9"): 1,  # E: "(13 > 9)" for the linter's "complexity is 13, max is 9"
        ("quote", '"continue with the remaining tasks."'): 1,  # B: its own instructions
        ("quote", "`{:ok, trace_id} | :error`"): 1,  # G: a type it inferred
        (
            "quote",
            "`config :opentelemetry, span_processor: :batch, traces_exporter: :stdout`",
        ): 1,  # G: two config lines joined into one
        (
            "path",
            "/home/USER/.claude/projects/-home-USER-projects-spotter-worktrees-spotter-4te/"
            "ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl",
        ): 1,  # B
    },
}


class TestRealSummaries:
    @pytest.mark.parametrize("name", sorted(REAL_FINDINGS))
    def test_findings_are_exactly_the_explained_ones(self, name: str, tmp_path: Path) -> None:
        """Real Claude Code compaction summaries: every finding is one docs/grounding.md explains."""
        idx, summary = real_session(name, tmp_path)
        g = check(summary, idx)
        found: dict[tuple[str, str], int] = {}
        for f in g.ungrounded:
            found[(f.kind, f.text)] = found.get((f.kind, f.text), 0) + 1
        assert found == REAL_FINDINGS[name]
        assert g.unverifiable == ()

    @pytest.mark.parametrize("name", sorted(REAL_FINDINGS))
    def test_most_facts_are_grounded(self, name: str, tmp_path: Path) -> None:
        """The summaries are faithful first passes: identifiers and URLs all rest on the history."""
        idx, summary = real_session(name, tmp_path)
        s = check(summary, idx).summary()
        assert s["facts"] > 120 and s["grounded_ratio"] > 0.9
        assert s["ungrounded_counts"]["identifier"] == 0 and s["ungrounded_counts"]["url"] == 0


def overlap(premise: str, hypothesis: str) -> float:
    """A real, small judge: the share of the sentence's words the passage has."""
    words = [w for w in hypothesis.lower().replace(".", " ").split() if len(w) > 2]
    return sum(f" {w} " in f" {premise} " for w in words) / max(1, len(words))


class TestHeavierChecker:
    """`check(judge=...)`: an NLI or factual-consistency model behind the same check."""

    SOURCES: ClassVar[dict[str, str]] = {
        "cfg": "retry_ceiling: 7\nbackoff_seconds: 2\n",
        "turn": "The deploy step keeps timing out against the staging cluster.",
    }

    def test_unsupported_sentences_become_ungrounded_claims(self) -> None:
        summary = (
            "The deploy step keeps timing out against staging. "
            "The database migration finished without errors."
        )
        g = check(summary, index(**self.SOURCES), judge=overlap)
        (claim,) = g.ungrounded
        assert claim.kind == "claim" and claim.text.startswith("The database migration")
        assert g.summary()["ungrounded_kinds"] == ["claim"]
        assert check(summary, index(**self.SOURCES)).ungrounded == ()  # without it: nothing

    def test_a_judge_only_adds_findings(self) -> None:
        """A judge that supports everything cannot ground a number no source states."""
        g = check("Retries are capped at 5.", index(**self.SOURCES), judge=lambda p, h: 1.0)
        assert [(f.kind, f.value) for f in g.ungrounded] == [("number", "5")]

    def test_judge_sees_live_passages_only(self) -> None:
        """A sentence only a dead source supports is a claim: the judge never sees the dead."""
        seen: list[str] = []

        def judge(premise: str, hypothesis: str) -> float:
            seen.append(premise)
            return overlap(premise, hypothesis)

        summary = "The deploy step keeps timing out against staging."
        g = check(summary, index(**self.SOURCES), live={"cfg"}, judge=judge)
        assert [f.kind for f in g.ungrounded] == ["claim"]
        assert all("staging" not in p for p in seen)

    def test_without_the_extra_the_error_names_it(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """No transformers (this test environment): a clear error naming the extra."""
        monkeypatch.setitem(sys.modules, "transformers", None)
        with pytest.raises(CheckerUnavailable, match=re.escape("pip install 'policyhook[nli]'")):
            nli_judge()

    def test_a_model_not_in_the_cache_is_a_clear_error(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The model is looked up offline only; missing weights say how to fetch them once."""
        calls: list[dict[str, Any]] = []

        def from_pretrained(name: str, **options: Any) -> Any:
            calls.append({"name": name, **options})
            raise OSError(f"We couldn't connect to 'https://huggingface.co' to load {name}")

        fake = types.ModuleType("transformers")
        loader = types.SimpleNamespace(from_pretrained=from_pretrained)
        fake.AutoTokenizer = loader  # type: ignore[attr-defined]
        fake.AutoModelForSequenceClassification = loader  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "transformers", fake)
        monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
        with pytest.raises(CheckerUnavailable, match="is not available offline") as info:
            nli_judge("some/nli-model")
        assert "huggingface-cli download some/nli-model" in str(info.value)
        assert calls == [{"name": "some/nli-model", "local_files_only": True}]
