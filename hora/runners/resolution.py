"""``backend=`` decided once: :func:`resolve` turns every shape it takes into one Launcher and one
:class:`LaunchOptions`.

The shapes (Horovod's estimators take the last two; hora's faces all of them):

* ``None``: the default launcher (the one of the DataFrame's engine, for an estimator);
* a launcher's name: ``"local"``, ``"spark"``, ``"dask"``, ``"ray"``;
* a :class:`~hora.runners.launcher.Launcher` (``HostsLauncher(...)``, ``RayLauncher(gpus_per_rank=1)``...);
* an object whose ``launch_options()`` gives :func:`hora.runners.run` keywords, its ``backend``
  the launcher's name (Horovod's ``SparkBackend``, :mod:`hora.spark.common.backend`);
* any other object with Horovod's Backend interface, ``run()`` and ``num_processes()``: it runs
  the function itself (:class:`~hora.runners.launchers.backend.BackendLauncher`).

Anything else is a :class:`~hora.errors.ConfigError` naming ``backend`` and what was given,
before any rank starts. The shapes are told apart by their methods: the runners never import
``hora.spark``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from hora.errors import ConfigError
from hora.runners.launcher import _BY_NAME, Launcher, resolve_launcher
from hora.runners.launchers.backend import BackendLauncher, is_horovod_backend


@dataclass(frozen=True)
class LaunchOptions:
    """How the ranks of one run start, beside the launcher: :func:`hora.runners.run`'s keywords.

    Attributes:
        num_proc: ranks (the most, with ``min_num_proc``).
        env: environment variables for every rank.
        start_timeout: seconds every rank has to start (None: ``HORA_START_TIMEOUT``).
        verbose: 0 silent, 1 rank output and progress, 2 also debug logs in the ranks.
        min_num_proc: the fewest ranks a (re)launch may run (None: exactly ``num_proc``).
        max_failures: relaunches allowed after a retriable failure.
        stdout, stderr: where rank output is printed (None: the driver's own).
        timestamps: prefix every printed rank line with the time it arrived.

    Raises:
        ConfigError: a value out of its range (named), checked when the options are made.
    """

    num_proc: int
    env: Mapping[str, str] = field(default_factory=dict)
    start_timeout: float | None = None
    verbose: int = 1
    min_num_proc: int | None = None
    max_failures: int = 0
    stdout: IO[str] | None = None
    stderr: IO[str] | None = None
    timestamps: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.num_proc, bool) or not isinstance(self.num_proc, int) or self.num_proc < 1:
            raise ConfigError(f"num_proc must be an int >= 1, got {self.num_proc!r}")
        if not isinstance(self.env, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in self.env.items()):
            raise ConfigError(f"env must be a mapping of str to str, got {self.env!r}")
        object.__setattr__(self, "env", dict(self.env))
        if self.start_timeout is not None and (isinstance(self.start_timeout, bool) or not isinstance(
                self.start_timeout, (int, float)) or self.start_timeout <= 0):
            raise ConfigError(f"start_timeout must be a positive number of seconds, got {self.start_timeout!r}")
        if not isinstance(self.verbose, int):
            raise ConfigError(f"verbose must be an int (0, 1 or 2), got {self.verbose!r}")
        least = self.min_num_proc
        if least is not None:
            if isinstance(least, bool) or not isinstance(least, int) or least < 1:
                raise ConfigError(f"min_num_proc must be an int >= 1, got {least!r}")
            if least > self.num_proc:
                raise ConfigError(f"min_num_proc={least} is greater than num_proc={self.num_proc}")
        if isinstance(self.max_failures, bool) or not isinstance(self.max_failures, int) or self.max_failures < 0:
            raise ConfigError(f"max_failures must be an int >= 0, got {self.max_failures!r}")
        if not isinstance(self.timestamps, bool):
            raise ConfigError(f"timestamps must be True or False, got {self.timestamps!r}")

    def run_kwargs(self) -> dict[str, Any]:
        """The keywords of :func:`hora.runners.run` these options stand for."""
        return {"num_proc": self.num_proc, "env": dict(self.env), "start_timeout": self.start_timeout,
                "verbose": self.verbose, "min_num_proc": self.min_num_proc, "max_failures": self.max_failures,
                "stdout": self.stdout, "stderr": self.stderr, "timestamps": self.timestamps}


def connected_ray(what: str = "backend='ray'") -> Any:
    """The ``ray`` module of a driver connected to a Ray cluster.

    Raises:
        ConfigError: Ray is not installed (names the extra to install) or the driver is
            not connected to a cluster (says to call ``ray.init()``).
    """
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"{what} needs Ray: pip install 'hora[ray]' (Ray Core and Ray Data); {exc}") from exc
    if not ray.is_initialized():
        raise ConfigError(f"{what} needs a connected Ray cluster: call ray.init() first (ray.init(address='auto') "
                          "joins a running cluster, ray.init() starts one on this machine)")
    return ray


def _ray_launcher(launcher: str | Launcher, use_gpu: bool) -> Launcher:
    """The RayLauncher of ``"ray"`` (one GPU per rank with ``use_gpu``), or the given one once checked
    against ``use_gpu``.

    Raises:
        ConfigError: Ray missing or not connected; ``use_gpu=True`` with a launcher that asks no GPU per rank.
    """
    connected_ray()
    from hora.runners.launchers.ray.launcher import RayLauncher

    if isinstance(launcher, str):
        return RayLauncher(gpus_per_rank=1 if use_gpu else 0)
    if use_gpu and launcher.resources.gpus_per_rank <= 0:  # type: ignore[attr-defined]
        raise ConfigError("use_gpu=True but the RayLauncher asks no GPU per rank: pass "
                          "RayLauncher(gpus_per_rank=1, ...) (or backend='ray')")
    return launcher


#: the launcher names an estimator's ``backend=`` takes (the launchers built without arguments of their own)
LAUNCHER_NAMES: tuple[str, ...] = _BY_NAME


def backend_kind(backend: Any) -> str | None:
    """Which shape of the module docstring ``backend`` is: ``"default"`` (None), ``"name"``,
    ``"launcher"``, ``"options"`` (a ``launch_options()`` object, Horovod's ``SparkBackend``),
    ``"horovod"`` (Horovod's Backend interface), or None for none of them. The one place the
    shapes are told apart (:func:`resolve` and :func:`check_backend` ask it)."""
    if backend is None:
        return "default"
    if isinstance(backend, str):
        return "name"
    if isinstance(backend, Launcher):
        return "launcher"
    if callable(getattr(backend, "launch_options", None)):
        return "options"
    if is_horovod_backend(backend):
        return "horovod"
    return None


def check_backend(backend: Any, *, num_proc: int | None = None, max_failures: int = 0) -> None:
    """The checks of an estimator's ``backend=`` made with its other parameters, before any data is read:
    a launcher's name among :data:`LAUNCHER_NAMES`, a Launcher, or an object with Horovod's Backend
    interface (``run()`` and ``num_processes()``; a ``SparkBackend`` has both); ``num_proc`` only beside
    a Launcher (as in Horovod, a Backend object brings its own); ``max_failures`` only where a hora
    launcher runs the ranks (a bare Backend's ``run()`` cannot relaunch them).

    Raises:
        ConfigError: names ``backend`` and what is wrong with it.
    """
    kind = backend_kind(backend)
    if kind == "default":
        return
    if kind == "name":
        if backend not in LAUNCHER_NAMES:
            raise ConfigError(f"backend {backend!r} is unknown; use one of {', '.join(LAUNCHER_NAMES)}, a "
                              "hora.runners Launcher or a SparkBackend")
        return
    if kind != "launcher" and not is_horovod_backend(backend):
        raise ConfigError(f"backend must be a launcher's name {LAUNCHER_NAMES}, a hora.runners Launcher, a "
                          "hora.spark.common.backend.SparkBackend or have Horovod's run()/num_processes(), "
                          f"got {type(backend).__name__}")
    if num_proc is not None and kind != "launcher":
        raise ConfigError("at most one of backend and num_proc may be given (as in Horovod): pass "
                          "num_proc to the backend, e.g. SparkBackend(num_proc=...)")
    if max_failures and kind == "horovod":
        raise ConfigError(f"max_failures={max_failures} needs a hora launcher: the run() of a "
                          f"{type(backend).__name__} cannot relaunch lost ranks")


def _shape(backend: Any, default: str | Launcher) -> tuple[str | Launcher | BackendLauncher, dict[str, Any]]:
    """Where the ranks run (a launcher's name, a Launcher or a BackendLauncher) and the keywords a
    ``launch_options()`` object adds.

    Raises:
        ConfigError: a shape :func:`resolve` does not take (names ``backend`` and what was given).
    """
    kind = backend_kind(backend)
    if kind == "default":
        return default, {}
    if kind == "options":  # Horovod's SparkBackend: hora.runners.run keywords
        wanted = dict(backend.launch_options())
        where = wanted.pop("backend", None)
        if where is not None and not isinstance(where, (str, Launcher)):
            raise ConfigError(f"backend {backend!r}: launch_options() names the launcher {where!r}; it must be a "
                              "launcher's name or a hora.runners Launcher")
        return (default if where is None else where), wanted
    if kind in ("name", "launcher"):
        return backend, {}
    if kind == "horovod":
        return BackendLauncher(backend), {}
    raise ConfigError(f"backend must be a launcher's name ({', '.join(_BY_NAME)}), a hora.runners Launcher, "
                      "a SparkBackend or an object with Horovod's Backend interface (run() and num_processes()), "
                      f"got {type(backend).__name__}: {backend!r}")


def resolve(backend: Any = None, *, default: str | Launcher = "local", default_num_proc: int | None = None,
            num_proc: int | None = None, min_num_proc: int | None = None, max_failures: int = 0,
            env: Mapping[str, str] | None = None, start_timeout: float | None = None, verbose: int = 1,
            spark: Any = None, client: Any = None, task_cpus: int | None = None,
            use_gpu: bool = False) -> tuple[Launcher, LaunchOptions]:
    """The Launcher and the :class:`LaunchOptions` of ``backend`` (any shape of the module docstring).

    Args:
        backend: where the ranks run (None: ``default``).
        default: the launcher (or its name) when ``backend`` is None or names none.
        default_num_proc: the ranks when ``backend`` is None and ``num_proc`` is not given
            (None: as many as the launcher has slots).
        num_proc: ranks (default: a ``launch_options()`` object's, a Backend's
            ``num_processes()``, else ``default_num_proc`` or the launcher's slots).
        min_num_proc, max_failures, start_timeout, verbose: as :func:`hora.runners.run` takes
            them (a ``launch_options()`` object's ``start_timeout`` / ``verbose`` win).
        env: environment variables for every rank (a ``launch_options()`` object's are added).
        spark, client: the SparkSession / distributed.Client of the Spark / Dask launcher.
        task_cpus, use_gpu: the Spark training stage's resources (``task_cpus`` only there);
            ``use_gpu`` asks Ray for one GPU per rank.

    Raises:
        ConfigError: a shape it does not take, an unknown launcher name, ``task_cpus`` off Spark,
            Ray missing or not connected, bad option values, fewer slots than ``min_num_proc``
            or (Spark) than ``num_proc``: all before any rank starts.
    """
    where, wanted = _shape(backend, default)
    rank_env = dict(env or {})
    rank_env.update(wanted.pop("env", None) or {})
    overrides = {k: v for k, v in wanted.items() if v is not None}
    custom = isinstance(where, BackendLauncher)
    if where == "ray" or getattr(where, "name", None) == "ray":
        where = _ray_launcher(where, use_gpu)
    if isinstance(where, str) and where == "spark":
        from hora.runners.launchers.spark import SparkLauncher

        # the training stage's resources (its ResourceProfile), on classic and Connect sessions
        where = SparkLauncher(spark, task_cpus=task_cpus, use_gpu=use_gpu)
    elif task_cpus is not None:
        raise ConfigError(f"task_cpus={task_cpus} sizes the tasks of the Spark training stage the estimator "
                          f"starts, but this fit runs on {where!r}: drop task_cpus (or pass "
                          "hora.runners.SparkLauncher(task_cpus=...) as backend)")
    launcher = resolve_launcher(where, spark=spark, client=client)
    given = overrides.pop("num_proc", None)
    n = num_proc if num_proc is not None else given
    if n is None:
        n = default_num_proc if backend is None and default_num_proc is not None else launcher.default_num_proc()
    options = LaunchOptions(num_proc=max(1, int(n)), env=rank_env, start_timeout=overrides.pop("start_timeout", start_timeout),
                            verbose=overrides.pop("verbose", verbose), min_num_proc=min_num_proc,
                            max_failures=max_failures or 0, stdout=overrides.pop("stdout", None),
                            stderr=overrides.pop("stderr", None), timestamps=bool(overrides.pop("timestamps", False)))
    if overrides:
        raise ConfigError(f"backend {backend!r}: launch_options() gives keyword(s) {sorted(overrides)} that "
                          "hora.runners.run does not take here")
    _check_slots(launcher, options, custom)
    return launcher, options


def _check_slots(launcher: Launcher, options: LaunchOptions, custom: bool) -> None:
    """Refuse, before the data is written, a run the cluster has no slots for.

    Raises:
        ConfigError: fewer slots than ``min_num_proc`` now; more ranks than a Spark stage's slots.
    """
    from hora.runners.driver.recovery import start_size
    from hora.runners.launchers.spark import SparkLauncher

    if options.min_num_proc is not None:
        if not custom:  # the cluster must have slots for the least now
            start_size(launcher, options.min_num_proc, options.num_proc)
    elif isinstance(launcher, SparkLauncher):  # more ranks than the stage's slots
        launcher.check_num_proc(options.num_proc)


__all__ = ["resolve", "LaunchOptions", "connected_ray", "check_backend", "backend_kind", "LAUNCHER_NAMES"]
