"""Process sets: named subsets of ranks that collectives can run over.

``global_process_set`` holds every rank. ``add_process_set(ranks)`` registers a new set;
like Horovod, every rank of the job must call it, with the same ranks, in the same order
(the engine checks this and raises CollectiveError otherwise). Ops accept
``process_set=`` and run only among its members; calling an op on a set this rank is not
part of raises ConfigError. Registering and removing sets is part of the process's
engine state (:func:`hora.native.state.add_process_set`); this module is only the type,
below the state, which tells it the job's rank and size.
"""

from __future__ import annotations

from collections.abc import Iterable

from hora.errors import ConfigError, NotInitializedError

# (rank, size) of this process while hora is initialized: set by :mod:`hora.native.state`
# (which builds on this module) at init and cleared at shutdown
_world: tuple[int, int] | None = None


def _bind_world(world: tuple[int, int] | None) -> None:
    global _world
    _world = world


def _world_or_raise() -> tuple[int, int]:
    world = _world
    if world is None:
        raise NotInitializedError("hora has not been initialized; call hora.init()")
    return world


class ProcessSet:
    """A subset of global ranks. ``process_set_id`` is set once registered (0 = global)."""

    def __init__(self, ranks: Iterable[int] | None = None) -> None:
        if ranks is None:
            self.ranks: list[int] | None = None
        else:
            try:
                rs = [int(r) for r in ranks]
            except (TypeError, ValueError):
                raise ConfigError(f"process set ranks must be integers, got {ranks!r}") from None
            if not rs:
                raise ConfigError("a process set needs at least one rank")
            if len(set(rs)) != len(rs):
                raise ConfigError(f"process set ranks {rs} contain duplicates")
            self.ranks = sorted(rs)
        self.process_set_id: int | None = None

    def _bind(self, ps_id: int, ranks: list[int]) -> None:
        self.process_set_id = ps_id
        self.ranks = list(ranks)

    def included(self) -> bool:
        """Whether this process is a member (requires init)."""
        return _world_or_raise()[0] in self._ranks_or_raise()

    def size(self) -> int:
        return len(self._ranks_or_raise())

    def rank(self) -> int:
        """This process's rank inside the set, or -1 when it is not a member."""
        me = _world_or_raise()[0]
        rs = self._ranks_or_raise()
        return rs.index(me) if me in rs else -1

    def _ranks_or_raise(self) -> list[int]:
        if self.ranks is None:
            return list(range(_world_or_raise()[1]))
        return self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(id={self.process_set_id}, ranks={self.ranks if self.ranks is not None else 'all'})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessSet) and other.ranks == self.ranks and other.process_set_id == self.process_set_id

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self.ranks or ())))


global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0

__all__ = ["ProcessSet", "global_process_set"]
