"""Train a LightningModule data-parallel with hora's Lightning strategy.

    hora run -np 2 python examples/lightning_synthetic.py [--epochs 4] [--package pytorch_lightning]

Every rank builds the same synthetic classification problem; Lightning's DistributedSampler
(fed hora's rank and size) gives each rank its share of every epoch, and
``Trainer(strategy=hora.lightning.Strategy())`` averages the gradients through hora.
The training loss and accuracy are logged with ``sync_dist=True`` (averaged over the ranks
through hora) and rank 0 prints them once per epoch. Rank 0 writes the checkpoints (in
``--ckpt-dir``, a temporary directory by default); a second ``fit`` resumes from the last
one for two more epochs. At the end the script checks that the loss went down and that the
weights are bit-identical on every rank, and exits non-zero when either check fails.
Runs alone too (``python examples/lightning_synthetic.py``: one rank).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import shutil
import sys
import tempfile

import torch

import hora.lightning
import hora.torch as hvd

FEATURES, CLASSES, SAMPLES = 20, 4, 4096


def make_dataset(seed: int = 0) -> torch.utils.data.TensorDataset:
    """Labels from a fixed random teacher network, so there is something to learn."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = (torch.tanh(x @ torch.randn(FEATURES, 32, generator=g)) @ torch.randn(32, CLASSES, generator=g)).argmax(1)
    return torch.utils.data.TensorDataset(x, y)


def build(pl):  # noqa: ANN001, ANN201 - the classes are built on the chosen Lightning package
    class Classifier(pl.LightningModule):
        def __init__(self, lr: float) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
                                           torch.nn.Linear(64, CLASSES))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            x, y = batch
            logits = self(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            self.log("train_acc", (logits.argmax(1) == y).float().mean(), on_step=False, on_epoch=True,
                     sync_dist=True)
            return loss

        def configure_optimizers(self):  # noqa: ANN201
            opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)  # times size: scale_lr
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)}

    class PrintEpochs(pl.Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_train_epoch_end(self, trainer, pl_module) -> None:  # noqa: ANN001
            loss = float(trainer.callback_metrics["train_loss"])
            self.losses.append(loss)
            if trainer.is_global_zero:
                acc = float(trainer.callback_metrics["train_acc"])
                print(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}: loss {loss:.4f} accuracy {acc:.3f}",
                      flush=True)

    return Classifier, PrintEpochs


def weights_digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4, help="epochs of the first fit (the resumed one adds 2)")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--package", choices=["lightning", "pytorch_lightning"], default="lightning")
    parser.add_argument("--ckpt-dir", default=None)
    args = parser.parse_args()

    torch.set_num_threads(1)
    pl = importlib.import_module("lightning.pytorch" if args.package == "lightning" else "pytorch_lightning")
    Classifier, PrintEpochs = build(pl)
    hvd.init()
    ckpt_dir = args.ckpt_dir or hvd.broadcast_object(tempfile.mkdtemp(prefix="hora-lightning-example-"))
    loader = torch.utils.data.DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True)

    def trainer(epochs: int, printer):  # noqa: ANN001, ANN202
        return pl.Trainer(
            strategy=hora.lightning.Strategy(), accelerator="cpu", max_epochs=epochs, logger=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[
                printer, pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, save_last=True)])

    torch.manual_seed(1234 + hvd.rank())  # different initial weights per rank on purpose: rank 0's win
    model = Classifier(args.lr)
    first = PrintEpochs()
    trainer(args.epochs, first).fit(model, loader)
    resumed = PrintEpochs()
    trainer(args.epochs + 2, resumed).fit(model, loader, ckpt_path=os.path.join(ckpt_dir, "last.ckpt"))

    digests = hvd.allgather_object(weights_digest(model))
    losses = first.losses + resumed.losses
    ok = True
    if hvd.rank() == 0:
        if len(set(digests)) == 1:
            print(f"weights identical on all {hvd.size()} ranks")
        else:
            print(f"weights differ between ranks: {digests}")
            ok = False
        if not losses[-1] < losses[0]:
            print(f"the loss did not go down: {losses}")
            ok = False
        print(f"resumed at epoch {len(first.losses) + 1}, {len(resumed.losses)} more epochs")
    ok = hvd.broadcast_object(ok)
    if args.ckpt_dir is None and hvd.rank() == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
