"""Horovod's classic TensorFlow 2 program on scikit-learn's digits, with ``import hora.tensorflow as hvd``.

Run it on two local processes::

    hora run -np 2 python examples/tensorflow_digits.py

Each rank trains a small CNN on its shard of the 8x8 digits (bundled with scikit-learn,
no download), averaging gradients with ``hvd.DistributedGradientTape``. The learning
rate is scaled by ``hvd.size()``, rank 0's initial variables are broadcast after the
first step, and only rank 0 writes checkpoints. At the end the program checks that the
loss went down and that every rank holds the same weights.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import hora.tensorflow as hvd  # noqa: E402


def build_model() -> tf.keras.Model:
    return tf.keras.Sequential([
        tf.keras.Input(shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(2),
        tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.001, help="single-process learning rate; scaled by hvd.size()")
    p.add_argument("--checkpoint-dir", default=None, help="default: a fresh temporary directory")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    hvd.init()

    # Pin one GPU per process by local rank (none with tensorflow-cpu).
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int64")
    # Every rank gets its own shard, and the same number of batches.
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    steps_per_epoch = len(x) // args.batch_size
    dataset = (tf.data.Dataset.from_tensor_slices((x, y))
               .shuffle(len(x), seed=args.seed + hvd.rank()).repeat()
               .batch(args.batch_size, drop_remainder=True))

    tf.keras.utils.set_random_seed(args.seed + hvd.rank())  # different init per rank: the broadcast must fix it
    model = build_model()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = tf.keras.optimizers.Adam(args.lr * hvd.size())
    checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="hora-tf-digits-")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss_value = loss_fn(labels, logits)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        # Broadcast initial variables from rank 0 after the first step, when the
        # optimizer's variables exist.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss_value

    epoch_losses = []
    batches = iter(dataset)
    for epoch in range(args.epochs):
        losses = []
        for step in range(steps_per_epoch):
            images, labels = next(batches)
            loss_value = training_step(images, labels, epoch == 0 and step == 0)
            losses.append(float(loss_value))
        mean_loss = float(hvd.allreduce(tf.constant(np.mean(losses))))
        epoch_losses.append(mean_loss)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {mean_loss:.4f}", flush=True)
            checkpoint.save(os.path.join(checkpoint_dir, "ckpt"))

    # Every rank must hold exactly rank 0's weights.
    flat = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    digests = hvd.allgather_object(hashlib.sha256(flat.tobytes()).hexdigest())
    weights_equal = all(d == digests[0] for d in digests)
    result = {"rank": hvd.rank(), "size": hvd.size(), "epoch_losses": epoch_losses,
              "weights_equal": weights_equal, "checkpoint_dir": checkpoint_dir}
    if hvd.rank() == 0:
        print(f"weights equal on all {hvd.size()} ranks: {weights_equal}; checkpoints in {checkpoint_dir}", flush=True)
    if not weights_equal:
        raise SystemExit(f"rank {hvd.rank()}: weights differ across ranks: {digests}")
    if not epoch_losses[-1] < epoch_losses[0]:
        raise SystemExit(f"rank {hvd.rank()}: loss did not decrease: {epoch_losses}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
