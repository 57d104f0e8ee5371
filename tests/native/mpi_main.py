"""Entry point run under ``mpiexec -n N python -m tests.native.mpi_main``: each rank writes its
results as JSON to ``$HORA_TEST_RESULT_DIR/rank<r>.json`` (ranks that print at the same moment
can interleave their lines on mpiexec's shared stdout)."""

from __future__ import annotations

import json
import os
import sys

from tests.native import workers


def stuck() -> None:
    """Rank 0 allreduces, rank 1 waits in a barrier, rank 2 never joins: the watchdog
    (HORA_COLLECTIVE_TIMEOUT) must name rank 2 and abort the job."""
    import time

    import torch

    from hora.native.backends import create_backend
    from hora.native.backends.base import ReduceOp

    be, _, _ = create_backend()
    if be.rank == 0:
        be.allreduce(torch.ones(4), ReduceOp.Sum, be.world)
    elif be.rank == 1:
        be.barrier(be.world)
    time.sleep(120)


def main() -> None:
    import hora.native as hn

    if os.environ.get("HORA_TEST_MPI_MODE") == "stuck":
        stuck()
        return

    out: dict = {}
    out["dtypes"] = workers.all_ops_all_dtypes()
    out["numpy"] = workers.all_ops_all_dtypes(True)
    a = workers.async_objects_compression()
    out["async"] = a["fails"]
    out["mismatch"] = [m for m in workers.mismatches() if m.startswith("NO ")]
    out["ooo"] = workers.out_of_order(30)["ok"]
    out["fused"] = workers.fused_vs_unfused()
    hn.init()
    out["backend"] = hn.backend_name()
    out["rank"], out["size"] = hn.rank(), hn.size()
    out["local"] = (hn.local_rank(), hn.local_size(), hn.cross_rank(), hn.cross_size())
    hn.shutdown()
    path = os.path.join(os.environ["HORA_TEST_RESULT_DIR"], f"rank{out['rank']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
    sys.exit(0)
