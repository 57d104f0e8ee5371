"""``hora.spark.driver.driver_service``: Horovod's Spark driver service, an internal hora does not have.

``hora.spark.run`` and the estimators start their ranks through hora's own control plane
(:mod:`hora.runners.driver` and :mod:`hora.native.rendezvous`); importing Horovod's names
works, using them raises (:mod:`hora.horovod_internals`).
"""

from hora.horovod_internals import module_getattr

_INSTEAD = ("hora.spark.run(fn, num_proc=...) starts the ranks as one Spark barrier stage, through hora's own "
            "signed control plane (hora.runners.driver)")

__getattr__ = module_getattr(__name__, {"SparkDriverService": _INSTEAD, "SparkDriverClient": _INSTEAD})
