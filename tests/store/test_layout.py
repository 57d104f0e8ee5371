import pytest

from hora.errors import ConfigError
from hora.store import StoreLayout


def test_paths_follow_the_documented_layout():
    lay = StoreLayout("/data/hora")
    assert lay.dataset_dir("fp1") == "/data/hora/datasets/fp1"
    assert lay.train_dir("fp1") == "/data/hora/datasets/fp1/train"
    assert lay.val_dir("fp1") == "/data/hora/datasets/fp1/val"
    assert lay.metadata_path("fp1") == "/data/hora/datasets/fp1/_metadata.json"
    assert lay.commit_marker("fp1") == "/data/hora/datasets/fp1/_COMMITTED"
    assert lay.tmp_dir("fp1", "abc") == "/data/hora/datasets/fp1/_tmp-abc"
    assert lay.run_dir("r1") == "/data/hora/runs/r1"
    assert lay.checkpoint_dir("r1") == "/data/hora/runs/r1/checkpoints"
    assert lay.checkpoint_path("r1", 7) == "/data/hora/runs/r1/checkpoints/epoch-000007.ckpt"
    assert lay.logs_dir("r1") == "/data/hora/runs/r1/logs"
    assert lay.history_path("r1") == "/data/hora/runs/r1/history.json"
    assert lay.model_dir("r1") == "/data/hora/runs/r1/model"


def test_object_store_root_without_leading_slash():
    lay = StoreLayout("bucket/prefix/")
    assert lay.dataset_dir("x") == "bucket/prefix/datasets/x"


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "_tmp", "x" * 201, None])
def test_bad_names_are_refused(bad):
    lay = StoreLayout("/r")
    with pytest.raises(ConfigError):
        lay.run_dir(bad)
    with pytest.raises(ConfigError):
        lay.dataset_dir(bad)


def test_bad_split_and_epoch():
    lay = StoreLayout("/r")
    with pytest.raises(ConfigError, match="split"):
        lay.split_dir("fp", "test")
    with pytest.raises(ConfigError, match="epoch"):
        lay.checkpoint_path("r", -1)
    with pytest.raises(ConfigError):
        StoreLayout("")


def test_checkpoint_names_parse_back():
    lay = StoreLayout("/r")
    assert StoreLayout.parse_checkpoint_epoch(lay.checkpoint_path("run", 12)) == 12
    assert StoreLayout.parse_checkpoint_epoch("epoch-x.ckpt") is None
    assert StoreLayout.parse_checkpoint_epoch(".epoch-000001.ckpt.tmp-123") is None
