"""The Store's retry policy under injected S3 faults: materialize + a 3-epoch fit + predict.

Run: ``.venv/bin/python benchmarks/bench_store_faults.py [--rows 20000]``.

An S3-protocol server (moto) on 127.0.0.1 behind a proxy that answers a share of the
requests ``503 SlowDown`` / ``500 InternalError`` and resets another share
(``benchmarks/_common/s3_faults.py``). For each fault rate, in the same run: materialize a
pandas frame to an ``s3://`` Store through the proxy, fit a ``TorchEstimator`` for 3
epochs on 2 local ranks (their Store reads go through the proxy too), predict; with
``--strategy fsdp`` each epoch's checkpoint is torch's distributed checkpoint, every shard
written through the Store. The storage options are a user's (no retry settings): the Store
sets s3fs's and botocore's own retries to one attempt, so what carries the job is hora's
policy alone. Prints one
markdown table: fault rate | requests | faults injected | fit completes | seconds | time
against no faults.

``--dead``: instead, a Store on a dead endpoint (a loopback port nobody listens on), with
the storage options a user writes (no retry settings of s3fs's or botocore's), and
``HORA_STORE_RETRY_S`` set to ``--budget``: the seconds a write and a read take to fail,
against that budget (the Store's budget must be the only one: s3fs's and botocore's own
retries inside each of its attempts would multiply it).
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


def one(endpoint: str, fail: float, reset: float, pdf: pd.DataFrame, seed: int, strategy: str = "hora") -> dict:
    with FaultyProxy(endpoint, fail=fail, reset=reset, seed=seed) as proxy:
        # the options a user writes: the Store sets s3fs's and botocore's own retries to one attempt
        options = {"key": "testing", "secret": "testing", "anon": False,
                   "client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": "us-east-1"}}
        start = time.monotonic()
        ok, error = True, ""
        try:
            store = Store.create(f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}", **options)
            torch.manual_seed(0)
            net = torch.nn.Linear(8, 1)
            est = TorchEstimator(num_proc=2, backend="local", store=store, model=net,
                                 optimizer=torch.optim.SGD(net.parameters(), lr=0.05), loss=torch.nn.MSELoss(),
                                 feature_cols=["features"], label_cols=["y"], batch_size=256, epochs=3, verbose=0,
                                 strategy=strategy)
            model = est.fit(pdf)
            pred = model.predict(pdf.head(1000))
            assert len(pred) == 1000
        except Exception as exc:  # reported in the table (whole on stderr)
            ok, error = False, f"{type(exc).__name__}: {str(exc)[:120]}"
            print(f"fault rate {fail:.0%} + {reset:.0%}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        seconds = time.monotonic() - start
        counts = dict(proxy.counts)
    return {"fail": fail, "reset": reset, "requests": sum(counts.values()),
            "faults": counts["failed"] + counts["reset"], "ok": ok, "seconds": seconds, "error": error}


def dead_endpoint(budget: float) -> None:
    """Time to the error of a write and of a read on a Store whose endpoint does not answer: with the
    filesystems' own retries left as they are (what hora did before: their attempts inside each of the
    Store's) and set to one attempt (the Store's budget the only one), in the same run."""
    from hora.store import retry

    rows = []
    keep = retry.single_attempt, retry.single_attempt_options
    for inner in (True, False, True, False):
        if inner:
            retry.single_attempt, retry.single_attempt_options = (lambda fs: fs), (lambda protocol, o: dict(o))
        try:
            rows += [(inner, what, seconds) for what, seconds, _ in _dead_once(budget)]
        finally:
            retry.single_attempt, retry.single_attempt_options = keep
    print()
    print("| operation on a dead endpoint | s3fs/botocore retries | budget (HORA_STORE_RETRY_S) | seconds to the error "
          "| against the budget |")
    print("|---|---|---:|---:|---:|")
    for inner, what, seconds in rows:
        print(f"| {what} | {'their defaults (before)' if inner else 'one attempt (now)'} | {budget:g} s | "
              f"{seconds:.1f} | {seconds / budget:.2f} x |")


def _dead_once(budget: float) -> list[tuple[str, float, str]]:
    import socket

    from hora.errors import StoreError

    os.environ["HORA_STORE_RETRY_S"] = str(budget)
    with socket.socket() as probe:  # a free loopback port, closed again: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"}}
    store = Store.create(f"s3://{BUCKET}/dead-{uuid.uuid4().hex[:6]}", check_writable=False, **options)
    rows = []
    for what, op in (("write", lambda: store.write_bytes("runs/r/history.json", b"{}")),
                     ("read", lambda: store.read_bytes("runs/r/history.json"))):
        start = time.monotonic()
        try:
            op()
            error = "no error"
        except StoreError as exc:
            error = str(exc).splitlines()[0][:100]
        seconds = time.monotonic() - start
        rows.append((what, seconds, error))
        print(what, f"{seconds:.1f} s", error, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--strategy", default="hora", help="the estimator's strategy (fsdp: torch's distributed "
                                                       "checkpoint, written and read through the Store)")
    ap.add_argument("--dead", action="store_true", help="time to the error on a dead endpoint (see above)")
    ap.add_argument("--budget", type=float, default=20.0, help="HORA_STORE_RETRY_S for --dead")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.dead:
        dead_endpoint(args.budget)
        return
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
                rows.append(one(endpoint, fail, reset, pdf, args.seed, args.strategy))
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
