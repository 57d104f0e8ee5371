"""The frame's engine is decided once, as a hora.store Source: the estimators' face check, column
check, sample and transform dispatch all take it (no engine names compared in the estimators)."""

from __future__ import annotations

import pandas as pd
import pytest

from hora.errors import DataError

pytestmark = pytest.mark.timeout(60)


def test_a_frame_source_is_decided_once_and_serves_columns_samples_and_transform(tmp_path):
    from hora.estimators.data.frames import check_face, sample_numpy, source_of
    from hora.estimators.driver.transform import predict_source
    from hora.store.sources import PandasSource

    pdf = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0.0, 1.0, 0.0]})
    source = check_face(pdf, "hora.dask", "TorchEstimator.fit")
    assert isinstance(source, PandasSource) and source.frame is pdf and source_of(source) is source
    assert (source.launcher, source.default_num_proc, source.compresses_sparse) == ("local", 1, False)
    assert source.columns() == ["x", "y"] and list(sample_numpy(source, ["x"], rows=2)["x"]) == [1.0, 2.0]
    with pytest.raises(DataError, match=r"column\(s\) 'w' \(sample_weight_col\) not in the DataFrame; its columns are"):
        sample_numpy(source, ["x"], rows=2, roles=[("feature_cols", "x"), ("sample_weight_col", "w")])
    with pytest.raises(TypeError, match="takes a Spark DataFrame, got a pandas DataFrame .*use hora.dask"):
        check_face(source, "hora.spark", "TorchEstimator.fit")

    class Doubling:  # a codec: predict gives one output, twice the feature
        def predict(self, model, inputs, input_shapes, rows):
            return [inputs[0].reshape(-1) * 2.0]

    out = predict_source(source, Doubling(), None, lambda: {}, ["x"], None, ["p"], [()], 8)
    assert list(out["p"]) == [2.0, 4.0, 6.0] and list(out["x"]) == [1.0, 2.0, 3.0]
