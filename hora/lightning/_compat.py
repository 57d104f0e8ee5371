"""Which Lightning: ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``.

The two distributions ship the same code under two import names, and their classes are
distinct: a ``pytorch_lightning.Trainer`` only accepts a subclass of
``pytorch_lightning.strategies.Strategy``. A :class:`Flavor` names one of them and
holds its two packages (the trainer package and its fabric); every class hora builds on
Lightning is built once per flavor.

How a flavor is chosen (:func:`resolve_flavor`): the package asked for by name; else the
package of the Lightning objects at hand (a module, a callback, a precision plugin...);
else the only one of the two that the program imported; else the one installed.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from hora.errors import ConfigError

#: flavor name -> (trainer package, fabric package, prefixes of their module names)
_PACKAGES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "lightning": ("lightning.pytorch", "lightning.fabric", ("lightning.pytorch", "lightning.fabric")),
    "pytorch_lightning": ("pytorch_lightning", "lightning_fabric", ("pytorch_lightning", "lightning_fabric")),
}
PACKAGE_NAMES = tuple(_PACKAGES)

#: The oldest Lightning release hora is built and tested against (both import names).
MIN_PL_VERSION = "2.6.0"

INSTALL_HINT = 'pip install -c constraints.txt "hora[lightning]"'


@dataclass(frozen=True)
class Flavor:
    """One of the two Lightning import names, with its packages imported.

    Attributes:
        name: ``"lightning"`` or ``"pytorch_lightning"``.
        pl: the trainer package (``lightning.pytorch`` or ``pytorch_lightning``).
        fabric: its fabric package (``lightning.fabric`` or ``lightning_fabric``).
    """

    name: str
    pl: ModuleType
    fabric: ModuleType

    @property
    def version(self) -> str:
        return str(getattr(self.pl, "__version__", "unknown"))

    def sub(self, path: str) -> ModuleType:
        """A submodule of the trainer package: ``sub("core.optimizer")``."""
        return importlib.import_module(f"{self.pl.__name__}.{path}")

    def fabric_sub(self, path: str) -> ModuleType:
        """A submodule of the fabric package: ``fabric_sub("utilities.seed")``."""
        return importlib.import_module(f"{self.fabric.__name__}.{path}")

    def __repr__(self) -> str:
        return f"Flavor({self.name} {self.version})"


_CACHE: dict[str, Flavor] = {}


def get_flavor(name: str) -> Flavor:
    """Import and return the flavor called ``name``.

    Raises:
        ConfigError: ``name`` is neither ``"lightning"`` nor ``"pytorch_lightning"``, or
            that package is not installed, or it is older than :data:`MIN_PL_VERSION`.
    """
    if name in _CACHE:
        return _CACHE[name]
    if name not in _PACKAGES:
        raise ConfigError(f"package={name!r} is not a Lightning import name; use one of {', '.join(PACKAGE_NAMES)}")
    trainer_pkg, fabric_pkg, _ = _PACKAGES[name]
    try:
        pl = importlib.import_module(trainer_pkg)
        fabric = importlib.import_module(fabric_pkg)
    except ImportError as exc:
        raise ConfigError(f"{trainer_pkg} cannot be imported ({exc}); install it with {INSTALL_HINT}") from exc
    flavor = Flavor(name, pl, fabric)
    _check_version(flavor)
    _CACHE[name] = flavor
    return flavor


def _check_version(flavor: Flavor) -> None:
    from packaging.version import InvalidVersion, Version

    try:
        too_old = Version(flavor.version) < Version(MIN_PL_VERSION)
    except InvalidVersion:
        return
    if too_old:
        raise ConfigError(
            f"{flavor.name} {flavor.version} is older than {MIN_PL_VERSION}, the oldest Lightning hora supports; "
            f"upgrade with {INSTALL_HINT}"
        )


def flavor_name_of(obj: Any) -> str | None:
    """The flavor name of a Lightning object or class (module, callback, logger, plugin...),
    read from where its class (or a base class) is defined; None for anything else."""
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        module = getattr(klass, "__module__", "") or ""
        for name, (_, _, prefixes) in _PACKAGES.items():
            if any(module == p or module.startswith(p + ".") for p in prefixes):
                return name
    return None


def imported_flavor_names() -> list[str]:
    """The flavors whose trainer package this process has imported already."""
    return [name for name, (pkg, _, _) in _PACKAGES.items() if pkg in sys.modules]


def resolve_flavor(package: str | None = None, hints: Iterable[Any] = ()) -> Flavor:
    """The flavor to build on (see the module docstring for the order of the rules).

    Args:
        package: ``"lightning"`` or ``"pytorch_lightning"``, or None to infer it.
        hints: Lightning objects the result must be compatible with (None entries and
            non-Lightning objects are ignored).

    Raises:
        ConfigError: the hints come from both packages, or disagree with ``package``;
            both packages are imported and nothing says which one is meant; neither is
            installed.
    """
    seen = {}
    for obj in hints:
        if obj is None:
            continue
        name = flavor_name_of(obj)
        if name is not None:
            seen.setdefault(name, type(obj).__name__)
    if len(seen) > 1:
        parts = ", ".join(f"{kind} from {name}" for name, kind in seen.items())
        raise ConfigError(f"Lightning objects from both import names were mixed ({parts}); use one package")
    if package is not None:
        if seen and package not in seen:
            (name, kind), = seen.items()
            raise ConfigError(f"package={package!r}, but the {kind} given comes from {name}")
        return get_flavor(package)
    if seen:
        return get_flavor(next(iter(seen)))
    imported = imported_flavor_names()
    if len(imported) == 1:
        return get_flavor(imported[0])
    if len(imported) > 1:
        raise ConfigError(
            "both `lightning` and `pytorch_lightning` are imported, so hora cannot tell which Trainer the "
            "strategy is for; pass package='lightning' or package='pytorch_lightning'"
        )
    errors = []
    for name in PACKAGE_NAMES:
        try:
            return get_flavor(name)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(f"no Lightning is installed ({'; '.join(errors)})")


def flavor_of_module(module: Any, what: str = "module") -> Flavor:
    """The flavor of a ``LightningModule`` instance.

    Raises:
        ConfigError: ``module`` is not a LightningModule of either package.
    """
    name = flavor_name_of(module)
    if name is not None:
        flavor = get_flavor(name)
        if isinstance(module, flavor.pl.LightningModule):
            return flavor
    raise ConfigError(
        f"{what} must be a LightningModule (lightning.pytorch.LightningModule or "
        f"pytorch_lightning.LightningModule), got {type(module).__module__}.{type(module).__qualname__}"
    )


__all__ = ["Flavor", "MIN_PL_VERSION", "PACKAGE_NAMES", "flavor_name_of", "flavor_of_module", "get_flavor",
           "imported_flavor_names", "resolve_flavor"]
