"""The Store's retry policy under injected S3 faults: materialize + a 3-epoch fit + predict.

Run: ``.venv/bin/python benchmarks/bench_store_faults.py [--rows 20000]``.

An S3-protocol server (moto) on 127.0.0.1 behind a proxy that answers a share of the
requests ``503 SlowDown`` / ``500 InternalError`` and resets another share
(``benchmarks/_common/s3_faults.py``). For each fault rate, in the same run: materialize a
pandas frame to an ``s3://`` Store through the proxy, fit a ``TorchEstimator`` for 3
epochs on 2 local ranks (their Store reads go through the proxy too), predict. botocore's
own retries are turned off in the storage options (``max_attempts=1``), so what carries
the job is hora's policy (s3fs keeps its own few retries of some calls). Prints one
markdown table: fault rate | requests | faults injected | fit completes | seconds | time
against no faults.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from hora.dask import TorchEstimator  # noqa: E402
from hora.store import Store  # noqa: E402
from _common.s3_faults import FaultyProxy  # noqa: E402

BUCKET = "hora-bench"


def _frame(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8)).astype("float32")
    return pd.DataFrame({"features": list(x), "y": (x @ np.linspace(-1, 1, 8)).astype("float32")})


def one(endpoint: str, fail: float, reset: float, pdf: pd.DataFrame, seed: int) -> dict:
    with FaultyProxy(endpoint, fail=fail, reset=reset, seed=seed) as proxy:
        options = {"key": "testing", "secret": "testing", "anon": False,
                   "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
                   "client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": "us-east-1"}}
        start = time.monotonic()
        ok, error = True, ""
        try:
            store = Store.create(f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}", **options)
            torch.manual_seed(0)
            net = torch.nn.Linear(8, 1)
            est = TorchEstimator(num_proc=2, backend="local", store=store, model=net,
                                 optimizer=torch.optim.SGD(net.parameters(), lr=0.05), loss=torch.nn.MSELoss(),
                                 feature_cols=["features"], label_cols=["y"], batch_size=256, epochs=3, verbose=0)
            model = est.fit(pdf)
            pred = model.predict(pdf.head(1000))
            assert len(pred) == 1000
        except Exception as exc:  # reported in the table
            ok, error = False, f"{type(exc).__name__}: {str(exc)[:120]}"
        seconds = time.monotonic() - start
        counts = dict(proxy.counts)
    return {"fail": fail, "reset": reset, "requests": sum(counts.values()),
            "faults": counts["failed"] + counts["reset"], "ok": ok, "seconds": seconds, "error": error}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    from moto.server import ThreadedMotoServer
    import s3fs

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}).mkdir(BUCKET)
    pdf = _frame(args.rows)
    rows = []
    try:
        with tempfile.TemporaryDirectory():
            for fail, reset in [(0.0, 0.0), (0.12, 0.03), (0.30, 0.05), (0.0, 0.0)]:
                rows.append(one(endpoint, fail, reset, pdf, args.seed))
                print(rows[-1], flush=True)
    finally:
        server.stop()
    base = min(r["seconds"] for r in rows if r["fail"] == 0 and r["ok"])
    print()
    print("| fault rate (5xx + resets) | requests | faults injected | materialize + 3-epoch fit + predict | seconds "
          "| time against no faults |")
    print("|---|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['fail']:.0%} + {r['reset']:.0%} | {r['requests']} | {r['faults']} | "
              f"{'completes' if r['ok'] else 'FAILS: ' + r['error']} | {r['seconds']:.1f} | {r['seconds'] / base:.2f} x |")


if __name__ == "__main__":
    main()
