"""The modules of ``hora.estimators`` under the paths they had before its subpackages, for pickles.

A pickle names every class and function it holds by module path, and cloudpickle names a
module a by-value function uses the same way. Pickles written before the estimators were
arranged in subpackages (the objects saved beside a model, a model's definition, Keras'
custom objects, a Spark stage's ``Has<Param>`` mixin of ``hora.estimators.spark_face``) may
name a module by its old path; :func:`loads` reads them at the new one. A saved model finds its
framework by name (``"torch"``, ``"keras"``, ``"lightning"``: :data:`hora.estimators.framework.BUILTIN`),
never by module path, and the faces' classes by their public modules (``hora.spark.torch.estimator``,
``hora.dask``; the names older versions saved, ``hora.spark.torch.TorchModel`` or Horovod's
``hora.spark.lightning.TorchModel``, are still exported there).
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Callable

#: old module path -> the module it is now (only the modules that moved)
OLD_MODULES: dict[str, str] = {
    "hora.estimators.base": "hora.estimators.faces.history",
    "hora.estimators.batches": "hora.estimators.worker.batches",
    "hora.estimators.columns": "hora.estimators.data.columns",
    "hora.estimators.core": "hora.estimators.driver.fit",
    "hora.estimators.dask_face": "hora.estimators.faces.sklearn",
    "hora.estimators.data": "hora.estimators.data.frames",
    "hora.estimators.feed": "hora.estimators.worker.feed",
    "hora.estimators.horovod_face": "hora.estimators.faces.horovod",
    "hora.estimators.keras": "hora.estimators.frameworks.keras.codec",
    "hora.estimators.keras_io": "hora.estimators.frameworks.keras.io",
    "hora.estimators.keras_session": "hora.estimators.frameworks.keras.session",
    "hora.estimators.lightning": "hora.estimators.frameworks.lightning",
    "hora.estimators.persistence": "hora.estimators.driver.persistence",
    "hora.estimators.ray_data": "hora.estimators.data.ray_dataset",
    "hora.estimators.spark_face": "hora.estimators.faces.spark",
    "hora.estimators.spark_python": "hora.estimators.driver.spark_python",
    "hora.estimators.torch": "hora.estimators.frameworks.torch.codec",
    "hora.estimators.torch_dcp": "hora.estimators.frameworks.torch.dcp",
    "hora.estimators.torch_session": "hora.estimators.frameworks.torch.session",
    "hora.estimators.torch_strategies": "hora.estimators.frameworks.torch.strategies",
    "hora.estimators.torch_tensors": "hora.estimators.frameworks.torch.tensors",
    "hora.estimators.transform": "hora.estimators.driver.transform",
    "hora.estimators.worker": "hora.estimators.worker.loop",
}

_SUBIMPORT = ("cloudpickle.cloudpickle", "subimport")


def current(module: str) -> str:
    """The path of ``module`` today (itself unless it is an old path of :data:`OLD_MODULES`)."""
    return OLD_MODULES.get(module, module)


class _Unpickler(pickle.Unpickler):
    """``pickle.Unpickler`` finding each class, function and cloudpickled module at its current path."""

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(current(module), name)
        if (module, name) == _SUBIMPORT:
            subimport: Callable[[str], Any] = found
            return lambda path: subimport(current(path))
        return found


def loads(data: bytes) -> Any:
    """``pickle.loads`` (and so ``cloudpickle.loads``) of ``data``, old module paths read as today's."""
    return _Unpickler(io.BytesIO(data)).load()


__all__ = ["OLD_MODULES", "current", "loads"]
