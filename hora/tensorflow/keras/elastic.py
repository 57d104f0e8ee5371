"""``hora.tensorflow.keras.elastic``: :mod:`hora.keras.elastic` under Horovod's path."""

from hora.keras.elastic import *  # noqa: F401,F403
from hora.keras.elastic import __all__  # noqa: F401
