"""Data and models of the estimator tests, one definition each, importable by the Spark and Dask workers."""

from __future__ import annotations

import numpy as np


def regression_data(n: int = 256, d: int = 4, seed: int = 0):
    """(X float32 (n, d), y float64 (n,)) of a noiseless linear target."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("float32")
    w = np.arange(1, d + 1, dtype="float32") / d
    return x, (x @ w + 0.5).astype("float64")


def regression_frame(n: int = 256, d: int = 4, seed: int = 0):
    """:func:`regression_data` as a pandas frame: an array column ``features`` and a label ``y``."""
    import pandas as pd

    x, y = regression_data(n=n, d=d, seed=seed)
    return pd.DataFrame({"features": list(x), "y": y})


def regression_columns(n: int = 256, seed: int = 0):
    """:func:`regression_data` (4 features) as a pandas frame of scalar columns ``a``-``d`` and ``y``."""
    import pandas as pd

    x, y = regression_data(n=n, seed=seed)
    pdf = pd.DataFrame(x, columns=list("abcd"))
    pdf["y"] = y
    return pdf


def mlp(d: int = 4, out: int = 1, seed: int = 0):
    """A seeded ``d -> 16 -> out`` MLP."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d, 16), torch.nn.ReLU(), torch.nn.Linear(16, out))


def sparse_images(n: int = 96, classes: int = 2, seed: int = 0):
    """``[(SparseVector(64), label double)]``: 8x8 'images' whose lit pixels say the class (as a libsvm MNIST)."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(seed)
    band = 64 // classes
    rows = []
    for i in range(n):
        label = i % classes
        idx = np.sort(rng.choice(band, 6, replace=False) + band * label)
        rows.append((Vectors.sparse(64, idx.tolist(), [1.0] * len(idx)), float(label)))
    return rows


def scalar_frame(n: int = 96, cols: int = 64, seed: int = 0):
    """A pandas frame of ``cols`` float32 scalar columns ``x0..``, an array column ``extra`` (3 floats), a label
    ``y`` linear in them, and a shuffled index (as tabular data arrives)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, cols)).astype("float32")
    extra = rng.normal(size=(n, 3)).astype("float32")
    y = x[:, :4].sum(axis=1) / 4 + extra[:, 0] / 2
    pdf = pd.DataFrame({f"x{i}": x[:, i] for i in range(cols)})
    pdf["extra"] = list(extra)
    pdf["y"] = y.astype("float64")
    pdf.index = rng.permutation(np.arange(1000, 1000 + n))
    return pdf


def torch_image_net():
    """A small CNN over 1x8x8 inputs, log-softmax over 2 classes; a buffer counts minibatch-function calls."""
    import torch
    import torch.nn.functional as F

    class ImageNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 4, 3)
            self.fc = torch.nn.Linear(4 * 6 * 6, 2)
            self.register_buffer("minibatch_calls", torch.zeros(()))

        def forward(self, features):
            x = F.relu(self.conv(features.float()))
            return F.log_softmax(self.fc(x.flatten(1)), dim=1)

    torch.manual_seed(0)
    return ImageNet()


def horovod_minibatch(model, optimizer, transform_outputs, loss_fn, inputs, labels, sample_weights,
                      backward_passes_per_step, batch_idx):
    """Horovod's default minibatch step (step at the start of each window), counting its calls in a buffer."""
    import torch

    if batch_idx % backward_passes_per_step == 0:
        if batch_idx != 0:
            optimizer.step()
        optimizer.zero_grad()
    outputs = model(*inputs)
    outputs, labels = transform_outputs(outputs, labels)
    loss = loss_fn(outputs, labels, sample_weights)
    loss.backward()
    with torch.no_grad():
        model.minibatch_calls += 1
    return outputs, loss


def torch_tabular_net(cols: int = 64):
    """``model(group, extra)``: a (n, cols) feature group and a (n, 3) array input -> (n, 1)."""
    import torch

    class TabularNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(cols, 8)
            self.b = torch.nn.Linear(3, 8)
            self.out = torch.nn.Linear(8, 1)

        def forward(self, group, extra):
            return self.out(torch.relu(self.a(group) + self.b(extra)))

    torch.manual_seed(0)
    return TabularNet()


def keras_image_net():
    """A Keras CNN with an (8, 8, 1) input (fed flat 64-vectors) and a 2-way softmax."""
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                             keras.layers.Flatten(), keras.layers.Dense(2, activation="softmax")])


def keras_group_net(cols: int = 8):
    """A Keras regressor of one (n, cols) feature group input."""
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((cols,))
    return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(inputs)))


def lightning_image_module():
    """A LightningModule as Horovod's pytorch_lightning_spark_mnist.py writes one (8x8 inputs, 2 classes)."""
    import lightning as L
    import torch
    import torch.nn.functional as F

    class ImageModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 4, 3)
            self.fc = torch.nn.Linear(4 * 6 * 6, 2)

        def forward(self, x):
            x = x.float().reshape((-1, 1, 8, 8))
            return F.log_softmax(self.fc(F.relu(self.conv(x)).flatten(1)), -1)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.5)

        def training_step(self, batch, batch_idx):
            loss = F.nll_loss(self(batch["features"]), batch["label"].long())
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", F.nll_loss(self(batch["features"]), batch["label"].long()))

    torch.manual_seed(0)
    return ImageModule()


def lightning_data_module(n: int = 64):
    """A LightningDataModule of dict batches ``{"features": (64,), "label": ()}``, the classes of sparse_images."""
    import lightning as L
    import torch

    class Rows(torch.utils.data.Dataset):
        def __init__(self, seed: int) -> None:
            rng = np.random.default_rng(seed)
            self.rows = []
            for i in range(n):
                x = np.zeros(64, dtype="float32")
                x[np.sort(rng.choice(32, 6, replace=False) + 32 * (i % 2))] = 1.0
                self.rows.append({"features": torch.tensor(x), "label": torch.tensor(float(i % 2))})

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, i: int):
            return self.rows[i]

    class Images(L.LightningDataModule):
        def train_dataloader(self):
            return torch.utils.data.DataLoader(Rows(0), batch_size=8)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(Rows(1), batch_size=8)

    return Images()


# the column types of tests/estimators/test_column_types.py and tests/ray: image bytes, token ids, words
def column_png(value: int, rng) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    pixels = np.clip(np.full((6, 6), value) + rng.integers(0, 10, (6, 6)), 0, 255).astype("uint8")
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def column_frame(n: int = 160, seed: int = 0):
    """Images whose brightness, token ids whose range and words that tell the class (0/1)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    return pd.DataFrame({
        "img": [column_png(200 if t else 20, rng) for t in y],
        "tok": [(rng.integers(1, 5, size=rng.integers(2, 9)) + 5 * t).astype("int64") for t in y],
        "word": ["good" if t else "bad" for t in y],
        "y": y.astype("float64"),
    })


def multi_net():
    """Image (HWC uint8), padded token ids with their mask, and a word id: two logits (a new module, seeded)."""
    import torch

    class MultiNet(torch.nn.Module):
        """Image (HWC uint8), padded token ids with their mask, and a word id: two logits."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(12, 4)
            self.word = torch.nn.Embedding(2, 2)
            self.lin = torch.nn.Linear(36 + 4 + 2, 2)

        def forward(self, img, tok, mask, word):
            mask = mask.to(self.emb.weight.dtype)
            e = (self.emb(tok) * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
            return self.lin(torch.cat([img.flatten(1).float() / 255.0, e, self.word(word.long()).flatten(1)], 1))

    return MultiNet()


def column_words(batch):
    """A tokenizer on the rank: the string column as numpy objects -> ids."""
    out = dict(batch)
    out["word"] = np.array([1 if w == "good" else 0 for w in batch["word"]], dtype=np.int64)
    return out
