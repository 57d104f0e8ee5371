"""A tiny Hugging Face GPT-2 fine-tuned as a causal language model on a raw text column of a Dask
DataFrame, on a Dask LocalCluster with 2 ranks.

    python examples/dask_hf_causal_lm.py [--epochs 6] [--num-proc 2] [--rows 384] [--store DIR]

Nothing is downloaded: the sentences come from a small grammar generated here ("alice reads the
book every morning"), the word-level tokenizer is trained on them with ``tokenizers`` and wrapped
in ``PreTrainedTokenizerFast``, and the 2-layer GPT-2 is built from a ``GPT2Config``.
``TorchEstimator(task="causal_lm", tokenizer=tok)`` takes no label column: the labels are the input
ids (the model shifts them; padding does not count), the loss is the model's own and the history
has ``perplexity`` / ``val_perplexity``. ``transform`` on held-out sentences writes each row's mean
token loss (``loss``) and, with ``generate_kwargs``, the generated continuation (``generated``).
Exits non-zero when the held-out perplexity is above ``--max-perplexity`` (the grammar's own floor
is about 2.2; a model that learned nothing is near the vocabulary's size, 19).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import torch

SUBJECTS = ["alice", "bob", "carol", "dave"]
VERBS = ["reads", "writes", "sells", "buys"]
OBJECTS = ["book", "letter", "poem", "card"]
TIMES = ["morning", "evening", "night"]


def sentences(rows: int, seed: int = 0) -> pd.DataFrame:
    """A ``text`` column: "<subject> <verb> the <object> every <time>", each word drawn at random."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"text": [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} the {rng.choice(OBJECTS)} every "
                                  f"{rng.choice(TIMES)}" for _ in range(rows)]})


def train_tokenizer(texts: list[str]):
    """A word-level ``PreTrainedTokenizerFast`` trained on ``texts``, with a [PAD] and an [EOS] token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]",
                                   model_input_names=["input_ids", "attention_mask"])


def tiny_gpt2(tok):
    """A 2-layer GPT-2 (hidden 64) built from a config."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=2, n_positions=32,
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    return GPT2LMHeadModel(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--rows", type=int, default=384)
    parser.add_argument("--store", default=None, help="store URL or folder (default: a temporary folder)")
    parser.add_argument("--max-perplexity", type=float, default=3.0)
    args = parser.parse_args(argv)

    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    from hora.dask import TorchEstimator
    from hora.store import Store

    t0 = time.time()
    store = Store.create(args.store or tempfile.mkdtemp(prefix="hora-causal-lm-"))
    train, test = sentences(args.rows, seed=0), sentences(64, seed=1)
    tok = train_tokenizer(train.text.tolist())
    net = tiny_gpt2(tok)
    with LocalCluster(n_workers=args.num_proc, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=40) as cluster, Client(cluster):
        model = TorchEstimator(
            num_proc=args.num_proc, store=store, model=net, tokenizer=tok, feature_cols=["text"],
            task="causal_lm",  # no label_cols: the labels are the input ids
            optimizer=torch.optim.AdamW(net.parameters(), lr=1e-2), batch_size=16, epochs=args.epochs,
            validation=0.2, random_seed=0, verbose=0, lr_scaling="none",
            generate_kwargs={"max_new_tokens": 4, "do_sample": False},
        ).fit(dd.from_pandas(train, npartitions=2))
        # held-out sentences: each row's mean token loss; prompts of two words: their continuation
        scored = model.transform(dd.from_pandas(test, npartitions=2)).compute()
        prompts = pd.DataFrame({"text": ["alice reads", "dave buys the"]})
        generated = model.transform(prompts)["generated"].tolist()
    held_out = math.exp(float(scored["loss"].mean()))  # every test sentence has 6 words: the token mean
    first, last = model.history_[0], model.history_[-1]
    print(f"GPT-2 on {args.rows} sentences, {args.num_proc} ranks, {args.epochs} epochs: perplexity "
          f"{first['perplexity']:.2f} -> {last['perplexity']:.2f} (validation {last['val_perplexity']:.2f}); "
          f"held-out perplexity {held_out:.2f} on {len(test)} sentences; in {time.time() - t0:.1f} s")
    for prompt, text in zip(prompts.text, generated):
        print(f"  {prompt!r} -> {text!r}")
    if held_out > args.max_perplexity:
        print(f"FAILED: held-out perplexity above {args.max_perplexity}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
