"""tests/xdist_groups.py, the scheduler of `make test`'s two processes: which files share the Spark
servers' process, and the order the work units go out in (longest first)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests import xdist_groups as xg

pytestmark = pytest.mark.timeout(60)


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    xg.uses_fixtures.cache_clear()
    return path


def test_a_file_uses_the_servers_through_a_test_or_fixture_argument_or_a_fixture_name_in_a_string(tmp_path):
    assert xg.uses_servers(_file(tmp_path, "a.py", "def test_x(connect_spark):\n    pass\n"))
    assert xg.uses_servers(_file(tmp_path, "b.py", """
        import pytest
        @pytest.fixture(scope="module")
        def frame(standalone_cluster):
            return standalone_cluster
    """))
    assert xg.uses_servers(_file(tmp_path, "c.py", """
        def test_y(request):
            request.getfixturevalue("spark" if request.param else "connect_spark")
    """))
    # a helper's parameter of the same name (a cluster the test starts itself) is not the fixture
    assert not xg.uses_servers(_file(tmp_path, "d.py", """
        def _run(standalone_cluster, tmp_path):
            return standalone_cluster.url
        def test_z(tmp_path):
            _run(object(), tmp_path)
    """))
    assert not xg.uses_servers(_file(tmp_path, "e.py", "def test_w(spark):\n    pass\n"))
    assert not xg.uses_servers(tmp_path / "missing.py")


def test_units_go_out_longest_first_the_servers_group_weighing_its_files_and_a_new_file_the_default(monkeypatch):
    seconds = {"tests/a.py": 10.0, "tests/b.py": 100.0, "tests/s1.py": 40.0, "tests/s2.py": 45.0}
    monkeypatch.setattr(xg, "file_seconds", lambda: seconds)
    units = [("tests/a.py", ["tests/a.py::t"]), (xg.SERVERS_GROUP, ["tests/s1.py::t", "tests/s2.py::u"]),
             ("tests/new.py", ["tests/new.py::t"]), ("tests/b.py", ["tests/b.py::t", "tests/b.py::u"])]
    order = [u for u, _ in xg.longest_first(Path("."), units)]
    assert order == ["tests/b.py", xg.SERVERS_GROUP, "tests/a.py", "tests/new.py"]
    assert xg.unit_seconds(Path("."), "tests/new.py", ["tests/new.py::t"]) == xg.UNKNOWN_SECONDS


def test_the_committed_seconds_name_test_files_that_exist():
    seconds = xg.file_seconds()
    root = Path(xg.__file__).parent.parent
    assert len(seconds) > 50
    present = [f for f in seconds if (root / f).exists()]
    assert len(present) >= 0.9 * len(seconds), sorted(set(seconds) - set(present))


def test_the_files_that_use_the_ssh_server_share_one_unit():
    """The sshd fixture writes and restores ~/.ssh: its files must not run in two processes at once."""
    root = Path(xg.__file__).parent.parent
    users = ["tests/ssh/test_ssh_launch.py", "tests/ssh/test_ssh_faults_in_series.py", "tests/elastic/test_elastic_ssh.py"]
    assert {xg.group_of(root, f + "::t") for f in users} == {xg.SSH_GROUP}
    assert xg.group_of(root, "tests/elastic/test_rounds.py::t") == "tests/elastic/test_rounds.py"
    assert xg.unit_seconds(root, xg.SSH_GROUP, [f + "::t" for f in users]) == pytest.approx(sum(
        xg.file_seconds().get(f, xg.UNKNOWN_SECONDS) for f in users))  # sums of floats, in either order


def test_the_files_that_use_the_ray_cluster_share_one_unit():
    """tests/ray's package fixture starts a Ray cluster: the files that use it run in one process, which starts it once."""
    root = Path(xg.__file__).parent.parent
    users = ["tests/ray/test_ray_estimators.py", "tests/ray/test_ray_hf.py", "tests/ray/test_ray_launcher.py"]
    assert {xg.group_of(root, f + "::t") for f in users} == {xg.RAY_GROUP}
    assert xg.group_of(root, "tests/ray/test_ray_placement.py::t") == "tests/ray/test_ray_placement.py"
