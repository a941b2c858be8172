"""The output phase: policies decide on what the summarizer returned, before the caller gets it."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from policyhook import Guard, PolicyError, UnsafeRecompactionError, remedies, request
from policyhook._demo import CONFIG, TURNS
from policyhook._loader import compile_sources, load_default
from policyhook.testing import PolicyTestError, capture_decisions, run_tests

OUTPUT_POLICY = """
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata:
  name: {name}
spec:
  mode: {mode}
  phase: output
  rules:
    - name: {name}
      expression: "{expression}"
      message: {name} refused
"""


def policies(*docs: str) -> object:
    return compile_sources([(f"p{i}.yaml", d) for i, d in enumerate(docs)])


def seed_guard(**options: object) -> Guard:
    guard = Guard(**options)  # type: ignore[arg-type]  # the embedded default
    guard.record_source(CONFIG, kind="config_read", source_id="cfg-retry-ceiling")
    for turn in TURNS:
        guard.record_source(turn, kind="user_turn")
    return guard


def summarizer(*claims: str) -> Callable[[list[str]], str]:
    said = iter(claims)

    def summarize(messages: list[str]) -> str:
        return f"Summary: deploy keeps timing out; notify #ops; {next(said)}."

    return summarize


class TestDefaultOutputCheck:
    def test_seed_confabulation_refused_with_every_source_live(self) -> None:
        """The seed's pass 3 ("retries capped at 5") is refused on its output, though nothing
        was evicted: the input guard allows it, the output phase does not."""
        guard = seed_guard()
        summarize = guard(
            summarizer(
                "retry ceiling is 7 (from config)", "retries are capped", "retries capped at 5"
            ),
            summarizer="seed",
        )
        window = [CONFIG, TURNS[0]]
        with request(window="w"):
            window = [summarize(window), TURNS[1]]
            window = [summarize(window), TURNS[2]]
            with capture_decisions(guard) as seen, pytest.raises(UnsafeRecompactionError) as info:
                summarize(window)
        assert [d.effect for d, _ in seen] == ["allow", "deny"]  # input granted, output refused
        refusal = info.value
        assert (refusal.policy, refusal.rule, refusal.depth) == (
            "grounded-numbers",
            "grounded-numbers",
            2,
        )
        assert "ungrounded: number 'retries capped 5'" in str(refusal)
        assert "retries are capped" in window[0]  # the window keeps its last grounded summary

    def test_confabulation_at_depth_1_is_refused(self) -> None:
        """A first pass over originals that invents a number is refused too."""
        guard = seed_guard()
        summarize = guard(summarizer("retries capped at 5"), summarizer="first")
        with request(window="w"), pytest.raises(UnsafeRecompactionError) as info:
            summarize([CONFIG, TURNS[0]])
        assert info.value.depth == 0 and info.value.rule == "grounded-numbers"

    def test_grounded_output_is_returned_with_its_sources(self) -> None:
        """A faithful summary passes; the call knows each fact's live sources."""
        guard = seed_guard()
        with request(window="w"), guard.guarding([CONFIG, TURNS[0]], summarizer="s") as call:
            out = call.record("Deploy times out; retry ceiling is 7 (from config).")
        assert out.endswith("(from config).")
        assert call.grounding is not None and call.grounding.ungrounded == ()
        assert set(call.grounding.sources.values()) == {frozenset({"cfg-retry-ceiling"})}

    def test_unregistered_input_content_is_evidence(self) -> None:
        """Text the input carries that no store holds still grounds the summary of it."""
        guard = Guard()
        with guard.guarding(["build took 95s on runner-7"], summarizer="s") as call:
            assert call.record("The build took 95s on runner-7.").startswith("The build")
        with (
            pytest.raises(UnsafeRecompactionError),
            guard.guarding(["build took 95s on runner-7"], summarizer="s") as call,
        ):
            call.record("The build took 59s on runner-7.")

    def test_facts_carry_their_sources_across_passes(self) -> None:
        """A number repeated by a later pass is grounded through the earlier pass's provenance
        while its source is live."""
        guard = seed_guard()
        summarize = guard(
            summarizer("retry ceiling is 7", "retry ceiling still 7"), summarizer="seed"
        )
        with request(window="w"), capture_decisions(guard) as seen:
            first = summarize([CONFIG, TURNS[0]])
            summarize([first, TURNS[1]])
        assert [d.effect for d, _ in seen] == ["allow", "allow", "allow", "allow"]

    def test_citations_on_request(self) -> None:
        """cite_sources renders the live sources after each grounded fact."""
        guard = seed_guard(cite_sources=True)
        summarize = guard(summarizer("retry ceiling is 7"), summarizer="s")
        with request(window="w"):
            out = summarize([CONFIG, TURNS[0]])
        assert "retry ceiling is 7 [cfg-retry-ceiling]." in out

    def test_refusal_outcome(self) -> None:
        """A refused output ends the call as `refused`, and nothing is recorded as a summary."""
        guard = seed_guard()
        with (
            request(window="w"),
            pytest.raises(UnsafeRecompactionError),
            guard.guarding([CONFIG], summarizer="s") as call,
        ):
            call.record("retries capped at 5")
        assert guard.provenance("retries capped at 5").depth == 0  # never recorded


class TestOutputPolicies:
    def test_no_output_policy_no_check(self) -> None:
        """Without output-phase policies the output is not looked at."""
        only_input = compile_sources([("d.yaml", load_default_text().split("\n---\n")[0])])
        guard = Guard(only_input)
        with guard.guarding(["x"], summarizer="s") as call:
            assert call.record("retries capped at 5") == "retries capped at 5"
        assert call.grounding is None

    def test_audit_mode_output_policy_lets_the_output_through(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """An audit-mode output policy records a would-be refusal and returns the output."""
        doc = OUTPUT_POLICY.format(name="audit-out", mode="audit", expression="summary.facts == 0")
        guard = Guard(policies(doc))  # type: ignore[arg-type]
        with (
            caplog.at_level(logging.INFO, "policyhook"),
            capture_decisions(guard) as seen,
            guard.guarding(["retry ceiling 7"], summarizer="s") as call,
        ):
            assert call.record("retry ceiling 7") == "retry ceiling 7"
        assert [d.effect for d, _ in seen] == ["allow", "would_deny"]
        assert "would refuse the output" in caplog.text

    def test_summary_fields_reach_policies(self) -> None:
        """Ratios, counts and kinds of the `summary` variable can be used in rules."""
        doc = OUTPUT_POLICY.format(
            name="ratio",
            mode="enforce",
            expression="summary.grounded_ratio >= 0.5 && summary.key_facts >= 0 "
            "&& !('path' in summary.ungrounded_kinds)",
        )
        guard = Guard(policies(doc))  # type: ignore[arg-type]
        with guard.guarding(["see /etc/app.conf"], summarizer="s") as call:
            call.record("see /etc/app.conf")
        with (
            pytest.raises(
                UnsafeRecompactionError, match=re.escape("ungrounded: path '/etc/other.conf'")
            ),
            guard.guarding(["see /etc/app.conf"], summarizer="s") as call,
        ):
            call.record("see /etc/other.conf")

    def test_summary_in_an_input_policy_is_a_load_error(self) -> None:
        """`summary` exists only for `phase: output`; an input rule over it fails at load."""
        doc = OUTPUT_POLICY.format(name="x", mode="enforce", expression="summary.facts > 0")
        with pytest.raises(PolicyError, match="summary"):
            policies(doc.replace("  phase: output\n", ""))

    def test_bad_phase_names_the_field(self) -> None:
        """An unknown phase is a load error naming spec.phase."""
        doc = OUTPUT_POLICY.format(name="x", mode="enforce", expression="summary.facts > 0")
        with pytest.raises(
            PolicyError, match=re.escape("spec.phase must be input or output, got 'after'")
        ):
            policies(doc.replace("phase: output", "phase: after"))

    def test_the_default_checks_outputs(self) -> None:
        """The embedded default is the input policy and `grounded-numbers` on the output, with
        pin as its way forward; every shipped copy of the default is that file."""
        default = load_default()
        assert default.checks_output
        assert {p.name: p.phase for p in default.policies} == {
            "default": "input",
            "grounded-numbers": "output",
        }
        assert "remedy: pin" in load_default_text().split("---\n")[-1]


class TestWayForward:
    """A refusal on the output never strands the agent: with remedies on, the default's pin
    archives the input and hands back a pointer with the exact facts of its live sources, on
    every adapter path (the LangChain and langmem ones: tests/test_adapter_*.py)."""

    def test_decorator_with_remedy_returns_a_pointer_with_the_exact_facts(self) -> None:
        guard = seed_guard()
        summarize = guard(summarizer("retries capped at 5"), summarizer="s", remedy=True)
        with request(window="w"):
            out = summarize([CONFIG, TURNS[0]])
        assert out.startswith("[policyhook offload offload:")
        assert "retry_ceiling: 7 [cfg-retry-ceiling]" in out  # the source's fact, verbatim
        assert "capped at 5" not in out
        (ref,) = re.findall(r"offload:[0-9a-f]+", out)[:1]
        assert guard.retrieve(ref) == [CONFIG, TURNS[0]]  # the input, back exactly

    def test_guard_remedy_after_the_seam_refuses(self) -> None:
        """`guard.guarding` raises; `guard.remedy(refusal, input)` gives the way forward."""
        guard = seed_guard()
        window = [CONFIG, TURNS[0]]
        with (
            request(window="w"),
            pytest.raises(UnsafeRecompactionError) as info,
            guard.guarding(window, summarizer="s") as call,
        ):
            call.record("retries capped at 5")
        remedied = guard.remedy(info.value, window, summarizer="s")
        assert remedied.remedy == "pin" and remedied.ref is not None
        assert any(p.value == "7" for p in remedied.pinned)

    def test_a_pointer_in_the_input_is_no_fact_the_summary_drops(self) -> None:
        """A window holding a remedy's pointer is summarized: the pointer is carried into the
        output verbatim, so neither its wording (the ref, a hash) nor the facts it pinned are
        facts the summary dropped; a summary restating a pinned fact is grounded."""
        guard = seed_guard()
        summarize = guard(summarizer("retries capped at 5"), summarizer="s", remedy=True)
        with request(window="w"):
            pointer = summarize([CONFIG, TURNS[0]])
        assert "retry_ceiling: 7 [cfg-retry-ceiling]" in pointer
        guard.record_source("user: and the status?", kind="user_turn")
        window = [pointer, "user: and the status?"]
        for claim in ("the archive holds the history", "retry ceiling is 7 (from config)"):
            again = guard(summarizer(claim), summarizer="s")
            with request(window="w"), capture_decisions(guard) as seen:
                out = again(window)
            decision, activation = seen[-1]
            assert decision.effect == "allow", decision.message
            assert activation["summary"]["dropped"] == 0, activation["summary"]
            assert out.endswith(pointer)  # carried

    def test_a_list_after_a_pointer_is_the_summarizer_s_and_checked(self) -> None:
        """A summary keeping a pointer that pinned nothing, then a list of its own: the list
        is the summarizer's claim, checked like the rest (it was read as the pointer's pinned
        facts and skipped, so an invented number in it passed)."""
        guard = seed_guard()
        pointer = remedies.pointer_text("offload:00aa11bb", ["archived"])
        assert remedies.pin([("p", pointer)]) == ()
        guard.record_source(pointer, kind=remedies.POINTER_KIND)
        said = pointer + "\n- retries capped at 5"
        summarize = guard(lambda messages: said, summarizer="s")
        with request(window="w"), pytest.raises(UnsafeRecompactionError) as refused:
            summarize([pointer, TURNS[0]])
        assert refused.value.rule == "grounded-numbers"


def load_default_text() -> str:
    from importlib import resources

    return resources.files("policyhook").joinpath("default_policy.yaml").read_text("utf-8")


class TestPolicyTestFiles:
    """`policyhook test`: a case that gives a `summary` is decided by output-phase policies."""

    HEAD = (
        "apiVersion: policyhook.dev/v1\nkind: PolicyTest\nmetadata: {name: t}\n"
        "defaults:\n"
        "  region: {id: r1, kind: original, depth: 0, sources: [cfg], live_sources: [cfg],\n"
        "           dead_sources: [], source_kinds: [config_read], tokens: 10, chars: 40}\n"
        "  request: {trigger: automatic, budget_pressure: 0.9, attempt: 1}\n"
        "  window: {id: w1, tokens: 900, budget: 1000, max_depth: 0}\n"
        "  summarizer: {name: s, lossless: false, idempotent: false}\n"
        "  summary: {facts: 1, grounded: 1, ungrounded: 0, unverifiable: 0, dropped: 0,\n"
        "            key_facts: 0, kinds: [number], ungrounded_kinds: [],\n"
        "            unverifiable_kinds: [], dropped_kinds: [], grounded_ratio: 1.0,\n"
        "            ungrounded_ratio: 0.0, dropped_ratio: 0.0}\n"
        "cases:\n"
    )

    def folder(self, tmp_path: Path, cases: str) -> Path:
        (tmp_path / "default.yaml").write_text(load_default_text(), encoding="utf-8")
        (tmp_path / "t_test.yaml").write_text(self.HEAD + cases, encoding="utf-8")
        return tmp_path

    def test_output_cases_get_the_output_decision(self, tmp_path: Path) -> None:
        """The input alone allows; with an ungrounded number in `summary` the output phase
        refuses, and a case expecting otherwise fails with both decisions shown."""
        cases = (
            "  - name: input only\n    input: {}\n    expect: {decision: allow, policy: default}\n"
            "  - name: wrong on purpose\n"
            "    input: {summary: {grounded: 0, ungrounded: 1, ungrounded_kinds: [number]}}\n"
            "    expect: {decision: allow}\n"
            "  - name: right\n"
            "    input: {summary: {grounded: 0, ungrounded: 1, ungrounded_kinds: [number]}}\n"
            "    expect: {decision: deny, policy: grounded-numbers, rule: grounded-numbers}\n"
        )
        results = run_tests(self.folder(tmp_path, cases))
        assert [(r.name, r.passed) for r in results] == [
            ("input only", True),
            ("wrong on purpose", False),
            ("right", True),
        ]
        assert results[1].actual["rule"] == "grounded-numbers"

    @pytest.mark.parametrize(
        ("summary", "message"),
        [
            ("{facts: many}", "summary.facts must be int, got 'many'"),
            ("{fact: 1}", "summary.fact is not a field"),
            ("{ungrounded_kinds: number}", "summary.ungrounded_kinds must be list(string)"),
            ("[1]", "'summary' must be a mapping of its fields"),
        ],
    )
    def test_bad_summary_names_file_line_and_field(
        self, tmp_path: Path, summary: str, message: str
    ) -> None:
        cases = (
            f"  - name: bad\n    input: {{summary: {summary}}}\n    expect: {{decision: allow}}\n"
        )
        with pytest.raises(PolicyTestError, match=re.escape(message)) as info:
            run_tests(self.folder(tmp_path, cases))
        assert "t_test.yaml:" in str(info.value)

    def test_missing_summary_fields_are_errors_without_defaults(self, tmp_path: Path) -> None:
        """As for every activation field: a field the case never chose is not made up."""
        head = self.HEAD.split("  summary:")[0] + "cases:\n"
        (tmp_path / "default.yaml").write_text(load_default_text(), encoding="utf-8")
        (tmp_path / "t_test.yaml").write_text(
            head + "  - name: c\n    input: {summary: {facts: 1}}\n    expect: {decision: allow}\n",
            encoding="utf-8",
        )
        with pytest.raises(PolicyTestError, match=re.escape("summary.grounded (int) is missing")):
            run_tests(tmp_path)


class TestFactIndexIsABoundedCache:
    """The guard's index of source facts is a cache: bounded, and never the reason for a finding."""

    def test_a_long_run_keeps_the_index_within_its_bound(self) -> None:
        guard = Guard(max_fact_sources=8)
        summarize = guard(lambda messages: "Summary: the queue holds jobs.", summarizer="s")
        for i in range(60):
            with request(window=f"w{i % 5}"):
                summarize([f"user: turn {i} says the queue holds {i + 3} jobs", "one more"])
        index = guard._facts
        assert len(index) <= 8
        assert set(index._norm) == set(index._owned) and set(index._assigned) <= set(index._owned)
        indexed = set(index._owned)
        assert all(ids <= indexed for ids in index._keys.values())  # nothing of a forgotten source
        guard.close()

    def test_a_source_another_call_indexed_does_not_vouch_for_this_output(self) -> None:
        """A number only an unrelated source states (indexed by an earlier call, not part of
        this input) is ungrounded and refused, as with a cold cache: it was unverifiable, and
        let through, whenever the cache happened to hold that source."""
        for warm in (False, True):
            guard = Guard()
            guard.record_source("retry_ceiling: 5", kind="config_read", source_id="cfg")
            guard.record_source("the deploy keeps timing out", kind="user_turn", source_id="turn")
            if warm:
                with request(window="w1"):
                    guard(lambda m: "Summary: retry ceiling 5.", summarizer="s")(
                        ["retry_ceiling: 5"]
                    )
                assert "cfg" in guard._facts
            summarize = guard(
                lambda m: "Summary: deploy timing out; retry ceiling 5.", summarizer="s"
            )
            with request(window="w2"), pytest.raises(UnsafeRecompactionError, match="ungrounded"):
                summarize(["the deploy keeps timing out"])
            guard.close()

    def test_many_distinct_sources_and_carried_facts_stay_within_the_bound(self) -> None:
        """Thousands of sources with words of their own, and carried facts naming ids the index
        never read, go through an index of 8: it holds exactly the keys its 8 ids put, no key
        or id of a forgotten one (counted in entries, not bytes)."""
        from policyhook.grounding import Fact, FactIndex

        index = FactIndex(max_sources=8)
        per_id = 0
        for i in range(2_000):
            index.add(f"s{i}", f"job{i} on host-{i % 97}: retries {i % 7}, timeout_ms: {i}")
            carried = Fact("number", str(i), frozenset({f"word{i}", "retry"}))
            index.add_facts([(carried, {f"summary-source-{i}"})])
            index.trim(keep={f"s{i}"})
            per_id = max(per_id, max(len(keys) for keys in index._owned.values()))
            assert len(index._owned) <= 8 and len(index) <= 8
        entries = sum(len(ids) for ids in index._keys.values())
        assert entries == sum(len(keys) for keys in index._owned.values())
        assert len(index._keys) <= entries <= 8 * per_id
        assert set(index._norm) | set(index._assigned) <= set(index._owned)
        kept = set(index._owned)
        assert all(ids and ids <= kept for ids in index._keys.values())

    def test_an_id_set_that_shrinks_is_compacted(self) -> None:
        """A word 1,000 forgotten sources shared leaves a set no larger than a new one holding
        what is left (Python's sets keep their table when emptied), so memory follows entries."""
        import sys

        from policyhook.grounding import FactIndex

        index = FactIndex(max_sources=1)
        for i in range(1_000):
            index.add(f"s{i}", f"shared word {i}")
        index.trim()
        (ids,) = [ids for key, ids in index._keys.items() if key == "wshared"]
        assert ids == {"s999"} and sys.getsizeof(ids) <= sys.getsizeof(set(ids))

    def test_facts_carried_for_an_id_do_not_stop_its_text_from_being_indexed(self) -> None:
        from policyhook.grounding import Fact, FactIndex, check

        index = FactIndex(max_sources=4)
        index.add_facts([(Fact("identifier", "retry_ceiling"), {"cfg"})])
        assert "cfg" not in index  # its text was never read
        index.add("cfg", "retry_ceiling: 7")
        assert "cfg" in index and not check("retry ceiling 7", index, {"cfg"}).ungrounded

    def test_a_forgotten_live_source_is_indexed_again_and_still_grounds(self) -> None:
        """The config is forgotten by the cache after many other sources; a later summary that
        states its number is still grounded (re-read from the store), not refused."""
        guard = seed_guard(max_fact_sources=2)
        for i in range(20):
            guard.record_source(f"note {i}: deploy {i} finished", kind="user_turn")
        summarize = guard(
            summarizer("retry ceiling is 7 (from config)", "retry ceiling is 7 (from config)"),
            summarizer="seed",
        )
        with request(window="w"):
            assert "ceiling is 7" in summarize([CONFIG, TURNS[0]])
            for i in range(6):  # other sources push the config out of the cache
                guard.check([f"note {i}: deploy {i} finished"], summarizer="x")
                summarize_other = guard(lambda m: "Summary: deploys finished.", summarizer="o")
                summarize_other([f"note {i}: deploy {i} finished"])
            assert "cfg-retry-ceiling" not in guard._facts
            assert "ceiling is 7" in summarize([CONFIG, TURNS[1]])
        guard.close()

    def test_a_check_larger_than_the_bound_keeps_all_its_sources(self) -> None:
        from policyhook.grounding import FactIndex, check

        index = FactIndex(max_sources=2)
        for i in range(5):
            index.add(f"s{i}", f"the pool size is {i + 10}")
        index.trim(keep=["s0", "s1", "s2", "s3", "s4"])
        assert len(index) == 5  # a check's own sources are never forgotten under it
        assert not check("the pool size is 14", index, {"s4"}).ungrounded
        index.trim()
        assert len(index) == 2 and set(index._owned) == {"s3", "s4"}  # the most recently kept
        with pytest.raises(ValueError, match="max_sources"):
            FactIndex(max_sources=0)
