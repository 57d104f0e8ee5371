"""A small causal transformer trained with FSDP (``strategy="fsdp"``) on a Spark DataFrame of token ids, 2 ranks.

    python examples/spark_text_fsdp.py [--rows 4000] [--epochs 4] [--num-proc 2] [--store DIR]

The model is built from a config (no downloaded weights): token and position embeddings,
``layers`` pre-norm blocks of causal self-attention and an MLP, a final norm and a head over
the vocabulary. Under ``strategy="fsdp"`` every rank holds a shard of each block (each block
of the ``ModuleList`` is one FSDP unit), of its gradients and of its AdamW state.

The "text" is made here: sequences from a Markov chain over a vocabulary of 64 tokens in
which each token has a few likely successors. A model that learns the chain's transitions
reaches its entropy rate (the floor printed below); one that only learns how often each
token occurs stays at the unigram entropy. The held-out loss is the fit's ``val_loss`` on
the 20% of sequences kept out of training (``validation=0.2``). Exits non-zero unless the
held-out loss is below the midpoint of the two.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 64
    seq_len: int = 32
    dim: int = 64
    heads: int = 4
    layers: int = 2


class Block(torch.nn.Module):
    """Pre-norm causal self-attention and an MLP, each added to the residual stream."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = torch.nn.LayerNorm(cfg.dim)
        self.qkv = torch.nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = torch.nn.Linear(cfg.dim, cfg.dim)
        self.norm2 = torch.nn.LayerNorm(cfg.dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(cfg.dim, 4 * cfg.dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * cfg.dim, cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
        q, k, v = (z.view(n, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(n, t, d))
        return x + self.mlp(self.norm2(x))


class CausalLM(torch.nn.Module):
    """Next-token logits ``(rows, seq_len, vocab)`` for token ids ``(rows, seq_len)``."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(cfg.vocab, cfg.dim)
        self.positions = torch.nn.Embedding(cfg.seq_len, cfg.dim)
        self.blocks = torch.nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.norm = torch.nn.LayerNorm(cfg.dim)
        self.head = torch.nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class NextTokenLoss(torch.nn.Module):
    """Cross-entropy of every position's logits against the next token."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def markov_text(rows: int, cfg: Config, seed: int = 0) -> tuple[pd.DataFrame, float, float]:
    """``(frame of input_ids / targets, the chain's entropy rate, the unigram entropy)`` in nats."""
    rng = np.random.default_rng(seed)
    v = cfg.vocab
    trans = np.full((v, v), 0.02 / v)
    for i in range(v):  # four likely successors per token
        trans[i, rng.choice(v, 4, replace=False)] += rng.dirichlet(np.ones(4)) * 0.98
    trans /= trans.sum(1, keepdims=True)
    seqs = np.empty((rows, cfg.seq_len + 1), dtype=np.int64)
    seqs[:, 0] = rng.integers(0, v, rows)
    cum = trans.cumsum(1)
    for t in range(1, cfg.seq_len + 1):
        u = rng.random(rows)[:, None]
        seqs[:, t] = np.minimum((u > cum[seqs[:, t - 1]]).sum(1), v - 1)
    freq = np.bincount(seqs[:, 1:].ravel(), minlength=v) / seqs[:, 1:].size
    visits = np.bincount(seqs[:, :-1].ravel(), minlength=v) / seqs[:, :-1].size
    rate = float(-(visits[:, None] * trans * np.log(trans)).sum())
    unigram = float(-(freq[freq > 0] * np.log(freq[freq > 0])).sum())
    frame = pd.DataFrame({"input_ids": list(seqs[:, :-1]), "targets": list(seqs[:, 1:])})
    return frame, rate, unigram


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", default=None, help="store URL or folder (default: a temporary folder)")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    from hora.spark import TorchEstimator
    from hora.store import Store

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("hora-text-fsdp")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    store = Store.create(args.store or tempfile.mkdtemp(prefix="hora-fsdp-"))

    cfg = Config()
    frame, floor, unigram = markov_text(args.rows, cfg)
    torch.manual_seed(0)
    net = CausalLM(cfg)
    params = sum(p.numel() for p in net.parameters())
    model = TorchEstimator(
        num_proc=args.num_proc, store=store, model=net, strategy="fsdp",
        optimizer=torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01), loss=NextTokenLoss(),
        task="regression",  # per-position logits: not one class per row
        feature_cols=["input_ids"], label_cols=["targets"], validation=0.2, batch_size=32,
        epochs=args.epochs, gradient_clip_norm=1.0, random_seed=0, verbose=0,
    ).fit(spark.createDataFrame(frame))
    held_out = model.history_[-1]["val_loss"]
    print(f"causal transformer ({params:,} parameters, {cfg.layers} blocks) trained with strategy='fsdp' on "
          f"{args.num_proc} ranks: held-out loss {held_out:.4f} nats per token (chain's entropy rate {floor:.4f}, "
          f"unigram {unigram:.4f}, uniform {math.log(cfg.vocab):.4f})")
    spark.stop()
    if not held_out < (floor + unigram) / 2:
        print(f"FAILED: held-out loss not below {(floor + unigram) / 2:.4f}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
