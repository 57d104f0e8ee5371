"""The frameworks, each filling the seam of :mod:`hora.estimators.framework`.

Each framework registers one :class:`~hora.estimators.framework.Framework` descriptor: its
configuration, its :class:`~hora.estimators.framework.ModelCodec` (the driver's side, in ``codec.py``)
and its :class:`~hora.estimators.framework.TrainingSession` (a rank's side, in ``session.py``).

* :mod:`~hora.estimators.frameworks.torch` - PyTorch (``codec``, ``session``, ``strategies``, ``tensors``, ``dcp``)
* :mod:`~hora.estimators.frameworks.keras` - Keras 3 (``codec``, ``session``, ``io``)
* :mod:`~hora.estimators.frameworks.lightning` - PyTorch Lightning, on the torch codec

Importing this package imports no framework; :func:`hora.estimators.framework.get_framework`
imports a framework's module on first use.
"""
