"""task="causal_lm": a tiny GPT-2 (from a config) fine-tuned on a text column with no label column, on a
Dask LocalCluster with 2 ranks (history's perplexity, transform's per-row loss and generated text) and
on Spark local[2]; the bad configurations refused on the driver."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")

from hora.errors import ConfigError  # noqa: E402
from tests.estimators.hf_helpers import WORDS, cyclic_text, lm_tokenizer, tiny_gpt2  # noqa: E402


def _args(store, model, tok, **kw):
    args = dict(num_proc=2, store=store, model=model, tokenizer=tok, feature_cols=["text"], task="causal_lm",
                optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), batch_size=8, epochs=5, random_seed=1,
                verbose=0, lr_scaling="none")
    args.update(kw)
    return args


def _row_loss(model, tok, text):
    """The model's own mean token loss on one row (no padding), as transform should write it."""
    enc = tok([text], return_tensors="pt")
    with torch.no_grad():
        return float(model(**enc, labels=enc["input_ids"]).loss)


@pytest.mark.timeout(180)
def test_dask_causal_lm_perplexity_row_loss_and_generated_text(dask_client, store, tmp_path):
    import dask.dataframe as dd

    from hora.dask import TorchEstimator, TorchModel

    pdf = cyclic_text(64)
    tok = lm_tokenizer(pdf.text.tolist())
    est = TorchEstimator(**_args(store, tiny_gpt2(tok), tok, validation=0.25,
                                 generate_kwargs={"max_new_tokens": 2, "do_sample": False}))
    fitted = est.fit(dd.from_pandas(pdf, npartitions=2))
    history = fitted.history_
    for h in history:  # exp of the mean token loss, for training and validation alike
        assert h["perplexity"] == pytest.approx(math.exp(h["loss"]), rel=1e-9)
        assert h["val_perplexity"] == pytest.approx(math.exp(h["val_loss"]), rel=1e-9)
    assert history[-1]["perplexity"] < history[0]["perplexity"] * 0.5, history
    assert history[-1]["val_perplexity"] < 2.0, history  # each word predicts the next
    assert fitted.task_ == "causal_lm"

    # prompts of 2 to 4 words (padded in their batch; continued within the trained lengths)
    prompts = pdf.head(8).assign(text=[" ".join(t.split()[:2 + i % 3]) for i, t in enumerate(pdf.text.head(8))])
    scored = fitted.transform(dd.from_pandas(prompts, npartitions=2)).compute().sort_index()
    assert list(scored.columns) == ["text", "loss", "generated"]
    hf_model = fitted.model_.model
    expected = [_row_loss(hf_model, tok, t) for t in prompts.text]  # rows padded in the batch: padding not counted
    np.testing.assert_allclose(scored["loss"].to_numpy(), expected, rtol=1e-4, atol=1e-5)
    # the continuation: the next two words of the cycle, decoded by the tokenizer
    for text, generated in zip(prompts.text, scored["generated"]):
        last = WORDS.index(text.split()[-1])
        assert generated == f"{WORDS[(last + 1) % 8]} {WORDS[(last + 2) % 8]}", (text, generated)
    # save/load keeps the task and generate_kwargs: the same columns on a pandas frame
    fitted.save(str(tmp_path / "lm"))
    again = TorchModel.load(str(tmp_path / "lm")).transform(prompts)
    assert list(again["generated"]) == list(scored["generated"])
    np.testing.assert_allclose(again["loss"].to_numpy(), scored["loss"].to_numpy(), rtol=1e-5)


@pytest.mark.timeout(180)
def test_spark_causal_lm_fit_and_transform(spark, store):
    from hora.spark import TorchEstimator

    pdf = cyclic_text(64, seed=1)
    tok = lm_tokenizer(pdf.text.tolist())
    df = spark.createDataFrame(pdf).repartition(2)
    fitted = TorchEstimator(**_args(store, tiny_gpt2(tok), tok, epochs=3, output_cols=["token_loss", "next"],
                                    generate_kwargs={"max_new_tokens": 1})).fit(df)
    history = fitted.getHistory()
    assert history[-1]["perplexity"] < history[0]["perplexity"], history
    assert fitted.getTask() == "causal_lm"
    scored = fitted.transform(df.limit(6)).toPandas()
    assert list(scored.columns) == ["text", "token_loss", "next"]
    assert np.isfinite(scored.token_loss).all() and (scored.token_loss > 0).all()
    assert all(isinstance(t, str) and t in WORDS for t in scored["next"]), list(scored["next"])


@pytest.mark.timeout(60)
def test_causal_lm_bad_configurations_are_config_errors(store):
    from hora.dask import TorchEstimator

    pdf = cyclic_text(16)
    tok = lm_tokenizer(pdf.text.tolist())
    model = tiny_gpt2(tok)
    with pytest.raises(ConfigError, match=r"task='causal_lm' takes no label column.*drop label_cols=\['next'\]"):
        TorchEstimator(**_args(store, model, tok, label_cols=["next"])).fit(pdf.assign(next=1.0))
    with pytest.raises(ConfigError, match="set tokenizer="):
        TorchEstimator(**_args(store, model, None)).fit(pdf)
    with pytest.raises(ConfigError, match="generate_kwargs applies to task='causal_lm'"):
        TorchEstimator(**_args(store, model, tok, task=None, label_cols=["text"], generate_kwargs={})).fit(pdf)
    no_pad = lm_tokenizer(pdf.text.tolist(), pad=False)
    with pytest.raises(ConfigError, match=r"no pad token.*tokenizer.pad_token"):
        TorchEstimator(**_args(store, model, no_pad)).fit(pdf)


def causal_minibatch(model, optimizer, transform_outputs, loss_fn, inputs, labels, sample_weights,
                     backward_passes_per_step, batch_idx):
    """Horovod's step, counting its calls in a buffer of the model and checking what it is given: the
    logits as the one output, no labels, and a loss_fn that is the model's own loss on the input ids."""
    optimizer.zero_grad()
    outputs, labels = transform_outputs(model(*inputs), labels)
    assert labels == [] and len(outputs) == 1 and outputs[0].dim() == 3, (labels, [o.shape for o in outputs])
    loss = loss_fn(outputs, labels, sample_weights)
    kwargs = model.keywords(inputs)
    with torch.no_grad():  # (no dropout in the model: the same loss again)
        own = model.model(**kwargs, labels=model.causal_labels(kwargs)).loss
    torch.testing.assert_close(loss.detach(), own, rtol=1e-5, atol=1e-6)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        model.model.minibatch_calls += 1
    return outputs, loss


@pytest.mark.timeout(120)
def test_causal_lm_train_minibatch_fn_gets_the_models_own_loss(store):
    """train_minibatch_fn with task='causal_lm': its loss_fn is the model's own loss on the input ids."""
    from hora.dask import TorchEstimator

    pdf = cyclic_text(32, seed=2)
    tok = lm_tokenizer(pdf.text.tolist())
    model = tiny_gpt2(tok)
    model.register_buffer("minibatch_calls", torch.zeros((), dtype=torch.long))
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    fitted = TorchEstimator(**_args(store, model, tok, epochs=3, train_minibatch_fn=causal_minibatch)).fit(pdf)
    history = fitted.history_
    assert history[-1]["loss"] < history[0]["loss"], history
    for h in history:
        assert h["perplexity"] == pytest.approx(math.exp(h["loss"]), rel=1e-9)
    # every step went through the function: 32 rows over 2 ranks in batches of 8, 3 epochs
    assert int(fitted.model_.model.minibatch_calls) == 2 * 3, fitted.model_.model.minibatch_calls
