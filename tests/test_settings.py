"""hora.settings: every HORA_* name in the code is declared, values are checked against
their bounds (a ConfigError naming variable, value and bounds, at init), the README's
table is the generated one, and ``hora check --env`` lists every setting."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hora import settings
from hora.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"HORA_[A-Z0-9_]*[A-Z0-9]")


def _names_in(paths: list[Path]) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in paths:
        for name in _NAME.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, str(path.relative_to(ROOT)))
    return found


@pytest.mark.timeout(30)
def test_every_hora_variable_the_code_names_is_declared():
    used = _names_in(sorted((ROOT / "hora").rglob("*.py")))
    undeclared = {n: where for n, where in used.items() if n not in settings.SETTINGS}
    assert not undeclared, f"declare these in hora/settings.py: {undeclared}"
    assert len(used) >= 40  # the grep found the code's names (not an empty tree)


_LITERAL = re.compile(r"[\"'](HORA_[A-Z0-9_]*[A-Z0-9])[\"']")


@pytest.mark.timeout(30)
def test_every_hora_name_is_written_once_as_a_string_outside_the_registry():
    # a name is a constant of the one module that owns it (``ENV_SECRET = "HORA_SECRET"``)
    # and everything else imports that constant; the names both the launchers and the
    # engine use are hora.settings' own constants
    written: dict[str, list[str]] = {}
    for path in sorted((ROOT / "hora").rglob("*.py")):
        if path.name == "settings.py" and path.parent.name == "hora":
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in _LITERAL.findall(line):
                written.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{no}")
    twice = {n: where for n, where in written.items() if len(where) > 1}
    assert not twice, f"import the one constant of each of these instead of writing it again: {twice}"
    owned = {getattr(settings, c) for c in dir(settings) if c.startswith("ENV_")}
    assert len(owned) >= 8
    elsewhere = {n: written[n] for n in owned if n in written}
    assert not elsewhere, f"hora.settings owns these names: {elsewhere}"
    backends = re.compile(r"\(\s*[\"']auto[\"'],\s*[\"']gloo[\"']")
    again = [str(p.relative_to(ROOT)) for p in (ROOT / "hora").rglob("*.py")
             if p.name != "settings.py" and backends.search(p.read_text(encoding="utf-8"))]
    assert not again, f"use hora.settings.BACKENDS in {again}"


@pytest.mark.timeout(30)
def test_values_are_checked_against_their_type_and_bounds():
    env = {"HORA_CACHE_CAPACITY": "1e9", "HORA_SPECULATE": "maybe", "HORA_CYCLE_TIME": "fast",
           "HORA_OP_TIMEOUT": "0", "HORA_BACKEND": "Carrier-Pigeon", "HORA_LINGER_ROUNDS": "1.5"}
    for name, raw in env.items():
        with pytest.raises(ConfigError) as info:
            settings.get(name, env)
        msg = str(info.value)
        assert msg.startswith(f"{name}={raw!r} is invalid: it must be "), msg
    assert "an integer in [0, 65536]" in str(pytest.raises(ConfigError, settings.get, "HORA_CACHE_CAPACITY",
                                                           env).value)
    ok = {"HORA_CACHE_CAPACITY": " 64 ", "HORA_SPECULATE": "Off", "HORA_CYCLE_TIME": "0.5", "HORA_BACKEND": "GLOO",
          "HORA_FUSION_THRESHOLD": "1e6", "HORA_LOG_LEVEL": "debug", "HORA_SSH_ARGS": " -v "}
    got = {n: settings.get(n, ok) for n in ok}
    assert got == {"HORA_CACHE_CAPACITY": 64, "HORA_SPECULATE": False, "HORA_CYCLE_TIME": 0.5,
                   "HORA_BACKEND": "gloo", "HORA_FUSION_THRESHOLD": 1_000_000, "HORA_LOG_LEVEL": "DEBUG",
                   "HORA_SSH_ARGS": " -v "}
    assert settings.get("HORA_CACHE_CAPACITY", {"HORA_CACHE_CAPACITY": ""}) == 1024  # empty: the default
    with pytest.raises(KeyError, match="not a declared hora setting"):
        settings.get("HORA_NO_SUCH_THING", {})


@pytest.mark.timeout(60)
def test_a_setting_out_of_bounds_fails_init_naming_variable_value_and_bounds(monkeypatch):
    import hora.native as hn

    for k in list(os.environ):
        if k.startswith("HORA_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HORA_CACHE_CAPACITY", "100000")
    with pytest.raises(ConfigError, match=r"HORA_CACHE_CAPACITY='100000' is invalid: it must be an integer in "
                                          r"\[0, 65536\]"):
        hn.init()
    assert not hn.is_initialized()


@pytest.mark.timeout(30)
def test_the_readme_lists_the_settings_from_the_registry():
    readme = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    begin, end = "<!-- settings:begin -->", "<!-- settings:end -->"
    assert begin in readme and end in readme, "docs/settings.md lacks the generated settings table"
    table = readme.split(begin, 1)[1].split(end, 1)[0].strip()
    assert table == settings.markdown_table(), (
        "docs/settings.md's settings table is out of date: regenerate it with `python -m hora.settings --markdown`")


@pytest.mark.timeout(120)
def test_hora_check_env_lists_every_setting_with_value_and_default(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORA_")}
    env.update({"HORA_CYCLE_TIME": "2.5", "HORA_SECRET": "ab" * 32, "HORA_SPECULATE": "perhaps"})
    bindir = Path(sys.executable).parent
    proc = subprocess.run([str(bindir / "hora"), "check", "--env"], capture_output=True, text=True, env=env,
                          timeout=100, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for name in settings.SETTINGS:
        assert name in out, name
    line = next(x for x in out.splitlines() if x.startswith("HORA_CYCLE_TIME"))
    assert "2.5" in line and "default 1" in line, line
    secret = next(x for x in out.splitlines() if x.startswith("HORA_SECRET"))
    assert "ab" * 32 not in secret and "not shown" in secret
    assert "INVALID" in next(x for x in out.splitlines() if x.startswith("HORA_SPECULATE"))
