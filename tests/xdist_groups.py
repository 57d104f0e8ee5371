"""How pytest-xdist shares the test files between its processes (``make test TEST_WORKERS=2``,
loaded with ``-p tests.xdist_groups``).

Every test of a file runs in one process, as with ``--dist loadfile`` (a module's fixtures are
built once), and the files that use the Spark servers of tests/spark_clusters.py (a Spark
Connect server; the standalone cluster: a master and two workers, three JVMs, 20-50 s of CPU
to start) all run in one process, so those session fixtures start once per run instead of once
in each process, and two sets of JVMs never compete for the two cores. A file uses them if its
text names one of :data:`SERVER_FIXTURES` (as a test's argument or in
``request.getfixturevalue("...")``). Serially (no ``-n``) this does nothing.

A scheduler rather than ``--dist loadgroup``: xdist 3.8 marks a group by appending ``@group``
to the item's ``_nodeid``, which pytest 9 no longer reads, so ``xdist_group`` marks are ignored.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

#: the session fixtures that start JVM servers (tests/spark_clusters.py)
SERVER_FIXTURES = ("connect_server", "connect_spark", "any_spark", "standalone_cluster", "standalone_connect")
SERVERS_GROUP = "spark-servers"

_NAMES = re.compile(r"\b(%s)\b" % "|".join(SERVER_FIXTURES))


@functools.lru_cache(maxsize=None)
def uses_servers(path: Path) -> bool:
    """Whether the test file at ``path`` names a fixture of :data:`SERVER_FIXTURES`."""
    try:
        return bool(_NAMES.search(path.read_text()))
    except OSError:
        return False


def group_of(rootpath: Path, nodeid: str) -> str:
    """The work unit of the test ``nodeid``: :data:`SERVERS_GROUP` or its file."""
    file = nodeid.split("::", 1)[0]
    return SERVERS_GROUP if uses_servers(rootpath / file) else file


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(Path(config.rootpath), nodeid)

    return FileGroupScheduling(config, log)
