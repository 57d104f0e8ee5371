"""Tiny Hugging Face models and a tokenizer trained on the test's own text (nothing downloaded)."""

from __future__ import annotations

import numpy as np
import pandas as pd

POSITIVE = ["good", "great", "fine", "nice", "happy"]
NEGATIVE = ["bad", "awful", "poor", "sad", "ugly"]
FILLER = ["the", "day", "was", "very", "movie", "food", "it"]


def text_frame(n: int = 64, seed: int = 0) -> pd.DataFrame:
    """A ``text`` column of short sentences and a ``label`` (1.0: a positive word, 0.0: a negative one)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = i % 2
        words = list(rng.choice(FILLER, size=int(rng.integers(2, 6))))
        words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(POSITIVE if label else NEGATIVE)))
        rows.append((" ".join(words), float(label)))
    return pd.DataFrame(rows, columns=["text", "label"])


def tokenizer(texts: list[str], model: str = "wordlevel"):
    """A ``PreTrainedTokenizerFast`` trained on ``texts`` with the ``tokenizers`` library, with a pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    if model == "wordlevel":
        tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        trainer = trainers.WordLevelTrainer(special_tokens=special)
    else:
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        trainer = trainers.BpeTrainer(special_tokens=special, vocab_size=200)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", eos_token="[SEP]",
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def tiny_bert(tok, num_labels: int = 2, seed: int = 0):
    """A 2-layer BERT of hidden size 32 for sequence classification, built from a config."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=num_labels,
                        pad_token_id=tok.pad_token_id, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


def tiny_gpt2(tok, seed: int = 0):
    """A 2-layer GPT-2 of hidden size 32, built from a config."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=64,
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return GPT2LMHeadModel(config)


WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight"]


def cyclic_text(n: int = 64, seed: int = 0) -> pd.DataFrame:
    """A ``text`` column of runs of :data:`WORDS` in their cyclic order (each word predicts the next),
    starting anywhere, 4 to 7 words long: a causal LM's perplexity on it falls fast."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        start, length = int(rng.integers(0, len(WORDS))), int(rng.integers(4, 8))
        rows.append(" ".join(WORDS[(start + k) % len(WORDS)] for k in range(length)))
    return pd.DataFrame({"text": rows})


def lm_tokenizer(texts: list[str], pad: bool = True):
    """A word-level ``PreTrainedTokenizerFast`` for a causal LM (no special tokens added to the text),
    trained on ``texts``; ``pad=False``: without a pad token, as GPT-2's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]",
                                   model_input_names=["input_ids", "attention_mask"],
                                   **({"pad_token": "[PAD]"} if pad else {}))
