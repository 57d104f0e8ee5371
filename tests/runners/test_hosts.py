"""Hosts, the key protocol and the monitor's first-failure rule, without starting processes."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from hora.errors import ConfigError
from hora.native import keys
from hora.runners.slots import HostSlots, assign_ranks, is_local_host, parse_hostfile, parse_hosts, resolve_hosts
from hora.runners.driver.monitor import Failure, first_failure, start_stragglers

pytestmark = pytest.mark.timeout(30)


def test_host_lists_parse_as_horovodrun_and_mpirun_write_them(tmp_path):
    assert parse_hosts("a:2, b:4,c") == [HostSlots("a", 2), HostSlots("b", 4), HostSlots("c", 1)]
    assert parse_hosts("[::1]:2,10.0.0.1:3") == [HostSlots("::1", 2), HostSlots("10.0.0.1", 3)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\nnode1 slots=4\n\nnode2:2   # MPICH style\nnode3 slots=2 max_slots=8\nnode4\n")
    assert parse_hostfile(hostfile) == [HostSlots("node1", 4), HostSlots("node2", 2), HostSlots("node3", 2),
                                        HostSlots("node4", 1)]


@pytest.mark.parametrize("text, message", [
    ("a:x", "-H entry 1 'a:x': slots must be an integer, got 'x'"),
    ("a:2,,b", "entry 2 is empty"),
    ("a:0", "slots must be >= 1, got 0"),
    (":3", "-H entry 1 ':3': no host name"),
    ("a b:2", "is not a valid host name"),
])
def test_malformed_host_lists_are_named(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_hosts(text)


@pytest.mark.parametrize("content, message", [
    ("good slots=2\nbad slots=two\n", "line 2 'bad slots=two': slots must be an integer, got 'two'"),
    ("a slots=2\n\n# note\nb gpus=4\n", "line 4 'b gpus=4': unknown field 'gpus'"),
    ("a slots=2\nb 4\n", "line 2 'b 4': expected 'host slots=N', got the field '4'"),
    ("a:2 slots=3\n", "line 1 'a:2 slots=3': slots given twice"),
    ("# only comments\n\n", "lists no hosts"),
])
def test_malformed_hostfile_lines_are_named_with_their_number(tmp_path, content, message):
    path = tmp_path / "hostfile"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        parse_hostfile(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_a_missing_hostfile_and_both_sources_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        parse_hostfile(tmp_path / "nope")
    with pytest.raises(ConfigError, match="not both"):
        resolve_hosts("a:1", str(tmp_path / "nope"), 1)


def test_local_hosts_are_this_machine_names_and_addresses_only():
    for name in ("localhost", "127.0.0.1", "::1", socket.gethostname()):
        assert is_local_host(name), name
    for name in ("127.0.0.2", "127.0.0.3", "192.0.2.77", "some-other-machine"):
        assert not is_local_host(name), name
    # names of this machine are merged into one host: their ranks share memory
    assert resolve_hosts(f"localhost:1,127.0.0.2:2,{socket.gethostname()}:2", None, 5) == [
        HostSlots("localhost", 3), HostSlots("127.0.0.2", 2)]
    assert resolve_hosts(None, None, 3) == [HostSlots("localhost", 3)]


def test_ranks_fill_hosts_in_order_and_local_cross_ranks_follow():
    slots = assign_ranks([HostSlots("a", 2), HostSlots("b", 3), HostSlots("c", 4)], 6)
    assert [(s.rank, s.host.name, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in slots] == [
        (0, "a", 0, 2, 0, 3), (1, "a", 1, 2, 0, 2), (2, "b", 0, 3, 1, 3), (3, "b", 1, 3, 1, 2),
        (4, "b", 2, 3, 0, 1), (5, "c", 0, 1, 2, 3)]
    with pytest.raises(ConfigError, match="-np 10 needs 10 slots but the hosts 'a:2,b:3' offer 5"):
        assign_ranks([HostSlots("a", 2), HostSlots("b", 3)], 10)


def test_the_key_protocol_round_trips():
    name = keys.native_init_barrier("job-1", 3)
    assert keys.parse_native_init(name) == ("job-1", 3)
    assert keys.parse_barrier_key(keys.barrier_key(name, 7)) == (name, 7)
    assert keys.parse_native_init("hora/native/job/x/init") is None and keys.parse_native_init("user/init") is None
    assert keys.parse_barrier_key("runner/started/1") is None
    assert keys.parse_log_key(keys.log_key(2, 15)) == (2, 15)
    assert keys.rank_of(keys.DONE, keys.rank_key(keys.DONE, 4)) == 4 and keys.rank_of(keys.DONE, "runner/done/x") is None
    # only the engine's start barriers count, not a user's barrier that happens to be called "init"
    present = [keys.barrier_key(name, 0), keys.barrier_key(name, 2), keys.barrier_key("mine/init", 0)]
    assert start_stragglers(present, 3) == {name: [1]}
    assert start_stragglers(present + [keys.barrier_key(name, 1)], 3) == {}


class _Counter:
    """The monitor's view of a driver service: a failure counter and posted reports."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def next_seq(self) -> int:
        with self.lock:
            self.n += 1
            return self.n

    def failures(self):
        return []


class _Job:
    def __init__(self) -> None:
        self.items: list[Failure] = []

    def failures(self):
        return list(self.items)


def test_the_first_failure_wins_even_when_a_later_one_is_seen_first():
    service, job = _Counter(), _Job()
    first_seq = service.next_seq()  # rank 1 died first; its output is still draining
    later = Failure(seq=service.next_seq(), rank=0, host="h0", message="raised CollectiveError: peer closed")
    job.items.append(later)

    def drained():
        time.sleep(0.5)
        job.items.append(Failure.from_exit(first_seq, 1, "h1", -9, "killed"))

    threading.Thread(target=drained).start()
    chosen = first_failure(service, job, job.failures(), [])
    assert (chosen.rank, chosen.host, chosen.exitcode) == (1, "h1", -9)
    err = chosen.error()
    assert err.rank == 1 and err.exitcode == -9 and "rank 1 on h1 failed with signal 9 (SIGKILL)" in str(err)


def test_a_rank_report_and_its_exit_are_merged():
    service, job = _Counter(), _Job()
    report = Failure(seq=service.next_seq(), rank=2, host=None, message="raised KeyError: 'x'", traceback="Traceback...")
    job.items += [report, Failure.from_exit(service.next_seq(), 2, "h2", 1, None)]
    chosen = first_failure(service, job, job.failures(), [])
    assert (chosen.message, chosen.exitcode, chosen.host, chosen.traceback) == ("raised KeyError: 'x'", 1, "h2",
                                                                                 "Traceback...")


def test_network_choices_are_checked_on_this_machine():
    from hora.runners.network import choose_service_address, interface_address, interface_addresses

    assert choose_service_address(["127.0.0.2"]) == "127.0.0.1"
    assert "lo" in interface_addresses() and interface_address("lo") == "127.0.0.1"
    with pytest.raises(ConfigError, match="network interface 'nope0' does not exist on"):
        choose_service_address(["10.1.1.1"], interface="nope0")
    with pytest.raises(ConfigError, match="--network-address 198.51.100.7 is not an address of this machine"):
        choose_service_address(["10.1.1.1"], address="198.51.100.7")


def test_mpiexec_gets_the_hosts_and_the_ssh_wrapper(tmp_path):
    from hora.runners.launchers.mpi import mpiexec_argv, write_ssh_wrapper
    from hora.runners.rank.ssh import SshOptions

    key = tmp_path / "key"
    key.write_text("k")
    ssh = SshOptions(port=2222, identity_file=str(key))
    wrapper = write_ssh_wrapper(str(tmp_path), ssh)
    text = open(wrapper).read()
    assert f"-p 2222 -i {key}" in text and "StrictHostKeyChecking=no" in text and text.rstrip().endswith('"$@"')
    argv = mpiexec_argv("mpiexec", 4, ["python", "t.py"], parse_hosts("127.0.0.1:2,node2:2"), "/work",
                        ssh_wrapper=wrapper, interface="eth1", extra_args=["-bind-to", "none"])
    assert argv[:2] == ["mpiexec", "-n"] and argv[-2:] == ["python", "t.py"]
    joined = " ".join(argv)
    assert ("-hosts 127.0.0.1:2,node2:2 -launcher ssh -launcher-exec " + wrapper) in joined
    assert "-iface eth1 -wdir /work -bind-to none python t.py" in joined
    assert "-hosts" not in mpiexec_argv("mpiexec", 2, ["x"], parse_hosts("localhost:2"), "/w")
    with pytest.raises(ConfigError, match="ssh port must be an integer"):
        SshOptions(port=70000)
    with pytest.raises(ConfigError, match="ssh identity file '/no/key' does not exist"):
        SshOptions(identity_file="/no/key")
