"""The reader's batches against a plain reference of what it documents: the same rows, in the same order.

The reference reads each planned segment with pyarrow and ``to_pylist``, stacks a feature
group with ``np.stack``, and mixes each shuffle window by scattering its rows to a seeded
permutation (the reader's random stream, which ranks and resumed runs depend on), carrying
the rows short of a full batch into the next window. Nothing of it is shared with the
reader but :func:`plan_segments`, which ``test_reader.py`` checks on its own.
"""

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from hora.store import Store, make_reader, materialize
from hora.store.arrow_arrays import stack_members as _stack
from hora.store.segments import plan_segments

pytestmark = pytest.mark.timeout(120)

GROUPS = {
    "g32": [f"f{i}" for i in range(32)],  # the fit's case: many float32 members
    "g1": ["f5"],  # a group of one
    "h": ["d2", "d0", "d1"],  # float64, not in stored order
    "s": ["i1", "i0"],  # int16
    "k": ["flag", "flag"],  # bool, a member twice
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """1,003 rows in three files of row groups of 61 rows (cut mid-way by most ranks' shares)."""
    rng = np.random.default_rng(4)
    n = 1003
    df = pd.DataFrame({
        "id": np.arange(n, dtype=np.int64),
        **{f"f{i}": rng.random(n, dtype=np.float32) for i in range(32)},
        **{f"d{i}": rng.random(n) for i in range(3)},
        **{f"i{i}": rng.integers(-1000, 1000, n).astype(np.int16) for i in range(2)},
        "flag": rng.random(n) < 0.5,
        "vec": list(rng.random((n, 3)).astype(np.float32)),
        "img": list(np.arange(n * 4, dtype=np.float64).reshape(n, 2, 2)),
    })
    store = Store.create(str(tmp_path_factory.mktemp("reference") / "store"))
    features = [c for c in df.columns if c != "id"]
    return store, materialize(df, store, features, ["id"], num_proc=3, rows_per_row_group=61, validation=0.15)


def _column(table, name, dtype):
    return np.array(table.column(name).to_pylist(), dtype=dtype)


def reference(store, info, split, rank, size, batch_size, epoch, seed, shuffle, buffer, columns, groups,
              remainder, drop_last):
    """The batches the reader documents, computed the plain way."""
    files = info.split_files(split)
    paths = info.file_paths(split)
    plan = [(i, g, rows) for i, f in enumerate(files) for g, rows in enumerate(f.row_groups)]
    segments, per = plan_segments(plan, rank, size, epoch, seed, shuffle, remainder)
    parts = []
    for seg in segments:
        table = pq.ParquetFile(store.open(paths[seg.file], "rb")).read_row_group(seg.row_group)
        part = {}
        for c in columns:
            if c in groups:
                dtype = info.columns[groups[c][0]].dtype
                part[c] = np.stack([_column(table, m, dtype) for m in groups[c]], axis=1)
            else:
                part[c] = _column(table, c, info.columns[c].dtype)
            part[c] = part[c][seg.start : seg.stop]
        parts.append(part)
    join = lambda ps: {c: np.concatenate([p[c] for p in ps]) for c in columns}  # noqa: E731
    if not shuffle:
        mixed = [join(parts)]
    else:
        rng = np.random.default_rng([seed, epoch, rank, 0xB0F])
        windows, current, acc = [], [], 0
        for part in parts:
            current.append(part)
            acc += len(part[columns[0]])
            if acc >= buffer:
                windows.append(current)
                current, acc = [], 0
        if current:
            windows.append(current)
        mixed, carry = [], []
        for wi, window in enumerate(windows):
            rows = join(carry + window)
            total = len(rows[columns[0]])
            dest = rng.permutation(total)
            out = {c: np.empty_like(a) for c, a in rows.items()}
            for c in columns:
                out[c][dest] = rows[c]
            upto = total if wi == len(windows) - 1 else total // batch_size * batch_size
            mixed.append({c: a[:upto] for c, a in out.items()})
            carry = [{c: a[upto:] for c, a in out.items()}]
    rows = join(mixed)
    batches = per // batch_size if drop_last else -(-per // batch_size)
    return [{c: a[b * batch_size : (b + 1) * batch_size] for c, a in rows.items()} for b in range(batches)]


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert list(a) == list(b)
        for c in a:
            assert a[c].dtype == b[c].dtype and a[c].shape == b[c].shape, c
            np.testing.assert_array_equal(a[c], b[c], err_msg=c)


@pytest.mark.parametrize("columns", [
    ["g32", "id"],  # the fit's layout
    ["g1", "h", "id", "f5", "vec", "img", "s", "k"],  # groups of every kind beside their members and n-d columns
])
@pytest.mark.parametrize("size", [1, 3])
@pytest.mark.parametrize("shuffle,buffer", [(False, None), (True, 50), (True, 333), (True, 5000)])
def test_batches_equal_the_reference(dataset, columns, size, shuffle, buffer):
    """Windows smaller than a row group, of several row groups with rows carried over, and one window for all."""
    store, info = dataset
    groups = {k: GROUPS[k] for k in columns if k in GROUPS}
    for rank in range(size):
        for batch_size, remainder, drop_last, epoch, seed, prefetch in (
                (32, "pad", False, 0, 0, 0), (100, "truncate", True, 2, 9, 0), (7, "pad", True, 1, 3, 2)):
            kw = dict(split="train", rank=rank, size=size, batch_size=batch_size, epoch=epoch, seed=seed,
                      shuffle=shuffle, columns=columns, groups=groups, remainder=remainder, drop_last=drop_last)
            got = list(make_reader(store, info, shuffle_buffer_size=buffer, prefetch=prefetch, **kw))
            assert_same(got, reference(store, info, buffer=buffer, **kw))


def test_the_val_split_with_one_row_per_batch(dataset):
    store, info = dataset
    kw = dict(split="val", rank=1, size=2, batch_size=1, epoch=4, seed=1, shuffle=True, columns=["g32", "s", "id"],
              groups={"g32": GROUPS["g32"], "s": GROUPS["s"]}, remainder="pad", drop_last=False)
    assert_same(list(make_reader(store, info, shuffle_buffer_size=40, prefetch=0, **kw)),
                reference(store, info, buffer=40, **kw))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int64, np.bool_])
@pytest.mark.parametrize("rows,k", [(1, 1), (1, 5), (63, 1), (1000, 3), (4099, 32), (257, 33)])
def test_stack_equals_a_column_loop(dtype, rows, k):
    """Into a new array and into a slice of a larger one (a window), from contiguous and strided members."""
    rng = np.random.default_rng(rows * k)
    members = [(rng.random(rows * 2) * 200 - 100).astype(dtype) for _ in range(k)]
    for cols in (tuple(m[:rows] for m in members), tuple(m[::2] for m in members)):
        want = np.empty((rows, k), dtype)
        for j, m in enumerate(cols):
            want[:, j] = m
        got = _stack(cols)
        assert got.dtype == want.dtype and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
        window = np.zeros((rows + 10, k), dtype)
        _stack(cols, window[4 : 4 + rows])
        np.testing.assert_array_equal(window[4 : 4 + rows], want)
        assert not window[:4].any() and not window[4 + rows :].any()
