"""Horovod's ``Backend`` interface as a launcher: an object that runs the function on its ranks itself.

Horovod's estimators take ``backend=`` any object with ``run(fn, args, kwargs, env)`` (the
per-rank results in rank order) and ``num_processes()``. hora takes the same:
:class:`BackendLauncher` wraps such an object and :func:`hora.runners.run` hands it the
function. The backend starts, connects and watches its ranks itself, so none of hora's
driver service, monitor or relaunches take part (``max_failures`` needs one of hora's
launchers).

The interface is recognized by its methods (duck typing), as Horovod does:
:func:`is_horovod_backend`. The runners never import ``hora.spark``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hora.errors import ConfigError
from hora.runners.launcher import Job, Launcher

if TYPE_CHECKING:
    from hora.runners.driver.service import DriverService
    from hora.runners.spec import LaunchSpec


def is_horovod_backend(obj: Any) -> bool:
    """Whether ``obj`` has Horovod's Backend interface: callable ``run`` and ``num_processes``."""
    return callable(getattr(obj, "run", None)) and callable(getattr(obj, "num_processes", None))


class BackendLauncher(Launcher):
    """Runs a function through a Horovod-style ``Backend`` object (``backend.run(fn, args, kwargs, env)``).

    Args:
        backend: an object with Horovod's Backend interface (:func:`is_horovod_backend`).

    Raises:
        ConfigError: ``backend`` lacks ``run()`` or ``num_processes()`` (names what was given).
    """

    name = "backend"

    def __init__(self, backend: Any) -> None:
        if not is_horovod_backend(backend):
            raise ConfigError(f"backend {type(backend).__name__} ({backend!r}) lacks Horovod's Backend interface: "
                              "run(fn, args, kwargs, env) and num_processes()")
        self.backend = backend

    def default_num_proc(self) -> int:
        """The backend's ``num_processes()``.

        Raises:
            ConfigError: it is not a whole number >= 1.
        """
        n = self.backend.num_processes()
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"backend {self.backend!r}: num_processes() must give an int >= 1, got {n!r}")
        return n

    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on the backend's ranks: their results in rank order.

        ``kwargs`` reaches ``backend.run`` only when there are some (a backend written with
        ``run(fn, args, env)`` keeps working).
        """
        extra = {"kwargs": dict(kwargs)} if kwargs else {}
        return list(self.backend.run(fn, args=tuple(args), env=dict(env or {}), **extra))

    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        """Not a way to start this launcher's ranks: the backend starts them itself in :meth:`run`.

        Raises:
            ConfigError: always, naming the backend (:func:`hora.runners.run` calls :meth:`run` instead).
        """
        raise ConfigError(f"backend {self.backend!r} starts its ranks itself: run the function with "
                          "hora.runners.run(fn, backend=...), which calls its run()")

    def __repr__(self) -> str:
        return f"BackendLauncher({self.backend!r})"


__all__ = ["BackendLauncher", "is_horovod_backend"]
