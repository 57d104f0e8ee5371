#!/usr/bin/env bash
# The wheel carries everything: build it, install it (not editable) with hora[torch,dask] into a fresh
# venv, and from outside the source tree run a 2-rank Dask fit and `hora run -np 2`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/hora-wheel-smoke.XXXXXX)
trap 'rm -rf "$work"' EXIT
python=${PYTHON:-python3}

"$root/.venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$root"
wheel=$(ls "$work"/dist/hora-*.whl)
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip install -q -c "$root/constraints.txt" torch==2.13.0
"$work/venv/bin/python" -m pip install -q -c "$root/constraints.txt" "hora[torch,dask] @ file://$wheel"

cd "$work"  # nothing of the source tree on sys.path
cat > smoke_fit.py <<'PY'
import numpy as np
import pandas as pd
import torch
import dask.dataframe as dd
from distributed import Client, LocalCluster

import hora
from hora.dask import TorchEstimator
from hora.store import Store

if __name__ == "__main__":
    assert "site-packages" in hora.__file__, hora.__file__
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype("float32")
    pdf = pd.DataFrame({"features": list(x), "y": x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32")})
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster):
        net = torch.nn.Linear(4, 1)
        est = TorchEstimator(num_proc=2, store=Store.create("file:///tmp/hora-wheel-smoke-store"), model=net,
                             optimizer=torch.optim.SGD(net.parameters(), lr=0.05), loss=torch.nn.MSELoss(),
                             feature_cols=["features"], label_cols=["y"], batch_size=32, epochs=3, verbose=0)
        model = est.fit(dd.from_pandas(pdf, npartitions=2))
        pred = model.predict(dd.from_pandas(pdf.head(8), npartitions=1)).compute()
        assert len(pred) == 8
    print("wheel smoke: dask fit ok, final loss", model.history_[-1]["loss"])
PY
"$work/venv/bin/python" smoke_fit.py
"$work/venv/bin/hora" --version
PATH="$work/venv/bin:$PATH" "$work/venv/bin/hora" run -np 2 python -c \
  "import hora.torch as hvd, torch; hvd.init(); t = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum, name='s'); assert t.tolist() == [3.0, 3.0, 3.0], t; print('rank', hvd.rank(), 'ok')"
rm -rf /tmp/hora-wheel-smoke-store
echo "wheel smoke: passed"
