"""The placement arithmetic of the Ray launcher (bundles, capacity, checks), without a cluster:
the node tables are what ``ray.nodes()`` returns."""

from __future__ import annotations

import pytest

from hora.errors import ConfigError
from hora.runners.launchers.ray.placement import RayResources, capacity, check_capacity


class _Nodes:
    """Answers ``nodes()`` and ``cluster_resources()`` like ``ray`` does, for two nodes."""

    def __init__(self, *resources):
        self._nodes = [{"NodeID": f"n{i}", "Alive": True, "NodeManagerAddress": f"10.0.0.{i}", "Resources": r}
                       for i, r in enumerate(resources)]
        self._nodes.append({"NodeID": "dead", "Alive": False, "Resources": {"CPU": 64.0}})

    def nodes(self):
        return self._nodes

    def cluster_resources(self):
        total = {}
        for n in self._nodes:
            if n["Alive"]:
                for k, v in n["Resources"].items():
                    total[k] = total.get(k, 0) + v
        return total


def test_bundles_and_validation():
    res = RayResources(cpus_per_rank=2, gpus_per_rank=0.5, resources_per_rank=(("accel", 1),), ranks_per_bundle=2)
    assert res.per_rank() == {"CPU": 2.0, "GPU": 0.5, "accel": 1.0}
    assert res.bundles(4) == [{"CPU": 4.0, "GPU": 1.0, "accel": 2.0}] * 2
    with pytest.raises(ConfigError, match="not a multiple of 2"):
        res.bundles(3)
    for bad, match in ((dict(cpus_per_rank=-1), "cpus_per_rank"), (dict(strategy="x"), "strategy 'x'"),
                       (dict(ranks_per_bundle=0), "ranks_per_bundle"), (dict(placement_timeout=0), "placement_timeout"),
                       (dict(resources_per_rank=(("GPU", 1),)), "gpus_per_rank")):
        with pytest.raises(ConfigError, match=match):
            RayResources(**bad)
    assert RayResources(strategy="spread").strategy == "SPREAD"


def test_capacity_follows_the_strategy_and_skips_dead_nodes():
    ray = _Nodes({"CPU": 4.0, "GPU": 1.0}, {"CPU": 3.0})
    assert capacity(ray, RayResources(cpus_per_rank=1)) == 7
    assert capacity(ray, RayResources(cpus_per_rank=1, strategy="STRICT_PACK")) == 4
    assert capacity(ray, RayResources(cpus_per_rank=1, strategy="STRICT_SPREAD")) == 2
    assert capacity(ray, RayResources(cpus_per_rank=1, gpus_per_rank=1)) == 1
    assert capacity(ray, RayResources(cpus_per_rank=2, ranks_per_bundle=2, strategy="STRICT_SPREAD")) == 2
    check_capacity(ray, 7, RayResources(cpus_per_rank=1))
    with pytest.raises(ConfigError, match=r"num_proc=2 ranks of \{'CPU': 1.0, 'GPU': 1.0\}.*2 node\(s\) with "
                                          r"\{'CPU': 7.0, 'GPU': 1.0\} in total hold at most 1"):
        check_capacity(ray, 2, RayResources(cpus_per_rank=1, gpus_per_rank=1))
