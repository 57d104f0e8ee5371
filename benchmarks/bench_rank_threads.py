"""A CPU rank's torch threads: its share of the host's cores against torch's default (every core).

Run: ``.venv/bin/python benchmarks/bench_rank_threads.py [--images 4096] [--epochs 6] [--repeat 3]``.
Prints a markdown table. The digits CNN of ``bench_column_types.py`` (decoded uint8 arrays,
``inmemory_cache_all``) fitted by ``TorchEstimator(num_proc=2)`` on a pandas frame (two local ranks
on this host), alternated in pairs: ``HORA_RANK_THREADS=0`` (hora's default: cores //
ranks on the host) against ``HORA_RANK_THREADS=<cores>`` (torch's own default, what a rank had
before: a thread per core in every rank). ``OMP_NUM_THREADS`` is unset for both (when it is set,
hora leaves the threads alone). A fit's rows/s is the median of its epochs after the first.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_column_types import _cnn, _digits_pngs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import torch

    from hora.dask import TorchEstimator
    from hora.estimators.devices import host_cores
    from hora.store import Store

    os.environ.pop("OMP_NUM_THREADS", None)
    cores = host_cores()
    _, arrays, y = _digits_pngs(args.images)
    df = pd.DataFrame({"pixels": list(arrays), "y": y})
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"bench_rank_threads.py, {started:%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}, {cores} cores\n")
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.create(os.path.join(tmp, "store"))

        def fit(threads: int) -> float:
            os.environ["HORA_RANK_THREADS"] = str(threads)
            net = _cnn()
            est = TorchEstimator(num_proc=2, store=store, model=net, optimizer=torch.optim.SGD(net.parameters(), 0.05),
                                 loss=torch.nn.CrossEntropyLoss(), feature_cols=["pixels"], label_cols=["y"],
                                 batch_size=64, epochs=args.epochs, verbose=0, random_seed=0, inmemory_cache_all=True)
            hist = est.fit(df).history_
            return float(np.median([args.images / h["epoch_time_s"] for h in hist[1:]]))

        pairs = []
        for _ in range(args.repeat):
            load = os.getloadavg()[0]
            pairs.append((load, fit(0), fit(cores)))
    os.environ.pop("HORA_RANK_THREADS", None)
    share = max(1, cores // 2)
    ratios = [s / d for _, s, d in pairs]
    print(f"| 2 ranks on {cores} cores, digits CNN, {args.images:,} rows | threads a rank | rows/s (median of pairs) | vs torch's default |")
    print("|---|---:|---:|---:|")
    print(f"| torch's default (before) | {cores} | {np.median([d for _, _, d in pairs]):,.0f} | 1.00x |")
    print(f"| its share of the cores (`HORA_RANK_THREADS=0`, the default) | {share} | "
          f"{np.median([s for _, s, _ in pairs]):,.0f} | **{np.median(ratios):.2f}x** |")
    print("\nevery pair (load at its start: share / default rows/s = ratio):")
    for (load, s, d), r in zip(pairs, ratios):
        print(f"- ({load:.1f}) {s:,.0f} / {d:,.0f} = {r:.2f}x")


if __name__ == "__main__":
    main()
