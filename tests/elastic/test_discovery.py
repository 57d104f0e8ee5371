"""Host discovery, the blacklist and the rounds' rank assignment, without a job."""

from __future__ import annotations

import pytest

from hora.errors import ConfigError
from hora.runners.elastic.discovery import (
    ADDED,
    REMOVED,
    DiscoveryError,
    HostDiscoveryScript,
    HostManager,
    assign,
    parse_discovery_output,
)


@pytest.mark.timeout(30)
def test_discovery_output_is_parsed_or_refused_with_the_line():
    assert parse_discovery_output("a:2\n\n  b\nc:1\na:3\n", "s.sh", slots_per_host=4) == {"a": 3, "b": 4, "c": 1}
    assert parse_discovery_output("", "s.sh") == {}
    for text, line in (("a:2\nb:zero\n", "output line 2 'b:zero'"), ("a:0\n", "output line 1 'a:0'"),
                       ("a b:2\n", "output line 1 'a b:2'")):
        with pytest.raises(DiscoveryError, match=rf"host discovery script 's.sh', {line}"):
            parse_discovery_output(text, "s.sh")


@pytest.mark.timeout(30)
def test_a_script_that_cannot_run_or_fails_is_named(tmp_path):
    with pytest.raises(DiscoveryError, match=r"'/nonexistent/discover' was not found"):
        HostDiscoveryScript("/nonexistent/discover").find_available_hosts_and_slots()
    plain = tmp_path / "plain.sh"
    plain.write_text("echo a:1\n")
    with pytest.raises(DiscoveryError, match=r"plain.sh' is not executable"):
        HostDiscoveryScript(str(plain)).find_available_hosts_and_slots()
    failing = tmp_path / "failing.sh"
    failing.write_text("#!/bin/sh\necho 'no cluster' >&2\nexit 4\n")
    failing.chmod(0o755)
    with pytest.raises(DiscoveryError, match=r"failing.sh' failed with exit code 4: no cluster"):
        HostDiscoveryScript(str(failing)).find_available_hosts_and_slots()
    with pytest.raises(ConfigError, match="--slots-per-host must be an integer >= 1"):
        HostDiscoveryScript(str(failing), slots_per_host=0)
    assert HostDiscoveryScript("sh -c 'echo a; echo b:2'", slots_per_host=3).find_available_hosts_and_slots() == {
        "a": 3, "b": 2}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.timeout(30)
def test_host_manager_keeps_the_oldest_hosts_first_and_blacklists_with_cooldown():
    found = {"a": 2}
    clock = _Clock()
    hm = HostManager(lambda: dict(found), cooldown_range=(10, 40), clock=clock)
    assert hm.update() == ADDED and hm.hosts() == {"a": 2}
    found.update({"c": 1, "b": 1})
    assert hm.update() == ADDED and list(hm.hosts()) == ["a", "c", "b"]
    found.pop("c")
    found["a"] = 1
    assert hm.update() == REMOVED and hm.hosts() == {"a": 1, "b": 1}
    assert hm.update() == 0
    hm.blacklist("a")
    assert hm.is_blacklisted("a") and hm.hosts() == {"b": 1} and hm.slots() == 1
    clock.now += 41  # past the longest cooldown: back, in its old place
    assert not hm.is_blacklisted("a") and list(hm.hosts()) == ["a", "b"]
    forever = HostManager(lambda: {"a": 1}, clock=clock)
    forever.update()
    forever.blacklist("a")
    clock.now += 1e6
    assert forever.is_blacklisted("a")
    with pytest.raises(ConfigError, match=r"--blacklist-cooldown-range 0 5"):
        HostManager(lambda: {}, cooldown_range=(0, 5))


@pytest.mark.timeout(30)
def test_rounds_fill_the_surviving_hosts_first_up_to_max_np():
    slots = assign({"new": 2, "old": 2}, 1, 3, first=["old"])
    assert [(s.rank, s.host.name, s.local_rank, s.cross_rank) for s in slots] == [
        (0, "old", 0, 0), (1, "old", 1, 0), (2, "new", 0, 1)]
    assert len(assign({"a": 4}, 2, None)) == 4
    with pytest.raises(ConfigError, match=r"2 slot\(s\) on the available hosts \(a:2\), fewer than --min-np 3"):
        assign({"a": 2}, 3, None)
