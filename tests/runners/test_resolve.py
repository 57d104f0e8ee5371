"""hora.runners.resolve: every accepted shape of ``backend=`` becomes one Launcher and one LaunchOptions;
any other shape is a ConfigError naming ``backend`` and what was given, before anything starts."""

from __future__ import annotations

import io
import os

import pytest

from hora.errors import ConfigError
from hora.runners import BackendLauncher, LaunchOptions, resolve, run
from hora.runners.launchers.local import LocalLauncher
from hora.spark.common.backend import SparkBackend

pytestmark = pytest.mark.timeout(60)


class RecordingBackend:
    """Horovod's Backend interface: runs the function here, once per process it claims."""

    def __init__(self, n: int = 2):
        self.n = n
        self.calls: list[dict] = []

    def run(self, fn, args=(), kwargs=None, env=None):
        self.calls.append({"args": args, "kwargs": kwargs, "env": env})
        return [fn(*args, **(kwargs or {})) for _ in range(self.n)]

    def num_processes(self):
        return self.n


def _pid_plus(x):
    return x + 1


def test_none_a_name_and_a_launcher_resolve_to_that_launcher_with_typed_options():
    launcher, options = resolve(None, default="local", default_num_proc=1, env={"A": "1"}, verbose=0)
    assert isinstance(launcher, LocalLauncher) and options == LaunchOptions(num_proc=1, env={"A": "1"}, verbose=0)
    launcher, options = resolve("local", default="dask", default_num_proc=1, num_proc=3, min_num_proc=2,
                                max_failures=1)
    assert isinstance(launcher, LocalLauncher)  # the name wins over the default; default_num_proc is for None only
    assert (options.num_proc, options.min_num_proc, options.max_failures) == (3, 2, 1)
    given = LocalLauncher()
    launcher, options = resolve(given, num_proc=2)
    assert launcher is given and options.num_proc == 2
    with pytest.raises(Exception):  # frozen
        options.num_proc = 5  # type: ignore[misc]
    kwargs = options.run_kwargs()
    assert kwargs["num_proc"] == 2 and kwargs["env"] == {} and kwargs["timestamps"] is False


def test_a_spark_backend_gives_its_launcher_and_its_options(spark):
    from hora.runners.launchers.spark import SparkLauncher
    from hora.runners.spec import ENV_NETWORK_INTERFACE

    out = io.StringIO()
    backend = SparkBackend(num_proc=2, env={"B": "2"}, nics="lo", stdout=out, prefix_output_with_timestamp=True,
                           start_timeout=30, verbose=2)
    launcher, options = resolve(backend, default="local", default_num_proc=1, env={"A": "1"}, verbose=0, spark=spark)
    assert isinstance(launcher, SparkLauncher) and launcher.spark is spark
    assert options.num_proc == 2 and options.env == {"A": "1", "B": "2", ENV_NETWORK_INTERFACE: "lo"}
    assert (options.stdout, options.timestamps, options.start_timeout, options.verbose) == (out, True, 30, 2)


def test_a_horovod_backend_runs_the_function_itself():
    backend = RecordingBackend(n=3)
    launcher, options = resolve(backend, default="local", default_num_proc=1, env={"A": "1"})
    assert isinstance(launcher, BackendLauncher) and launcher.backend is backend
    assert options.num_proc == 3  # its num_processes(), not the default's
    assert run(_pid_plus, args=(41,), backend=launcher, **options.run_kwargs()) == [42, 42, 42]
    assert backend.calls == [{"args": (41,), "kwargs": None, "env": {"A": "1"}}]  # no kwargs it did not get
    with pytest.raises(ConfigError, match="cannot relaunch lost ranks"):
        run(_pid_plus, args=(1,), backend=launcher, max_failures=1)
    with pytest.raises(ConfigError, match="num_proc=2, but backend .* runs 3"):
        run(_pid_plus, args=(1,), backend=launcher, num_proc=2)
    assert len(backend.calls) == 1  # refused before its run()


def test_bad_shapes_and_options_name_backend_and_what_was_given():
    with pytest.raises(ConfigError, match=r"backend must be .* got int: 3"):
        resolve(3)
    with pytest.raises(ConfigError, match=r"backend must be .* got object"):
        resolve(object())
    with pytest.raises(ConfigError, match=r"backend 'yarn' is unknown"):
        resolve("yarn")

    class OnlyRun:
        def run(self, fn, args=(), kwargs=None, env=None):
            return []

    with pytest.raises(ConfigError, match=r"got OnlyRun"):  # Horovod's interface has num_processes() too
        resolve(OnlyRun())
    with pytest.raises(ConfigError, match=r"task_cpus=2 sizes the tasks of the Spark training stage.*'local'"):
        resolve("local", num_proc=1, task_cpus=2)
    with pytest.raises(ConfigError, match="min_num_proc=3 is greater than num_proc=2"):
        resolve("local", num_proc=2, min_num_proc=3)
    with pytest.raises(ConfigError, match=r"min_num_proc=.*launcher has \d+ slot"):
        resolve("local", num_proc=os.cpu_count() + 8, min_num_proc=os.cpu_count() + 4)
    with pytest.raises(ConfigError, match="num_processes\\(\\) must give an int >= 1"):
        resolve(RecordingBackend(n=0))
    with pytest.raises(ConfigError, match="env must be a mapping of str to str"):
        LaunchOptions(num_proc=1, env={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="max_failures must be an int >= 0"):
        LaunchOptions(num_proc=1, max_failures=-1)
    with pytest.raises(ConfigError, match="start_timeout must be a positive number"):
        LaunchOptions(num_proc=1, start_timeout=0)


def test_an_estimators_backend_checks_are_told_by_the_same_shapes():
    """``check_backend`` (what an estimator's parameters check before reading data) and ``resolve`` agree on the
    shapes: one table, ``backend_kind``."""
    from hora.runners.resolution import backend_kind, check_backend

    assert [backend_kind(b) for b in (None, "local", LocalLauncher(), SparkBackend(num_proc=1), RecordingBackend(),
                                      object())] == ["default", "name", "launcher", "options", "horovod", None]
    for ok in (None, "ray", LocalLauncher(), SparkBackend(num_proc=2), RecordingBackend()):
        check_backend(ok)
    check_backend(LocalLauncher(), num_proc=2, max_failures=1)  # a Launcher takes both
    check_backend(SparkBackend(num_proc=2), max_failures=1)  # launch_options(): a hora launcher relaunches
    with pytest.raises(ConfigError, match=r"backend 'hosts' is unknown; use one of local, spark, dask, ray"):
        check_backend("hosts")  # a name an estimator does not take (it needs a host list)
    with pytest.raises(ConfigError, match=r"backend must be a launcher's name .* got object"):
        check_backend(object())
    with pytest.raises(ConfigError, match="at most one of backend and num_proc may be given"):
        check_backend(SparkBackend(num_proc=2), num_proc=2)
    with pytest.raises(ConfigError, match=r"max_failures=1 needs a hora launcher: the run\(\) of a RecordingBackend"):
        check_backend(RecordingBackend(), max_failures=1)
