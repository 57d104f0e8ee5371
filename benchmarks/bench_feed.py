"""Feed rate: the rows per second one rank's reader delivers, as tensors on the rank's device, to a
step that does nothing; against the ceiling of reading the same rows with pyarrow at once.

    python benchmarks/bench_feed.py [--device cpu|cuda] [--batch 1024] [--repeat 3]
                                    [--rows-scalar 400000] [--rows-array 60000] [--rows-png 20000]
                                    [--rows-text 100000]

One rank of one (``rank=0, size=1``: every row of the split), shuffled as a fit shuffles, the
calls a rank of ``TorchEstimator`` makes: :func:`hora.store.make_reader` with the fit's column
operations as its ``batch_fn`` (:func:`hora.estimators.data.columns.column_ops`: PNG bytes decoded
in the reader's thread), then each batch made tensors as ``TorchSession`` makes them
(:func:`hora.estimators.frameworks.torch.tensors.to_inputs` for the features, the label through
``torch.from_numpy``; glibc's malloc thresholds set as a rank sets them) and, on a GPU, moved by :class:`hora.estimators.worker.feed.DeviceFeed` (pinned
memory, a side stream, one batch ahead). The step does nothing with the tensors.

The ceiling, the same run, the same rows: ``pyarrow.parquet.read_table`` of the split's files,
``to_numpy`` of each column (an array column's values at once, reshaped), ``torch.from_numpy``
(and ``.to(device)``); for PNG bytes, each row decoded with Pillow (what a plain loop does). No
batches, no shuffle: what reading the rows costs at least.

Cases: (a) 32 float32 scalar columns (a fit's ``feature_cols=[cols]``, one input of 32), (b) a
32x32x3 uint8 array column, (c) 32x32x3 PNG images, decoded, (d) a text column (8-48 words a row)
tokenized per batch by ``tokenizer=``'s column operation (a WordLevel tokenizer trained here, in
``PreTrainedTokenizerFast``; the ceiling tokenizes every row at once). Best of ``--repeat`` passes
each, alternated, in wall time and in the process's CPU time (all threads: steadier on a busy
machine); and hora unshuffled (``shuffle=False``), what the shuffle costs. Goal: (a) and (b) at
0.8 x the ceiling or more.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_now, table  # noqa: E402

from hora.store import Store, make_reader, materialize  # noqa: E402

SHAPE = (32, 32, 3)


def _png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def frame(case: str, rows: int) -> tuple[pd.DataFrame, list[str]]:
    """The case's DataFrame and its feature columns (a float32 label ``y`` in each)."""
    rng = np.random.default_rng(0)
    y = rng.random(rows, dtype=np.float32)
    if case == "scalars":
        cols = [f"f{i}" for i in range(32)]
        df = pd.DataFrame(rng.random((rows, 32), dtype=np.float32), columns=cols)
        df["y"] = y
        return df, cols
    if case == "text":
        words = np.array([f"w{i}" for i in range(2000)])
        lengths = rng.integers(8, 49, rows)
        texts = [" ".join(words[rng.integers(0, len(words), n)]) for n in lengths]
        return pd.DataFrame({"text": texts, "y": y}), ["text"]
    images = rng.integers(0, 256, size=(rows, *SHAPE), dtype=np.uint8)
    if case == "array":
        return pd.DataFrame({"img": list(images), "y": y}), ["img"]
    # small PNGs of a few colours in blocks (photo-like sizes compress; noise would not)
    blocks = (images[:, ::8, ::8] // 64 * 64).repeat(8, axis=1).repeat(8, axis=2)
    return pd.DataFrame({"img": [_png(im) for im in blocks], "y": y}), ["img"]


class Case:
    """One case's data in a store and its two ways of delivering tensors."""

    def __init__(self, name: str, rows: int, batch: int, device: torch.device, root: str) -> None:
        self.name, self.rows, self.batch, self.device = name, rows, batch, device
        df, self.features = frame(name, rows)
        self.store = Store.create(os.path.join(root, name))
        self.info = materialize(df, self.store, self.features, ["y"], num_proc=1)
        self.files = self.info.file_paths("train")
        self.group = {"feats": self.features} if name == "scalars" else None
        self.tokenizer = word_tokenizer(df["text"]) if name == "text" else None

    def hora(self, epoch: int, shuffle: bool = True) -> int:
        """One pass of a rank's reader (shuffled, as a fit reads), each batch made the step's tensors; the rows given."""
        from hora.estimators.data.columns import column_ops
        from hora.estimators.worker.feed import DeviceFeed
        from hora.estimators.frameworks.torch.tensors import _stack, _tensor, to_inputs

        columns = ["feats", "y"] if self.group else [*self.features, "y"]
        keys = ["feats"] if self.group else self.features
        reader = make_reader(self.store, self.info, rank=0, size=1, batch_size=self.batch, epoch=epoch, seed=0,
                             shuffle=shuffle, columns=columns, groups=self.group)
        config = _Config(self.features)
        collate = None
        if self.tokenizer is not None:
            from hora.estimators.data.text import make_tokenize

            collate = make_tokenize(self.tokenizer, self.features, None, True)
        reader.batch_fn = column_ops(config, {c: reader.specs[c] for c in reader.columns if c in reader.specs},
                                     None, collate)

        def tensors(batch: dict[str, Any]) -> tuple[list[torch.Tensor], None]:
            if self.tokenizer is not None:  # the packed (rows, k, length) ids, as the model adapter takes them
                return [torch.from_numpy(batch["text"]), _tensor(_stack(batch["y"]))], None
            return [*to_inputs(None, [batch[k] for k in keys], None, None, dtype=torch.float32),
                    _tensor(_stack(batch["y"]))], None

        rows = 0
        for out in DeviceFeed(self.device).batches(reader, tensors):
            rows += len(out.tensors[-1])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return rows

    def ceiling(self) -> int:
        """The same rows through pyarrow at once: ``read_table``, ``to_numpy``, ``torch.from_numpy``."""
        table_ = pa.concat_tables([pq.read_table(f, columns=[*self.features, "y"]) for f in self.files])
        out = []
        for name in [*self.features, "y"]:
            col = table_.column(name).combine_chunks()
            if self.name == "array" and name == "img":  # a list column: its values at once
                values = col
                while pa.types.is_list(values.type) or pa.types.is_fixed_size_list(values.type) or \
                        pa.types.is_large_list(values.type):
                    values = values.flatten()
                arr = values.to_numpy(zero_copy_only=False).reshape(len(col), *SHAPE)
            elif self.name == "text" and name == "text":  # every row at once, padded to the longest
                enc = self.tokenizer(col.to_pylist(), padding="longest", return_tensors="np")
                arr = np.stack([enc[k] for k in enc], axis=1)
            elif self.name == "png":
                from PIL import Image

                arr = np.stack([np.asarray(Image.open(io.BytesIO(v))) for v in col.to_numpy(zero_copy_only=False)]) \
                    if name == "img" else col.to_numpy()
            else:
                arr = col.to_numpy()
            t = torch.from_numpy(arr)
            out.append(t.to(self.device) if self.device.type != "cpu" else t)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return len(out[-1])


def word_tokenizer(texts: Any) -> Any:
    """A WordLevel tokenizer trained on ``texts`` (whitespace words), as a ``PreTrainedTokenizerFast`` with a pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(list(texts), trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


class _Config:
    """What :func:`column_ops` reads of a fit's config: the defaults of the estimators."""

    def __init__(self, features: list[str]) -> None:
        from hora.estimators.data.frames import Features

        self.features = Features.parse(features)
        self.on_decode_error = "raise"
        self.max_length = None
        self.truncation = True
        self.sparse_format = "csr"


def measure(fn: Callable[[], int], rows: int) -> tuple[float, float]:
    """``(rows per wall second, rows per CPU second of the process, all threads)`` of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    got = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if got != rows:
        raise AssertionError(f"{got} rows delivered, {rows} expected")
    return rows / wall, rows / max(cpu, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows-scalar", type=int, default=400_000)
    ap.add_argument("--rows-array", type=int, default=60_000)
    ap.add_argument("--rows-png", type=int, default=20_000)
    ap.add_argument("--rows-text", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from hora.estimators.worker.batches import steady_allocator

    steady_allocator()  # glibc's malloc thresholds as a training rank sets them (rank_batches does)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch sees no CUDA device")
    started, load = datetime.datetime.now(datetime.timezone.utc), load_now()
    rows_out = []
    with tempfile.TemporaryDirectory(prefix="hora-bench-feed-") as root:
        for name, rows, what in (("scalars", a.rows_scalar, "(a) 32 float32 columns"),
                                 ("array", a.rows_array, "(b) 32x32x3 uint8 array column"),
                                 ("png", a.rows_png, "(c) 32x32x3 PNG, decoded"),
                                 ("text", a.rows_text, "(d) text column, tokenized")):
            case = Case(name, rows, a.batch, device, root)
            case.hora(0)  # warm: imports, the page cache
            case.ceiling()
            hora_rate = ceiling_rate = hora_cpu = ceiling_cpu = plain_rate = 0.0
            for i in range(a.repeat):  # alternated, best of each
                wall, cpu = measure(lambda: case.hora(1 + i), rows)
                hora_rate, hora_cpu = max(hora_rate, wall), max(hora_cpu, cpu)
                plain_rate = max(plain_rate, measure(lambda: case.hora(1 + i, shuffle=False), rows)[0])
                wall, cpu = measure(case.ceiling, rows)
                ceiling_rate, ceiling_cpu = max(ceiling_rate, wall), max(ceiling_cpu, cpu)
            goal = "0.8" if name in ("scalars", "array") else "-"
            ratio = hora_rate / ceiling_rate
            met = "-" if goal == "-" else ("yes" if ratio >= 0.8 else "NO")
            rows_out.append((what, f"{rows:,}", f"{hora_rate:,.0f}", f"{ceiling_rate:,.0f}", f"{ratio:.2f}",
                             f"{hora_cpu / ceiling_cpu:.2f}", f"{plain_rate / ceiling_rate:.2f}", goal, met))
            print(f"{what}: hora {hora_rate:,.0f} rows/s, ceiling {ceiling_rate:,.0f} rows/s ({ratio:.2f} x; "
                  f"per CPU second {hora_cpu / ceiling_cpu:.2f} x)", flush=True)
    ended = datetime.datetime.now(datetime.timezone.utc)
    print(f"\n{started:%Y-%m-%d %H:%M}-{ended:%H:%M} UTC, {os.cpu_count()} CPUs, load {load} -> {load_now()}, "
          f"device {device}, torch {torch.__version__}, batch {a.batch}, best of {a.repeat}, torch threads "
          f"{torch.get_num_threads()}\n")
    print(table(rows_out, ("case", "rows", "hora rows/s", "ceiling rows/s", "hora / ceiling",
                           "per CPU second: hora / ceiling", "unshuffled hora / ceiling", "goal (wall)", "met")))


if __name__ == "__main__":
    main()
