"""Elastic PyTorch training, the way Horovod's elastic MNIST program is written, on hora.

Run it with elastic ``hora run``: ranks may join and leave while it trains, and a lost
rank costs at most the batches since the last commit::

    echo -e "localhost:2\\n127.0.0.1:1" > hosts.txt     # what the discovery script prints
    printf '#!/bin/sh\\ncat hosts.txt\\n' > discover.sh && chmod +x discover.sh
    hora run --min-np 2 --max-np 3 --host-discovery-script ./discover.sh \\
        python examples/torch_mnist_elastic.py --epochs 3

The data are MNIST-shaped (1x28x28 images, 10 classes) and generated here, so the
program needs no download: each class is a fixed random stroke pattern plus noise. The
program is a migrated Horovod one: ``import hora.torch as hvd`` and nothing else changes
(``hvd.elastic.run``, ``TorchState``, ``ElasticSampler``, reset callbacks, commits).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data

import hora.torch as hvd

parser = argparse.ArgumentParser(description="elastic PyTorch training on MNIST-shaped data")
parser.add_argument("--batch-size", type=int, default=64, help="input batch size per rank (default 64)")
parser.add_argument("--test-batch-size", type=int, default=256, help="batch size of the test pass (default 256)")
parser.add_argument("--epochs", type=int, default=3, help="epochs to train (default 3)")
parser.add_argument("--lr", type=float, default=0.05, help="learning rate of one rank (default 0.05)")
parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum (default 0.5)")
parser.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
parser.add_argument("--log-interval", type=int, default=10, help="batches between progress lines (default 10)")
parser.add_argument("--batches-per-commit", type=int, default=1, help="batches between commits (default 1)")
parser.add_argument("--num-samples", type=int, default=4096, help="training images to generate (default 4096)")
parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression of the gradients")
parser.add_argument("--use-adasum", action="store_true", help="Adasum instead of averaging")
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(1)  # one CPU thread per rank


def mnist_shaped(n: int, seed: int) -> torch.utils.data.TensorDataset:
    """``n`` 1x28x28 images of 10 classes: a fixed random pattern per class, plus noise."""
    g = torch.Generator().manual_seed(1234)  # the patterns are the same for every split and rank
    patterns = (torch.rand(10, 1, 28, 28, generator=g) > 0.8).float()
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = patterns[labels] + 0.5 * torch.randn(n, 1, 28, 28, generator=g)
    return torch.utils.data.TensorDataset((images - 0.2) / 0.5, labels)


train_dataset = mnist_shaped(args.num_samples, seed=1)
test_dataset = mnist_shaped(1024, seed=2)
# ElasticSampler: after a reset it splits what is left of the epoch among the ranks there are now
train_sampler = hvd.elastic.ElasticSampler(train_dataset, shuffle=True, seed=args.seed)
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=5)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=5)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


model = Net()
lr_scaler = hvd.size() if not args.use_adasum else 1  # the learning rate grows with the ranks
optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)


def metric_average(value: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(value), name=name).item()


@hvd.elastic.run
def train(state):
    # after a reset, state.epoch and state.batch are those of the last commit
    for state.epoch in range(state.epoch, args.epochs + 1):
        state.model.train()
        for state.batch, (data, target) in enumerate(train_loader, start=state.batch):
            state.optimizer.zero_grad()
            loss = F.nll_loss(state.model(data), target)
            loss.backward()
            state.optimizer.step()
            state.train_sampler.record_batch(state.batch, args.batch_size)
            if state.batch % args.log_interval == 0:
                print(f"Train Epoch: {state.epoch} batch {state.batch} size {hvd.size()} rank {hvd.rank()}"
                      f"\tLoss: {loss.item():.6f}", flush=True)
            if (state.batch + 1) % args.batches_per_commit == 0:
                state.commit()
        state.batch = 0
        state.train_sampler.set_epoch(state.epoch + 1)
        state.commit()


def test() -> None:
    # partitioned for the ranks there are at the end (the job may have grown or shrunk)
    sampler = torch.utils.data.distributed.DistributedSampler(test_dataset, num_replicas=hvd.size(),
                                                              rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=sampler)
    model.eval()
    test_loss, correct, seen = 0.0, 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
            seen += len(target)
    test_loss = metric_average(test_loss / max(seen, 1), "avg_loss")
    accuracy = metric_average(correct / max(seen, 1), "avg_accuracy")
    if hvd.rank() == 0:
        print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * accuracy:.2f}%\n", flush=True)


def on_state_reset() -> None:
    # the job may have another number of ranks now: scale the learning rate again
    for group in optimizer.param_groups:
        group["lr"] = args.lr * (hvd.size() if not args.use_adasum else 1)
    print(f"reset: {hvd.size()} ranks, lr {optimizer.param_groups[0]['lr']:g}", flush=True)


state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=1, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
test()
hvd.shutdown()
