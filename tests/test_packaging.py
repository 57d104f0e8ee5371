"""What a user installs: the version, the extras' bounds, and the wheel's contents."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import hora

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.mark.timeout(60)
def test_hora_version_prints_the_package_version():
    out = subprocess.run([sys.executable, "-m", "hora", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"hora {hora.__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", hora.__version__)


def test_the_extras_pin_nothing_exactly_and_leave_runtimes_their_builds():
    extras = _pyproject()["project"]["optional-dependencies"]
    users = {name: reqs for name, reqs in extras.items() if name != "dev"}
    for name, reqs in users.items():
        for req in reqs:
            assert "==" not in req and "<" not in req, f"extra {name!r} pins {req!r}: lower bounds only"
    assert not any(r.startswith("tensorflow-cpu") for r in extras["tensorflow"]), "a GPU TensorFlow must satisfy it"
    assert not any(r.startswith("mpich") for r in extras["mpi"]), "the cluster's MPI must do"
    assert any(r.startswith("mpich") for r in extras["dev"]), "the tests still get MPICH"
    # the default image decoder's Pillow is declared (it came only through matplotlib before)
    assert any(r.lower().startswith("pillow") for r in extras["images"])
    assert any("images" in r for r in extras["all"] if r.startswith("hora["))
    # this repository's own installs stay pinned
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text(encoding="utf-8").split()


def test_the_repository_ships_a_license_and_a_changelog():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").startswith("# Changelog")
    assert (ROOT / "hora" / "py.typed").exists()


@pytest.mark.timeout(240)
def test_the_wheel_carries_the_license_and_py_typed(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = tmp_path.glob("hora-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "hora/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names[-10:]
    assert f"Version: {hora.__version__}" in metadata
    assert "Classifier: Typing :: Typed" in metadata
    assert "Requires-Dist: torch>=2.1; extra == \"torch\"" in metadata
