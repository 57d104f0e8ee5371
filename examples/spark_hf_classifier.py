"""A Hugging Face BERT classifier fine-tuned with LoRA on a raw text column of a Spark DataFrame, 2 ranks.

    python examples/spark_hf_classifier.py [--epochs 12] [--num-proc 2] [--rows 512] [--store DIR]

Nothing is downloaded: the sentences are generated here (a positive or a negative word among
filler words), the WordPiece-free word-level tokenizer is trained on them with ``tokenizers`` and
wrapped in ``PreTrainedTokenizerFast``, and the 2-layer BERT is built from a ``BertConfig``. The
model is wrapped in a ``peft`` LoRA model: only the adapters and the classifier head train.
``TorchEstimator(tokenizer=tok, loss=None)`` tokenizes the ``text`` column on the ranks per batch
and trains on the model's own loss; the fitted model has the adapters merged, scores a held-out
DataFrame (``rawPrediction`` / ``probability`` / ``prediction``, scored with MLlib's
``MulticlassClassificationEvaluator``) and is exported with ``save_pretrained``. Exits non-zero
below ``--min-accuracy``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import pandas as pd
import torch

POSITIVE = ["good", "great", "fine", "nice", "happy", "superb", "lovely"]
NEGATIVE = ["bad", "awful", "poor", "sad", "ugly", "boring", "dull"]
FILLER = ["the", "day", "was", "very", "movie", "food", "it", "service", "really", "quite", "and", "a"]


def sentences(rows: int, seed: int = 0) -> pd.DataFrame:
    """``text`` (a short sentence) and ``label`` (1.0: it holds a positive word, 0.0: a negative one)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(rows):
        label = i % 2
        words = list(rng.choice(FILLER, size=int(rng.integers(3, 9))))
        words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(POSITIVE if label else NEGATIVE)))
        out.append((" ".join(words), float(label)))
    return pd.DataFrame(out, columns=["text", "label"])


def train_tokenizer(texts: list[str]):
    """A word-level ``PreTrainedTokenizerFast`` trained on ``texts`` ([CLS] ... [SEP], a [PAD] token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", model_input_names=["input_ids", "token_type_ids",
                                                                         "attention_mask"])


def lora_bert(tok):
    """A 2-layer BERT (hidden 64) for 2 classes, with LoRA adapters (r=8) on its attention's query and value."""
    from peft import LoraConfig, get_peft_model
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=64, num_labels=2,
                        pad_token_id=tok.pad_token_id)
    return get_peft_model(BertForSequenceClassification(config),
                          LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"],
                                     modules_to_save=["classifier"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--store", default=None, help="store URL or folder (default: a temporary folder)")
    parser.add_argument("--min-accuracy", type=float, default=0.9)
    args = parser.parse_args(argv)

    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.sql import SparkSession

    from hora.spark import TorchEstimator
    from hora.store import Store

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("hora-hf-classifier")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    store = Store.create(args.store or tempfile.mkdtemp(prefix="hora-hf-"))

    frame = sentences(args.rows)
    n_test = len(frame) // 5
    tok = train_tokenizer(frame.text.tolist())
    train_df = spark.createDataFrame(frame.iloc[n_test:])  # text: string, label: double
    test_df = spark.createDataFrame(frame.iloc[:n_test])
    net = lora_bert(tok)
    trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
    total = sum(p.numel() for p in net.parameters())
    model = TorchEstimator(
        num_proc=args.num_proc, store=store, model=net, tokenizer=tok, max_length=32,
        optimizer=torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-2),
        feature_cols=["text"], label_cols=["label"], task="classification",  # loss=None: the model's own loss
        batch_size=16, epochs=args.epochs, random_seed=0, verbose=0, lr_scaling="none",
    ).fit(train_df)
    scored = model.transform(test_df)
    accuracy = MulticlassClassificationEvaluator(labelCol="label", predictionCol="prediction",
                                                 metricName="accuracy").evaluate(scored)
    export = os.path.join(tempfile.mkdtemp(prefix="hora-hf-export-"), "model")
    model.save_pretrained(export)  # adapters merged: loads with AutoModelForSequenceClassification
    print(f"LoRA BERT on {len(frame) - n_test} sentences, {args.num_proc} ranks, {trainable} of {total} parameters "
          f"trained: held-out accuracy {accuracy:.4f} on {n_test} sentences (MulticlassClassificationEvaluator); "
          f"exported to {export}")
    spark.stop()
    if accuracy < args.min_accuracy:
        print(f"FAILED: accuracy below {args.min_accuracy}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
