"""Reader throughput against raw pyarrow, and its peak memory on a dataset larger than the shuffle buffer.

Run: ``.venv/bin/python benchmarks/bench_reader.py [--rows 1000000] [--cols 32]``. Prints a
markdown table. Baseline: ``pyarrow.parquet.read_table`` of the same files plus
``to_numpy`` of every column (no shuffling, no batching). hora: one rank, shuffled,
batch 1024, prefetch thread on. Two more rows read the feature columns as one model
input (the estimators' feature group ``feature_cols=[cols]``): stacked per batch after
the reader, as the estimators did before, and stacked by the reader (``groups=``).

``--only cpu`` runs just the last table (also printed after the others): the reader's CPU
time per batch (``time.process_time``, all threads) in the fit's layout, ``--cols`` float32
features stacked as one group plus a float32 label, rank 0 of 2, shuffled, batch 1024,
against :class:`BaselineReader` (the shuffle before 2026-12-02), alternated in the
same run, with the medians of ``--cpu-repeat`` epochs each and their ratio, and the stages
of one epoch without the prefetch thread.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from hora.store import Store, make_reader, materialize
from hora.store.arrow_arrays import stack_members as _stack
from hora.store.reader import Reader


def best_of(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _stack_by_column(members):
    """The reader's stacking before 2026-12-02: each member into its strided column."""
    out = np.empty((len(members[0]), len(members)), dtype=members[0].dtype)
    for j, m in enumerate(members):
        out[:, j] = m
    return out


class BaselineReader(Reader):
    """The reader's shuffle before 2026-12-02, the same-run baseline: each row group
    stacked column by column, its rows scattered into the window through the permutation,
    each batch copied out of the window. Yields the same batches as :class:`Reader` (it stacks
    in the batch thread where the old reader stacked in the read-ahead thread: the same CPU)."""

    def __init__(self, reader: Reader) -> None:  # the same plan as ``reader``
        self.__dict__.update(reader.__dict__)

    def _shuffled(self, chunks):
        bs = self.batch_size
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, 0xB0F])
        windows = self.windows()  # (the same windows: the plan did not change)
        carry, carry_rows, source = None, 0, iter(chunks)
        for wi, wrows in enumerate(windows):
            total = wrows + carry_rows
            dest = rng.permutation(total)
            out = {c: np.empty((total, *s.shape), dtype=s.dtype) for c, s in self.specs.items()}
            pos = 0
            if carry is not None:
                for c in self.columns:
                    out[c][dest[:carry_rows]] = carry[c]
                pos = carry_rows
            while pos < total:
                read = next(source)
                chunk = {c: _stack_by_column(a) if isinstance(a, tuple) else a for c, a in read.columns.items()}
                for c in self.columns:
                    out[c][dest[pos : pos + read.rows]] = chunk[c]
                pos += read.rows
            upto = total if wi == len(windows) - 1 else (total // bs) * bs
            carry = {c: out[c][upto:].copy() for c in self.columns} if upto < total else None
            carry_rows = total - upto
            for start in range(0, upto, bs):
                yield {c: out[c][start : min(start + bs, upto)].copy() for c in self.columns}


def _epoch_cpu(reader) -> float:
    """CPU seconds (all threads of this process) per batch of one pass of ``reader``."""
    t0, n = time.process_time(), 0
    for _ in reader:
        n += 1
    return (time.process_time() - t0) / n


def _stages(reader) -> dict[str, float]:
    """CPU seconds per batch of one epoch's stages, without the prefetch thread: Parquet decode
    (with the views of Arrow's buffers), stacking the group each way, and the whole reader."""
    key = next(iter(reader.groups))
    decode = new = old = 0.0
    window = None
    t = time.process_time()
    for read in reader._row_groups():
        t1 = time.process_time()
        decode += t1 - t
        members = read.columns[key]
        if window is None or len(window) < read.rows:
            window = np.empty((read.rows, len(members)), dtype=members[0].dtype)
        _stack(members, window[: read.rows])  # as the reader now does: into the window
        t2 = time.process_time()
        _stack_by_column(members)  # as it did: into a new array
        t = time.process_time()
        new, old = new + t2 - t1, old + t - t2
    batches = len(reader)
    return {"decode": decode / batches, "stack new": new / batches, "stack old": old / batches,
            "total new": _epoch_cpu(reader), "total old": _epoch_cpu(BaselineReader(reader))}


def cpu_table(args) -> None:
    """The reader's CPU per batch in the fit's layout, against the baseline, alternated."""
    tmp = tempfile.mkdtemp(prefix="hora-bench-reader-cpu-")
    store = Store.create(tmp)
    rng = np.random.default_rng(0)
    features = [f"f{i}" for i in range(args.cols)]
    x = rng.random((args.rows, args.cols), dtype=np.float32)
    df = pd.DataFrame(x, columns=features)
    df["y"] = x.sum(axis=1, dtype=np.float32)
    info = materialize(df, store, features, ["y"], num_proc=2)
    del df, x
    groups = {"feats": features}

    def reader(epoch, prefetch):
        return make_reader(store, info, rank=0, size=2, batch_size=args.batch, epoch=epoch, seed=0, shuffle=True,
                           columns=["feats", "y"], groups=groups, prefetch=prefetch)

    a, b = list(reader(0, 2)), list(BaselineReader(reader(0, 0)))
    assert len(a) == len(b) and all(np.array_equal(x[c], y[c]) for x, y in zip(a, b) for c in x)
    del a, b
    started, load = datetime.datetime.now(datetime.timezone.utc), os.getloadavg()
    cpu = {"old": [], "new": []}
    for rep in range(args.cpu_repeat):
        for which in (("old", "new") if rep % 2 == 0 else ("new", "old")):
            r = reader(rep, 2)
            cpu[which].append(_epoch_cpu(BaselineReader(r) if which == "old" else r))
    stages = [_stages(reader(rep, 0)) for rep in range(args.cpu_repeat)]
    stage = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
    ended, load_end = datetime.datetime.now(datetime.timezone.utc), os.getloadavg()
    old, new = statistics.median(cpu["old"]), statistics.median(cpu["new"])
    ratios = [n / o for n, o in zip(cpu["new"], cpu["old"])]
    ms = lambda v: f"{v * 1e3:.3f}"  # noqa: E731
    batches = len(reader(0, 0))
    print(f"\n### Reader CPU per batch: {args.rows:,} rows x {args.cols} float32 features as one group + "
          f"a float32 label, rank 0 of 2 ({batches} batches of {args.batch}), shuffled, "
          f"{started:%Y-%m-%d %H:%M}-{ended:%H:%M} UTC, load average {load[0]:.2f} -> {load_end[0]:.2f}\n")
    print(f"Medians of {args.cpu_repeat} epochs each, alternated; `time.process_time` (all threads).\n")
    print("| reader | CPU ms per batch (median) | min-max | new / old |")
    print("|---|---:|---:|---:|")
    print(f"| old: stacked column by column, scattered into the window, batches copied (prefetch=2) | {ms(old)} | "
          f"{ms(min(cpu['old']))}-{ms(max(cpu['old']))} | 1.00 |")
    print(f"| new: stacked into the window, batches gathered (prefetch=2) | {ms(new)} | "
          f"{ms(min(cpu['new']))}-{ms(max(cpu['new']))} | {new / old:.2f} (per-pair median "
          f"{statistics.median(ratios):.2f}) |")
    print(f"\nStages of one epoch without the prefetch thread (prefetch=0), CPU ms per batch, medians of "
          f"{args.cpu_repeat}:\n")
    print("| stage | old | new | new / old |")
    print("|---|---:|---:|---:|")
    rest_old = stage["total old"] - stage["decode"] - stage["stack old"]
    rest_new = stage["total new"] - stage["decode"] - stage["stack new"]
    for name, o, n in (("Parquet decode (`read_row_group` + views)", stage["decode"], stage["decode"]),
                       (f"stacking the {args.cols} features", stage["stack old"], stage["stack new"]),
                       ("shuffle and batches (the rest)", rest_old, rest_new),
                       ("whole reader, prefetch=0", stage["total old"], stage["total new"])):
        print(f"| {name} | {ms(o)} | {ms(n)} | {n / o:.2f} |")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu-repeat", type=int, default=7, help="epochs of each reader in the CPU table")
    ap.add_argument("--only", choices=("all", "cpu"), default="all")
    args = ap.parse_args()
    if args.only == "cpu":
        cpu_table(args)
        return

    tmp = tempfile.mkdtemp(prefix="hora-bench-reader-")
    store = Store.create(tmp)
    rng = np.random.default_rng(0)
    cols = [f"c{i}" for i in range(args.cols)]
    df = pd.DataFrame({c: rng.random(args.rows, dtype=np.float32) for c in cols})
    t0 = time.perf_counter()
    info = materialize(df, store, cols[:-1], cols[-1:], num_proc=4)
    write_s = time.perf_counter() - t0
    del df
    files = info.train_files
    data_mb = args.rows * args.cols * 4 / 2**20

    def raw():
        table = pq.read_table(files)
        return {c: table.column(c).to_numpy() for c in cols}

    def hora(shuffle):
        def run():
            n = 0
            for batch in make_reader(store, info, batch_size=args.batch, shuffle=shuffle, seed=1, prefetch=2):
                n += len(batch[cols[0]])
            assert n == args.rows, n
        return run

    features, key = cols[:-1], "[" + ",".join(cols[:-1]) + "]"

    def grouped(by_reader):
        def run():
            n = 0
            if by_reader:
                reader = make_reader(store, info, batch_size=args.batch, shuffle=True, seed=1, prefetch=2,
                                     columns=[key, cols[-1]], groups={key: features})
                for batch in reader:
                    n += len(batch[key])
            else:
                for batch in make_reader(store, info, batch_size=args.batch, shuffle=True, seed=1, prefetch=2):
                    n += len(np.stack([batch[c] for c in features], axis=1))
            assert n == args.rows, n
        return run

    raw()  # warm the page cache for everyone
    t_raw = best_of(raw, args.repeat)
    t_shuf = best_of(hora(True), args.repeat)
    t_seq = best_of(hora(False), args.repeat)
    t_stack = best_of(grouped(False), args.repeat)
    t_group = best_of(grouped(True), args.repeat)

    # peak RSS of a fresh process reading the whole dataset with a buffer of a quarter of it
    buffer_rows = args.rows // 4
    probe = textwrap.dedent(
        f"""
        import sys
        def hwm_kb():  # peak RSS of this process (ru_maxrss would include the parent's, from before exec)
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        from hora.store import Store, load_dataset_info, make_reader
        store = Store.create({tmp!r}); info = load_dataset_info(store, {info.fingerprint!r})
        base = hwm_kb()
        if sys.argv[1].startswith("read"):
            buffer = int(sys.argv[1].split(":")[1])
            for b in make_reader(store, info, batch_size={args.batch}, shuffle=True, shuffle_buffer_size=buffer):
                pass
        elif sys.argv[1] == "raw":
            import pyarrow.parquet as pq
            t = pq.read_table(info.train_files); arrays = [t.column(i).to_numpy() for i in range(t.num_columns)]
        print(base, hwm_kb())
        """
    )
    rss = {}
    modes = (f"read:{buffer_rows}", f"read:{buffer_rows // 2}", "raw")
    for mode in modes:
        out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, timeout=300, check=True)
        base_kb, peak_kb = map(int, out.stdout.split())
        rss[mode] = (base_kb / 1024, peak_kb / 1024)

    rows_s = lambda t: args.rows / t  # noqa: E731
    print(f"\n### Reader: {args.rows:,} rows x {args.cols} float32 columns ({data_mb:.0f} MiB), "
          f"{len(files)} files, batch {args.batch}, one rank, best of {args.repeat}\n")
    print("| what | seconds | rows/s | ratio vs baseline |")
    print("|---|---:|---:|---:|")
    print(f"| baseline: pq.read_table + to_numpy | {t_raw:.3f} | {rows_s(t_raw):,.0f} | 1.00 |")
    print(f"| hora reader, shuffled (buffer {min(100_000, args.rows):,} rows) | {t_shuf:.3f} | {rows_s(t_shuf):,.0f} | {t_raw / t_shuf:.2f} |")
    print(f"| hora reader, not shuffled | {t_seq:.3f} | {rows_s(t_seq):,.0f} | {t_raw / t_seq:.2f} |")
    print(f"| hora reader, shuffled, {len(features)} features stacked per batch after it | {t_stack:.3f} | "
          f"{rows_s(t_stack):,.0f} | {t_raw / t_stack:.2f} |")
    print(f"| hora reader, shuffled, {len(features)} features as one group (`groups=`) | {t_group:.3f} | "
          f"{rows_s(t_group):,.0f} | {t_raw / t_group:.2f} |")
    print(f"\n(materialize of the pandas frame: {write_s:.2f} s)\n")
    print(f"### Peak RSS, dataset {data_mb:.0f} MiB = 4 x the shuffle buffer ({buffer_rows:,} rows, "
          f"{buffer_rows * args.cols * 4 / 2**20:.0f} MiB)\n")
    print("| process | RSS after imports (MiB) | peak RSS (MiB) | peak - imports (MiB) |")
    print("|---|---:|---:|---:|")
    labels = (
        f"hora reader, shuffled, buffer {buffer_rows:,} rows (dataset = 4 x buffer)",
        f"hora reader, shuffled, buffer {buffer_rows // 2:,} rows (dataset = 8 x buffer)",
        "baseline: pq.read_table + to_numpy (whole table)",
    )
    for mode, label in zip(modes, labels):
        base, peak = rss[mode]
        print(f"| {label} | {base:.0f} | {peak:.0f} | {peak - base:.0f} |")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    cpu_table(args)


if __name__ == "__main__":
    main()
