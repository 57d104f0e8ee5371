"""How pytest-xdist shares the test files between its processes (``make test TEST_WORKERS=2``,
loaded with ``-p tests.xdist_groups``).

Every test of a file runs in one process, as with ``--dist loadfile`` (a module's fixtures are
built once), and the files that use the Spark servers of tests/spark_clusters.py (a Spark
Connect server; the standalone cluster: a master and two workers, three JVMs, 20-50 s of CPU
to start) all run in one process, so those session fixtures start once per run instead of once
in each process, and two sets of JVMs never compete for the two cores. The files that use the
throwaway OpenSSH server (the ``sshd`` fixture, which writes and restores ``~/.ssh``) share one
process too, for the same reason and because two restores of one folder undo each other. A file uses them if one of
its tests or fixtures takes one of :data:`SERVER_FIXTURES` as an argument, or the file names one
in a string (``request.getfixturevalue("connect_spark")``, ``usefixtures``); a helper function's
parameter of the same name (tests/runners/test_lost_driver.py starts a cluster of its own) does
not count. Serially (no ``-n``) this does nothing.

The work units go out longest first (:data:`SECONDS_FILE`, each file's seconds in a recent run; a unit
of several files, their sum; a file not in it, :data:`UNKNOWN_SECONDS`), so that the last unit a
process takes is a short one and neither process idles long at the end while the other finishes
a long file. xdist's own order is by number of tests, which put the long files of one to five
tests (the examples, the docs, Ray) last. ``python -m tests.xdist_groups JUNIT_XML`` rewrites
:data:`SECONDS_FILE` from a run's ``--junitxml`` (``PYTEST_ADDOPTS=--junitxml=FILE make test``).

A scheduler rather than ``--dist loadgroup``: xdist 3.8 marks a group by appending ``@group``
to the item's ``_nodeid``, which pytest 9 no longer reads, so ``xdist_group`` marks are ignored.
"""

from __future__ import annotations

import ast
import functools
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

#: the session fixtures that start JVM servers (tests/spark_clusters.py)
SERVER_FIXTURES = ("connect_server", "connect_spark", "any_spark", "standalone_cluster", "standalone_connect")
SERVERS_GROUP = "spark-servers"
#: the session fixture that starts a throwaway OpenSSH server and writes the user's ~/.ssh (its key,
#: known hosts, config; benchmarks/_common/sshd.py), restoring the folder at the end: two processes with one each
#: would restore it under each other (seen: one process removed ~/.ssh, which the other's restore read)
SSH_FIXTURES = ("sshd",)
SSH_GROUP = "ssh-hosts"
#: the package fixture of tests/ray that starts a local Ray cluster (a GCS, a raylet, workers: 5-11 s): the files
#: that use it share one process, so the cluster starts once per run instead of once per file
RAY_FIXTURES = ("ray_cluster", "free_cluster")
RAY_GROUP = "ray-cluster"
#: each test file's seconds (setup + call + teardown of its tests) in a recent run (only their ratios matter)
SECONDS_FILE = Path(__file__).with_name("file_seconds.json")
#: the weight of a file :data:`SECONDS_FILE` does not list (a new one)
UNKNOWN_SECONDS = 5.0


def _is_fixture(node: ast.AST) -> bool:
    for dec in getattr(node, "decorator_list", []):
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
        if isinstance(target, ast.Name) and target.id == "fixture":
            return True
    return False


@functools.lru_cache(maxsize=None)
def uses_fixtures(path: Path, names: tuple[str, ...]) -> bool:
    """Whether the test file at ``path`` uses a fixture of ``names``: a test or fixture takes one as an
    argument, or a string names one (see the module's doc)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names:
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name.startswith("test") or _is_fixture(node)):
            args = node.args
            if any(a.arg in names for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]):
                return True
    return False


def uses_servers(path: Path) -> bool:
    """Whether the test file at ``path`` uses a fixture of :data:`SERVER_FIXTURES`."""
    return uses_fixtures(path, SERVER_FIXTURES)


def group_of(rootpath: Path, nodeid: str) -> str:
    """The work unit of the test ``nodeid``: :data:`SERVERS_GROUP`, :data:`SSH_GROUP`, :data:`RAY_GROUP` or its file."""
    file = nodeid.split("::", 1)[0]
    if uses_servers(rootpath / file):
        return SERVERS_GROUP
    if uses_fixtures(rootpath / file, SSH_FIXTURES):
        return SSH_GROUP
    if uses_fixtures(rootpath / file, RAY_FIXTURES):
        return RAY_GROUP
    return file


@functools.lru_cache(maxsize=None)
def file_seconds() -> dict[str, float]:
    """:data:`SECONDS_FILE` (empty when missing or unreadable: every unit weighs the same)."""
    try:
        return {str(k): float(v) for k, v in json.loads(SECONDS_FILE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def unit_seconds(rootpath: Path, unit: str, nodeids: Any) -> float:
    """The expected seconds of a work unit: its file's, or the sum of its files' (the servers group)."""
    files = {n.split("::", 1)[0] for n in nodeids} if unit in (SERVERS_GROUP, SSH_GROUP, RAY_GROUP) else {unit}
    known = file_seconds()
    return sum(known.get(f, UNKNOWN_SECONDS) for f in files)


def longest_first(rootpath: Path, units: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``(unit, nodeids)`` pairs ordered by :func:`unit_seconds`, longest first (ties: as given)."""
    return sorted(units, key=lambda kv: -unit_seconds(rootpath, kv[0], kv[1]))


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        _longest_first = False

        def _split_scope(self, nodeid: str) -> str:
            return group_of(Path(config.rootpath), nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self._longest_first:  # the first assignment: the whole queue is known, order it once
                self._longest_first = True
                units = longest_first(Path(config.rootpath), list(self.workqueue.items()))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return FileGroupScheduling(config, log)


def seconds_from_junit(path: str) -> dict[str, float]:
    """Each test file's seconds in a pytest ``--junitxml`` report (its testcases' ``time``)."""
    out: dict[str, float] = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        # classname is the module path with dots, plus the class for tests in a class
        for cut in range(len(parts), 0, -1):
            candidate = "/".join(parts[:cut]) + ".py"
            if (Path(__file__).parent.parent / candidate).exists():
                out[candidate] += float(case.get("time", 0) or 0)
                break
    return dict(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.xdist_groups JUNIT_XML  (rewrites tests/file_seconds.json)", file=sys.stderr)
        return 2
    seconds = seconds_from_junit(argv[0])
    SECONDS_FILE.write_text(json.dumps({k: round(v, 1) for k, v in sorted(seconds.items())}, indent=0) + "\n")
    print(f"{SECONDS_FILE}: {len(seconds)} files, {sum(seconds.values()):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
