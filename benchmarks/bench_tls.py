"""What TLS on the control plane costs a run's start: ``hora.runners.run`` of a function that
returns at once, with and without ``tls=True``, interleaved in the same process, plus the parts
(the certificate the driver makes per attempt, one client's connect + handshake + ping).

    python benchmarks/bench_tls.py [--repeats 7] [-n 2] [--fit]

``--fit`` adds a local fit (``hora.dask.TorchEstimator`` on a pandas frame of 256 rows, one
epoch, the data materialized once before) with ``HORA_TLS`` 0 and 1: what TLS costs a fit's
fixed part, through the setting every estimator reads.

Prints a markdown table: the median of ``--repeats`` runs of each (after one warm-up run of
each), the difference TLS - plain against the goal (<= 0.2 s on a run's fixed costs), and the
ratio. Collectives do not move: they stay on Gloo, NCCL or shared memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import load_now, machine_note, table  # noqa: E402

GOAL_S = 0.2


def _ready() -> int:
    import hora.native as hn

    return hn.rank()  # init() ran before: the ranks met at the rendezvous (over TLS or not)


def _run(n: int, tls: bool) -> float:
    import hora.runners as hr

    t = time.perf_counter()
    out = hr.run(_ready, num_proc=n, verbose=0, tls=tls, env={"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    took = time.perf_counter() - t
    assert out == list(range(n)), out
    return took


def _fit_once(store: object, frame: object, n: int, tls: bool) -> float:
    import torch

    from hora.dask import TorchEstimator

    os.environ["HORA_TLS"] = "1" if tls else "0"
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    est = TorchEstimator(num_proc=n, store=store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.05),
                         loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"], batch_size=32,
                         epochs=1, random_seed=0, verbose=0)
    t = time.perf_counter()
    est.fit(frame)
    return time.perf_counter() - t


def _fits(n: int, repeats: int) -> tuple[float, float]:
    import tempfile

    import numpy as np
    import pandas as pd

    from hora.store import Store

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    frame = pd.DataFrame({"features": list(x), "y": (x @ np.arange(1, 5, dtype="float32")).astype("float32")})
    store = Store.create(tempfile.mkdtemp(prefix="hora-bench-tls-"))
    before = os.environ.get("HORA_TLS")
    try:
        _fit_once(store, frame, n, False), _fit_once(store, frame, n, True)  # materialize, warm up
        plain, tls = [], []
        for _ in range(repeats):
            plain.append(_fit_once(store, frame, n, False))
            tls.append(_fit_once(store, frame, n, True))
    finally:
        if before is None:
            os.environ.pop("HORA_TLS", None)
        else:
            os.environ["HORA_TLS"] = before
    return statistics.median(plain), statistics.median(tls)


def _connect_ping(tls: bool, repeats: int) -> float:
    from hora.native.rendezvous import tls as tls_mod
    from hora.native.rendezvous import KVClient, RendezvousServer, make_secret

    secret = make_secret()
    cert = tls_mod.make_job_certificate("bench-tls") if tls else None
    times = []
    with RendezvousServer(secret, tls=cert) as server:
        if cert is not None:
            tls_mod.register(secret, cert.pin())
        try:
            for _ in range(repeats + 1):
                t = time.perf_counter()
                client = KVClient(server.addr, secret, timeout=10)
                client.ping()
                times.append(time.perf_counter() - t)
                client.close()
        finally:
            tls_mod.forget(secret)
    return statistics.median(times[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("-n", "--num-proc", type=int, default=2)
    parser.add_argument("--fit", action="store_true", help="also a local fit with HORA_TLS 0 and 1")
    args = parser.parse_args()
    from hora.native.rendezvous import tls as tls_mod

    note = machine_note()
    t = time.perf_counter()
    tls_mod.make_job_certificate("warm-up")  # the import of cryptography, once per driver process
    first_cert = time.perf_counter() - t
    certs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        tls_mod.make_job_certificate("bench-tls")
        certs.append(time.perf_counter() - t)
    plain_ping, tls_ping = _connect_ping(False, args.repeats), _connect_ping(True, args.repeats)
    _run(args.num_proc, False), _run(args.num_proc, True)  # warm-up: imports, the warm rank server
    plain, tls = [], []
    for _ in range(args.repeats):  # interleaved, so a change of the machine's load hits both
        plain.append(_run(args.num_proc, False))
        tls.append(_run(args.num_proc, True))
    p, s = statistics.median(plain), statistics.median(tls)
    rows = [
        ("certificate per attempt (EC P-256)", "-", f"{statistics.median(certs) * 1e3:.1f} ms "
         f"(first, with the import: {first_cert * 1e3:.0f} ms)", "-", "-"),
        ("one client: connect + ping", f"{plain_ping * 1e3:.2f} ms", f"{tls_ping * 1e3:.2f} ms",
         f"{(tls_ping - plain_ping) * 1e3:+.2f} ms", f"{tls_ping / plain_ping:.2f} x"),
        (f"run start to end, {args.num_proc} local ranks (median of {args.repeats})", f"{p:.3f} s", f"{s:.3f} s",
         f"{s - p:+.3f} s (goal <= +{GOAL_S} s: {'met' if s - p <= GOAL_S else 'NOT met'})", f"{s / p:.2f} x"),
    ]
    if args.fit:
        fp, fs = _fits(args.num_proc, args.repeats)
        rows.append((f"local fit, {args.num_proc} ranks, 256 rows, 1 epoch (median of {args.repeats})", f"{fp:.3f} s",
                     f"{fs:.3f} s", f"{fs - fp:+.3f} s (goal <= +{GOAL_S} s: {'met' if fs - fp <= GOAL_S else 'NOT met'})",
                     f"{fs / fp:.2f} x"))
    print(f"TLS on the control plane; {note}; load {load_now()} at the end; "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}\n")
    print(table(rows, ("measure", "plain", "TLS", "TLS - plain", "ratio")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
