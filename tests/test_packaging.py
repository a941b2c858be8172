"""The built wheel and sdist ship every module and data file of the source tree.

An editable install reads the source tree, so a module left out of the wheel (as
policyhook.adapters once was) passes every other test; these build the real artefacts.
.ci/installed then installs the wheel into fresh virtualenvs and runs the commands from there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "policyhook"
#: What the package is made of: its modules and the data files it reads at run time.
SHIPPED = ("*.py", "*.yaml", "py.typed")
BUILD_OUTPUTS: tuple[str, ...] = (".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__")
BUILD_OUTPUTS += ("*_cache", "node_modules")


def source_files() -> set[str]:
    """Every module and data file under policyhook/, as paths relative to the repository."""
    found = {
        path.relative_to(ROOT).as_posix()
        for pattern in SHIPPED
        for path in PACKAGE.rglob(pattern)
        if "__pycache__" not in path.parts
    }
    assert "policyhook/adapters/claude_code.py" in found and "policyhook/py.typed" in found
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and sdist, built as a release would build them (python -m build).

    From a copy without build outputs: setuptools reuses a stale build/ or *.egg-info, which
    can put a module into the wheel that the configuration leaves out.
    """
    tree = tmp_path_factory.mktemp("tree") / "policyhook"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*BUILD_OUTPUTS), symlinks=True)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--quiet", "--outdir", str(out), str(tree)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def test_wheel_ships_every_module_and_data_file(dist: Path) -> None:
    """Every .py, .yaml and py.typed under policyhook/ is in the wheel."""
    (wheel,) = dist.glob("policyhook-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = source_files() - names
    assert not missing, f"not in {wheel.name}: {sorted(missing)}"


def test_wheel_declares_the_command_and_the_license(dist: Path) -> None:
    """The wheel installs the `policyhook` command and carries its license, Apache-2.0 in full."""
    (wheel,) = dist.glob("policyhook-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        info = {Path(n).name: n for n in archive.namelist() if ".dist-info/" in n}
        entry_points = archive.read(info["entry_points.txt"]).decode()
        metadata = Parser().parsestr(archive.read(info["METADATA"]).decode())
    assert "policyhook = policyhook.cli:main" in entry_points
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read(
            next(n for n in archive.namelist() if n.endswith("licenses/LICENSE"))
        )
    assert shipped == (ROOT / "LICENSE").read_bytes()


def test_sdist_ships_every_module_and_data_file(dist: Path) -> None:
    """The sdist holds the package, the shipped policies and the tests with their fixtures."""
    (sdist,) = dist.glob("policyhook-*.tar.gz")
    with tarfile.open(sdist) as archive:
        prefix = sdist.name.removesuffix(".tar.gz") + "/"
        names = {n.removeprefix(prefix) for n in archive.getnames()}
    wanted = source_files() | {
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "policies/strict/strict.yaml",
        "tests/fixtures/claude/compacted.jsonl",
    }
    missing = wanted - names
    assert not missing, f"not in {sdist.name}: {sorted(missing)}"
