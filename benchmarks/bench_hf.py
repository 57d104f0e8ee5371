"""Hugging Face models in TorchEstimator: tokenizing on the ranks, what LoRA saves, hora against the Trainer.

Run: ``.venv/bin/python benchmarks/bench_hf.py [--rows 4096] [--epochs 4] [--repeat 2] [--only trainer]``. Prints
markdown tables; every figure is a ratio of two measurements made in the same process.

* **tokenize**: a 2-rank fit (local processes, CPU) of a 2-layer BERT (hidden 64) on a raw text
  column with ``tokenizer=`` (tokenized per batch in the reader's background thread) against the
  same fit on the same text pre-tokenized into ``input_ids`` / ``attention_mask`` id columns
  (padded per batch by the reader to the same lengths). An epoch's seconds are the median of
  ``epoch_time_s`` over the epochs after the first; the two fits run back to back ``--repeat``
  times and the table shows each pair's ratio. Goal <= 1.05x.
* **lora**: a 2-layer BERT of hidden 256 with LoRA r=8 on query and value (the classifier head
  trained too): the bytes of what a checkpoint holds (the trainable state and Adam's state after
  one step, ``torch.save``) against full fine-tuning's. Goal <= 5%.
* **trainer**: the same 2-layer BERT classifier (hidden 64, built from one config), the same
  tokenizer (trained here with ``tokenizers``), batch size, epochs and rows, read from one Parquet
  file, trained three ways: (a) hora, a 2-rank fit (local processes, each with its share of the
  cores) of the raw text column with ``tokenizer=``; (b) ``transformers.Trainer`` in one process
  with ``torch.set_num_threads(2)`` on a dataset read from the Parquet file and tokenized with the
  same tokenizer, padded per batch by ``DataCollatorWithPadding`` (``report_to=[]``, no saving,
  no evaluation); (c) the compute floor: a plain torch loop in one process (2 threads) over the
  same batches tokenized and padded beforehand. The batch size is per process, as both
  ``Trainer``'s ``per_device_train_batch_size`` and hora's ``batch_size`` are (``--hora-batch
  global`` gives each hora rank half of it instead). Steady-state rows/s is the rows of an
  epoch over the median epoch's seconds after the first epoch; the start-up (the seconds outside
  the epochs: reading, tokenizing a whole dataset, starting ranks, writing the store) and the
  first epoch are reported apart. The three run in turn, their order reversed every repeat. Goal: hora >= 1.0x
  the Trainer's rows/s. ``OMP_WAIT_POLICY`` is ``PASSIVE`` unless set: on a machine whose cores
  other work keeps busy, a 2-thread process's OpenMP threads spinning at each barrier slow its
  steps many times over (a 1-thread rank does not spin), which would flatter hora; the policy is
  printed with the table.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

WORDS = ["good", "great", "fine", "nice", "happy", "bad", "awful", "poor", "sad", "ugly", "the", "day", "was", "very",
         "movie", "food", "it", "service", "really", "quite", "and", "a"]


def text_frame(rows: int, seed: int = 0):
    """``text`` (4 to 40 words) and ``label`` (whether a positive word comes first)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 41)))) for _ in range(rows)]
    labels = [float(next((w for w in t.split() if w in WORDS[:10]), "bad") in WORDS[:5]) for t in texts]
    return pd.DataFrame({"text": texts, "label": labels})


def tokenizer(texts: list[str]):
    """A word-level ``PreTrainedTokenizerFast`` trained on ``texts``, with a pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def tiny_bert(tok):
    """A 2-layer BERT of hidden 64 for 2 classes."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(bert_config(tok))


def bert_config(tok):
    """The one config every model of this benchmark is built from."""
    from transformers import BertConfig

    return BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=128, max_position_embeddings=64, num_labels=2, pad_token_id=tok.pad_token_id)


def _fit_seconds(pdf, tok, feature_cols, use_tokenizer: bool, epochs: int) -> float:
    import torch

    from hora.dask import TorchEstimator
    from hora.store import Store

    net = tiny_bert(tok)
    est = TorchEstimator(num_proc=2, backend="local", store=Store.create(tempfile.mkdtemp(prefix="hora-bench-hf-")),
                         model=net, tokenizer=tok if use_tokenizer else None, feature_cols=feature_cols,
                         label_cols=["label"], optimizer=torch.optim.Adam(net.parameters(), lr=1e-3),
                         batch_size=32, epochs=epochs, random_seed=0, verbose=0, task="classification",
                         shuffle=False)
    history = est.fit(pdf).history_
    return statistics.median(h["epoch_time_s"] for h in history[1:])


def bench_tokenize(rows: int, epochs: int, repeat: int) -> None:
    pdf = text_frame(rows)
    tok = tokenizer(pdf.text.tolist())
    enc = tok(pdf.text.tolist())
    ids = pdf[["label"]].copy()
    ids["input_ids"] = [np.asarray(r, dtype=np.int64) for r in enc["input_ids"]]
    ids["attention_mask"] = [np.asarray(r, dtype=np.int64) for r in enc["attention_mask"]]
    print(f"\n### Tokenizing on the ranks ({datetime.date.today()}, {rows} rows, batch 32, 2 ranks, {epochs} epochs)\n")
    print("| pair | raw text + tokenizer= (s/epoch) | pre-tokenized ids (s/epoch) | ratio |")
    print("|---|---|---|---|")
    ratios = []
    for i in range(repeat):
        raw = _fit_seconds(pdf, tok, ["text"], True, epochs)
        pre = _fit_seconds(ids, tok, ["input_ids", "attention_mask"], False, epochs)
        ratios.append(raw / pre)
        print(f"| {i + 1} | {raw:.3f} | {pre:.3f} | {raw / pre:.3f}x |")
    print(f"\nmedian ratio {statistics.median(ratios):.3f}x (goal <= 1.05x)")


def _state_bytes(model, params) -> int:
    import torch

    opt = torch.optim.Adam(params, lr=1e-3)
    inputs = {"input_ids": torch.randint(4, 100, (4, 16)), "attention_mask": torch.ones(4, 16, dtype=torch.long)}
    model(**inputs, labels=torch.tensor([0, 1, 0, 1])).loss.backward()
    opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    return buf.getbuffer().nbytes


def bench_lora() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import BertConfig, BertForSequenceClassification

    from hora.estimators.frameworks.torch.hf import HFModule

    def bert():
        torch.manual_seed(0)
        return BertForSequenceClassification(BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=2,
                                                        num_attention_heads=4, intermediate_size=1024, num_labels=2))

    full = bert()
    full_bytes = _state_bytes(full, list(full.parameters()))
    lora = get_peft_model(bert(), LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"],
                                             modules_to_save=["classifier"]))
    adapter = HFModule(lora, [("tokens", ("input_ids", "attention_mask"))], own_loss=True)
    lora_bytes = _state_bytes(_Keywords(adapter), [p for p in lora.parameters() if p.requires_grad])
    print(f"\n### LoRA r=8, 2-layer BERT hidden 256 ({datetime.date.today()})\n")
    print("| checkpoint (model + Adam state) | bytes | fraction |")
    print("|---|---|---|")
    print(f"| full fine-tuning | {full_bytes:,} | 100% |")
    print(f"| LoRA (trainable state only) | {lora_bytes:,} | {100 * lora_bytes / full_bytes:.2f}% |")


class _Keywords:
    """The adapter called with keywords, its state_dict the trainable one (what hora checkpoints)."""

    def __init__(self, adapter) -> None:
        self.adapter = adapter

    def __call__(self, **kw):
        return self.adapter.model(**kw)

    def state_dict(self):
        return self.adapter.state_dict()


class Run:
    """One way of training: the seconds of its whole run and of each epoch."""

    def __init__(self, total_s: float, epoch_s: list[float], rows: int, data_wait: list[float] | None = None) -> None:
        self.total_s, self.epoch_s, self.rows = total_s, epoch_s, rows
        #: hora: each epoch's wait for batches, the worst rank's fraction of the epoch
        self.data_wait = data_wait

    @property
    def steady_s(self) -> float:
        """The median epoch after the first."""
        return statistics.median(self.epoch_s[1:] if len(self.epoch_s) > 1 else self.epoch_s)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.steady_s

    @property
    def startup_s(self) -> float:
        """Everything outside the epochs: reading, tokenizing a whole dataset, building, starting ranks,
        writing the data to the store, collecting the result."""
        return self.total_s - sum(self.epoch_s)


def run_hora(path: str, tok, epochs: int, per_rank_batch: int, folder: str | None = None) -> Run:
    """(a) a 2-rank fit of the raw text column read from ``path``, tokenized on the ranks."""
    import pandas as pd
    import torch

    from hora.dask import TorchEstimator
    from hora.store import Store

    t0 = time.perf_counter()
    pdf = pd.read_parquet(path)
    net = tiny_bert(tok)
    store = Store.create(tempfile.mkdtemp(prefix="hora-bench-hf-", dir=folder))
    est = TorchEstimator(num_proc=2, backend="local", store=store,
                         model=net, tokenizer=tok, feature_cols=["text"], label_cols=["label"],
                         optimizer=torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0),
                         batch_size=per_rank_batch, epochs=epochs, random_seed=0, verbose=0, task="classification",
                         lr_scaling="none")
    fitted = est.fit(pdf)
    total = time.perf_counter() - t0
    history = fitted.history_
    run = Run(total, [h["epoch_time_s"] for h in history], len(pdf), [h["data_wait"] for h in history])
    run.timings = dict(fitted.fit_timings_)
    return run


def run_trainer(path: str, tok, batch: int, epochs: int, out_dir: str, threads: int = 2) -> Run:
    """(b) ``transformers.Trainer`` in this process, 2 torch threads, the Parquet rows tokenized with the
    tokenizer (no padding) and padded per batch by ``DataCollatorWithPadding``."""
    import pyarrow.parquet as pq
    import torch
    from transformers import DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments

    class EpochClock(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_epoch_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kw):
            self.seconds.append(time.perf_counter() - self.t0)

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    table = pq.read_table(path)
    texts, labels = table.column("text").to_pylist(), table.column("label").to_pylist()
    enc = tok(texts, truncation=True)
    dataset = [{"input_ids": ids, "attention_mask": mask, "labels": int(y)}
               for ids, mask, y in zip(enc["input_ids"], enc["attention_mask"], labels)]
    clock = EpochClock()
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch, num_train_epochs=epochs,
                             learning_rate=1e-3, weight_decay=0.0, optim="adamw_torch", lr_scheduler_type="constant",
                             report_to=[], save_strategy="no", eval_strategy="no", logging_strategy="no",
                             disable_tqdm=True, use_cpu=True, dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=tiny_bert(tok), args=args, train_dataset=dataset,
                      data_collator=DataCollatorWithPadding(tok), callbacks=[clock])
    trainer.train()
    return Run(time.perf_counter() - t0, clock.seconds, len(dataset))


def run_floor(path: str, tok, batch: int, epochs: int, threads: int = 2) -> Run:
    """(c) the compute floor: a plain torch loop in this process (2 threads) over the batches tokenized and
    padded (to each batch's longest row) beforehand."""
    import pyarrow.parquet as pq
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    table = pq.read_table(path)
    texts, labels = table.column("text").to_pylist(), table.column("label").to_pylist()
    batches = []
    for start in range(0, len(texts), batch):
        enc = tok(texts[start:start + batch], padding="longest", truncation=True, return_tensors="pt")
        batches.append((dict(enc), torch.tensor(labels[start:start + batch], dtype=torch.long)))
    net = tiny_bert(tok)
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
    seconds = []
    for _ in range(epochs):
        e0 = time.perf_counter()
        for inputs, y in batches:
            opt.zero_grad()
            net(**inputs, labels=y).loss.backward()
            opt.step()
        seconds.append(time.perf_counter() - e0)
    return Run(time.perf_counter() - t0, seconds, len(texts))


def bench_trainer(rows: int, epochs: int, repeat: int, batch: int, hora_batch: str) -> None:
    import transformers

    pdf = text_frame(rows)
    tok = tokenizer(pdf.text.tolist())
    folder = tempfile.mkdtemp(prefix="hora-bench-trainer-")
    path = os.path.join(folder, "text.parquet")
    pdf.to_parquet(path, index=False)
    per_rank = batch if hora_batch == "per-process" else max(1, batch // 2)
    ways = {"hora": lambda: run_hora(path, tok, epochs, per_rank, folder),
            "trainer": lambda: run_trainer(path, tok, batch, epochs, os.path.join(folder, "trainer")),
            "floor": lambda: run_floor(path, tok, batch, epochs)}
    runs: dict[str, list[Run]] = {k: [] for k in ways}
    loads = [os.getloadavg()[0]]
    try:
        for i in range(repeat):
            for name in (list(ways) if i % 2 == 0 else list(reversed(ways))):
                runs[name].append(ways[name]())
                loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    hora_label = (f"hora, 2 ranks x batch {per_rank}" + (" (global batch matched)" if hora_batch == "global" else ""))
    labels = {"hora": hora_label, "trainer": f"transformers {transformers.__version__} Trainer, 1 process, 2 threads",
              "floor": "plain torch loop, pre-tokenized, 1 process, 2 threads"}
    best = {k: statistics.median(r.rows_per_s for r in v) for k, v in runs.items()}
    scope = "per process" if hora_batch == "per-process" else "(hora: in all)"
    print(f"\n### Against the Hugging Face Trainer ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{rows} rows, batch {batch} {scope}, {epochs} epochs, {repeat} runs each alternated; "
          f"load average (1 min) {min(loads):.2f} to {max(loads):.2f}, {os.cpu_count()} cores, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')})\n")
    print("| way | steady rows/s (median; each run) | start-up s | first epoch s | whole run s | data wait |")
    print("|---|---|---|---|---|---|")
    for k, v in runs.items():
        each = ", ".join(f"{r.rows_per_s:.0f}" for r in v)
        waits = [w for r in v for w in (r.data_wait or [])[1:]]
        wait = f"{100 * statistics.median(waits):.1f}%" if waits else "-"
        print(f"| {labels[k]} | {best[k]:.0f} ({each}) | {statistics.median(r.startup_s for r in v):.1f} | "
              f"{statistics.median(r.epoch_s[0] for r in v):.2f} | {statistics.median(r.total_s for r in v):.1f} | "
              f"{wait} |")
    print("\n(start-up: the seconds outside the epochs; first epoch, whole run, start-up: medians; data wait: "
          "hora's wait for batches, the worst rank's share of a steady epoch, median)")
    h = runs["hora"]
    materialize = statistics.median(r.timings.get("materialize_s", float("nan")) for r in h)
    ranks = statistics.median(r.timings.get("train_s", float("nan")) - sum(r.epoch_s) for r in h)
    print(f"\nhora's start-up (medians): writing the frame to the store {materialize:.1f} s, starting the ranks and "
          f"everything else of the training stage but the epochs {ranks:.1f} s")

    def pairs(a: str, b: str) -> str:  # each repeat's ratio (its runs back to back: under the same load)
        ratios = [x.rows_per_s / y.rows_per_s for x, y in zip(runs[a], runs[b])]
        return f"{statistics.median(ratios):.2f}x (each repeat: {', '.join(f'{r:.2f}' for r in ratios)})"

    print(f"\nhora / Trainer: {pairs('hora', 'trainer')} (goal >= 1.0x); hora / floor: {pairs('hora', 'floor')}; "
          f"Trainer / floor: {pairs('trainer', 'floor')}")


def main() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (see the module's docstring)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="trainer: the batch size per process")
    parser.add_argument("--hora-batch", choices=["per-process", "global"], default="per-process",
                        help="trainer: each hora rank takes --batch rows (as Trainer's per-device batch) or half")
    parser.add_argument("--only", choices=["tokenize", "lora", "trainer"], default=None)
    args = parser.parse_args()
    if args.only in (None, "trainer"):
        bench_trainer(args.rows, args.epochs, args.repeat, args.batch, args.hora_batch)
    if args.only in (None, "lora"):
        bench_lora()
    if args.only in (None, "tokenize"):
        bench_tokenize(args.rows, args.epochs, args.repeat)


if __name__ == "__main__":
    main()
