"""``DistributedOptimizer(op=Adasum)``: combine the ranks' *updates* with Adasum (Horovod's
"delta optimizer").

Adasum adapts to how much two vectors agree, which makes sense for what an optimizer
would do with them, not for raw gradients. So, as in Horovod, each rank steps the wrapped
optimizer on its own gradient of a parameter as soon as backward has produced it (that
parameter alone), takes the change it made (``delta = new - start``), puts the parameter
back to ``start`` and starts an Adasum allreduce of the delta in the background; ``step()``
waits for the deltas and applies them: ``p = start + Adasum(deltas)``. Optimizer state
(momentum, Adam's moments) stays per rank, built from the rank's own gradients.

``synchronize()`` does nothing (there are no reduced gradients to wait for) and
``skip_synchronize()`` is refused, as in Horovod.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

import hora.native as _hn
from hora.errors import ConfigError
from hora.native.compression import resolve
from hora.torch._wrap import wrap_instance
from hora.torch.parameters import normalize_named_parameters


class AdasumMixin:
    """Methods mixed in front of the wrapped optimizer class (see :func:`wrap`)."""

    def _hora_adasum_setup(self, named_parameters: Iterable[tuple[str, torch.Tensor]] | None, compression: Any,
                           backward_passes_per_step: int, process_set: Any) -> None:
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step < 1:
            raise ConfigError(f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}")
        self._parameter_names = normalize_named_parameters(named_parameters, self.param_groups)  # type: ignore
        self._hora_compression = resolve(compression)
        self._hora_process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step
        self.op = _hn.Adasum
        self._hora_params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]  # type: ignore
        self._hora_delay = {p: backward_passes_per_step for p in self._hora_params}
        self._hora_start = {p: torch.zeros_like(p, requires_grad=False) for p in self._hora_params}
        self._hora_handles: dict[torch.Tensor, Any] = {}
        self._hora_hooks = [p.register_post_accumulate_grad_hook(self._hora_on_grad) for p in self._hora_params]

    def _hora_on_grad(self, p: torch.Tensor) -> None:
        if self._hora_delay[p] <= 0:
            raise ConfigError(f"gradient of {self._parameter_names[p]!r} was computed more than "
                              f"backward_passes_per_step={self.backward_passes_per_step} times before step()")
        self._hora_delay[p] -= 1
        if self._hora_delay[p] == 0:
            self._hora_handles[p] = self._hora_delta_async(p)

    def _hora_delta_async(self, p: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """Step the wrapped optimizer on ``p`` alone; start the Adasum of its change."""
        start = self._hora_start[p]
        data = p.detach()
        start.copy_(data)
        stashed = [g["params"] for g in self.param_groups]  # type: ignore[attr-defined]
        for g in self.param_groups:  # type: ignore[attr-defined]
            g["params"] = [q for q in g["params"] if q is p]
        try:
            super().step()  # type: ignore[misc]
        finally:
            for g, params in zip(self.param_groups, stashed):  # type: ignore[attr-defined]
                g["params"] = params
        delta = data - start
        data.copy_(start)
        handle = _hn.allreduce_async_(delta, op=_hn.Adasum, name=f"adasum.{self._parameter_names[p]}",
                                      process_set=self._hora_process_set, compression=self._hora_compression)
        return handle, delta

    def step(self, closure: Any = None) -> Any:
        """Apply every parameter's combined update (stepping now those whose gradient
        had not come in)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for p in self._hora_params:
            if p not in self._hora_handles:
                self._hora_handles[p] = self._hora_delta_async(p)
        try:
            for p, (handle, delta) in self._hora_handles.items():
                handle.synchronize()
                p.detach().add_(delta)
        finally:
            self._hora_handles.clear()
            for p in self._hora_delay:
                self._hora_delay[p] = self.backward_passes_per_step
        return loss

    def synchronize(self) -> None:
        """Nothing to wait for: Adasum combines updates in ``step()``."""

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Refused, as in Horovod: with Adasum, ``step()`` is where the ranks combine."""
        raise ConfigError("skip_synchronize() is not supported with op=Adasum (step() combines the updates)")
        yield  # pragma: no cover

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients (refused while updates are being combined: call step() first)."""
        if self._hora_handles:
            raise ConfigError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step(); "
                              "with op=Adasum the updates are in flight until step()")
        super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]

    def _hora_forget_step(self) -> None:
        self._hora_handles.clear()
        for p in self._hora_delay:
            self._hora_delay[p] = self.backward_passes_per_step

    def remove_hooks(self) -> None:
        for h in self._hora_hooks:
            h.remove()
        self._hora_hooks.clear()


def wrap(optimizer: torch.optim.Optimizer, named_parameters: Any, compression: Any, backward_passes_per_step: int,
         process_set: Any) -> torch.optim.Optimizer:
    """The Adasum DistributedOptimizer around ``optimizer`` (an instance of its class)."""
    dist = wrap_instance(optimizer, AdasumMixin)
    dist._hora_adasum_setup(named_parameters, compression, backward_passes_per_step,
                            _hn.global_process_set if process_set is None else process_set)
    return dist


__all__ = ["AdasumMixin", "wrap"]
