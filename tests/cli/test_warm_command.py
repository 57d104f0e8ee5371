"""``hora run --warm``: a command rank forked from the warm server is what ``python SCRIPT``
would be, as the script sees it (and ``python -c`` / another program start cold)."""

import os
import sys

import pytest

from tests.cli.test_cli import hora, write_script

SEMANTICS = """
    import atexit, os, sys
    atexit.register(lambda: print("atexit ran"))
    print("name", __name__)
    print("file", __file__)
    print("argv", sys.argv)
    print("path0", sys.path[0])
    print("cwd", os.getcwd())
    print("env", os.environ.get("CLIW_VAR"))
    print("torch", "torch" in sys.modules)
    print("group", os.getpgid(0) == os.getpid())  # its own process group, as a rank started cold
    print("tail", end="")  # left in the buffer: flushed at exit
    if sys.argv[1] == "term":
        import signal
        os.kill(os.getpid(), signal.SIGTERM)  # SIGTERM's default action: the process ends by it
    if sys.argv[1] == "raise":
        raise RuntimeError("boom from the script")
    if sys.argv[1] == "interrupt":
        raise KeyboardInterrupt  # the interpreter runs atexit, then ends by SIGINT
    sys.exit(int(sys.argv[1]))
"""


@pytest.mark.timeout(120)
def test_a_warm_command_rank_sees_what_a_fresh_python_would(tmp_path):
    script = write_script(tmp_path, "sem.py", SEMANTICS)
    work = tmp_path / "work"
    work.mkdir()
    res = hora("run", "-np", "2", "--warm", "python", os.path.join("..", "sem.py"), "3", cwd=str(work),
               env={"CLIW_VAR": "hello", "HORA_WARM_IDLE_TIMEOUT": "30"})
    assert res.returncode == 3, res.stderr
    for rank in (0, 1):
        out = [line.split(":", 1)[1] for line in res.stdout.splitlines() if line.startswith(f"[{rank}]<stdout>:")]
        assert out[:6] == ["name __main__", f"file {script}", "argv ['../sem.py', '3']", f"path0 {tmp_path}",
                           f"cwd {work}", "env hello"], res.stdout
        assert out[6] == "torch True", "the rank did not fork from the warm server (torch preloaded)"
        assert out[7] == "group True", res.stdout
        assert out[8] == "tailatexit ran", res.stdout  # atexit ran, and the unflushed tail came out first

    res = hora("run", "-np", "1", "--warm", sys.executable, script, "raise", cwd=str(tmp_path),
               env={"HORA_WARM_IDLE_TIMEOUT": "30"})
    assert res.returncode == 1, res.stderr
    tb = [line.split(":", 1)[1] for line in res.stdout.splitlines() + res.stderr.splitlines()
          if line.startswith("[0]<stderr>:")]
    assert tb[0] == "Traceback (most recent call last):" and f'File "{script}", line 17, in <module>' in tb[1], tb
    assert tb[-1] == "RuntimeError: boom from the script", tb
    assert not any("server.py" in line or "runpy" in line for line in tb), tb  # the server's frames are not the user's

    res = hora("run", "-np", "1", "--warm", sys.executable, script, "term", cwd=str(tmp_path),
               env={"HORA_WARM_IDLE_TIMEOUT": "30"})
    assert res.returncode == 128 + 15 and "failed with signal 15 (SIGTERM)" in res.stderr, res.stderr

    res = hora("run", "-np", "1", "--warm", sys.executable, script, "interrupt", cwd=str(tmp_path),
               env={"HORA_WARM_IDLE_TIMEOUT": "30"})
    assert res.returncode == 128 + 2 and "failed with signal 2 (SIGINT)" in res.stderr, res.stderr
    assert "[0]<stdout>:tailatexit ran" in res.stdout, res.stdout


@pytest.mark.timeout(120)
def test_commands_that_are_not_this_python_running_a_file_start_cold(tmp_path):
    res = hora("run", "-np", "1", "--warm", sys.executable, "-c",
               "import sys; print('torch', 'torch' in sys.modules); sys.exit(4)", cwd=str(tmp_path))
    assert res.returncode == 4, res.stderr
    assert "[0]<stdout>:torch False" in res.stdout


def test_forkable_command_names_this_interpreter_running_a_script_or_module(tmp_path):
    from hora.runners.rank.warm.client import forkable_command

    (tmp_path / "train.py").write_text("")
    here = os.path.dirname(sys.executable)
    assert forkable_command([sys.executable, "train.py"], cwd=str(tmp_path))
    assert forkable_command(["python", "train.py", "--lr", "1"], cwd=str(tmp_path), path=here)
    assert forkable_command([sys.executable, "-m", "pkg.train"], cwd=str(tmp_path))
    assert not forkable_command([sys.executable, "missing.py"], cwd=str(tmp_path))
    assert not forkable_command([sys.executable, "-c", "pass"], cwd=str(tmp_path))
    assert not forkable_command([sys.executable, "-u", "train.py"], cwd=str(tmp_path))
    assert not forkable_command(["echo", "train.py"], cwd=str(tmp_path))
    assert not forkable_command(["python", "train.py"], cwd=str(tmp_path), path="/nonexistent")


def test_the_server_validates_a_command_ranks_request_fields():
    import json

    from hora.runners.rank.warm.server import BadRequest, _parse_request

    ok = {"op": "spawn", "script": "/w/train.py", "argv0": "train.py", "command": True, "args": ["1"], "env": {},
          "cwd": "/w"}
    assert _parse_request(json.dumps(ok).encode())["script"] == "/w/train.py"
    assert _parse_request(json.dumps({**{k: v for k, v in ok.items() if k not in ("script", "argv0")},
                                      "module": "pkg.train"}).encode())["command"] is True
    for bad in ({"script": "train.py"}, {"command": False}, {"command": 1}, {"argv0": None}, {"module": "m"}):
        with pytest.raises(BadRequest):
            _parse_request(json.dumps({**ok, **bad}).encode())
