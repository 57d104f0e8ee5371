"""``hora.tensorflow.keras``: Horovod's ``horovod.tensorflow.keras`` path.

The same module objects as :mod:`hora.keras` (one implementation, two names), so
``import hora.tensorflow.keras as hvd`` is what Horovod programs expect after the rename.
Importing it imports Keras; ``import hora.tensorflow`` alone does not.
"""

from __future__ import annotations

import hora.keras as _impl
from hora.keras import *  # noqa: F401,F403 - the public API, re-exported under Horovod's path
from hora.keras import __all__, callbacks  # noqa: F401


def __getattr__(name: str):
    """``elastic`` and anything else lazy in :mod:`hora.keras`."""
    return getattr(_impl, name)
