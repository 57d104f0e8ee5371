"""Sharded optimizer (ZeRO-1 / ZeRO-2) against the unsharded DistributedOptimizer, same run.

    python benchmarks/bench_sharded_optimizer.py [--np 2] [--width 1024] [--depth 24]
                                                 [--steps 12] [--rounds 2] [--device cpu|cuda]

The model is a stack of ``--depth`` ``Linear(width, width)`` layers (+GELU; 25M
parameters at the defaults), AdamW, fp32, batch 8 rows per rank so activations do not
dominate. Each configuration (``none``: the unsharded DistributedOptimizer; ``zero1``:
``sharding="optimizer"``; ``zero2``: ``sharding="gradients"``) runs in fresh processes,
``--rounds`` times, interleaved. Per rank it reports:

* optimizer-state bytes (every tensor in ``opt.state``), against ``none``'s (goal ~1/N);
* peak memory: the process's peak RSS (``VmHWM``) minus its RSS just before the model was
  built (glibc is told to give blocks over 128 KiB back to the system at once,
  ``bench_sharding.glibc_gives_back``, so freed buffers do not count twice), and on CUDA
  ``torch.cuda.max_memory_allocated``; against ``none``'s, next to the floor of the
  issue (16 bytes a parameter replicated: zero1 ``(4 + 4 + 8/N) / 16``, zero2
  ``(4 + 12/N) / 16``);
* step time (median over the measured steps, rank 0, between barriers), against
  ``none``'s of the same round;
* the largest difference of the final weights from ``none``'s (same seed and batches).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_now, machine_note, run_local, table  # noqa: E402
from bench_sharding import glibc_gives_back  # noqa: E402

CONFIGS = {"none": None, "zero1": "optimizer", "zero2": "gradients"}
BATCH = 8


def _rss(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def rank_main(sharding: str | None, width: int, depth: int, steps: int, warmup: int, device: str) -> dict[str, Any]:
    glibc_gives_back()
    import torch

    torch.set_num_threads(1)
    import hora.torch as hvd

    hvd.init()
    try:
        dev = torch.device("cuda", hvd.local_rank()) if device == "cuda" else torch.device("cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        before = _rss("VmRSS")
        cuda_before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
        torch.manual_seed(0)
        layers: list[Any] = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers).to(dev)
        opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-4),
                                       named_parameters=model.named_parameters(), sharding=sharding)
        gen = torch.Generator().manual_seed(1 + hvd.rank())
        times = []
        for step in range(warmup + steps):
            x = torch.randn(BATCH, width, generator=gen).to(dev)
            hvd.barrier()
            t = time.perf_counter()
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t)
        hvd.barrier()
        state = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                    if isinstance(v, torch.Tensor))
        params = sum(p.numel() for p in model.parameters())
        flat = torch.cat([p.detach().reshape(-1)[::997].cpu() for p in model.parameters()])
        return {"state": state, "peak": _rss("VmHWM") - before, "params": params,
                "cuda_peak": (torch.cuda.max_memory_allocated(dev) - cuda_before) if dev.type == "cuda" else 0,
                "step": statistics.median(times[warmup:]), "sample": flat}
    finally:
        hvd.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = ap.parse_args()
    runs: dict[str, list[list[dict]]] = {name: [] for name in CONFIGS}
    print(f"# {machine_note()}; {a.np} ranks, {a.depth} x Linear({a.width}, {a.width}), AdamW, fp32, "
          f"{a.device}, batch {BATCH}/rank, {a.steps} steps after {a.warmup}", flush=True)
    for r in range(a.rounds):
        for name, sharding in CONFIGS.items():
            runs[name].append(run_local(rank_main, a.np, args=(sharding, a.width, a.depth, a.steps, a.warmup,
                                                               a.device), timeout=900))
            print(f"round {r} {name}: step {runs[name][-1][0]['step'] * 1e3:.1f} ms", flush=True)
    n = a.np
    floor = {"none": 1.0, "zero1": (8 + 8 / n) / 16, "zero2": (4 + 12 / n) / 16}
    base = runs["none"]
    params = base[0][0]["params"]
    rows = []
    for name in CONFIGS:
        rs = runs[name]
        state = max(rk["state"] for rk in rs[0])
        peak = statistics.median(max(rk["peak"] for rk in rnd) for rnd in rs)
        base_peak = statistics.median(max(rk["peak"] for rk in rnd) for rnd in base)
        ratio = statistics.median(rnd[0]["step"] / b[0]["step"] for rnd, b in zip(rs, base))
        diff = max(float((rnd[0]["sample"] - b[0]["sample"]).abs().max()) for rnd, b in zip(rs, base))
        row = [name, f"{state / 2**20:.1f}", f"{state / max(rk['state'] for rk in base[0]):.3f}",
               f"{peak / 2**20:.0f}", f"{peak / base_peak:.3f}", f"{floor[name]:.3f}",
               f"{statistics.median(rnd[0]['step'] for rnd in rs) * 1e3:.1f}", f"{ratio:.2f}", f"{diff:.1e}"]
        if a.device == "cuda":
            cuda = statistics.median(max(rk["cuda_peak"] for rk in rnd) for rnd in rs)
            cuda_base = statistics.median(max(rk["cuda_peak"] for rk in rnd) for rnd in base)
            row += [f"{cuda / 2**20:.0f}", f"{cuda / cuda_base:.3f}"]
        rows.append(tuple(row))
    header = ("config", "state MiB/rank", "x none", "peak MiB/rank", "x none", "floor", "step ms",
              "step x none", "max |w - none|")
    if a.device == "cuda":
        header += ("cuda peak MiB", "x none")
    print(f"\n{params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MiB fp32); load {load_now()}")
    print(table(rows, header))


if __name__ == "__main__":
    main()
