"""Keras 3 in the estimators.

* :mod:`~hora.estimators.frameworks.keras.codec` - the configuration, the driver's codec and the descriptor ``KERAS``
* :mod:`~hora.estimators.frameworks.keras.session` - a rank's training session
* :mod:`~hora.estimators.frameworks.keras.io` - the ``.keras`` format and arrays in and out, shared by both
"""
