"""What TorchEstimator's loop options and a classifier's outputs cost.

Run: ``.venv/bin/python benchmarks/bench_training_options.py [--steps 300] [--rows 200000] [--repeat 3]``.
Prints two markdown tables; every figure is a ratio of runs made in this process, one after the
other (alternated ``--repeat`` times, the fastest of each kept).

* **step**: the Torch session's training step (``TorchSession.train_step``: hora's
  ``DistributedOptimizer`` on one rank, a 3-layer MLP of width 512 on batches of 256 rows of 64
  features, 10 classes, ``CrossEntropyLoss``) with each option against the plain fp32 step:
  ``precision="bf16-mixed"`` (CPU autocast), ``"16-mixed"`` (float16 CPU autocast with a CPU
  ``GradScaler``: scaled backward, synchronize, unscale, step), ``gradient_clip_norm`` (synchronize, clip,
  ``skip_synchronize`` step), ``lr_scheduler`` stepped every step, ``class_weight`` (per-row
  weights).
* **predict**: ``predict_frame`` of a pandas frame through a classifier's codec (softmax,
  argmax: rawPrediction, probability, prediction) against the same model's raw outputs (what
  a regressor writes).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def _session(**options):
    import hora.torch as hvd
    from hora.estimators.frameworks.torch.codec import TorchSession

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    scheduler = options.pop("lr_scheduler", None)
    if "scaler" in options:  # a fresh GradScaler per session, on the named device
        options["scaler"] = torch.amp.GradScaler(options["scaler"])
    losses = [torch.nn.CrossEntropyLoss(reduction="none" if "class_weights" in options else "mean")]
    return TorchSession(hvd=hvd, model=model, optimizer=opt, losses=losses, metrics=[], feature_keys=("x",),
                        label_cols=("y",), loss_weights=[1.0], scheduler=scheduler(opt) if scheduler else None,
                        scheduler_interval="step", **options)


def _steps_per_s(session, batches, steps: int) -> float:
    for i in range(10):  # warm-up
        session.train_step(batches[i % len(batches)], i)
    t0 = time.perf_counter()
    for i in range(steps):
        session.train_step(batches[i % len(batches)], i)
    return steps / (time.perf_counter() - t0)


def bench_step(steps: int, repeat: int) -> None:
    import hora.torch as hvd

    hvd.init()
    rng = np.random.default_rng(0)
    batches = [{"x": rng.normal(size=(256, 64)).astype("float32"),
                "y": rng.integers(0, 10, 256).astype("float64")} for _ in range(8)]
    cases = {
        "fp32 (baseline)": {},
        "precision='bf16-mixed'": {"autocast_dtype": torch.bfloat16},
        "precision='16-mixed' (CPU GradScaler)": {"autocast_dtype": torch.float16, "scaler": "cpu"},
        "gradient_clip_norm=1.0": {"clip_norm": 1.0},
        "lr_scheduler per step": {"lr_scheduler": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda i: 0.999 ** i)},
        "class_weight (10 classes)": {"class_weights": torch.linspace(0.5, 2.0, 10)},
    }
    best = {name: 0.0 for name in cases}
    for _ in range(repeat):
        for name, options in cases.items():
            best[name] = max(best[name], _steps_per_s(_session(**dict(options)), batches, steps))
    base = best["fp32 (baseline)"]
    print(f"\n| step ({steps} steps, batch 256, MLP 64-512-512-10, 1 rank, CPU, {torch.get_num_threads()} threads) "
          "| steps/s | x fp32 |\n|---|---|---|")
    for name, rate in best.items():
        print(f"| {name} | {rate:.1f} | {rate / base:.2f} |")


def bench_predict(rows: int, repeat: int) -> None:
    import pandas as pd

    from hora.estimators.tasks import ClassifierCodec, ClassifierHead
    from hora.estimators.frameworks.torch.codec import TorchCodec
    from hora.estimators.driver.transform import predict_frame

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).eval()
    pdf = pd.DataFrame({"features": list(np.random.default_rng(0).normal(size=(rows, 16)).astype("float32"))})
    codec = TorchCodec()
    classifier = ClassifierCodec(codec, ClassifierHead(10))
    cases = {
        "raw outputs (a regressor's column)": (codec, ["prediction"], [(10,)]),
        "classifier (rawPrediction, probability, prediction)": (
            classifier, ["rawPrediction", "probability", "prediction"], classifier.output_shapes()),
    }
    best = {name: 0.0 for name in cases}
    for _ in range(repeat):
        for name, (c, cols, shapes) in cases.items():
            t0 = time.perf_counter()
            predict_frame(c, model, pdf, ["features"], None, cols, shapes, 4096)
            best[name] = max(best[name], rows / (time.perf_counter() - t0))
    base = best["raw outputs (a regressor's column)"]
    print(f"\n| predict_frame ({rows} rows, 10 classes) | rows/s | x raw |\n|---|---|---|")
    for name, rate in best.items():
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    bench_step(args.steps, args.repeat)
    bench_predict(args.rows, args.repeat)


if __name__ == "__main__":
    main()
