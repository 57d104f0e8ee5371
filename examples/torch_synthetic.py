"""Train a small MLP classifier data-parallel with hora's Horovod-style torch API.

    hora run -np 2 python examples/torch_synthetic.py [--epochs 8]

Every rank builds the same synthetic classification problem (seeded), trains on its own
shard of it, and averages gradients with ``DistributedOptimizer``. Rank 0 prints the
loss of every epoch (averaged over ranks). At the end the script checks that the loss
went down and that the final weights are bit-identical on every rank (each rank's
SHA-256 of its weights, allgathered), and exits non-zero when either check fails.
Runs alone too (``python examples/torch_synthetic.py``: one rank).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import torch

import hora.torch as hvd

FEATURES, CLASSES, SAMPLES = 20, 4, 8192


def make_dataset(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels from a fixed random teacher network, so there is something to learn."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w1 = torch.randn(FEATURES, 32, generator=g)
    w2 = torch.randn(32, CLASSES, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return x, y


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, CLASSES),
    )


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    x, y = make_dataset()
    x, y = x[rank::size], y[rank::size]  # this rank's shard
    steps = (SAMPLES // size) // args.batch_size  # the same number of steps on every rank

    torch.manual_seed(1234 + rank)  # different initial weights per rank on purpose...
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # ...which rank 0's replace
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    loss_fn = torch.nn.CrossEntropyLoss()

    losses = []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(epoch * 1000 + rank))
        total = torch.zeros(1, dtype=torch.float64)
        for step in range(steps):
            idx = order[step * args.batch_size : (step + 1) * args.batch_size]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.detach().double()
        epoch_loss = hvd.allreduce(total / steps, op=hvd.Average, name="epoch_loss").item()
        losses.append(epoch_loss)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {epoch_loss:.4f}", flush=True)

    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).double().mean().reshape(1)
    accuracy = hvd.allreduce(accuracy, op=hvd.Average, name="accuracy").item()
    digests = hvd.allgather_object(weights_digest(model))
    elapsed = time.perf_counter() - start
    hvd.shutdown()

    ok = True
    if rank == 0:
        print(f"{size} rank(s), {args.epochs} epochs in {elapsed:.1f}s, train accuracy {accuracy:.3f}", flush=True)
    if not losses[-1] < 0.8 * losses[0]:
        print(f"rank {rank}: FAIL loss did not decrease enough: {losses[0]:.4f} -> {losses[-1]:.4f}",
              file=sys.stderr, flush=True)
        ok = False
    if len(set(digests)) != 1:
        print(f"rank {rank}: FAIL final weights differ across ranks: "
              + ", ".join(f"rank {r}: {d[:12]}" for r, d in enumerate(digests)), file=sys.stderr, flush=True)
        ok = False
    if ok and rank == 0:
        print(f"OK: loss {losses[0]:.4f} -> {losses[-1]:.4f}; weights identical on all {size} ranks "
              f"(sha256 {digests[0][:12]})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
