"""Test-wide settings: quiet, single-threaded workers, and the Python that Spark should use."""

from __future__ import annotations

import os
import sys

# Workers spawned by tests inherit these: one thread per rank on a 2-core machine,
# Spark's Python workers run this interpreter, TensorFlow keeps quiet.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
