"""The README's and docs/'s code blocks cannot rot: each block meant to run is run.

Info strings say what a fenced block is: ``python`` is a complete program, run as a script in
its own process (from a temporary folder outside the source tree); ``shell`` is a command line,
run by bash with this venv's ``bin`` first on PATH; ``py`` marks a sketch (an API tour with
``...``), which must still compile; ``bash`` blocks (make targets, installs) are not run.
Also: the docs home page shows the README's code, no store path can shadow a package, and the
mkdocs site builds with ``--strict``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)


def blocks(page: Path) -> list[tuple[str, str]]:
    """The (info string, code) of every fenced block of ``page``."""
    return FENCE.findall(page.read_text(encoding="utf-8"))


def runnable() -> list[tuple[str, str, str]]:
    """Every distinct block to run, as (id, info, code): README's first, each once."""
    seen, out = set(), []
    for page in PAGES:
        for i, (info, code) in enumerate(blocks(page)):
            if info in ("python", "shell") and code not in seen:
                seen.add(code)
                out.append((f"{page.relative_to(ROOT)}#{i}", info, code))
    return out


RUNNABLE = runnable()


def test_the_readme_has_the_quickstarts_and_the_docs_home_shows_them():
    infos = [info for info, _ in blocks(ROOT / "README.md")]
    assert infos.count("python") == 2 and infos.count("shell") == 1, infos
    assert blocks(ROOT / "README.md") == blocks(ROOT / "docs" / "index.md"), (
        "docs/index.md's code blocks differ from README.md's: copy the README's quickstarts there")
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 200
    assert {info for page in PAGES for info, _ in blocks(page)} <= {"python", "shell", "py", "bash"}


def test_sketches_compile_and_no_store_path_shadows_a_package():
    for page in PAGES:
        for i, (info, code) in enumerate(blocks(page)):
            if info in ("python", "py"):
                compile(code, f"{page.name}#{i}", "exec")
    examples = [*PAGES, *sorted((ROOT / "examples").glob("*.py")), ROOT / "hora" / "dask.py",
                ROOT / "hora" / "spark" / "__init__.py"]
    for path in examples:
        # /tmp/hora is an importable folder name: run from /tmp, `import hora` would find it
        assert not re.search(r"/tmp/hora(?![\w-])", path.read_text(encoding="utf-8")), path


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name,info,code", RUNNABLE, ids=[r[0] for r in RUNNABLE])
def test_the_block_runs(name: str, info: str, code: str, tmp_path: Path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    code = code.replace("/tmp/hora-store", str(tmp_path / "store"))  # the same code, a store of this test's own
    if info == "python":
        (tmp_path / "block.py").write_text(code, encoding="utf-8")
        cmd = [sys.executable, "block.py"]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    if "TorchEstimator" in code:  # the fit printed its last epoch: a finite loss
        loss = re.search(r"'loss': ([0-9.e+-]+|nan|inf)", proc.stdout)
        assert loss and float(loss.group(1)) < 1e6, proc.stdout[-2000:]
    if "hora run" in code:
        assert sorted(re.findall(r"rank \d of 2", proc.stdout)) == ["rank 0 of 2", "rank 1 of 2"], proc.stdout


@pytest.mark.timeout(180)
def test_the_docs_site_builds_strict(tmp_path: Path):
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        pytest.fail(f"{mkdocs} is missing: `make install` installs the dev extra's mkdocs")
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-5000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert "hora.spark.TorchEstimator" in api and "hora.dask.TorchEstimator" in api
