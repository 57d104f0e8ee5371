"""Real estimator classes: each face's classes are written in the source with every parameter
keyword-only, typed and with its default, as the framework's config class declares it; ``help()``,
mypy and mkdocstrings' static reader (griffe) see them; the names they are saved under resolve."""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import pydoc
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hora.estimators.params import param_docs, param_signature

REPO = Path(__file__).resolve().parents[2]
KW = inspect.Parameter.KEYWORD_ONLY

# (module, estimator, model): the classes as users import them, Horovod's names included
FACES = [
    ("hora.spark.torch.estimator", "TorchEstimator", "TorchModel"),
    ("hora.spark.keras.estimator", "KerasEstimator", "KerasModel"),
    ("hora.spark.lightning.estimator", "LightningEstimator", "LightningModel"),
    ("hora.dask", "TorchEstimator", "TorchModel"),
    ("hora.dask", "KerasEstimator", "KerasModel"),
    ("hora.dask", "LightningEstimator", "LightningModel"),
]
#: the module and name each public class was saved under (Spark's metadata, pickles) before it was
#: written out in the source, and the class it is today
SAVED_NAMES = [
    ("hora.spark.torch", "TorchEstimator", "hora.spark.torch.estimator", "TorchEstimator"),
    ("hora.spark.torch", "TorchModel", "hora.spark.torch.estimator", "TorchModel"),
    ("hora.spark.keras", "KerasEstimator", "hora.spark.keras.estimator", "KerasEstimator"),
    ("hora.spark.keras", "KerasModel", "hora.spark.keras.estimator", "KerasModel"),
    ("hora.spark.lightning", "TorchEstimator", "hora.spark.lightning.estimator", "LightningEstimator"),
    ("hora.spark.lightning", "TorchModel", "hora.spark.lightning.estimator", "LightningModel"),
    ("hora.dask", "TorchModel", "hora.dask", "TorchModel"),
    ("hora.dask", "KerasModel", "hora.dask", "KerasModel"),
    ("hora.dask", "LightningModel", "hora.dask", "LightningModel"),
]


def _classes(module: str, est: str, model: str) -> tuple[type, type]:
    mod = importlib.import_module(module)
    return getattr(mod, est), getattr(mod, model)


@pytest.mark.parametrize("face", FACES, ids=[f"{f[0]}.{f[1]}" for f in FACES])
def test_the_written_constructor_is_the_config_s_parameters(face):
    est_cls, model_cls = _classes(*face)
    config = est_cls.framework.config
    # every parameter, in order, keyword-only, with the declared type and default (the source cannot drift)
    assert inspect.signature(est_cls.__init__) == param_signature(config)
    if hasattr(est_cls, "setParams"):  # Spark's convention: setParams takes the same keywords
        assert (list(inspect.signature(est_cls.setParams).parameters.values())
                == list(param_signature(config).parameters.values()))
    sig = inspect.signature(est_cls)
    assert all(p.kind is KW for p in sig.parameters.values())
    assert sig.parameters["batch_size"].default == 32
    with pytest.raises(TypeError):
        est_cls(16)
    # the names are honest: the class is found where it says it lives, under its own name
    for cls in (est_cls, model_cls):
        assert cls.__qualname__ == cls.__name__
        assert getattr(importlib.import_module(cls.__module__), cls.__name__) is cls
    assert est_cls.__name__ == face[1] and est_cls.model_class is model_cls
    # help() shows the typed keywords and what each one does
    text = pydoc.render_doc(est_cls, renderer=pydoc.plaintext)
    assert "batch_size: int = 32" in text and "label_nan: Literal['error', 'drop', 'keep'] = 'error'" in text
    for name, doc in param_docs(config).items():
        assert f"``{name}``: {doc}" in " ".join(text.split()), name


def test_horovod_s_lightning_names_are_the_lightning_classes():
    import hora.spark
    import hora.spark.lightning as hsl

    assert hsl.TorchEstimator is hsl.LightningEstimator is hora.spark.LightningEstimator
    assert hsl.TorchModel is hsl.LightningModel is hora.spark.LightningModel
    assert hora.spark.LightningEstimator.__name__ == "LightningEstimator"
    assert hora.spark.TorchEstimator.__module__ == "hora.spark.torch.estimator"  # Horovod's path


@pytest.mark.parametrize("old_module,old_name,module,name", SAVED_NAMES, ids=[f"{r[0]}.{r[1]}" for r in SAVED_NAMES])
def test_the_names_older_saves_hold_resolve_to_today_s_classes(old_module, old_name, module, name):
    cls = getattr(importlib.import_module(module), name)
    # Spark's DefaultParamsReader imports the metadata's "class" module and takes the name from it
    assert getattr(__import__(old_module, fromlist=[old_name]), old_name) is cls
    # a pickle refers to a class by module and name
    assert pickle.loads(f"c{old_module}\n{old_name}\n.".encode()) is cls


def test_spark_constructors_set_params_and_the_model_takes_keywords_only():
    from hora.spark import TorchEstimator, TorchModel
    from hora.spark.common.params import EstimatorParams

    est = TorchEstimator(batch_size=3, label_nan="drop", feature_cols=["x"], predictionCol="p")
    assert est.getBatchSize() == 3 and est.getOrDefault("label_nan") == "drop" and est.getFeatureCols() == ["x"]
    assert est.getPredictionCol() == "p" and est.isSet(est.batch_size) and not est.isSet(est.epochs)
    assert est.setParams(epochs=4) is est and est.getEpochs() == 4
    assert est.getStrategy() == "hora" and "strategy" in est.explainParams()  # Torch's own Param
    assert issubclass(TorchEstimator, EstimatorParams) and EstimatorParams.batch_size.name == "batch_size"
    copied = est.copy({est.epochs: 7})
    assert copied.getEpochs() == 7 and est.getEpochs() == 4 and copied.uid == est.uid
    sig = inspect.signature(TorchModel)
    assert all(p.kind is KW for p in sig.parameters.values())
    assert {"model", "feature_cols", "output_cols", "output_shapes", "batch_size", "feature_columns"} <= set(
        sig.parameters)
    model = TorchModel(model="m", feature_cols=["x"], label_cols=["y"])
    assert model.getModel() == "m" and model.getFeatureCols() == ["x"] and model.getLabelCols() == ["y"]
    assert "rows per forward pass" in model.batch_size.doc  # the model's own Param, not the estimator's


def test_dask_model_signature_is_typed_and_the_estimator_stores_its_keywords_only():
    import hora.dask

    sig = inspect.signature(hora.dask.TorchModel)
    assert {"model", "feature_cols", "label_cols", "output_shapes", "output_cols"} <= set(sig.parameters)
    assert all(p.annotation is not inspect.Parameter.empty and p.kind is KW for p in sig.parameters.values())
    with pytest.raises(TypeError):
        hora.dask.TorchModel(object(), ["x"], ["y"], [[1]])
    est = hora.dask.TorchEstimator(epochs=3, predictionCol="p")
    assert set(vars(est)) == set(inspect.signature(hora.dask.TorchEstimator).parameters)  # scikit-learn's rule
    assert est.get_params()["prediction_col"] == "p" and est.epochs == 3


def test_the_static_reader_of_the_api_docs_sees_the_written_signatures():
    """mkdocstrings reads the source with griffe, without importing it: it finds each keyword there."""
    griffe = pytest.importorskip("griffe")

    hora_pkg = griffe.load("hora", search_paths=[str(REPO)], resolve_aliases=False)
    for path, cls in (("hora.spark.torch.estimator.TorchEstimator", "hora.spark.TorchEstimator"),
                      ("hora.dask.LightningEstimator", "hora.dask.LightningEstimator")):
        obj = hora_pkg[path.removeprefix("hora.")]
        module, _, name = cls.rpartition(".")
        expected = param_signature(getattr(importlib.import_module(module), name).framework.config)
        params = [p.name for p in obj.members["__init__"].parameters]
        assert params == list(expected.parameters), path
        assert obj.docstring is not None and "data-parallel" in obj.docstring.value, path


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
        "reveal_type(f)\n"
        "reveal_type(e.setParams(epochs=3))\n"
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
    # fit returns the framework's model class, setParams the estimator
    assert 'Revealed type is "hora.dask.LightningModel"' in out.stdout, out.stdout
    assert 'Revealed type is "hora.spark.torch.estimator.TorchEstimator"' in out.stdout, out.stdout
