"""Module-level code run on every rank by tests/lightning (spawn needs importable code), and
the single-process references the ranks are compared against.

One launch per Lightning package runs every scenario in sequence (starting processes and
importing Lightning is the expensive part on 2 cores); each scenario's outcome, or its
traceback, comes back separately so the tests report failures one by one.

The references are plain torch loops (no Lightning, no hora): one process, the whole
global batch, the mean loss. Two ranks on half batches each must reproduce them.
"""

from __future__ import annotations

import functools
import importlib
import os
import pickle
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

N, IN, HID, OUT = 24, 4, 8, 2
GLOBAL_BATCH = 8  # 4 per rank, 3 steps per epoch
STEPS = N // GLOBAL_BATCH
LR = 0.1


# ---------------------------------------------------------------------------- data, references
def dataset(seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, IN, generator=g)
    y = x @ torch.randn(IN, OUT, generator=g) + 0.1 * torch.randn(N, OUT, generator=g)
    return x, y


def make_net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.Tanh(), torch.nn.Linear(HID, OUT))


def reference(epochs: int, lr: float = LR, momentum: float = 0.0, scheduler: bool = False, accumulate: int = 1,
              clip: float | None = None, shuffled: bool = False) -> tuple[dict[str, torch.Tensor], float]:
    """Lightning's loop by hand on the whole global batch: the loss of each of ``accumulate``
    micro-batches divided by ``accumulate``, a step at the end of each window and at the
    end of the epoch, clipping (by norm) before the step, StepLR(1, 0.5) per epoch.
    ``shuffled``: the rows in the order of the DistributedSampler Lightning gives a training
    DataLoader (seed 0 + epoch): rank r of 2 takes positions r, r+2, ... of that order, so the
    ranks' batch s together hold positions 8s .. 8s+7.
    Returns the state (keys as in the LightningModule) and the largest gradient norm seen."""
    net = make_net(0)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5) if scheduler else None
    x, y = dataset()
    max_norm = 0.0
    for epoch in range(epochs):
        order = torch.randperm(N, generator=torch.Generator().manual_seed(epoch)) if shuffled else torch.arange(N)
        for i in range(STEPS):
            if i % accumulate == 0:
                opt.zero_grad()
            rows = order[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH]
            (torch.nn.functional.mse_loss(net(x[rows]), y[rows]) / accumulate).backward()
            if (i + 1) % accumulate == 0 or i == STEPS - 1:
                norm = torch.nn.utils.clip_grad_norm_(net.parameters(), clip if clip else float("inf"))
                max_norm = max(max_norm, float(norm))
                opt.step()
        if sched is not None:
            sched.step()
    return {f"net.{k}": v.detach().clone() for k, v in net.state_dict().items()}, max_norm


def rank_batches(rank: int, size: int, as_dict: bool = True) -> list[Any]:
    """Rank ``rank``'s contiguous quarter of each global batch (as hora's reader shards)."""
    x, y = dataset()
    per = GLOBAL_BATCH // size
    out = []
    for s in range(STEPS):
        sl = slice(s * GLOBAL_BATCH + rank * per, s * GLOBAL_BATCH + (rank + 1) * per)
        out.append({"x": x[sl], "y": y[sl]} if as_dict else (x[sl], y[sl]))
    return out


# ---------------------------------------------------------------------------- Lightning classes
@functools.lru_cache(maxsize=None)
def classes(package: str) -> Any:
    """The test's LightningModules, callbacks and plugins, built on ``package``."""
    pl = importlib.import_module("lightning.pytorch" if package == "lightning" else "pytorch_lightning")
    ns: dict[str, Any] = {"pl": pl}

    class Regression(pl.LightningModule):
        def __init__(self, lr: float = LR, momentum: float = 0.0, scheduler: bool = False, seed: int = 0) -> None:
            super().__init__()
            self.lr, self.momentum, self.scheduler = lr, momentum, scheduler
            self.net = make_net(seed)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def _loss(self, batch: Any) -> torch.Tensor:
            x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
            return torch.nn.functional.mse_loss(self(x), y.to(torch.float32))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = self._loss(batch)
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", self._loss(batch), sync_dist=True)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)
            if self.scheduler:
                return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}
            return opt

    class RankMetrics(Regression):
        """Logs values that differ by rank, reduced by different ops."""

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            r = float(self.global_rank)
            self.log("rank_mean", r, on_step=False, on_epoch=True, sync_dist=True)
            self.log("rank_sum", torch.tensor(r + 1.0), on_step=False, on_epoch=True, sync_dist=True, reduce_fx="sum")
            self.log("rank_max", r, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="max")
            self.log("rank_local", r, on_step=False, on_epoch=True)
            return super().training_step(batch, batch_idx)

    class Normalized(Regression):
        """A BatchNorm between the layers: its statistics depend on which rows a rank sees."""

        def __init__(self, seed: int = 0) -> None:
            super().__init__(seed=seed)
            self.net = torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.BatchNorm1d(HID), torch.nn.Tanh(),
                                           torch.nn.Linear(HID, OUT))

    class NanLoss(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return super().training_step(batch, batch_idx) * float("nan")

    class NoOptimizers(pl.LightningModule):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return torch.zeros(())

    class EpochStarts(pl.Callback):
        def __init__(self) -> None:
            self.epochs: list[int] = []

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.epochs.append(trainer.current_epoch)

    io_base = importlib.import_module(
        "lightning.fabric.plugins" if package == "lightning" else "lightning_fabric.plugins").TorchCheckpointIO

    class RecordingIO(io_base):
        def __init__(self) -> None:
            super().__init__()
            self.saved: list[str] = []

        def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
            self.saved.append(os.path.basename(str(path)))
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)

    class Data(pl.LightningDataModule):
        """The whole dataset; Lightning's DistributedSampler gives each rank its part."""

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*dataset()),
                                               batch_size=GLOBAL_BATCH // 2)

        def val_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*dataset(8)), batch_size=4)

    # Horovod's examples/spark/pytorch/pytorch_lightning_spark_mnist.py, shrunk: the same hooks
    class HorovodNet(pl.LightningModule):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.fc = torch.nn.Sequential(torch.nn.Linear(IN, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.log_softmax(self.fc(x.float()), -1)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.5)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = torch.nn.functional.nll_loss(self(batch["features"]), batch["label"].long())
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            loss = torch.nn.functional.nll_loss(self(batch["features"]), batch["label"].long())
            self.log("val_loss", loss)

        def validation_epoch_end(self, outputs: list) -> None:
            avg_loss = torch.stack([x["val_loss"] for x in outputs]).mean() if len(outputs) > 0 else float("inf")
            self.log("avg_val_loss", avg_loss)

    class MyDummyCallback(pl.Callback):
        def __init__(self, epochs: int) -> None:
            self.epochs = epochs
            self.init_calls = 0
            self.epoch_end_counter = 0
            self.train_epoch_end_counter = 0
            self.validation_epoch_end_counter = 0
            self.checked = False

        def on_init_start(self, trainer: Any) -> None:
            self.init_calls += 1

        def on_init_end(self, trainer: Any) -> None:
            self.init_calls += 1

        def on_epoch_end(self, trainer: Any, model: Any) -> None:
            self.epoch_end_counter += 1

        def on_train_epoch_end(self, trainer: Any, model: Any, unused: Any = None) -> None:
            self.train_epoch_end_counter += 1

        def on_validation_epoch_end(self, trainer: Any, model: Any, unused: Any = None) -> None:
            self.validation_epoch_end_counter += 1

        def on_train_end(self, trainer: Any, model: Any) -> None:
            assert self.train_epoch_end_counter <= self.epochs
            assert self.epoch_end_counter == self.train_epoch_end_counter + self.validation_epoch_end_counter
            self.checked = True

    ns.update(Regression=Regression, RankMetrics=RankMetrics, Normalized=Normalized, NanLoss=NanLoss, NoOptimizers=NoOptimizers, EpochStarts=EpochStarts,
              RecordingIO=RecordingIO, Data=Data, HorovodNet=HorovodNet, MyDummyCallback=MyDummyCallback)
    return type("Classes", (), ns)


def trainer(package: str, **kwargs: Any) -> Any:
    """A quiet CPU Trainer with hora's strategy (unless ``strategy`` is given)."""
    import hora.lightning

    c = classes(package)
    defaults = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, num_sanity_val_steps=0)
    defaults.update(kwargs)
    # both import names in this process (the pytorch_lightning scenarios run after the lightning ones,
    # in the same ranks): hora cannot guess which Trainer the strategy is for, the user names it
    both = "lightning" in sys.modules and "pytorch_lightning" in sys.modules
    defaults.setdefault("strategy", hora.lightning.Strategy(scale_lr=False, **({"package": package} if both else {})))
    return c.pl.Trainer(**defaults)


def loader() -> torch.utils.data.DataLoader:
    """The whole dataset, 4 per batch; Lightning adds a (shuffling) DistributedSampler fed
    hora's rank and size (see ``reference(shuffled=True)``)."""
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*dataset()), batch_size=GLOBAL_BATCH // 2)


def state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def seed_for(rank: int) -> int:
    """Rank 0 builds the reference's initial weights, the others different ones (the
    strategy must broadcast rank 0's)."""
    return 0 if rank == 0 else 1000 + rank


# ---------------------------------------------------------------------------- scenarios
def scenario_sgd(package: str, tmp: str) -> dict[str, Any]:
    import hora.native as hn

    c = classes(package)
    module = c.Regression(seed=seed_for(hn.rank()))
    t = trainer(package, max_epochs=2)
    t.fit(module, loader())
    opt = t.optimizers[0]
    after = hn.allreduce(torch.tensor([float(hn.rank())]), op=hn.Sum)  # hora still usable after teardown
    return {"state": state(module), "global_step": t.global_step, "lr": opt.param_groups[0]["lr"],
            "hooks_left": len(opt._hora_hooks), "allreduce_after": float(after[0])}


def scenario_accumulate_clip(package: str, tmp: str) -> dict[str, Any]:
    import hora.native as hn

    c = classes(package)
    module = c.Regression(momentum=0.9, seed=seed_for(hn.rank()))
    t = trainer(package, max_epochs=2, accumulate_grad_batches=2, gradient_clip_val=0.5)
    t.fit(module, loader())
    return {"state": state(module), "global_step": t.global_step}


def scenario_scale_lr(package: str, tmp: str) -> dict[str, Any]:
    """The default strategy: learning rate times the number of ranks, and the scheduler follows."""
    import hora.lightning
    import hora.native as hn

    c = classes(package)
    module = c.Regression(scheduler=True, seed=seed_for(hn.rank()))
    t = trainer(package, max_epochs=2, strategy=hora.lightning.Strategy())
    t.fit(module, loader())
    sched = t.lr_scheduler_configs[0].scheduler
    return {"state": state(module), "lr": t.optimizers[0].param_groups[0]["lr"], "base_lrs": list(sched.base_lrs),
            "follows": sched.optimizer is t.optimizers[0]}


def scenario_sync_batchnorm(package: str, tmp: str) -> dict[str, Any]:
    """Trainer(sync_batchnorm=True): hora's SyncBatchNorm while fitting, a plain one after."""
    import hora.native as hn

    c = classes(package)
    module = c.Normalized(seed=seed_for(hn.rank()))
    t = trainer(package, max_epochs=1, sync_batchnorm=True)
    t.fit(module, loader())
    bn = module.net[1]
    return {"state": state(module), "class": f"{type(bn).__module__}.{type(bn).__name__}"}


def scenario_metrics(package: str, tmp: str) -> dict[str, Any]:
    import hora.native as hn

    c = classes(package)
    t = trainer(package, max_epochs=1)
    t.fit(c.RankMetrics(seed=seed_for(hn.rank())), loader())
    metrics = {k: float(v) for k, v in t.callback_metrics.items()}
    s = t.strategy
    r = hn.rank()
    from torch.distributed import ReduceOp

    x = torch.tensor([r + 1.0], requires_grad=True)
    gathered = s.all_gather(x, sync_grads=True)
    (gathered.sum() * (r + 1)).backward()  # d/dx_r of sum over ranks q of (q+1) * sum(g): the sum of (q+1)
    return {
        "metrics": metrics,
        "sum": float(s.reduce(torch.tensor(r + 1.0), reduce_op="sum")),
        "mean": float(s.reduce(torch.tensor(r + 1.0))),
        "max": float(s.reduce(torch.tensor([float(r)]), reduce_op=ReduceOp.MAX)[0]),
        "int_mean": s.reduce(torch.tensor(2 * r + 1)),  # 1 and 3 -> 2, still an integer
        "not_tensor": s.reduce("text"),
        "gather_shape": tuple(s.all_gather(torch.tensor([r, r])).shape),
        "gather_scalar": s.all_gather(torch.tensor(float(r))).tolist(),
        "grad": float(x.grad[0]),
        "broadcast": s.broadcast({"from": r}, src=1),
        "all_true": s.reduce_boolean_decision(r == 0),
        "any_true": s.reduce_boolean_decision(r == 0, all=False),
    }


def scenario_checkpoint_resume(package: str, tmp: str) -> dict[str, Any]:
    import hora.lightning
    import hora.native as hn

    c = classes(package)
    ckdir = os.path.join(tmp, f"ckpt-{package}")
    io = c.RecordingIO()
    first = trainer(package, max_epochs=2, strategy=hora.lightning.Strategy(), plugins=[io], enable_checkpointing=True,
                    callbacks=[c.pl.callbacks.ModelCheckpoint(dirpath=ckdir, save_last=True, save_top_k=-1)],
                    default_root_dir=tmp)
    first.fit(c.Regression(momentum=0.9, scheduler=True, seed=seed_for(hn.rank())), loader())
    hn.barrier()
    files = sorted(os.listdir(ckdir))
    starts = c.EpochStarts()
    second = trainer(package, max_epochs=4, strategy=hora.lightning.Strategy(), callbacks=[starts])
    module = c.Regression(momentum=0.9, scheduler=True, seed=77)
    second.fit(module, loader(), ckpt_path=os.path.join(ckdir, "last.ckpt"))
    return {"saved": io.saved, "files": files, "epochs": starts.epochs, "global_step": second.global_step,
            "current_epoch": second.current_epoch, "state": state(module),
            "lr": second.optimizers[0].param_groups[0]["lr"]}


def scenario_fit_module(package: str, tmp: str) -> dict[str, Any]:
    import hora.lightning
    import hora.native as hn

    c = classes(package)
    rank, size = hn.rank(), hn.size()
    train = rank_batches(rank, size)
    val = rank_batches(rank, size)[:2]
    seen: list[tuple] = []

    def on_epoch_end(end: Any) -> None:
        seen.append((end.epoch, sorted(end.metrics), end.global_step, end.checkpoint is not None, end.rank))

    batches_seen: list[tuple] = []
    tb = c.pl.loggers.TensorBoardLogger(save_dir=os.path.join(tmp, f"tb-{package}-{rank}"), name="m")
    first = hora.lightning.fit_module(
        c.Regression(seed=seed_for(rank)), lambda epoch: train, val, epochs=3, scale_lr=False,
        trainer_args={"log_every_n_steps": 1}, loggers=[tb], on_epoch_end=on_epoch_end,
        on_batch_end=lambda b: batches_seen.append((b.epoch, b.batch, b.global_step, b.loss is not None)))
    ckpt = hn.broadcast_object(first.checkpoint, root_rank=0)  # as the estimator hands it out from the store
    module = c.Regression(seed=5)
    second = hora.lightning.fit_module(module, train, val, epochs=5, scale_lr=False, ckpt_bytes=ckpt)
    last = hn.broadcast_object(second.checkpoint, root_rank=0)
    again = hora.lightning.fit_module(c.Regression(seed=6), train, val, epochs=5, scale_lr=False, ckpt_bytes=last)
    tb_files = [f for _, _, fs in os.walk(os.path.join(tmp, f"tb-{package}-{rank}")) for f in fs]
    return {"first": _result(first), "second": _result(second), "state": state(module), "seen": seen,
            "tb_files": len(tb_files), "batches_seen": batches_seen, "again_epochs": again.epochs_run, "again_history": len(again.history)}


def _result(r: Any) -> dict[str, Any]:
    return {"history": r.history, "has_checkpoint": r.checkpoint is not None, "start_epoch": r.start_epoch,
            "epochs_run": r.epochs_run, "global_step": r.global_step, "stopped_early": r.stopped_early,
            "state": r.state_dict}


def scenario_fit_module_datamodule(package: str, tmp: str) -> dict[str, Any]:
    import hora.lightning
    import hora.native as hn

    c = classes(package)
    rank = hn.rank()
    csv = c.pl.loggers.CSVLogger(save_dir=os.path.join(tmp, f"csv-{package}-{rank}"), name="m")
    module = c.Regression(momentum=0.9, seed=seed_for(rank))
    result = hora.lightning.fit_module(
        module, data_module=c.Data(), epochs=2, loggers=[csv],
        trainer_args={"precision": "bf16-mixed", "accumulate_grad_batches": 2, "gradient_clip_val": 1.0,
                      "limit_val_batches": 2})
    csv_files = [f for _, _, fs in os.walk(os.path.join(tmp, f"csv-{package}-{rank}")) for f in fs]
    return {"state": result.state_dict, "history": result.history, "global_step": result.global_step,
            "csv_files": csv_files}


def scenario_stop_on_request(package: str, tmp: str) -> dict[str, Any]:
    """on_epoch_end returning True on rank 1 only stops both ranks after that epoch."""
    import hora.lightning
    import hora.native as hn

    c = classes(package)
    rank = hn.rank()
    result = hora.lightning.fit_module(
        c.Regression(seed=seed_for(rank)), rank_batches(rank, hn.size()), epochs=5,
        on_epoch_end=lambda end: end.epoch == 1 and end.rank == 1)
    return {"epochs": [row["epoch"] for row in result.history], "stopped_early": result.stopped_early}


def scenario_legacy_hooks(package: str, tmp: str) -> dict[str, Any]:
    import hora.lightning
    import hora.native as hn

    c = classes(package)
    x, _ = dataset()
    g = torch.Generator().manual_seed(hn.rank())
    batches = [{"features": x[i:i + 4], "label": torch.randint(0, 3, (4,), generator=g)} for i in range(0, 12, 4)]
    cb = c.MyDummyCallback(epochs=2)
    module = c.HorovodNet(6)
    cls = type(module)
    result = hora.lightning.fit_module(module, batches, batches[:1], epochs=2, callbacks=[cb])
    return {"checked": cb.checked, "init_calls": cb.init_calls, "epoch_end": cb.epoch_end_counter,
            "train_end": cb.train_epoch_end_counter, "val_end": cb.validation_epoch_end_counter,
            "class_restored": type(module) is cls, "history": result.history}


def scenario_uneven_batches(package: str, tmp: str) -> str:
    import hora.lightning
    import hora.native as hn
    from hora.errors import DataError

    c = classes(package)
    batches = rank_batches(hn.rank(), hn.size())
    try:
        hora.lightning.fit_module(c.Regression(), batches[: 2 + hn.rank()], epochs=1)
    except DataError as exc:
        return str(exc)
    return "no error"


def scenario_terminate_on_nan(package: str, tmp: str) -> str:
    import hora.lightning
    import hora.native as hn
    from hora.errors import DataError

    c = classes(package)
    try:
        hora.lightning.fit_module(c.NanLoss(), rank_batches(hn.rank(), hn.size()), epochs=1, terminate_on_nan=True)
    except DataError as exc:
        return str(exc)
    return "no error"


SCENARIOS: dict[str, Callable[[str, str], Any]] = {
    "sgd": scenario_sgd,
    "accumulate_clip": scenario_accumulate_clip,
    "scale_lr": scenario_scale_lr,
    "sync_batchnorm": scenario_sync_batchnorm,
    "metrics": scenario_metrics,
    "checkpoint_resume": scenario_checkpoint_resume,
    "fit_module": scenario_fit_module,
    "fit_module_datamodule": scenario_fit_module_datamodule,
    "stop_on_request": scenario_stop_on_request,
    "legacy_hooks": scenario_legacy_hooks,
    "uneven_batches": scenario_uneven_batches,
    "terminate_on_nan": scenario_terminate_on_nan,
}


def run_all_scenarios(plan: list[tuple[str, tuple[str, ...] | None]], tmp: str) -> bytes:
    """Entry point on each rank: for each ``(package, names)`` of ``plan`` in turn, the scenarios
    ``names`` (all when None) under that Lightning import name, in one launch; pickled
    ``{package: {scenario: (ok, result or traceback)}}``."""
    torch.set_num_threads(1)
    import hora.native as hn

    hn.init()
    results: dict[str, dict[str, tuple[bool, Any]]] = {}
    try:
        for package, names in plan:
            mine = results.setdefault(package, {})
            for name, fn in SCENARIOS.items():
                if names is not None and name not in names:
                    continue
                try:
                    mine[name] = (True, fn(package, tmp))
                except Exception:  # noqa: BLE001 - reported per scenario to the test
                    mine[name] = (False, traceback.format_exc())
                hn.barrier()
    finally:
        hn.shutdown()
    return pickle.dumps(results)
