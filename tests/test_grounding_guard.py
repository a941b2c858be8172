"""The output phase: policies decide on what the summarizer returned, before the caller gets it."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from policyhook import Guard, PolicyError, UnsafeRecompactionError, request
from policyhook._demo import CONFIG, TURNS
from policyhook._loader import compile_sources, load, load_default
from policyhook.testing import capture_decisions

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


GROUNDED = Path(__file__).resolve().parent.parent / "policies" / "grounded"


def policies(*docs: str) -> object:
    return compile_sources([(f"p{i}.yaml", d) for i, d in enumerate(docs)])


def seed_guard(**options: object) -> Guard:
    guard = Guard(load(GROUNDED), **options)  # type: ignore[arg-type]
    guard.record_source(CONFIG, kind="config_read", source_id="cfg-retry-ceiling")
    for turn in TURNS:
        guard.record_source(turn, kind="user_turn")
    return guard


def summarizer(*claims: str) -> Callable[[list[str]], str]:
    said = iter(claims)

    def summarize(messages: list[str]) -> str:
        return f"Summary: deploy keeps timing out; notify #ops; {next(said)}."

    return summarize


class TestGroundedSet:
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
        guard = Guard(load(GROUNDED))
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

    def test_grounded_set_is_the_default_plus_the_output_check(self) -> None:
        """policies/grounded/ is the embedded default and `grounded-numbers` on the output;
        the embedded default itself does not look at outputs (docs/grounding.md says why)."""
        grounded = load(GROUNDED)
        assert {p.name: p.phase for p in grounded.policies} == {
            "default": "input",
            "grounded-numbers": "output",
        }
        default = load_default()
        assert not default.checks_output
        text = (GROUNDED / "grounded.yaml").read_text(encoding="utf-8")
        assert text.startswith(load_default_text() + "---\n")  # the default, unchanged


def load_default_text() -> str:
    from importlib import resources

    return resources.files("policyhook").joinpath("default_policy.yaml").read_text("utf-8")
