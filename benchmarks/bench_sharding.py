"""Sharded training strategies against replicated training, same run: speed and memory.

    python benchmarks/bench_sharding.py [--np 2] [--memory-np 4] [--steps 20] [--dim 768] [--layers 12]
                                        [--vocab 40000] [--seq 64] [--batch 2] [--device cpu|cuda]
    python benchmarks/bench_sharding.py --model mlp [--dim 2048] [--layers 8] ...   # 8 x Linear(2048, 2048)

The model is a GPT-like causal transformer built from a config (``--layers`` pre-norm blocks of
``--dim`` with ``--heads`` heads, token and position embeddings, an untied head over ``--vocab``;
146M parameters at the defaults), AdamW, fp32, ``--batch`` sequences of ``--seq`` tokens per
rank, so activations do not dominate. Each strategy runs through the code ``TorchEstimator``
uses (:func:`hora.estimators.frameworks.torch.strategies.prepare`), in fresh processes:

* ``hora``: replicated, hora's DistributedOptimizer (the baseline);
* ``zero1`` / ``zero2``: the same with ``sharding="optimizer"`` / ``"gradients"``;
* ``ddp``: torch's DistributedDataParallel on the group ``hora.torch.init_process_group()`` makes;
* ``fsdp``: FSDP2's ``fully_shard`` on it (each block one unit).

Per configuration it reports, per rank (the largest over the ranks):

* peak memory: the process's peak RSS (``VmHWM``) minus its RSS just before the model was built
  (with the code every strategy runs already loaded, :func:`load_code`; glibc gives blocks
  over 128 KiB back at once, :func:`glibc_gives_back`, so a freed buffer does not count
  twice), against ``hora``'s, next to the floor for fp32 AdamW (16 bytes a parameter
  replicated): zero1 ``(4 + 4 + 8/N) / 16``, zero2 ``(4 + 12/N) / 16``, fsdp ``1/N``; on CUDA
  also ``torch.cuda.max_memory_allocated``; and the same peak by phase (building the model and
  preparing the strategy, forward, backward, optimizer step) and at rest after the last step;
* the loss of the last step (the mean over the ranks' batches) against ``hora``'s: the same
  seeds and batches give the same training, to fp32 rounding;
* step time (median of the steps after the first two, rank 0, between barriers) against
  ``hora``'s of the same run.

With ``--memory-np`` (default 4; 0 skips it), ``hora`` and ``fsdp`` run again at that many
ranks (oversubscribed on a small machine: memory only, a few steps).

``--model mlp``: ``--layers`` x ``Linear(--dim, --dim)`` with ReLUs between (33.6M parameters
at ``--dim 2048 --layers 8``: buckets of one or two layers, where the parameter gather's and
the reduce-scatter's buffers are a larger part of the model than in the transformer), on
``--batch`` random rows against a random target (mean squared error).
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

STRATEGIES = ("hora", "zero1", "zero2", "ddp", "fsdp")
PHASES = ("build", "forward", "backward", "step")
WARMUP = 2


def _rss(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def glibc_gives_back() -> None:
    """Tell this process's glibc to serve every block over 128 KiB by ``mmap`` and to return
    freed heap tops over 128 KiB at once, so that a freed buffer leaves the RSS (and a later
    one does not reuse its pages unseen). ``mallopt`` rather than ``MALLOC_MMAP_THRESHOLD_``
    in the environment: glibc reads that when the process starts, and a rank's environment
    is set after its interpreter has started (the variables never reached glibc: its
    threshold then rises with every freed block up to 32 MiB, and whatever was freed below it
    stays in the heap)."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    if libc.mallopt(-3, 128 * 1024) != 1 or libc.mallopt(-1, 128 * 1024) != 1:  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
        raise RuntimeError("mallopt failed")


def load_code() -> None:
    """Load what every strategy runs before the RSS "before the model" is read: the modules
    (hora's optimizers and strategies, torch's FSDP) and what ``torch.optim`` imports at its
    first optimizer and step: ~80 MiB of code and interpreter state, the same at any model
    size, which would otherwise count as the first strategy-dependent allocations."""
    import importlib

    import torch

    for module in ("torch.distributed.fsdp", "hora.estimators.frameworks.torch.strategies", "hora.torch.sharded_optimizer"):
        importlib.import_module(module)
    w = torch.zeros(1, requires_grad=True)
    w.grad = torch.zeros(1)
    torch.optim.AdamW([w]).step()


class PhasePeaks:
    """The peak RSS of each phase of a step, above the RSS before the model was built
    (``VmHWM`` reset at each phase's start through ``/proc/self/clear_refs``), the largest over
    the steps."""

    def __init__(self, before: int) -> None:
        self.before = before
        self.peaks: dict[str, int] = {}
        self.reset()

    @staticmethod
    def reset() -> None:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")

    def end(self, phase: str) -> None:
        self.peaks[phase] = max(self.peaks.get(phase, 0), _rss("VmHWM") - self.before)
        self.reset()


def build_model(dim: int, layers: int, heads: int, vocab: int, seq: int) -> Any:
    import torch
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
            self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                           torch.nn.Linear(4 * dim, dim))

        def forward(self, x: Any) -> Any:
            n, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
            q, k, v = (z.view(n, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(n, t, d))
            return x + self.mlp(self.norm2(x))

    class GPT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(seq, dim)
            self.blocks = torch.nn.ModuleList([Block() for _ in range(layers)])
            self.norm, self.head = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, vocab)

        def forward(self, ids: Any) -> Any:
            x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return GPT()


def build_mlp(dim: int, layers: int) -> Any:
    import torch

    blocks: list[Any] = []
    for i in range(layers):
        blocks.append(torch.nn.Linear(dim, dim))
        if i < layers - 1:
            blocks.append(torch.nn.ReLU())
    return torch.nn.Sequential(*blocks)


def rank_main(strategy: str, cfg: dict[str, Any], steps: int, device: str) -> dict[str, Any]:
    glibc_gives_back()
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    import hora.torch as hvd
    from hora.estimators.frameworks.torch import strategies as torch_strategies

    hvd.init()
    try:
        dev = torch.device("cuda", hvd.local_rank()) if device == "cuda" else torch.device("cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        load_code()
        before = _rss("VmRSS")
        phases = PhasePeaks(before)
        cuda_before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
        torch.manual_seed(0)
        mlp = cfg.get("model") == "mlp"
        model = (build_mlp(cfg["dim"], cfg["layers"]) if mlp else
                 build_model(cfg["dim"], cfg["layers"], cfg["heads"], cfg["vocab"], cfg["seq"])).to(dev)
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        module, opt = torch_strategies.prepare(strategy, hvd, model, opt, {})
        if strategy not in ("ddp", "fsdp"):
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        phases.end("build")
        gen = torch.Generator().manual_seed(1 + hvd.rank())
        times, loss = [], None
        for _ in range(steps):
            if mlp:
                x = torch.randn(cfg["batch"], cfg["dim"], generator=gen).to(dev)
                y = torch.randn(cfg["batch"], cfg["dim"], generator=gen).to(dev)
            else:
                ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=gen).to(dev)
            hvd.barrier()
            t = time.perf_counter()
            phases.reset()
            opt.zero_grad()
            if mlp:
                logits = module(x)
                loss = F.mse_loss(logits, y)
            else:
                logits = module(ids[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            phases.end("forward")
            loss.backward()
            del logits
            phases.end("backward")
            opt.step()
            phases.end("step")
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t)
        hvd.barrier()
        rest = _rss("VmRSS") - before
        peak = max(phases.peaks.values())
        cuda_peak = (torch.cuda.max_memory_allocated(dev) - cuda_before) if dev.type == "cuda" else 0
        mean_loss = float(hvd.allreduce(loss.detach().cpu().reshape(1), name="bench.loss"))
        return {"peak": peak, "phases": phases.peaks, "rest": rest, "cuda_peak": cuda_peak, "params": params,
                "loss": mean_loss,
                "step": statistics.median(times[WARMUP:]) if len(times) > WARMUP else statistics.median(times)}
    finally:
        hvd.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("transformer", "mlp"), default="transformer")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--memory-np", type=int, default=4)
    ap.add_argument("--memory-steps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=40000)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = ap.parse_args()
    cfg = {k: getattr(a, k) for k in ("model", "dim", "layers", "heads", "vocab", "seq", "batch")}
    names = [s for s in a.strategies.split(",") if s]
    if names[0] != "hora":
        raise SystemExit("--strategies must start with hora (the baseline)")
    print(f"# {machine_note()}; {a.np} ranks, transformer {cfg}, AdamW, fp32, {a.device}, {a.steps} steps",
          flush=True)
    runs: dict[tuple[str, int], list[dict]] = {}
    plan = [(s, a.np, a.steps) for s in names]
    if a.memory_np:
        plan += [(s, a.memory_np, a.memory_steps) for s in ("hora", "fsdp") if s in names]
    for name, n, steps in plan:
        t0 = time.monotonic()
        runs[(name, n)] = run_local(rank_main, n, args=(name, cfg, steps, a.device), timeout=3000)
        r = runs[(name, n)]
        print(f"{name} x{n}: peak {max(x['peak'] for x in r) / 2**20:.0f} MiB, step {r[0]['step'] * 1e3:.0f} ms, "
              f"loss {r[0]['loss']:.6f} ({time.monotonic() - t0:.0f} s)", flush=True)
    params = runs[("hora", a.np)][0]["params"]
    rows = []
    for (name, n), r in runs.items():
        base = runs[("hora", n)]
        peak, base_peak = max(x["peak"] for x in r), max(x["peak"] for x in base)
        floor = {"hora": 1.0, "ddp": 1.0, "zero1": (8 + 8 / n) / 16, "zero2": (4 + 12 / n) / 16, "fsdp": 1 / n}[name]
        same_steps = n == a.np
        row = [name, str(n), f"{peak / 2**20:.0f}", f"{peak / base_peak:.3f}", f"{floor:.3f}",
               f"{r[0]['step'] * 1e3:.0f}" if same_steps else "-",
               f"{r[0]['step'] / base[0]['step']:.2f}" if same_steps else "-",
               f"{r[0]['loss']:.6f}", f"{abs(r[0]['loss'] / base[0]['loss'] - 1):.1e}"]
        if a.device == "cuda":
            cuda, cuda_base = max(x["cuda_peak"] for x in r), max(x["cuda_peak"] for x in base)
            row += [f"{cuda / 2**20:.0f}", f"{cuda / cuda_base:.3f}"]
        rows.append(tuple(row))
    header = ("strategy", "ranks", "peak MiB/rank", "x hora", "floor", "step ms", "step x hora", "last loss",
              "rel. diff from hora")
    if a.device == "cuda":
        header += ("cuda peak MiB", "x hora")
    print(f"\n{params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MiB fp32); load {load_now()}")
    print(table(rows, header))
    print("\nPeak MiB above the RSS before the model, by phase (the largest over the steps and ranks); "
          "at rest: after the last step")
    rows = [(name, str(n), *(f"{max(x['phases'][ph] for x in r) / 2**20:.0f}" for ph in PHASES),
             f"{max(x['rest'] for x in r) / 2**20:.0f}") for (name, n), r in runs.items()]
    print(table(rows, ("strategy", "ranks", "build + prepare", "forward", "backward", "optimizer step", "at rest")))


if __name__ == "__main__":
    main()
