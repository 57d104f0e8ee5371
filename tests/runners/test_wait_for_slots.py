"""A relaunch that waits for task slots (a lost Spark executor being replaced) starts within a
tenth of a second of the slots coming back (issue 29: it looked every 0.5 s)."""

from __future__ import annotations

import time

import pytest

from hora.errors import ConfigError
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


@pytest.mark.timeout(30)
def test_a_relaunch_follows_the_slots_coming_back_within_a_tenth_of_a_second():
    assert SLOT_POLL_INTERVAL <= 0.1
    cluster = _Cluster(time.monotonic() + 0.73)
    assert wait_for_slots(cluster, 2, 2, 10, "slots") == 2
    assert time.monotonic() - cluster.back < 0.35, time.monotonic() - cluster.back  # 0.1 s and the scheduler's delay
    assert cluster.looks >= 7


@pytest.mark.timeout(30)
def test_a_relaunch_that_never_gets_its_slots_fails_naming_the_wait():
    with pytest.raises(ConfigError, match=r"run slots cannot be relaunched: .*waited 0.3s"):
        wait_for_slots(_Cluster(time.monotonic() + 60), 2, 2, 0.3, "slots")
