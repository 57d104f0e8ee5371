"""Horovod's internal names at Horovod's import paths: importing one works, using it says why hora has none.

Horovod's modules exposed implementation details (``horovod.spark.torch.remote._metric_cls``,
``horovod.spark.keras.util.TFKerasUtil``, the driver and task services of ``horovod.spark.run``,
the Params serialization helpers...). Programs and test files often import a few of them at
the top even where they use only the public API. hora has none of these internals: its
training loop, reader and control plane are built differently. So that such a file still
imports, each of these names resolves to a :class:`HorovodInternal`, which raises
:class:`NotImplementedError` naming the internal, and what hora does instead, the moment it is
called or one of its attributes is used. Nothing is silently emulated.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping


class HorovodInternal:
    """Stands for one of Horovod's internal names that hora does not have (see the module docstring)."""

    def __init__(self, path: str, instead: str) -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_instead", instead)

    def _refuse(self) -> NotImplementedError:
        path, instead = object.__getattribute__(self, "_path"), object.__getattribute__(self, "_instead")
        return NotImplementedError(f"{path} is an internal of Horovod that hora does not have: {instead}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise self._refuse()

    def __repr__(self) -> str:
        return f"<Horovod internal {object.__getattribute__(self, '_path')}: not in hora>"


def module_getattr(module: str, internals: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving each name of ``internals`` (name -> what hora does instead)
    to a :class:`HorovodInternal`; other names raise AttributeError as usual."""
    made: dict[str, HorovodInternal] = {}

    def __getattr__(name: str) -> Any:
        if name in internals:
            if name not in made:
                made[name] = HorovodInternal(f"{module}.{name}", internals[name])
            return made[name]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["HorovodInternal", "module_getattr"]
