"""A relaunch that waits for task slots (a lost Spark executor being replaced) looks at the cluster
every tenth of a second (it used to look every 0.5 s), and gives up naming the wait."""

from __future__ import annotations

import time
import types

import pytest

from hora.errors import ConfigError
from hora.runners.driver import recovery
from hora.runners.driver.recovery import SLOT_POLL_INTERVAL, wait_for_slots


class _Cluster:
    """What wait_for_slots asks of a launcher: 1 slot until ``back`` (monotonic time), then 2."""

    def __init__(self, back: float) -> None:
        self.back = back
        self.looks = 0

    def refresh_slots(self) -> None:
        self.looks += 1

    def default_num_proc(self) -> int:
        return 2 if time.monotonic() >= self.back else 1

    def check_num_proc(self, num_proc: int) -> None:
        if num_proc > self.default_num_proc():
            raise ConfigError(f"num_proc={num_proc} needs {num_proc} task slots, the cluster has 1")


class _AfterLooks(_Cluster):
    """1 slot for the first ``n`` looks, then 2 (no clock involved)."""

    def __init__(self, n: int) -> None:
        super().__init__(0.0)
        self.n = n

    def default_num_proc(self) -> int:
        return 2 if self.looks > self.n else 1


@pytest.mark.timeout(30)
def test_a_relaunch_looks_every_tenth_of_a_second_until_the_slots_come_back(monkeypatch):
    slept: list[float] = []
    clock = types.SimpleNamespace(monotonic=time.monotonic, sleep=slept.append)  # the waits asked, none slept
    monkeypatch.setattr(recovery, "time", clock)
    cluster = _AfterLooks(7)
    assert wait_for_slots(cluster, 2, 2, 60, "slots") == 2
    assert cluster.looks == 8  # returned at the first look that found the slots
    assert slept == [SLOT_POLL_INTERVAL] * 7 and SLOT_POLL_INTERVAL <= 0.1


@pytest.mark.timeout(30)
def test_a_relaunch_that_never_gets_its_slots_fails_naming_the_wait():
    with pytest.raises(ConfigError, match=r"run slots cannot be relaunched: .*waited 0.3s"):
        wait_for_slots(_Cluster(time.monotonic() + 60), 2, 2, 0.3, "slots")
