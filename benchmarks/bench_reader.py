"""Reader throughput against raw pyarrow, and its peak memory on a dataset larger than the shuffle buffer.

Run: ``.venv/bin/python benchmarks/bench_reader.py [--rows 1000000] [--cols 32]``. Prints a
markdown table. Baseline: ``pyarrow.parquet.read_table`` of the same files plus
``to_numpy`` of every column (no shuffling, no batching). hora: one rank, shuffled,
batch 1024, prefetch thread on. Two more rows read the feature columns as one model
input (the estimators' feature group ``feature_cols=[cols]``): stacked per batch after
the reader, as the estimators did before, and stacked by the reader (``groups=``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from hora.store import Store, make_reader, materialize


def best_of(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

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


if __name__ == "__main__":
    main()
