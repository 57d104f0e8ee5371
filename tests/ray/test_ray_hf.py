"""A Hugging Face causal language model fitted on a Ray Dataset of text and its ``transform`` on Ray (the
real local Ray cluster of conftest.py): the same per-row token loss and generated text as the pandas
transform."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")


@pytest.mark.timeout(300)
def test_causal_lm_fit_and_transform_on_ray(free_cluster, tmp_path):
    """Trained on 2 Ray actors from a Ray Dataset of text; transform on Ray equals the pandas transform."""
    from hora.dask import TorchEstimator
    from hora.store import Store
    from tests.estimators.hf_helpers import WORDS, cyclic_text, lm_tokenizer, tiny_gpt2

    ray = free_cluster
    pdf = cyclic_text(32, seed=3)
    tok = lm_tokenizer(pdf.text.tolist())
    model = tiny_gpt2(tok)
    fitted = TorchEstimator(num_proc=2, store=Store.create(str(tmp_path / "store")), model=model,
                            tokenizer=tok, feature_cols=["text"], task="causal_lm", batch_size=8, epochs=4,
                            optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), random_seed=1, verbose=0,
                            lr_scaling="none", generate_kwargs={"max_new_tokens": 1, "do_sample": False}).fit(
                                ray.data.from_pandas(pdf, override_num_blocks=2))
    assert fitted.history_[-1]["perplexity"] < fitted.history_[0]["perplexity"], fitted.history_
    prompts = pdf.head(12).assign(id=np.arange(12), text=[" ".join(t.split()[:2 + i % 3])
                                                          for i, t in enumerate(pdf.text.head(12))])
    rows = fitted.transform(ray.data.from_pandas(prompts, override_num_blocks=2)).to_pandas().sort_values("id")
    local = fitted.transform(prompts)
    assert list(rows.columns) == ["text", "id", "loss", "generated"]
    np.testing.assert_allclose(rows["loss"].to_numpy(), local["loss"].to_numpy(), rtol=1e-5, atol=1e-6)
    assert np.isfinite(rows["loss"]).all() and (rows["loss"] > 0).all()
    assert list(rows["generated"]) == list(local["generated"])
    assert all(g in WORDS for g in rows["generated"]), list(rows["generated"])
