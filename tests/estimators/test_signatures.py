"""Typed estimators: every parameter keyword-only, with its declared type and
default, in ``inspect.signature``, ``help()``, the committed ``.pyi`` stubs, and mypy."""

from __future__ import annotations

import importlib
import inspect
import os
import pydoc
import shutil
import subprocess
import sys

import pytest

from hora.estimators import _stubgen
from hora.estimators.params import param_defaults, param_types

REPO = _stubgen.root()
KW = inspect.Parameter.KEYWORD_ONLY

# (module, estimator, model, framework descriptor module, descriptor)
FACES = [
    ("hora.spark.torch", "TorchEstimator", "TorchModel", "hora.estimators.frameworks.torch.codec", "TORCH"),
    ("hora.spark.keras", "KerasEstimator", "KerasModel", "hora.estimators.frameworks.keras.codec", "KERAS"),
    ("hora.spark.lightning", "TorchEstimator", "TorchModel", "hora.estimators.frameworks.lightning", "LIGHTNING"),
    ("hora.dask", "TorchEstimator", "TorchModel", "hora.estimators.frameworks.torch.codec", "TORCH"),
    ("hora.dask", "KerasEstimator", "KerasModel", "hora.estimators.frameworks.keras.codec", "KERAS"),
    ("hora.dask", "LightningEstimator", "LightningModel", "hora.estimators.frameworks.lightning", "LIGHTNING"),
]


def _face(module: str, est: str, model: str, fw_module: str, fw: str):
    mod = importlib.import_module(module)
    return getattr(mod, est), getattr(mod, model), getattr(importlib.import_module(fw_module), fw).config


def test_committed_stubs_equal_the_declarations():
    """The .pyi files are what the generator makes from today's declarations (they cannot drift)."""
    for rel, text in _stubgen.stubs().items():
        path = os.path.join(REPO, rel)
        assert os.path.exists(path), f"{rel} is missing: run python -m hora.estimators._stubgen"
        with open(path, encoding="utf-8") as fh:
            assert fh.read() == text, f"{rel} differs from the declarations: run python -m hora.estimators._stubgen"


@pytest.mark.parametrize("face", FACES, ids=[f"{f[0]}.{f[1]}" for f in FACES])
def test_estimator_signature_lists_every_parameter_keyword_only_typed(face):
    est_cls, _, config = _face(*face)
    sig = inspect.signature(est_cls)
    defaults, types = param_defaults(config), param_types(config)
    assert list(sig.parameters) == list(defaults)
    for name, p in sig.parameters.items():
        assert p.kind is KW, name
        assert p.default == defaults[name], name
        assert p.annotation is not inspect.Parameter.empty, name
    assert "int" in str(sig.parameters["batch_size"].annotation) and sig.parameters["batch_size"].default == 32
    assert types["label_cols"] == "Sequence[str] | None"
    assert "feature_cols" in sig.parameters and "label_nan" in sig.parameters
    with pytest.raises(TypeError):
        est_cls(16)
    # help() shows the typed keywords
    text = pydoc.render_doc(est_cls, renderer=pydoc.plaintext)
    assert "batch_size: int = 32" in text and "label_nan: Literal['error', 'drop', 'keep'] = 'error'" in text


def test_spark_constructors_still_set_params():
    from hora.spark import TorchEstimator, TorchModel

    est = TorchEstimator(batch_size=3, label_nan="drop", feature_cols=["x"])
    assert est.getBatchSize() == 3 and est.getOrDefault("label_nan") == "drop" and est.getFeatureCols() == ["x"]
    assert est.setParams(epochs=4) is est and est.getEpochs() == 4
    assert list(inspect.signature(est.setParams).parameters) == list(inspect.signature(TorchEstimator).parameters)
    sig = inspect.signature(TorchModel)
    assert all(p.kind is KW for p in sig.parameters.values())
    assert {"model", "feature_cols", "output_cols", "output_shapes", "batch_size"} <= set(sig.parameters)
    model = TorchModel(model="m", feature_cols=["x"], label_cols=["y"])
    assert model.getModel() == "m" and model.getFeatureCols() == ["x"] and model.getLabelCols() == ["y"]


def test_dask_model_signature_is_typed():
    import hora.dask

    sig = inspect.signature(hora.dask.TorchModel)
    assert {"model", "feature_cols", "label_cols", "output_shapes", "output_cols"} <= set(sig.parameters)
    assert all(p.annotation is not inspect.Parameter.empty and p.kind is KW for p in sig.parameters.values())
    with pytest.raises(TypeError):
        hora.dask.TorchModel(object(), ["x"], ["y"], [[1]])


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("mypy", path=os.path.dirname(sys.executable)) is None
                    and importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (pip install 'hora[dev]')")
def test_mypy_reports_a_misspelt_keyword_and_a_wrong_type(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(
        "import hora.dask\n"
        "from hora.spark import KerasEstimator, TorchEstimator\n"
        "from hora.spark.lightning import TorchEstimator as LightningEstimator\n"
        "\n"
        "a = TorchEstimator(feture_cols=['x'])\n"
        "b = hora.dask.TorchEstimator(batch_size='3')\n"
        "c = KerasEstimator(label_col=['y'])\n"
        "d = LightningEstimator(epochs=2, feature_cols=['x'], label_nan='drop')\n"
        "e = TorchEstimator(feature_cols=['x'], batch_size=3, label_nan='drop')\n"
        "f = hora.dask.LightningEstimator(epochs=2).fit(None)\n"
        "g = hora.dask.TorchEstimator(label_nan='dorp', num_proc=(1, 2), checkpoint_every='2 steps')\n"
    )
    # The third-party packages hora's signatures name are not type-checked (Any to mypy): the errors asserted are
    # hora's own keywords and types, and torch and pyspark alone are 1,600 modules to parse (29 -> 4 s).
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n[mypy-torch.*,pyspark.*,numpy.*,matplotlib.*,filelock.*,PIL.*,optree.*,pandas.*,"
                      "dask.*,keras.*,tensorflow.*,lightning.*,pyarrow.*,fsspec.*]\nfollow_imports = skip\n")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--follow-imports=silent", "--no-error-summary",
         "--show-column-numbers",
         "--cache-dir", str(tmp_path / "cache"), str(script)],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )
    lines = [ln for ln in out.stdout.splitlines() if ": error:" in ln]
    by_line = {int(ln.split(":")[1]): ln for ln in lines}
    assert 'Unexpected keyword argument "feture_cols"' in by_line.get(5, ""), out.stdout + out.stderr
    assert 'did you mean "feature_cols"' in by_line[5], out.stdout
    assert 'Argument "batch_size"' in by_line.get(6, "") and 'expected "int"' in by_line[6], out.stdout
    assert 'Unexpected keyword argument "label_col"' in by_line.get(7, ""), out.stdout
    assert 'Argument "label_nan"' in by_line.get(11, ""), out.stdout  # a Literal: the three modes
    assert set(by_line) == {5, 6, 7, 11}, out.stdout  # the correct calls pass
