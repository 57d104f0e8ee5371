"""The runners' layout: every launcher of the name table imports and is a Launcher, and the
import paths users write (README, docs, Horovod's names) resolve to the same objects."""

import importlib
import subprocess
import sys

import pytest

import hora.runners
from hora.errors import ConfigError
from hora.runners.launcher import BUILTIN, Launcher, launcher_class, resolve_launcher


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_launcher_of_the_table_imports_and_is_named_for_its_class(name):
    module, _, cls_name = BUILTIN[name].partition(":")
    cls = launcher_class(name)
    assert cls.__name__ == cls_name and cls.__module__ == module
    assert issubclass(cls, Launcher)
    assert cls.name == name


def test_the_table_holds_the_hosts_and_mpi_launchers():
    assert {"local", "hosts", "mpi", "spark", "dask", "ray"} <= set(BUILTIN)


def test_resolve_launcher_builds_by_name_and_refuses_unknown_names():
    assert type(resolve_launcher("local")).__name__ == "LocalLauncher"
    mine = launcher_class("local")()
    assert resolve_launcher(mine) is mine
    with pytest.raises(ConfigError, match="'nope' is unknown"):
        resolve_launcher("nope")
    with pytest.raises(ConfigError, match="'nope' is unknown"):
        launcher_class("nope")


@pytest.mark.parametrize("attr", sorted(hora.runners.__all__))
def test_every_public_name_of_hora_runners_resolves(attr):
    assert getattr(hora.runners, attr) is not None


def test_public_paths_are_the_moved_objects():
    from hora.runners import HostsLauncher, LocalLauncher, MpiLauncher, report, run
    from hora.runners.launchers.hosts import HostsLauncher as hosts_cls
    from hora.runners.launchers.local import LocalLauncher as local_cls
    from hora.runners.rank.main import report as rank_report

    assert HostsLauncher is hosts_cls and LocalLauncher is local_cls and issubclass(LocalLauncher, HostsLauncher)
    assert MpiLauncher is launcher_class("mpi")
    assert report is rank_report
    assert run is importlib.import_module("hora.runners.api").run
    import hora

    assert hora.run is importlib.import_module("hora.runners.api").horovod_run


def test_hora_ray_keeps_horovods_names():
    ray_api = pytest.importorskip("ray")
    assert ray_api is not None
    from hora.ray import ElasticRayExecutor, RayExecutor, RaySettings

    assert RayExecutor.__module__ == "hora.ray.executor"
    assert RaySettings is not None and ElasticRayExecutor is not None


def test_a_ranks_entry_runs_as_a_module_and_imports_light():
    # `python -m hora.runners.rank.main` is how every launcher starts a rank: the module must
    # exist under that name, and importing hora.runners must not import it (runpy would warn)
    code = ("import sys, importlib.util, hora.runners; "
            "assert importlib.util.find_spec('hora.runners.rank.main') is not None; "
            "assert 'hora.runners.rank.main' not in sys.modules, 'hora.runners imports the rank entry'; "
            "assert not {'pyspark', 'distributed', 'ray'} & set(sys.modules), 'an engine imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_warm_server_runs_the_rank_entry_by_its_real_name():
    from hora.runners.rank import main as rank_main
    from hora.runners.rank.warm import server

    assert server.RANK_ENTRY == rank_main.__name__ and callable(rank_main.main)


def test_fault_records_and_the_timeout_error_keep_their_old_import_paths():
    from hora.errors import RunTimeoutError, WorkerFailedError
    from hora.runners.driver import faults, monitor

    assert monitor.RunTimeoutError is RunTimeoutError and hora.runners.RunTimeoutError is RunTimeoutError
    assert issubclass(RunTimeoutError, (WorkerFailedError, TimeoutError))
    assert monitor.Failure is faults.Failure
    assert faults.fault_kind(RunTimeoutError("late")) is faults.FaultKind.TIMEOUT
