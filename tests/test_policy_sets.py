"""The shipped policy sets: plain files users can copy, every copy of one policy the same.

`policies/` in the repository is what users read and copy; `policyhook/policy_sets/` is what the
package ships for `policyhook init`. A set is a folder of `policies/` (the default set: its top).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from policyhook import load
from policyhook.cli import POLICY_SETS
from policyhook.cli import main as cli_main
from policyhook.testing import run_tests

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "policyhook" / "policy_sets"
DEFAULT = ROOT / "policyhook" / "default_policy.yaml"


def in_repository(name: str) -> Path:
    return ROOT / "policies" if name == "default" else ROOT / "policies" / name


def test_no_symlinks_in_policies() -> None:
    """A copied policies/ folder works: nothing in it is a symlink."""
    links = [p for p in (ROOT / "policies").rglob("*") if p.is_symlink()]
    assert links == []


def test_every_copy_of_the_default_policy_is_identical() -> None:
    """Each default.yaml, in policies/ and in the shipped sets, is the embedded default policy."""
    copies = sorted((ROOT / "policies").rglob("default.yaml")) + sorted(
        SHIPPED.rglob("default.yaml")
    )
    assert len(copies) == 4
    for copy in copies:
        assert copy.read_bytes() == DEFAULT.read_bytes(), f"{copy} differs from {DEFAULT}"


def test_the_sets_init_offers_are_the_shipped_folders() -> None:
    """`policyhook init --set` names exactly the folders under policyhook/policy_sets/."""
    assert sorted(POLICY_SETS) == sorted(p.name for p in SHIPPED.iterdir() if p.is_dir())


@pytest.mark.parametrize("name", POLICY_SETS)
def test_shipped_set_is_the_repository_folder(name: str) -> None:
    """policyhook/policy_sets/<set> holds the same files, byte for byte, as its policies/ folder."""
    here = in_repository(name)
    files = sorted(p.name for p in here.iterdir() if p.is_file())
    assert files, here
    assert sorted(p.name for p in (SHIPPED / name).iterdir()) == files
    for file in files:
        shipped = SHIPPED / name / file
        assert shipped.read_bytes() == (here / file).read_bytes(), (
            f"copy {here / file} to {shipped}"
        )


def test_every_set_init_writes_checks_outputs() -> None:
    """The grounded set is gone: the default covers it. Every set `policyhook init` writes
    refuses ungrounded numbers on the output, with pin as the way forward; no separate
    `grounded` folder remains to be offered."""
    assert not (ROOT / "policies" / "grounded").exists()
    assert "grounded" not in POLICY_SETS
    for name in POLICY_SETS:
        policies = load(SHIPPED / name)
        outputs = [p for p in policies.policies if p.phase == "output"]
        assert outputs, name
        text = "".join(p.read_text("utf-8") for p in sorted((SHIPPED / name).glob("*.yaml")))
        assert "number" in text and "summary.ungrounded_kinds" in text and "remedy: pin" in text


def test_init_writes_the_grounded_default(tmp_path: Path) -> None:
    """`policyhook init` (the default set) writes the embedded default, output check included;
    its test cases, output-phase ones among them, pass as written."""
    assert cli_main(["init", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "default.yaml").read_bytes() == DEFAULT.read_bytes()
    results = run_tests(tmp_path / "p")
    assert all(r.passed for r in results)
    assert any(r.expected.get("policy") == "grounded-numbers" for r in results)
