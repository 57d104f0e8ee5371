"""A training script for elastic ``hora run`` tests (run by hora run, not collected by pytest).

Every step allreduces a one per rank (so the sum is the job's size at that step), adds it
to ``state.total``, takes a real SGD step through DistributedOptimizer and commits. The
loop ends when every rank sees ``STOP_FILE`` (an allreduced flag, so all ranks stop at the
same step). Prints ``step=... size=... total=...`` for each step, ``reset size=...`` in the
reset callback, and ``done ...`` with the final state and a checksum of the weights.

    hora run ... python elastic_counter.py STOP_FILE [DELAY_S]
"""

import os
import sys
import time

import torch

import hora.torch as hvd

stop_file = sys.argv[1]
delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, optimizer, step=0, total=0.0)
first_step_seen = []


def on_reset():
    print(f"reset size={hvd.size()} rank={hvd.rank()}", flush=True)


state.register_reset_callbacks([on_reset])
x, y = torch.randn(32, 4), torch.randn(32, 1)


@hvd.elastic.run
def train(state):
    while True:
        size = float(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="counter.size")[0])
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(state.model(x), y).backward()
        optimizer.step()
        state.total += size
        state.step += 1
        if not first_step_seen:
            first_step_seen.append(state.step)
            print(f"first step={state.step} worker={os.environ.get('HORA_ELASTIC_WORKER')}", flush=True)
        print(f"step={state.step} size={int(size)} rank={hvd.rank()} total={state.total:g}", flush=True)
        stop = float(hvd.allreduce(torch.tensor([1.0 if os.path.exists(stop_file) else 0.0]), op=hvd.Max,
                                   name="counter.stop")[0])
        time.sleep(delay)
        state.commit()
        if stop:
            return


train(state)
checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
print(f"done rank={hvd.rank()} size={hvd.size()} step={state.step} total={state.total:g} weights={checksum:.10f}",
      flush=True)
hvd.shutdown()
