"""GPU check for hora: one table, written as JSON, non-zero exit if a required check fails.

    python benchmarks/gpu_check.py --device cuda --out gpu_check.json   # on the GPU machine (< 6 minutes)
    python benchmarks/gpu_check.py --device cpu --out /tmp/gpu_check.json  # anywhere: small sizes, same paths

Each check runs in its own try/except and yields one row: name | result | numbers | pass/fail/skip (reason).
Does not import pyspark; uses only torch APIs present in torch 2.11.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from typing import Any, Callable

import numpy as np
import torch

ROWS: list[dict[str, Any]] = []


def row(name: str, status: str, result: str = "", numbers: dict | None = None, required: bool = True) -> None:
    ROWS.append({"name": name, "status": status, "result": result, "numbers": numbers or {}, "required": required})


def check(name: str, required: bool = True) -> Callable:
    def deco(fn: Callable) -> Callable:
        def run(*args: Any) -> None:
            try:
                out = fn(*args)
                if isinstance(out, tuple) and out and out[0] == "skip":
                    row(name, "skip", out[1], required=required)
                else:
                    result, numbers = out if isinstance(out, tuple) else (str(out), {})
                    row(name, "pass", result, numbers, required)
            except Exception as exc:  # one failing check must not hide the others
                row(name, "fail", f"{type(exc).__name__}: {exc}", {"trace": traceback.format_exc(limit=3)}, required)
        return run
    return deco


def _dtypes(device: str) -> list[torch.dtype]:
    return [torch.float32, torch.float16, torch.bfloat16] if device == "cuda" else [torch.float32, torch.bfloat16]


def _fresh(n: int, value: float, dtype: torch.dtype, device: str) -> torch.Tensor:
    """A tensor written by a kernel queued just before the collective (the producer stream must be waited for)."""
    x = torch.empty(n, dtype=dtype, device=device)
    if device == "cuda":
        torch.cuda._sleep(1_000_000)  # keep the stream busy so an unsynchronized read would see garbage
    x.fill_(value)
    return x


def _same(t: torch.Tensor, value: float, device: str, what: str) -> None:
    if t.device.type != device:
        raise AssertionError(f"{what}: result on {t.device}, expected {device}")
    got = t.float().cpu()
    if not torch.allclose(got, torch.full_like(got, value), rtol=1e-2):
        raise AssertionError(f"{what}: expected {value}, got {got[:4].tolist()}")


@check("collectives 1 rank (allreduce Sum/Average in/out of place, allgather, broadcast, alltoall, grouped)")
def check_collectives(device: str, n: int) -> tuple[str, dict]:
    import hora.torch as hvd

    hvd.init()
    done = []
    for dt in _dtypes(device):
        _same(hvd.allreduce(_fresh(n, 3.0, dt, device), op=hvd.Sum), 3.0, device, f"allreduce Sum {dt}")
        _same(hvd.allreduce(_fresh(n, 3.0, dt, device), op=hvd.Average), 3.0, device, f"allreduce Average {dt}")
        x = _fresh(n, 2.0, dt, device)
        hvd.allreduce_(x, op=hvd.Sum)
        _same(x, 2.0, device, f"allreduce_ {dt}")
        g = hvd.allgather(_fresh(n, 5.0, dt, device).reshape(-1, 1))
        if g.shape[0] != n * hvd.size():
            raise AssertionError(f"allgather {dt}: shape {tuple(g.shape)}")
        _same(g.reshape(-1), 5.0, device, f"allgather {dt}")
        _same(hvd.broadcast(_fresh(n, 7.0, dt, device), root_rank=0), 7.0, device, f"broadcast {dt}")
        a = hvd.alltoall(_fresh(n, 4.0, dt, device))
        _same(a[0] if isinstance(a, tuple) else a, 4.0, device, f"alltoall {dt}")
        for t in hvd.grouped_allreduce([_fresh(n, 1.0, dt, device), _fresh(n // 2, 6.0, dt, device)], op=hvd.Sum):
            _same(t, 1.0 if t.numel() == n else 6.0, device, f"grouped {dt}")
        done.append(str(dt).replace("torch.", ""))
    if device == "cuda":
        torch.cuda.synchronize()
    return f"correct, on {device}: {', '.join(done)}", {"elements": n}


@check("DistributedOptimizer steps 1 rank")
def check_optimizer(device: str, n: int) -> tuple[str, dict]:
    import hora.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(256, 16, device=device)
    y = x.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if not all(p.device.type == device for p in model.parameters()):
        raise AssertionError("parameters left the device")
    if not losses[-1] < losses[0] * 0.5:
        raise AssertionError(f"loss did not fall: {losses[0]:.4f} -> {losses[-1]:.4f}")
    return f"loss {losses[0]:.3f} -> {losses[-1]:.3f}", {"steps": 30}


@check("two ranks sharing one GPU (hora run -np 2)")
def check_two_ranks(device: str, n: int) -> Any:
    if device != "cuda":
        return "skip", "needs a CUDA device"
    if torch.cuda.device_count() >= 2:
        return "skip", f"{torch.cuda.device_count()} GPUs: no sharing needed"
    script = textwrap.dedent("""
        import torch, hora.torch as hvd
        from hora.errors import ConfigError
        from hora.estimators.devices import rank_device
        hvd.init()
        try:
            dev = rank_device(hvd.rank(), hvd.local_rank(), hvd.local_size())
            x = hvd.allreduce(torch.ones(8, device=dev), op=hvd.Sum)
            print("RESULT", hvd.rank(), x.sum().item(), x.device, flush=True)
        except ConfigError as exc:
            print("CONFIG_ERROR", hvd.rank(), exc, flush=True)
    """)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    try:
        proc = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "2", sys.executable, f.name],
                              capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(f.name)
    out = proc.stdout + proc.stderr
    if "CONFIG_ERROR" in out and "cuda:0" in out:
        return "clear ConfigError at pinning naming the rank and cuda:0 (no hang, no NCCL crash)", {"rc": proc.returncode}
    if out.count("RESULT") == 2 and "16.0" in out:
        return "both ranks ran on the shared GPU (staged)", {"rc": proc.returncode}
    raise AssertionError(f"neither a clear error nor a result (rc={proc.returncode}): {out[-800:]}")


@check("pinning: local rank / CUDA_VISIBLE_DEVICES / Spark task address -> device")
def check_pinning(device: str, n: int) -> tuple[str, dict]:
    from hora.errors import ConfigError
    from hora.estimators.devices import pick_device_index

    assert pick_device_index(rank=1, local_rank=1, local_size=2, device_count=2) == 1
    assert pick_device_index(rank=0, local_rank=0, local_size=2, device_count=2, visible_devices="3,5",
                             task_gpu_addresses=["5"]) == 1
    try:
        pick_device_index(rank=1, local_rank=1, local_size=2, device_count=1)
    except ConfigError as exc:
        assert "rank 1" in str(exc) and "cuda:0" in str(exc)
    else:
        raise AssertionError("two ranks on one GPU were not refused")
    if device == "cuda":
        from hora.estimators.devices import rank_device

        got = rank_device(0, 0, 1)
        assert got == torch.device("cuda", 0) and torch.cuda.current_device() == 0
    return "mapping and errors as specified", {"device_count": torch.cuda.device_count()}


@check("transform with use_gpu vs a plain batched loop on the device")
def check_transform(device: str, n: int) -> Any:
    import pandas as pd

    from hora.estimators.frameworks.torch.codec import TorchCodec
    from hora.estimators.driver.transform import predict_frame

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    rows = n * 4
    data = np.random.default_rng(0).normal(size=(rows, 64)).astype(np.float32)
    pdf = pd.DataFrame({"x": list(data)})
    batch = 4096
    use_gpu = device == "cuda"
    predict_frame(TorchCodec(), model, pdf.head(batch), ["x"], [[-1, 64]], ["p"], [[1]], batch, use_gpu=use_gpu)
    t0 = time.perf_counter()
    out = predict_frame(TorchCodec(), model, pdf, ["x"], [[-1, 64]], ["p"], [[1]], batch, use_gpu=use_gpu)
    t_hora = time.perf_counter() - t0
    model.to(device).eval()
    t0 = time.perf_counter()
    with torch.inference_mode():
        host = np.stack(pdf["x"].to_numpy())  # the same frame -> array step a user's loop needs
        ref = np.concatenate([model(torch.from_numpy(host[i:i + batch]).to(device)).cpu().numpy()
                              for i in range(0, rows, batch)]).ravel()
    t_plain = time.perf_counter() - t0
    np.testing.assert_allclose(out["p"].to_numpy(), ref, rtol=1e-3, atol=1e-4)
    ratio = t_plain / t_hora
    numbers = {"rows": rows, "hora_rows_s": rows / t_hora, "plain_rows_s": rows / t_plain, "ratio": ratio}
    if device == "cuda" and ratio < 0.9:
        raise AssertionError(f"hora transform at {ratio:.2f} x the plain loop (goal >= 0.9): {numbers}")
    return f"predictions equal; {ratio:.2f} x the plain loop", numbers


class _HalfProbe(torch.nn.Module):
    """A small classifier that records (in a buffer) whether its hidden layer ran in float16 or bfloat16."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
        self.register_buffer("saw_half", torch.zeros(()))

    def forward(self, x):
        out = self.body(x)
        if self.training and out.dtype in (torch.float16, torch.bfloat16):
            self.saw_half.fill_(1.0)
        return out


def _class_frame(rows: int):
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 16)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.float32)
    return pd.DataFrame({"features": list(x), "y": y})


@check("TorchEstimator precision='16-mixed' and 'bf16-mixed' (GradScaler on the rank's device) vs '32'")
def check_mixed_precision_fit(device: str, n: int) -> Any:
    import io

    from hora.dask import TorchEstimator
    from hora.store import Store

    df = _class_frame(2048)
    use_gpu = device == "cuda"
    with tempfile.TemporaryDirectory() as folder:
        store = Store.create(folder)
        fits, seconds = {}, {}
        for precision in ("32", "16-mixed", "bf16-mixed"):
            net = _HalfProbe()
            est = TorchEstimator(num_proc=1, use_gpu=use_gpu, store=store, model=net,
                                 optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                                 loss=torch.nn.CrossEntropyLoss(), feature_cols=["features"], label_cols=["y"],
                                 batch_size=64, epochs=3, random_seed=0, verbose=0, lr_scaling="none",
                                 precision=precision, run_id=f"precision-{precision}")
            t0 = time.perf_counter()
            fits[precision] = est.fit(df)
            seconds[precision] = time.perf_counter() - t0
        _, data = store.latest_checkpoint("precision-16-mixed")
        scaler = torch.load(io.BytesIO(data), weights_only=False).get("grad_scaler") or {}
    losses = {p: [h["loss"] for h in f.history_] for p, f in fits.items()}
    for p, f in fits.items():
        assert all(np.isfinite(losses[p])) and losses[p][-1] < losses[p][0], (p, losses[p])
        assert float(f.model_.saw_half) == (0.0 if p == "32" else 1.0), (p, float(f.model_.saw_half))
        assert f.model_.body[0].weight.dtype == torch.float32, p  # the weights stay float32
    for p in ("16-mixed", "bf16-mixed"):
        assert abs(losses[p][-1] - losses["32"][-1]) <= 0.05 * losses["32"][-1] + 0.01, losses
    assert scaler.get("scale", 0) > 0, f"no GradScaler state in the 16-mixed checkpoint: {scaler}"
    acc = (fits["16-mixed"].transform(df.head(256))["prediction"].to_numpy() == df["y"].to_numpy()[:256]).mean()
    numbers = {"loss_32": losses["32"][-1], "loss_16": losses["16-mixed"][-1], "loss_bf16": losses["bf16-mixed"][-1],
               "scale": float(scaler["scale"]), "acc_16": float(acc),
               **{f"fit_s_{p}": v for p, v in seconds.items()}}
    return "float16 and bfloat16 autocast train as float32 does; the GradScaler's state is checkpointed", numbers


@check("LightningEstimator with Lightning's FSDPStrategy on a GPU rank vs hora's data-parallel strategy")
def check_lightning_fsdp(device: str, n: int) -> Any:
    if device != "cuda":
        return "skip", "Lightning's FSDPStrategy needs a GPU accelerator"
    import lightning.pytorch as pl

    from hora.dask import LightningEstimator
    from hora.store import Store

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self(batch["features"]).squeeze(-1), batch["y"])
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    df = _class_frame(1024)
    fits = {}
    with tempfile.TemporaryDirectory() as folder:
        store = Store.create(folder)
        for name, args in (("hora", {}), ("fsdp", {"strategy": "fsdp"})):
            est = LightningEstimator(num_proc=1, use_gpu=True, store=store, model=Regressor(),
                                     feature_cols=["features"], label_cols=["y"], batch_size=64, epochs=2,
                                     lr_scaling="none", random_seed=1, verbose=0, trainer_args=args,
                                     run_id=f"lightning-{name}")
            fits[name] = est.fit(df)
    want = {k: v.detach().cpu().numpy() for k, v in fits["hora"].model_.state_dict().items()}
    got = {k: v.detach().cpu().numpy() for k, v in fits["fsdp"].model_.state_dict().items()}
    assert set(got) == set(want), (sorted(got), sorted(want))
    worst = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    assert worst < 1e-3, f"FSDP's weights differ from hora's by {worst}"
    out = fits["fsdp"].transform(df.head(8))
    assert len(out) == 8 and np.isfinite(np.stack(out["prediction"].to_numpy()).astype(float)).all()
    return "FSDPStrategy trained on the GPU rank and returned the whole model", {
        "max_weight_diff": worst, "loss_fsdp": fits["fsdp"].history_[-1]["loss"],
        "loss_hora": fits["hora"].history_[-1]["loss"]}


class _Block(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        nn = torch.nn
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                  nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


class ResNet(torch.nn.Module):
    """ResNet-18 for 32x32x3 uint8 rows (width 64, blocks 2-2-2-2; smaller on CPU): the rows come as the
    reader gives them, ``(n, 32, 32, 3)`` uint8, and are made ``(n, 3, 32, 32)`` floats here."""

    def __init__(self, width: int = 64, blocks: tuple = (2, 2, 2, 2), classes: int = 10) -> None:
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn
        layers: list = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        cin = width
        for i, n in enumerate(blocks):
            cout = width * 2 ** i
            for j in range(n):
                layers.append(_Block(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.body(x.permute(0, 3, 1, 2).float().div_(255.0)))


def _image_frame(rows: int):
    import pandas as pd

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(rows, 32, 32, 3), dtype=np.uint8)
    labels = (images[:, 0, 0, 0] // 26).astype(np.int64).clip(0, 9)  # every class, learnable from one pixel
    return pd.DataFrame({"img": list(images), "label": labels}), images, labels


class _Utilization:
    """NVML's GPU utilization sampled every 0.2 s while a block runs (None without NVML or off CUDA)."""

    def __init__(self, device: str) -> None:
        self.samples: list[tuple[float, int]] = []
        self.ok = False
        if device == "cuda":
            try:
                torch.cuda.utilization()
                self.ok = True
            except Exception:  # pynvml missing: reported as n/a
                pass
        self._stop = None

    def __enter__(self) -> "_Utilization":
        import threading

        if self.ok:
            self._stop = threading.Event()

            def sample() -> None:
                while not self._stop.wait(0.2):
                    self.samples.append((time.time(), torch.cuda.utilization()))

            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join(timeout=2)

    def mean(self, start: float, end: float) -> float | None:
        got = [u for t, u in self.samples if start <= t <= end]
        return float(np.mean(got)) if got else None


def _ceiling(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, batch: int, epochs: int, device: str,
             precision: str) -> float:
    """Rows/s of the last of ``epochs`` epochs of the same model on batches already in device memory."""
    dev = torch.device(device)
    model = model.to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.from_numpy(images).to(dev), torch.from_numpy(labels).to(dev)
    dtype = {"bf16-mixed": torch.bfloat16}.get(precision)
    loss_fn = torch.nn.CrossEntropyLoss()
    seconds = 0.0
    for _ in range(epochs):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        order = torch.randperm(len(x), device=dev)
        for i in range(0, len(x), batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
                loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    return len(x) / seconds


def _dataloader_loop(model: torch.nn.Module, files: list[str], batch: int, epochs: int, device: str,
                     precision: str) -> tuple[float, float]:
    """(rows/s of the last epoch, seconds loading the Parquet) of what users write: the Parquet read
    into a Dataset, a shuffling DataLoader (pinned on CUDA, worker processes), the same step."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    table = pa.concat_tables([pq.read_table(f, columns=["img", "label"]) for f in files])
    values = table.column("img").combine_chunks()
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or \
            pa.types.is_fixed_size_list(values.type):
        values = values.flatten()
    images = values.to_numpy(zero_copy_only=False).reshape(len(table), 32, 32, 3)
    labels = table.column("label").to_numpy().astype(np.int64)
    load = time.perf_counter() - t0
    import warnings

    with warnings.catch_warnings():  # Arrow's read-only buffer: the loop only reads it
        warnings.simplefilter("ignore", UserWarning)
        data = torch.utils.data.TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))
    cuda = device == "cuda"
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, pin_memory=cuda,
                                         num_workers=min(4, os.cpu_count() or 1) if cuda else 0,
                                         persistent_workers=cuda)
    dev = torch.device(device)
    model = model.to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dtype = {"bf16-mixed": torch.bfloat16}.get(precision)
    loss_fn = torch.nn.CrossEntropyLoss()
    seconds = 0.0
    for _ in range(epochs):
        t1 = time.perf_counter()
        for xb, yb in loader:
            xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
            opt.zero_grad()
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
                loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t1
    return len(data) / seconds, load


def estimator_throughput(device: str, rows: int, precision: str, folder: str) -> tuple[str, dict]:
    """TorchEstimator(num_proc=1) on ``rows`` 32x32x3 uint8 rows (2 epochs) against the same model on
    batches in device memory (the ceiling) and a DataLoader loop over the same Parquet."""
    from hora.dask import TorchEstimator
    from hora.store import Store, materialize

    cuda = device == "cuda"
    width, blocks, batch = (64, (2, 2, 2, 2), 512) if cuda else (8, (1, 1, 1, 1), 128)
    frame, images, labels = _image_frame(rows)
    store = Store.create(os.path.join(folder, "throughput"))
    info = materialize(frame, store, ["img"], ["label"], num_proc=1, seed=0)  # the fit reuses it
    net = ResNet(width, blocks)
    est = TorchEstimator(num_proc=1, use_gpu=cuda, store=store, model=net,
                         optimizer=torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                         loss=torch.nn.CrossEntropyLoss(), feature_cols=["img"], label_cols=["label"],
                         batch_size=batch, epochs=2, random_seed=0, verbose=0, lr_scaling="none", precision=precision,
                         run_id=f"throughput-{precision}")
    with _Utilization(device) as util:
        fitted = est.fit(frame)
        ended = time.time()
    last = fitted.history_[-1]
    train_rows = info.train_rows
    hora_rate = train_rows / last["epoch_time_s"]
    collect = fitted.fit_timings_.get("collect_s", 0.0)
    busy = util.mean(ended - collect - last["epoch_time_s"], ended - collect)
    ceiling = _ceiling(ResNet(width, blocks), images, labels, batch, 2, device, precision)
    loader_rate, load_s = _dataloader_loop(ResNet(width, blocks), info.file_paths("train"), batch, 2, device,
                                           precision)
    numbers = {"rows": train_rows, "batch": batch, "hora_rows_s": hora_rate, "ceiling_rows_s": ceiling,
               "dataloader_rows_s": loader_rate, "dataloader_load_s": load_s,
               "x_ceiling": hora_rate / ceiling, "x_dataloader": hora_rate / loader_rate,
               "data_wait": last["data_wait"], "gpu_util_pct": busy if busy is not None else "n/a (no NVML)",
               "loss_first": fitted.history_[0]["loss"], "loss_last": last["loss"]}
    said = (f"{hora_rate / ceiling:.2f} x the in-memory ceiling, {hora_rate / loader_rate:.2f} x the DataLoader loop, "
            f"data_wait {last['data_wait']:.2f}" + ("" if cuda else " (CPU sizes: the row's smoke run; its goals "
                                                    "are a GPU's)"))
    if cuda and (hora_rate / ceiling < 0.9 or hora_rate / loader_rate < 1.0):
        raise AssertionError(f"below the goals (>= 0.9 x ceiling, >= 1.0 x DataLoader): {said}; {numbers}")
    return said, numbers


@check("estimator throughput (TorchEstimator, ResNet-18 on 32x32x3 uint8 rows) vs batches in device memory and vs "
       "a DataLoader loop, precision 32", required=False)
def check_throughput_32(device: str, rows: int, folder: str) -> tuple[str, dict]:
    return estimator_throughput(device, rows, "32", folder)


@check("estimator throughput as above, precision bf16-mixed", required=False)
def check_throughput_bf16(device: str, rows: int, folder: str) -> tuple[str, dict]:
    return estimator_throughput(device, rows, "bf16-mixed", folder)


@check("sharded model: peak memory per strategy (ZeRO-1/2 vs replicated, 2 ranks)", required=False)
def check_sharded_memory(device: str, n: int) -> Any:
    if device == "cuda" and torch.cuda.device_count() < 2:
        return "skip", "needs 2 GPUs: ZeRO shards across ranks, and NCCL refuses two ranks on one GPU"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_sharding as bs
    from _common import run_local

    cfg = {"model": "mlp", "dim": 2048 if device == "cuda" else 1024, "layers": 8, "heads": 1, "vocab": 1, "seq": 1,
           "batch": 32}
    out = {}
    for strategy in ("hora", "zero1", "zero2"):
        ranks = run_local(bs.rank_main, 2, args=(strategy, cfg, 3, device), timeout=600)
        key = "cuda_peak" if device == "cuda" else "peak"
        out[strategy] = max(r[key] for r in ranks)
    numbers = {f"{s}_peak_mib": v / 2**20 for s, v in out.items()}
    numbers.update({f"{s}_x_hora": out[s] / out["hora"] for s in ("zero1", "zero2")})
    what = "torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS growth"
    return (f"{what}: zero1 {numbers['zero1_x_hora']:.2f} x, zero2 {numbers['zero2_x_hora']:.2f} x the replicated "
            "run's"), numbers


def skipped_rows() -> None:
    row("text model (a tokenized text column) on the device", "skip",
        "needs tokenizer support in the estimators (a text column is not tokenized by hora yet)", required=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--rows", type=int, default=None,
                    help="rows of the throughput rows (default: 200,000 on CUDA, 2,048 on the CPU)")
    ap.add_argument("--skip-throughput", action="store_true", help="leave out the estimator throughput rows")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda but torch sees no CUDA device; use --device cpu", file=sys.stderr)
        return 2
    n = 1 << 20 if args.device == "cuda" else 1 << 12
    t0 = time.time()
    if not args.skip_throughput:  # first: while hora.torch is initialized in this process (the checks below),
        # its engine's thread takes a core from torch's CPU threads (the CPU ceiling ran ~7x slower)
        rows = args.rows or (200_000 if args.device == "cuda" else 2048)
        with tempfile.TemporaryDirectory() as folder:
            check_throughput_32(args.device, rows, folder)
            check_throughput_bf16(args.device, rows, folder)
    for fn in (check_collectives, check_optimizer, check_pinning, check_transform):
        fn(args.device, n)
    try:
        import hora.torch as hvd

        if hvd.is_initialized():
            hvd.shutdown()
    except Exception as exc:  # shutdown trouble is reported, not fatal for the table
        row("hora.torch shutdown", "fail", f"{type(exc).__name__}: {exc}")
    check_two_ranks(args.device, n)
    check_mixed_precision_fit(args.device, n)
    check_lightning_fsdp(args.device, n)
    check_sharded_memory(args.device, n)
    skipped_rows()
    env = {"device": args.device, "torch": torch.__version__, "python": sys.version.split()[0],
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "seconds": round(time.time() - t0, 1)}
    width = max(len(r["name"]) for r in ROWS)
    print(f"gpu_check {env}")
    for r in ROWS:
        nums = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r["numbers"].items() if k != "trace"}
        print(f"{r['name']:<{width}} | {r['status']:<4} | {r['result']} | {nums if nums else ''}")
    with open(args.out, "w") as f:
        json.dump({"env": env, "rows": ROWS}, f, indent=2)
    failed = [r["name"] for r in ROWS if r["status"] == "fail" and r["required"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
