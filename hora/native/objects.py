"""Python objects as collectives: :func:`broadcast_object` and :func:`allgather_object`
(pickled with cloudpickle, sent as uint8 tensors through :mod:`.collectives`)."""

from __future__ import annotations

import pickle
from typing import Any

import torch

from hora.native.arguments import op_name, process_set_or_none
from hora.native.collectives import allgather, broadcast_
from hora.native.process_sets import ProcessSet
from hora.native.state import _state_or_raise


def _dumps(obj: Any) -> bytes:
    try:
        import cloudpickle

        return cloudpickle.dumps(obj)
    except ImportError:  # pragma: no cover - cloudpickle is a dependency
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """Return ``root_rank``'s ``obj`` (pickled with cloudpickle) on every member."""
    st = _state_or_raise()
    base = op_name(st, "broadcast_object", name, process_set_or_none(process_set))
    payload = _dumps(obj) if st.rank == root_rank else b""
    n = torch.tensor([len(payload)], dtype=torch.int64)
    n = broadcast_(n, root_rank, name=f"{base}.size", process_set=process_set)
    buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if st.rank == root_rank else \
        torch.empty(int(n.item()), dtype=torch.uint8)
    if buf.numel() == 0:
        buf = torch.empty(0, dtype=torch.uint8)
    broadcast_(buf, root_rank, name=f"{base}.data", process_set=process_set)
    return obj if st.rank == root_rank else pickle.loads(buf.numpy().tobytes())


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet | None = None) -> list[Any]:
    """Return the list of every member's ``obj``, in rank order."""
    st = _state_or_raise()
    base = op_name(st, "allgather_object", name, process_set_or_none(process_set))
    payload = _dumps(obj)
    sizes = allgather(torch.tensor([len(payload)], dtype=torch.int64), name=f"{base}.size", process_set=process_set)
    data = allgather(torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else
                     torch.empty(0, dtype=torch.uint8), name=f"{base}.data", process_set=process_set)
    raw = data.numpy().tobytes()
    out, off = [], 0
    for s in sizes.tolist():
        out.append(pickle.loads(raw[off : off + s]))
        off += s
    return out


__all__ = ["allgather_object", "broadcast_object"]
