"""Where the ranks of a Ray run go: the resources each rank asks for, the placement
group's bundles and strategy, and the checks that a group can fit (at once, against the
cluster's totals) and is scheduled (within ``placement_timeout``, naming what was asked
and what is free), so an impossible request is an error, never a hang.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hora import settings
from hora.errors import ConfigError, RendezvousError

log = logging.getLogger(__name__)

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
ENV_PLACEMENT_TIMEOUT = "HORA_RAY_PLACEMENT_TIMEOUT"
DEFAULT_PLACEMENT_TIMEOUT = settings.default(ENV_PLACEMENT_TIMEOUT)  # seconds, Horovod's placement_group_timeout_s
STOP_TIMEOUT = 15.0  # seconds for killed actors to be confirmed dead


def require_ray() -> Any:
    """The ``ray`` module, initialised (``ray.init()`` with its defaults when no cluster is
    connected yet: ``RAY_ADDRESS``, a running local cluster, or a new one).

    Raises:
        ImportError: Ray is not installed (``pip install 'hora[ray]'``).
        ConfigError: the driver is a Ray Client (``ray://``): ranks could not reach it.
    """
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"the Ray launcher needs Ray: pip install 'hora[ray]' ({exc})") from exc
    if not ray.is_initialized():
        log.info("Ray is not initialised; calling ray.init()")
        ray.init()
    if ray.util.client.ray.is_connected():
        raise ConfigError("hora's Ray launcher cannot run from a Ray Client (ray://) driver: the ranks report to a "
                          "service on the driver; run the script on the cluster (ray job submit)")
    return ray


@dataclasses.dataclass(frozen=True)
class RayResources:
    """What each rank asks of Ray, and how the ranks are placed.

    Attributes:
        cpus_per_rank: CPUs per rank (may be fractional).
        gpus_per_rank: GPUs per rank (0: none; Ray sets the rank's ``CUDA_VISIBLE_DEVICES``).
        resources_per_rank: custom Ray resources per rank, ``{"name": amount}``.
        strategy: the placement group's strategy: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD.
        ranks_per_bundle: ranks sharing one bundle (Horovod's ``num_workers_per_host``:
            with STRICT_SPREAD, one bundle per node).
        placement_timeout: seconds the placement group may take to be scheduled.

    Raises:
        ConfigError: a negative amount, an unknown strategy, a non-positive timeout.
    """

    cpus_per_rank: float = 1.0
    gpus_per_rank: float = 0.0
    resources_per_rank: tuple[tuple[str, float], ...] = ()
    strategy: str = "PACK"
    ranks_per_bundle: int = 1
    placement_timeout: float = DEFAULT_PLACEMENT_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("cpus_per_rank", "gpus_per_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
        for name, value in self.resources_per_rank:
            if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"resources_per_rank[{name!r}] must be a number >= 0, got {value!r}")
            if name in ("CPU", "GPU"):
                raise ConfigError(f"resources_per_rank may not name {name!r}: use cpus_per_rank / gpus_per_rank")
        if not isinstance(self.strategy, str) or self.strategy.upper() not in STRATEGIES:
            raise ConfigError(f"strategy {self.strategy!r} is unknown; use one of {', '.join(STRATEGIES)}")
        object.__setattr__(self, "strategy", self.strategy.upper())
        if isinstance(self.ranks_per_bundle, bool) or not isinstance(self.ranks_per_bundle, int) \
                or self.ranks_per_bundle < 1:
            raise ConfigError(f"ranks_per_bundle must be an int >= 1, got {self.ranks_per_bundle!r}")
        if not (isinstance(self.placement_timeout, (int, float)) and self.placement_timeout > 0):
            raise ConfigError(f"placement_timeout must be a positive number of seconds, got {self.placement_timeout!r}")

    def per_rank(self) -> dict[str, float]:
        """The resources of one rank (zero amounts left out)."""
        out = {"CPU": float(self.cpus_per_rank), "GPU": float(self.gpus_per_rank)}
        out.update({k: float(v) for k, v in self.resources_per_rank})
        return {k: v for k, v in out.items() if v > 0}

    def bundles(self, num_proc: int) -> list[dict[str, float]]:
        """The placement group's bundles for ``num_proc`` ranks.

        Raises:
            ConfigError: ``num_proc`` is not a multiple of ``ranks_per_bundle``.
        """
        if num_proc % self.ranks_per_bundle:
            raise ConfigError(f"num_proc={num_proc} is not a multiple of {self.ranks_per_bundle} ranks per bundle "
                              "(num_workers_per_host)")
        bundle = {k: v * self.ranks_per_bundle for k, v in self.per_rank().items()} or {"CPU": 0.001}
        return [dict(bundle) for _ in range(num_proc // self.ranks_per_bundle)]


def _fits(bundle: Mapping[str, float], have: Mapping[str, float]) -> int:
    """How many ``bundle`` fit in ``have``."""
    return int(min((have.get(k, 0.0) + 1e-9) // v for k, v in bundle.items())) if bundle else 1 << 30


def _relevant(resources: Mapping[str, float], names: Sequence[str]) -> dict[str, float]:
    return {k: resources.get(k, 0.0) for k in names}


def _alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def capacity(ray: Any, resources: RayResources) -> int:
    """The most ranks the cluster's *total* resources could ever hold with this strategy."""
    bundle = resources.bundles(resources.ranks_per_bundle)[0]
    per_node = [_fits(bundle, n.get("Resources") or {}) for n in _alive_nodes(ray)]
    if resources.strategy == "STRICT_PACK":
        bundles = max(per_node, default=0)
    elif resources.strategy == "STRICT_SPREAD":
        bundles = sum(1 for n in per_node if n > 0)
    else:
        bundles = sum(per_node)
    return bundles * resources.ranks_per_bundle


def check_capacity(ray: Any, num_proc: int, resources: RayResources) -> None:
    """Fail at once when the cluster's total resources can never hold ``num_proc`` ranks.

    Raises:
        ConfigError: naming the resources asked per rank and the cluster's totals.
    """
    resources.bundles(num_proc)
    most = capacity(ray, resources)
    if num_proc > most:
        per_rank = resources.per_rank()
        total = _relevant(ray.cluster_resources(), list(per_rank))
        nodes = len(_alive_nodes(ray))
        raise ConfigError(
            f"num_proc={num_proc} ranks of {per_rank} each ({resources.strategy}) do not fit this Ray cluster: "
            f"{nodes} node(s) with {total} in total hold at most {most}; lower num_proc, cpus_per_rank or "
            "gpus_per_rank, or add nodes")


def wait_placement(ray: Any, pg: Any, bundles: list[dict[str, float]], resources: RayResources) -> None:
    """Wait until the placement group is scheduled.

    Raises:
        RendezvousError: not within ``placement_timeout``; names the bundles asked and the
            resources available and in total.
    """
    ready, _ = ray.wait([pg.ready()], timeout=resources.placement_timeout)
    if ready:
        ray.get(ready[0])
        return
    names = sorted({k for b in bundles for k in b})
    raise RendezvousError(
        f"the Ray placement group of {len(bundles)} bundle(s) of {bundles[0]} ({resources.strategy}) was not "
        f"scheduled within {resources.placement_timeout:g}s: the cluster has "
        f"{_relevant(ray.available_resources(), names)} available of {_relevant(ray.cluster_resources(), names)} "
        f"in total (other jobs hold the rest?); free resources, lower num_proc, or raise placement_timeout "
        f"({ENV_PLACEMENT_TIMEOUT})")


__all__ = ["RayResources", "require_ray", "capacity", "check_capacity", "wait_placement", "STRATEGIES",
           "ENV_PLACEMENT_TIMEOUT", "DEFAULT_PLACEMENT_TIMEOUT"]
