"""The warm client reads the server's answers whatever way they arrive: a child that exits at once has its
exit line sent right behind its pid, and a loaded client reads both in one ``recv`` (a clean-clone CI run
once saw ``spawn`` refuse such an answer as "out of turn" and start a plain process instead)."""

from __future__ import annotations

import socket

import pytest

from hora.runners.rank.warm import client as warm


@pytest.mark.timeout(30)
def test_the_pid_and_the_exit_in_one_read_give_the_process_and_its_exit_code():
    ours, server = socket.socketpair()
    try:
        server.sendall(b'{"pid": 4242}\n{"exit": 3}\n')
        reply, rest = warm._answer_and_rest(ours, 5.0)
        assert reply == {"pid": 4242} and rest == b'{"exit": 3}\n'
        proc = warm.WarmProcess(["python"], reply["pid"], ours, None, None, None, rest)
        assert proc.poll() == 3 and proc.wait(5) == 3  # from what was read already: nothing more comes
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_an_exit_that_comes_later_and_a_server_that_goes_away():
    ours, server = socket.socketpair()
    proc = warm.WarmProcess(["python"], 4242, ours, None, None, None)
    assert proc.poll() is None
    server.sendall(b'{"exit": 0}\n')
    assert proc.wait(5) == 0
    ours, server = socket.socketpair()
    proc = warm.WarmProcess(["python"], 4243, ours, None, None, None)
    server.close()
    assert proc.wait(5) == -9  # the server died first: the child died with it


@pytest.mark.timeout(30)
def test_an_answer_with_anything_after_it_is_refused_where_one_answer_is_all_there_is():
    ours, server = socket.socketpair()
    try:
        server.sendall(b'{"ok": true}\n{"ok": true}\n')
        with pytest.raises(warm.WarmUnavailable, match="out of turn"):
            warm._answer(ours, 5.0)
    finally:
        ours.close()
        server.close()
