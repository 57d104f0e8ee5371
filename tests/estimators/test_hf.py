"""Hugging Face models fine-tuned from a text column in one fit: tiny models built from a config and a
tokenizer trained here with ``tokenizers`` (nothing is downloaded), on Spark local[2] and a Dask
LocalCluster with 2 ranks, and the bad inputs refused on the driver."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")

from hora.errors import ConfigError, DataError  # noqa: E402
from tests.estimators.hf_helpers import text_frame, tiny_bert, tokenizer  # noqa: E402

pytestmark = [pytest.mark.timeout(300)]


def _args(store, model, tok, **kw):
    args = dict(num_proc=2, store=store, model=model, tokenizer=tok, feature_cols=["text"], label_cols=["label"],
                optimizer=torch.optim.Adam(model.parameters(), lr=5e-3), batch_size=8, epochs=6, random_seed=1,
                verbose=0, lr_scaling="none", task="classification")
    args.update(kw)
    return args


def test_spark_bert_classifier_own_loss_transform_persist_and_export(spark, store, tmp_path):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from transformers import AutoModelForSequenceClassification

    from hora.spark import TorchEstimator, TorchModel

    pdf = text_frame(128)
    tok = tokenizer(pdf.text.tolist())
    df = spark.createDataFrame(pdf).repartition(2)
    model = TorchEstimator(**_args(store, tiny_bert(tok), tok)).fit(df)
    losses = [h["loss"] for h in model.getHistory()]
    assert losses[-1] < losses[0] * 0.5, losses  # the model's own cross-entropy, falling
    scored = model.transform(df)
    assert {"rawPrediction", "probability", "prediction"} <= set(scored.columns)
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
    assert accuracy >= 0.9, accuracy
    # write/load round-trips; the result's transform is the same (tokenizer kept for transform)
    path = str(tmp_path / "model")
    model.write().overwrite().save(path)
    first = scored.select("text", "rawPrediction").toPandas().sort_values("text", kind="stable")
    again = TorchModel.load(path).transform(df).select("text", "rawPrediction").toPandas()
    again = again.sort_values("text", kind="stable")
    raw = np.stack(first.rawPrediction.map(lambda v: v.toArray()))
    np.testing.assert_allclose(np.stack(again.rawPrediction.map(lambda v: v.toArray())), raw, rtol=1e-5, atol=1e-6)
    # export in the Hugging Face format: it loads with from_pretrained and gives the same logits
    hf_dir = str(tmp_path / "hf")
    model.save_pretrained(hf_dir)
    loaded = AutoModelForSequenceClassification.from_pretrained(hf_dir).eval()
    enc = tok(first.text.tolist()[:8], padding="longest", return_tensors="pt")
    with torch.no_grad():
        logits = loaded(**enc).logits.numpy()
    np.testing.assert_allclose(logits, raw[:8], rtol=1e-3, atol=1e-4)  # (batches padded to other lengths)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(hf_dir)("good day")["input_ids"] == tok("good day")["input_ids"]


def test_dask_text_pair_given_loss_and_numeric_keyword(dask_client, store):
    """A text pair tokenized as a pair, a loss given (on output.logits), predict_proba / classes_."""
    import dask.dataframe as dd

    from hora.dask import TorchEstimator

    pdf = text_frame(128)
    pdf["other"] = text_frame(128, seed=3).text  # the second text of each pair (noise)
    pdf["scale"] = np.float32(1.0)  # a numeric column, passed by its name
    tok = tokenizer(pdf.text.tolist() + pdf.other.tolist())
    seen = []

    class Recording(torch.nn.Module):
        """A BERT classifier that records the keyword arguments it is called with."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = tiny_bert(tok)

        def forward(self, input_ids, attention_mask, token_type_ids, scale):
            seen.append(int(token_type_ids.max()))
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            out.logits = out.logits * scale.reshape(-1, 1)
            return out

    net = Recording()
    est = TorchEstimator(**_args(store, net, tok, feature_cols=["text", "other", "scale"],
                                 loss=torch.nn.CrossEntropyLoss(), max_length=12))
    fitted = est.fit(dd.from_pandas(pdf, npartitions=2))
    assert seen and max(seen) == 1  # the driver's check saw the pair's second segment
    assert list(fitted.classes_) == [0, 1]
    proba = fitted.predict_proba(dd.from_pandas(pdf, npartitions=2))
    pdf["scale"] = np.float32(0.0)  # the numeric keyword reaches the model at transform too: uniform probabilities
    np.testing.assert_allclose(np.asarray(fitted.predict_proba(pdf)), 0.5, atol=1e-6)
    proba = proba.compute() if hasattr(proba, "compute") else proba
    assert np.asarray(proba).shape == (128, 2)
    assert (np.asarray(proba).argmax(1) == pdf.label.to_numpy()).mean() >= 0.9


# ---------------------------------------------------------------------------------------------
# bad input, refused on the driver (pandas frames: nothing starts)
# ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_string_column_without_tokenizer_names_it_and_points_at_tokenizer(store):
    from hora.dask import TorchEstimator

    pdf = text_frame(16)
    tok = tokenizer(pdf.text.tolist())
    net = torch.nn.Linear(4, 2)
    with pytest.raises(DataError, match=r"\['text'\].*tokenizer="):
        TorchEstimator(**_args(store, net, None, loss=torch.nn.CrossEntropyLoss())).fit(pdf)
    del tok


@pytest.mark.timeout(60)
def test_forward_argument_missing_from_batch_names_it_and_the_keys(store):
    from hora.dask import TorchEstimator

    pdf = text_frame(16)
    tok = tokenizer(pdf.text.tolist())

    class NeedsPixels(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = tiny_bert(tok)

        def forward(self, input_ids, attention_mask, pixel_values):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask)

    with pytest.raises(ConfigError, match=r"'pixel_values'.*\['attention_mask', 'input_ids', 'token_type_ids'\]"):
        TorchEstimator(**_args(store, NeedsPixels(), tok)).fit(pdf)


@pytest.mark.timeout(60)
def test_unpicklable_tokenizer_and_missing_pad_token_are_config_errors(store):
    import threading

    from hora.dask import TorchEstimator

    pdf = text_frame(16)
    tok = tokenizer(pdf.text.tolist())

    class Locked:
        """A callable tokenizer holding a lock (it cannot travel to the ranks)."""

        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __call__(self, texts):
            return {"input_ids": [[1] * len(t.split()) for t in texts]}

    with pytest.raises(ConfigError, match="tokenizer Locked cannot be pickled"):
        TorchEstimator(**_args(store, tiny_bert(tok), Locked())).fit(pdf)
    tok.pad_token = None
    with pytest.raises(ConfigError, match="no pad token.*tokenizer.pad_token"):
        TorchEstimator(**_args(store, tiny_bert(tokenizer(pdf.text.tolist())), tok)).fit(pdf)


def test_dask_lora_trains_adapters_only_merges_and_round_trips(dask_client, store, tmp_path):
    """A peft LoRA model: only the adapters (and the head) train; checkpoints hold them only; the fitted
    model has them merged; save/load and save_pretrained round-trip."""
    import io

    import dask.dataframe as dd
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    from hora.dask import TorchEstimator
    from hora.dask import TorchModel as DaskTorchModel

    pdf = text_frame(128)
    tok = tokenizer(pdf.text.tolist())
    base = tiny_bert(tok)
    frozen = {k: v.clone() for k, v in base.state_dict().items() if "classifier" not in k}
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"],
                                           modules_to_save=["classifier"]))
    trainable = [p for p in lora.parameters() if p.requires_grad]
    fitted = TorchEstimator(**_args(store, lora, tok, optimizer=torch.optim.Adam(trainable, lr=2e-2), epochs=8,
                                    run_id="lora")).fit(dd.from_pandas(pdf, npartitions=2))
    losses = [h["loss"] for h in fitted.history_]
    assert losses[-1] < losses[0], losses
    _, data = store.latest_checkpoint("lora")
    ckpt = torch.load(io.BytesIO(data), weights_only=False)
    names = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert {k.removeprefix("model.") for k in ckpt["model"]} == names  # the trainable state only
    assert len(ckpt["optimizer"]["state"]) == len(trainable)
    full = io.BytesIO()
    torch.save(lora.state_dict(), full)
    assert len(data) < 0.5 * full.getbuffer().nbytes
    merged = fitted.model_.model
    assert type(merged).__name__ == "BertForSequenceClassification"  # merge_adapters=True (default)
    assert not torch.equal(merged.state_dict()["bert.encoder.layer.0.attention.self.query.weight"],
                           frozen["bert.encoder.layer.0.attention.self.query.weight"])  # the adapters merged in
    torch.testing.assert_close(merged.state_dict()["bert.embeddings.word_embeddings.weight"],
                               frozen["bert.embeddings.word_embeddings.weight"])  # frozen weights unchanged
    proba = np.asarray(fitted.predict_proba(pdf))
    path = str(tmp_path / "dask_model")
    fitted.save(path)
    np.testing.assert_allclose(np.asarray(DaskTorchModel.load(path).predict_proba(pdf)), proba, rtol=1e-5, atol=1e-6)
    fitted.save_pretrained(str(tmp_path / "hf"))
    loaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "hf")).eval()
    enc = tok(pdf.text.tolist()[:4], padding="longest", return_tensors="pt")
    with torch.no_grad():
        got = torch.softmax(loaded(**enc).logits, -1).numpy()
    np.testing.assert_allclose(got, proba[:4], rtol=1e-3, atol=1e-4)


@pytest.mark.timeout(60)
def test_adapters_kept_without_merge_and_state_is_trainable_only():
    from peft import LoraConfig, PeftModel, get_peft_model

    from hora.estimators.frameworks.torch.hf import HFModule

    tok = tokenizer(text_frame(16).text.tolist())
    lora = get_peft_model(tiny_bert(tok), LoraConfig(r=2, target_modules=["query"]))
    adapter = HFModule(lora, [("tokens", ("input_ids", "attention_mask"))], own_loss=True, merge_adapters=False)
    state = adapter.state_dict()
    assert state and all("lora_" in k or "classifier" in k for k in state)
    fresh = HFModule(get_peft_model(tiny_bert(tok, seed=5), LoraConfig(r=2, target_modules=["query"])),
                     [("tokens", ("input_ids", "attention_mask"))], own_loss=True, merge_adapters=False)
    fresh.load_state_dict(state)
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in state.items())
    with pytest.raises(RuntimeError, match="unexpected"):
        fresh.load_state_dict({**state, "model.nothing": torch.zeros(1)})
    assert isinstance(adapter.after_fit().model, PeftModel)


@pytest.mark.timeout(120)
def test_labels_outside_num_labels_name_the_column(store):
    from hora.dask import TorchEstimator

    pdf = text_frame(16)
    pdf.loc[3, "label"] = 2.0  # a 2-label model
    tok = tokenizer(pdf.text.tolist())
    with pytest.raises(DataError, match="'label'"):
        TorchEstimator(**_args(store, tiny_bert(tok), tok, backend="local")).fit(pdf)


@pytest.mark.timeout(60)
def test_fsdp_shards_the_modules_the_model_lists_as_no_split():
    from hora.estimators.frameworks.torch.hf import HFModule
    from hora.estimators.frameworks.torch.strategies import shard_units

    tok = tokenizer(text_frame(16).text.tolist())
    adapter = HFModule(tiny_bert(tok), [("tokens", ("input_ids", "attention_mask"))], own_loss=True)
    assert [type(u).__name__ for u in shard_units(adapter)] == ["BertEmbeddings", "BertLayer", "BertLayer"]


@pytest.mark.timeout(60)
def test_tokenize_pads_to_the_batch_longest_row_cuts_at_max_length_and_takes_callables():
    from hora.estimators.data.text import make_tokenize

    tok = tokenizer(text_frame(16).text.tolist())
    batch = {"text": np.array(["good day", "the movie was very very bad"], dtype=object), "label": np.zeros(2)}
    op = make_tokenize(tok, ["text"], None, True)
    out = op(batch)
    assert op.names == ("input_ids", "token_type_ids", "attention_mask")
    assert out["text"].shape == (2, 3, 8) and out["text"].dtype == np.int64  # [CLS] 6 words [SEP]: the longest row
    assert out["text"][0, 2].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]  # the short row's mask
    assert make_tokenize(tok, ["text"], 5, True)(batch)["text"].shape == (2, 3, 5)
    with pytest.raises(DataError, match="max_length=5, and truncation=False"):
        make_tokenize(tok, ["text"], 5, False)(batch)

    def words(texts):  # a callable tokenizer: list[str] -> dict of (ragged) arrays
        return {"input_ids": [[len(w) for w in t.split()] for t in texts]}

    out = make_tokenize(words, ["text"], None, True)(batch)
    assert out["text"].tolist() == [[[4, 3, 0, 0, 0, 0]], [[3, 5, 3, 4, 4, 3]]]
