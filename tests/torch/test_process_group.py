"""torch.distributed's default group inside hora ranks (hora.torch.init_process_group): DDP,
FSDP2's fully_shard and a torchmetrics metric's cross-rank compute under ``hora run -np 2``,
idempotence, and a new group after shutdown and init."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = r'''
import sys
import torch
import torch.distributed as dist
import hora.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert not dist.is_initialized()  # nothing unless asked for
group = hvd.init_process_group()
assert hvd.init_process_group() is group  # idempotent
assert dist.get_rank() == rank and dist.get_world_size() == size

# torch's own collectives on the default group
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == sum(range(1, size + 1)), t

# DistributedDataParallel: ranks see different data, end with the same weights, equal to one
# process training on the averaged gradients
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
reference.load_state_dict(net.state_dict())
ddp = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(7)
for step in range(3):
    xs = [torch.randn(8, 4, generator=gen) for _ in range(size)]
    ys = [x.sum(dim=1, keepdim=True) for x in xs]
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(xs[rank]), ys[rank]).backward()
    opt.step()
    ref_opt.zero_grad()
    (sum(torch.nn.functional.mse_loss(reference(x), y) for x, y in zip(xs, ys)) / size).backward()
    ref_opt.step()
for p, q in zip(net.parameters(), reference.parameters()):
    assert torch.allclose(p, q, atol=1e-6), (p, q)
gathered = hvd.allgather(torch.cat([p.detach().flatten() for p in net.parameters()]).unsqueeze(0), name="w")
assert torch.equal(gathered[0], gathered[1])

# FSDP2: parameters sharded across the ranks, the same training result as replicated
from torch.distributed.fsdp import fully_shard
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
replica = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
replica.load_state_dict(model.state_dict())
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
local = sum(p.to_local().numel() for p in model.parameters())
full = sum(p.numel() for p in replica.parameters())
assert local < full, (local, full)  # each rank holds a shard
f_opt = torch.optim.Adam(model.parameters(), lr=0.01)
r_opt = torch.optim.Adam(replica.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(3)
for step in range(3):
    xs = [torch.randn(4, 6, generator=gen) for _ in range(size)]
    f_opt.zero_grad()
    model(xs[rank]).square().mean().backward()
    f_opt.step()
    r_opt.zero_grad()
    (sum(replica(x).square().mean() for x in xs) / size).backward()
    r_opt.step()
for p, q in zip(model.parameters(), replica.parameters()):
    assert torch.allclose(p.full_tensor(), q, atol=1e-5), "FSDP2 diverged from the replicated run"

# torchmetrics syncs over the default group
import torchmetrics
metric = torchmetrics.MeanMetric()
metric.update(torch.tensor([float(rank)] * (rank + 1)))
expected = sum(r * (r + 1) for r in range(size)) / sum(r + 1 for r in range(size))
assert abs(metric.compute().item() - expected) < 1e-6, metric.compute()

# a new hora init gets a new group over its own Store
hvd.shutdown()
hvd.init()
again = hvd.init_process_group()
t = torch.tensor([1.0])
dist.all_reduce(t)
assert t.item() == size
print("rank", rank, "process group ok")
'''


@pytest.mark.timeout(240)
def test_ddp_fsdp_and_torchmetrics_under_hora_run(tmp_path):
    pytest.importorskip("torchmetrics")
    script = tmp_path / "pg.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    res = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "2", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=230, env=env)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert res.stdout.count("process group ok") == 2, res.stdout


def test_init_process_group_needs_hora_init():
    import hora.torch as hvd
    from hora.errors import NotInitializedError

    if hvd.is_initialized():
        pytest.skip("hora is initialized in this test process")
    with pytest.raises(NotInitializedError, match="needs hora.torch.init"):
        hvd.init_process_group()


@pytest.mark.timeout(120)
def test_fsdp_of_a_cpu_model_shards_over_the_cpu_mesh_on_a_host_with_an_accelerator():
    """Found on a GPU host: ``strategy="fsdp"`` with a CPU model took FSDP2's default mesh (the
    machine's accelerator, CUDA) and failed in NCCL ('Duplicate GPU detected')."""
    from tests.spawn_util import run_ranks
    from tests.torch import workers as W

    outs = run_ranks(W.fsdp_cpu_model_on_an_accelerator_host, 2, timeout=110)
    assert [types for types, _ in outs] == [{"cpu"}, {"cpu"}]
    assert all(loss == loss and loss < 10 for _, loss in outs)  # finite: the steps ran
