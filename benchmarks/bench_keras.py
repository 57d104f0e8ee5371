"""Keras 3 on hora: training throughput scaling, and the cost of the TensorFlow bridge.

::

    python benchmarks/bench_keras.py [--steps 60] [--batch-size 32] [--iters 30]

1. **Scaling.** The digits CNN of ``examples/tensorflow_digits.py`` trained with
   ``model.fit`` and ``hora.keras.DistributedOptimizer`` on 2 ranks with one TensorFlow
   thread each, against the same program on 1 rank with one thread (both launched the
   same way, by ``hora.runners.run``, in this run). Scaling efficiency =
   throughput(2 ranks) / (2 x throughput(1 rank)). A third row runs the 2 ranks without
   exchanging gradients, to separate CPU sharing from communication.
2. **Bridge.** ``hora.tensorflow.allreduce`` of a ``tf.Tensor`` against
   ``hora.native.allreduce`` of a torch tensor of the same bytes, on 2 ranks. The tf path
   hands TensorFlow's buffer to the backend without a copy and takes the result back
   through DLPack (or one copy), so the ratio stays near 1; a bridge that copied twice
   each way would show up as a ratio growing with the size.

Prints Markdown tables. Timings are medians over repeats measured in this run; on a
shared 2-core machine expect noise of a few tens of percent.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _train_rank(steps: int, warmup: int, batch_size: int, exchange: bool = True) -> dict:
    import os

    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    from sklearn.datasets import load_digits

    import hora.keras as hk
    import hora.native as hn

    hk.init()
    rank, size = hk.rank(), hk.size()
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None][rank::size]
    y = digits.target.astype("int64")[rank::size]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=rank).repeat().batch(
        batch_size, drop_remainder=True).prefetch(2)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    opt = keras.optimizers.SGD(0.01 * size, momentum=0.9)
    if size > 1 and exchange:
        opt = hk.DistributedOptimizer(opt)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    callbacks = [hk.callbacks.BroadcastGlobalVariablesCallback(0)] if size > 1 and exchange else []
    model.fit(ds, epochs=1, steps_per_epoch=warmup, verbose=0, callbacks=callbacks)  # trace, build, warm
    hn.barrier()
    t0 = time.perf_counter()
    hist = model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0)
    hn.barrier()
    elapsed = time.perf_counter() - t0
    return {"rank": rank, "size": size, "seconds": elapsed, "samples": steps * batch_size,
            "loss": float(hist.history["loss"][-1])}


def _allreduce_rank(sizes: list[int], iters: int, repeats: int) -> list[dict]:
    import os

    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    import torch

    import hora.native as hn
    import hora.tensorflow as hvd

    hvd.init()
    rows = []
    for n in sizes:
        t_torch = torch.ones(n, dtype=torch.float32)
        t_tf = tf.ones([n], dtype=tf.float32)

        def torch_op():
            return hn.allreduce(t_torch, op=hn.Sum)

        def tf_op():
            return hvd.allreduce(t_tf, op=hvd.Sum)

        for fn in (torch_op, tf_op):  # warm the response cache
            for _ in range(3):
                fn()
        times: dict[str, list[float]] = {"torch": [], "tf": []}
        for _ in range(repeats):  # interleaved, so drift hits both alike
            for key, fn in (("torch", torch_op), ("tf", tf_op)):
                hn.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    out = fn()
                elapsed = (time.perf_counter() - t0) / iters
                times[key].append(elapsed)
        assert float(out[0]) == hvd.size()
        rows.append({"floats": n, "torch_s": statistics.median(times["torch"]),
                     "tf_s": statistics.median(times["tf"])})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="timed training steps per rank")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iters", type=int, default=20, help="allreduces per timing")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)

    import hora.runners

    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}
    one = hora.runners.run(_train_rank, args=(args.steps, args.warmup, args.batch_size), num_proc=1,
                           backend="local", env=env, verbose=0)
    two = hora.runners.run(_train_rank, args=(args.steps, args.warmup, args.batch_size), num_proc=2,
                           backend="local", env=env, verbose=0)
    alone = hora.runners.run(_train_rank, args=(args.steps, args.warmup, args.batch_size, False), num_proc=2,
                             backend="local", env=env, verbose=0)
    tput1 = one[0]["samples"] / one[0]["seconds"]
    tput2 = sum(r["samples"] for r in two) / max(r["seconds"] for r in two)
    tput0 = sum(r["samples"] for r in alone) / max(r["seconds"] for r in alone)
    eff = tput2 / (2 * tput1)
    print("## Keras digits CNN, model.fit, 1 TensorFlow thread per rank\n")
    print("| ranks | batch/rank | steps | samples/s | scaling efficiency |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| 1 | {args.batch_size} | {args.steps} | {tput1:,.0f} | 1.00 (baseline) |")
    print(f"| 2 | {args.batch_size} | {args.steps} | {tput2:,.0f} | {eff:.2f} |")
    print(f"| 2, no gradient exchange (CPU sharing only) | {args.batch_size} | {args.steps} | {tput0:,.0f} | "
          f"{tput0 / (2 * tput1):.2f} |")
    print(f"\nms per step: 1 rank {one[0]['seconds'] / args.steps * 1e3:.1f}, 2 ranks "
          f"{max(r['seconds'] for r in two) / args.steps * 1e3:.1f}, 2 ranks without exchange "
          f"{max(r['seconds'] for r in alone) / args.steps * 1e3:.1f}")
    print()

    sizes = [1 << 10, 1 << 16, 1 << 20, 1 << 22]
    rows = hora.runners.run(_allreduce_rank, args=(sizes, args.iters, args.repeats), num_proc=2,
                            backend="local", env=env, verbose=0)[0]
    print("## allreduce (Sum, 2 ranks, Gloo): tf.Tensor through the bridge vs torch tensor, same bytes\n")
    print("| float32 elements | bytes | torch ms/op | tf ms/op | tf / torch |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['floats']:,} | {r['floats'] * 4:,} | {r['torch_s'] * 1e3:.3f} | {r['tf_s'] * 1e3:.3f} | "
              f"{r['tf_s'] / r['torch_s']:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
