#!/usr/bin/env bash
# Runs hora's GPU checks on a GPU machine, within ~8 minutes.
#
# Prepare here (network), before carrying the tree to the GPU machine (wheels are NOT committed):
#   .venv/bin/pip wheel --no-deps -w benchmarks/gpu_wheels .
#   .venv/bin/pip download --no-deps -d benchmarks/gpu_wheels -c constraints.txt --python-version 3.12 \
#       --only-binary=:all: dask distributed toolz partd locket msgpack sortedcontainers tblib zict tornado \
#       click pyyaml psutil pytest-timeout
# On the GPU machine (Python 3.12, CUDA torch 2.11, no network, no pyspark):
#   bash benchmarks/gpu_check.sh            # writes gpu_check.json; exit code non-zero if a check failed
# Dry run on CPU: PYTHON=.venv/bin/python DEVICE=cpu OUT=/tmp bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [ -d benchmarks/gpu_wheels ]; then
    "$PY" -m pip install --no-deps --no-index --find-links benchmarks/gpu_wheels benchmarks/gpu_wheels/*.whl
fi
"$PY" -c "import torch, hora; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
status=0
# the gpu-marked tests (gpu_check.py itself runs once, below)
timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu -k "not test_gpu_check_on_cuda" tests/gpu || status=$?
timeout 360 "$PY" benchmarks/gpu_check.py --device "${DEVICE:-cuda}" --out "${OUT:-.}/gpu_check.json" || status=$?
exit $status
