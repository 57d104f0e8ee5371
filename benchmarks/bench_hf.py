"""Hugging Face models in TorchEstimator: is tokenizing on the ranks hidden, and what LoRA saves.

Run: ``.venv/bin/python benchmarks/bench_hf.py [--rows 4096] [--epochs 4] [--repeat 2]``. Prints
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
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import statistics
import tempfile

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
    return BertForSequenceClassification(BertConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=64, num_labels=2, pad_token_id=tok.pad_token_id))


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", choices=["tokenize", "lora"], default=None)
    args = parser.parse_args()
    if args.only in (None, "lora"):
        bench_lora()
    if args.only in (None, "tokenize"):
        bench_tokenize(args.rows, args.epochs, args.repeat)


if __name__ == "__main__":
    main()
