"""``hora run`` says, before any rank starts, when the command's python cannot import hora."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

VENV_BIN = os.path.dirname(sys.executable)
HORA = os.path.join(VENV_BIN, "hora")
EXIT_USAGE = 2

# a rank that ran would leave this file
SCRIPT = "import os, sys\nopen(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ran.' + os.environ.get('HORA_RANK', 'x')), 'w').close()\n"


def _system_python() -> str:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.isfile(candidate) and os.path.realpath(candidate) != os.path.realpath(sys.executable):
            probe = subprocess.run([candidate, "-I", "-c", "import hora"], capture_output=True, timeout=30)
            if probe.returncode != 0:
                return candidate
    pytest.skip("no system python3 without hora on this machine")


def _run(args: list[str], cwd, path: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = path
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run([HORA, "run", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(120)
def test_run_names_both_interpreters_when_the_commands_python_lacks_hora(tmp_path):
    system = _system_python()
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir()
    shim = shim_dir / "python"
    shim.write_text(f'#!/bin/sh\nexec {system} -I "$@"\n')
    shim.chmod(0o755)
    (tmp_path / "train.py").write_text(SCRIPT)
    out = _run(["-np", "2", "python", "train.py"], tmp_path, f"{shim_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert out.returncode == EXIT_USAGE, out.stderr
    assert str(shim) in out.stderr  # the command's python
    assert sys.executable in out.stderr  # hora run's own
    assert "cannot import hora" in out.stderr and "No module named 'hora'" in out.stderr
    assert ".venv/bin/python" in out.stderr
    assert not list(tmp_path.glob("ran.*")), "ranks started although the check failed"


@pytest.mark.timeout(180)
def test_run_warns_when_the_commands_python_has_hora_but_not_torch(tmp_path):
    """The repository's checkout imports hora from source in any python: torch is what is missing there."""
    pytest.importorskip("torch")
    system = _system_python()
    if subprocess.run([system, "-I", "-c", "import torch"], capture_output=True, timeout=60).returncode == 0:
        pytest.skip(f"{system} has torch")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir()
    shim = shim_dir / "python"
    shim.write_text(f'#!/bin/sh\nexport PYTHONPATH={repo}\nexec {system} "$@"\n')
    shim.chmod(0o755)
    (tmp_path / "train.py").write_text(SCRIPT)
    out = _run(["-np", "2", "python", "train.py"], tmp_path, f"{shim_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert "hora run: warning:" in out.stderr and "cannot import torch" in out.stderr, out.stderr
    assert str(shim) in out.stderr and sys.executable in out.stderr


@pytest.mark.timeout(120)
def test_run_reports_a_namespace_hora_folder_next_to_the_script(tmp_path):
    (tmp_path / "hora").mkdir()  # what the README's store file:///tmp/hora made in /tmp
    (tmp_path / "train.py").write_text(SCRIPT)
    out = _run(["-np", "2", "python", "train.py"], tmp_path, VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    assert out.returncode == EXIT_USAGE, out.stderr
    assert "namespace package" in out.stderr and str(tmp_path / "hora") in out.stderr
    assert not list(tmp_path.glob("ran.*"))


@pytest.mark.timeout(180)
def test_run_starts_ranks_when_the_commands_python_has_hora(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    out = _run(["-np", "2", "python", "train.py"], tmp_path, VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.glob("ran.*")) == ["ran.0", "ran.1"]


def test_commands_that_do_not_start_a_python_are_not_probed():
    from hora.runners.launchers.local import check_command_python

    assert check_command_python(["bash", "-c", "true"]) is None
    assert check_command_python([shutil.which("true") or "/bin/true"]) is None
