"""The eager kernels of :mod:`hora.tensorflow.mpi_ops`: numpy in the backend, tensors at the edges.

A kernel takes eager tensors and returns eager tensors; :func:`hora.tensorflow.bridge.run`
calls it directly in eager mode and from a ``tf.py_function`` in a graph.
"""

from __future__ import annotations

import numpy as np

import hora.native as hn
from hora.tensorflow import bridge
from hora.tensorflow.bridge import from_numpy, movable, moved_back, reducible, to_numpy



def k_allreduce(tensors, op, pre, post, name, ps, compression):
    arrays = [to_numpy(reducible(t)) for t in tensors]
    kwargs = dict(op=op, prescale_factor=pre, postscale_factor=post, process_set=ps)
    if compression is not None:
        kwargs["compression"] = compression
    if len(arrays) == 1:
        outs = [hn.allreduce(arrays[0], name=name, **kwargs)]
    else:
        outs = hn.grouped_allreduce(arrays, name=name, **kwargs)
    # native allreduce writes each result into a tensor it allocated for this call
    return [from_numpy(o, t.dtype, fresh=True) for o, t in zip(outs, tensors)]


def k_allgather(tensors, name, ps):
    arrays = [to_numpy(t) for t in tensors]
    if len(arrays) == 1:
        outs = [hn.allgather(movable(arrays[0]), name=name, process_set=ps)]
    else:
        outs = hn.grouped_allgather([movable(a) for a in arrays], name=name, process_set=ps)
    return [from_numpy(moved_back(o, a.dtype), t.dtype) for o, a, t in zip(outs, arrays, tensors)]


def k_broadcast(tensors, root_rank, name, ps):
    arrays = [to_numpy(t) for t in tensors]
    if name is None or len(arrays) == 1:
        names = [name] * len(arrays)
    else:
        names = [f"{name}.{i}" for i in range(len(arrays))]
    handles = [hn.broadcast_async(movable(a), root_rank, name=n, process_set=ps) for a, n in zip(arrays, names)]
    # native broadcast returns a clone made for this call
    return [from_numpy(moved_back(o, a.dtype), t.dtype, fresh=True)
            for o, a, t in zip(hn.GroupHandle(handles).synchronize(), arrays, tensors)]


def k_alltoall(t, splits, name, ps):
    tf = bridge.tf_module()
    a = to_numpy(t)
    sp = None if splits is None else np.asarray(to_numpy(splits), dtype=np.int64).reshape(-1)
    out, received = hn.alltoall(movable(a), splits=sp, name=name, process_set=ps)
    return [from_numpy(moved_back(out, a.dtype), t.dtype), tf.constant(np.asarray(received, np.int32).reshape(-1))]


def k_reducescatter(tensors, op, pre, post, name, ps):
    arrays = [to_numpy(reducible(t)) for t in tensors]
    kwargs = dict(op=op, name=name, process_set=ps, prescale_factor=pre, postscale_factor=post)
    outs = [hn.reducescatter(arrays[0], **kwargs)] if len(arrays) == 1 else hn.grouped_reducescatter(arrays, **kwargs)
    return [from_numpy(o, t.dtype) for o, t in zip(outs, tensors)]


__all__ = ["k_allreduce", "k_allgather", "k_broadcast", "k_alltoall", "k_reducescatter"]
