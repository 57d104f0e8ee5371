"""The seam between the engine-neutral fit pipeline and one deep-learning framework.

A framework is described once, by a :class:`Framework` descriptor that bundles

* a :class:`ModelCodec`, the driver side: validate the model on a data sample, freeze
  the framework objects for the workers, load the trained model, serialize it for
  persistence, predict on numpy inputs;
* a :class:`TrainingSession` class, the worker side: one object per rank that holds the
  run's state as typed attributes (model, optimizer, where training stands) and trains
  one batch at a time inside the shared loop of :mod:`hora.estimators.worker.loop`;
* its configuration class, an :class:`~hora.estimators.params.EstimatorConfig`
  subclass that declares the framework's extra parameters (each once).

The Spark and Dask faces (:mod:`hora.estimators.faces.spark`,
:mod:`hora.estimators.faces.sklearn`) take the framework from a descriptor (each estimator
class names its own: ``framework = TORCH``), so each framework is one small module
(:mod:`hora.estimators.frameworks.torch.codec`, :mod:`hora.estimators.frameworks.keras.codec`) and no
face holds framework code. Frameworks register their descriptor by name (:func:`get_framework`),
which is how a saved model finds its codec again.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Sequence

import numpy as np

from hora.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from hora.estimators.params import EstimatorConfig
    from hora.estimators.spec import TrainSpec

#: module of each built-in framework, imported on first use (no framework is imported before)
BUILTIN = {"torch": "hora.estimators.frameworks.torch.codec", "keras": "hora.estimators.frameworks.keras.codec", "lightning": "hora.estimators.frameworks.lightning"}
_REGISTRY: dict[str, "Framework"] = {}


@dataclass(frozen=True)
class CheckResult:
    """What :meth:`ModelCodec.check` learned from the sample.

    Attributes:
        output_shapes: per-row shape of each model output, one per label.
        input_shapes: the shape each feature input is reshaped to (``-1`` batch dimension
            first), or None when inputs are fed as stored; a codec may derive them from
            the model (Keras reshapes a flat 784-vector to its ``(28, 28, 1)`` input).
    """

    output_shapes: list[tuple[int, ...]]
    input_shapes: list[list[int]] | None = None


@dataclass
class Resume:
    """Where a run stands, as read from its last checkpoint (see :meth:`TrainingSession.restore`).

    Attributes:
        epoch: the epoch training continues at (0-based).
        step: batches of that epoch already trained (0: the epoch starts from its first batch).
        global_step: training batches taken so far in the run (learning-rate schedules continue from it).
        history: one dict of metrics per finished epoch, each epoch once.
        size: the ranks that wrote the checkpoint (0: unknown, a checkpoint of before it
            was recorded); a run resumed at another size rescales the learning rate and
            the step it continues at.
    """

    epoch: int = 0
    step: int = 0
    global_step: int = 0
    #: True when :meth:`checkpoint` is a collective (a sharded optimizer gathers its state):
    #: the loop then calls it on every rank whenever a checkpoint is due, and rank 0 writes it
    checkpoint_collective: bool = False
    history: list[dict[str, float]] = field(default_factory=list)
    size: int = 0

    def to_meta(self) -> dict[str, Any]:
        """The JSON-able form stored in a checkpoint."""
        return {"epoch": self.epoch, "step": self.step, "global_step": self.global_step, "history": self.history,
                "size": self.size}

    @classmethod
    def from_meta(cls, meta: dict[str, Any], ckpt_epoch: int) -> "Resume":
        """Inverse of :meth:`to_meta`; an end-of-epoch checkpoint of epoch ``e`` resumes at ``e + 1``.

        Checkpoints written before ``step`` existed hold only ``epoch`` and ``history``.
        """
        epoch = int(meta.get("epoch", ckpt_epoch))
        step = int(meta.get("step", 0))
        history = list(meta.get("history", []))
        if step == 0:  # the checkpoint of a finished epoch
            epoch += 1
        return cls(epoch=epoch, step=step, global_step=int(meta.get("global_step", 0)), history=history,
                   size=int(meta.get("size", 0)))


class ModelCodec:
    """Driver side of a framework: everything the driver does with the framework's objects.

    A codec is stateless and picklable (the transform functions ship it to the executors).
    """

    #: short framework name ("torch", "keras", ...), stored in saved models
    name: ClassVar[str] = "base"

    def check(self, config: "EstimatorConfig", sample: dict[str, np.ndarray]) -> CheckResult:
        """Validate model, optimizer, loss and metrics on ``sample`` (feature key or label -> array).

        Raises:
            ConfigError: an unusable model/optimizer/loss, a label that cannot meet its
                output, a wrong number of inputs or outputs (each names what is wrong).
        """
        raise NotImplementedError(f"{type(self).__name__}.check")

    def trains_on_frame(self, config: "EstimatorConfig") -> bool:
        """Whether the workers train on the materialized DataFrame (False: the framework brings its data)."""
        return True

    def freeze(self, config: "EstimatorConfig") -> bytes:
        """The framework objects of ``config`` (model, optimizer, loss, ...) as bytes for the workers."""
        raise NotImplementedError(f"{type(self).__name__}.freeze")

    def load(self, payload: bytes, weights: bytes) -> Any:
        """The trained model: the payload's model definition with ``weights`` (a session's :meth:`~TrainingSession.weights`)."""
        raise NotImplementedError(f"{type(self).__name__}.load")

    def serialize(self, model: Any) -> dict[str, bytes]:
        """Named files persisting a trained model (definition and weights)."""
        raise NotImplementedError(f"{type(self).__name__}.serialize")

    def deserialize(self, files: dict[str, bytes]) -> Any:
        """Inverse of :meth:`serialize`."""
        raise NotImplementedError(f"{type(self).__name__}.deserialize")

    def predict(self, model: Any, inputs: Sequence[np.ndarray], input_shapes: Any, batch_size: int) -> list[np.ndarray]:
        """Run ``model`` on one array per feature input, ``batch_size`` rows at a time; one array per output."""
        raise NotImplementedError(f"{type(self).__name__}.predict")

    def clone(self, model: Any) -> Any:
        """An independent copy of a trained model (``Model.copy()``)."""
        return copy.deepcopy(model)

    def check_checkpoint(self, config: "EstimatorConfig", data: bytes, where: str) -> None:
        """Check on the driver that a checkpoint (``where`` names it) belongs to ``config.model``
        before a fit resumes from it; the default checks nothing.

        Raises:
            ConfigError: its parameters differ (the message names the first mismatch).
        """


class TrainingSession:
    """Worker side of a framework: one rank's training run, its state held as attributes.

    :meth:`open` builds the session from the spec (collectives, model, optimizer); the
    shared loop of :mod:`hora.estimators.worker.loop` then calls, per epoch, :meth:`batches`,
    :meth:`train_step` per batch, :meth:`finish_epoch`, and :meth:`eval_batch` /
    :meth:`eval_finish` per validation pass; it averages the metrics across ranks, runs
    the callbacks and checkpoints (:meth:`checkpoint`). Subclasses are dataclasses;
    the base holds no state, so a bare ``TrainingSession()`` reads numpy batches.

    Where training stands is in :attr:`epoch`, :attr:`step` (batch in the epoch) and
    :attr:`global_step` (batches in the run), kept by the loop and stored in every
    checkpoint, so a resumed run continues at an epoch and step and its learning-rate
    schedules where they were.
    """

    epoch: int = 0
    step: int = 0
    global_step: int = 0
    #: True when :meth:`checkpoint` is a collective (a sharded optimizer gathers its state):
    #: the loop then calls it on every rank whenever a checkpoint is due, and rank 0 writes it
    checkpoint_collective: bool = False
    #: ``(store, run_id, attempt)`` of the run, set by the worker before training: a session whose state
    #: is sharded writes its shards there itself (its :meth:`checkpoint` then returns what
    #: locates them; rank 0 commits that as the checkpoint)
    checkpoint_location: Any = None
    #: True for a framework whose own loop trains (Lightning): the worker calls :meth:`fit_run`
    drives_loop: ClassVar[bool] = False

    @classmethod
    def open(cls, spec: "TrainSpec") -> "TrainingSession":
        """Initialise the collectives and rebuild model and optimizer on this rank from ``spec``."""
        raise NotImplementedError(f"{cls.__name__}.open")

    # what the loop needs ------------------------------------------------------------------
    @property
    def rank(self) -> int:
        import hora.native as hn

        return hn.rank()

    @property
    def size(self) -> int:
        import hora.native as hn

        return hn.size()

    def batches(self, reader: Any, transform: Callable[[dict], dict] | None) -> Iterable[Any]:
        """What the loop iterates for one pass of ``reader`` (a :class:`hora.store.Reader`).

        Each item goes as is to :meth:`train_step` or :meth:`eval_batch`. Exactly
        ``len(reader)`` items (every rank steps the same number of times; the loop checks
        it). A numpy batch holds every input under its feature key (a feature group as one
        ``(rows, k)`` array under :func:`~hora.estimators.data.frames.group_key`; the reader
        stacks it, and its member columns are left out unless they are labels or the
        weight), the labels and the weight. ``transform`` (a ``transformation_fn``, which
        sees the members, followed by the stacking) applies to each numpy batch first.
        The default yields the numpy batch dicts.
        """
        if transform is None:
            return reader
        return (transform(batch) for batch in reader)

    def train_step(self, batch: Any, step: int) -> float:
        """One training batch (forward, backward, an optimizer step when due); returns its loss."""
        raise NotImplementedError(f"{type(self).__name__}.train_step")

    def finish_epoch(self, steps: int) -> None:
        """After the epoch's last training batch (e.g. step a partial accumulation window)."""

    def eval_keys(self) -> list[str]:
        """Every key :meth:`eval_batch` / :meth:`eval_finish` may return, the same on every rank."""
        return ["loss", "_n"]

    def eval_batch(self, batch: Any) -> dict[str, float]:
        """One validation batch: ``{"loss": sum over rows, "<metric>": sum, ..., "_n": rows}``."""
        raise NotImplementedError(f"{type(self).__name__}.eval_batch")

    def eval_finish(self) -> dict[str, float]:
        """Per-epoch sums of stateful metrics (``{name: value * rows}``); resets them."""
        return {}

    def set_train(self, training: bool) -> None:
        """Switch between training and evaluation mode."""

    def rescale_learning_rate(self, factor: float) -> None:
        """Multiply the learning rates by ``factor``: a run resumed from a checkpoint written
        by another number of ranks, under ``lr_scaling="linear"`` (the default does nothing)."""

    # state ----------------------------------------------------------------------------------
    def broadcast_initial(self) -> None:
        """Make every rank start from rank 0's model and optimizer state."""

    def checkpoint(self, resume: Resume) -> bytes:
        """Model, optimizer and ``resume`` (where training stands) as one checkpoint."""
        raise NotImplementedError(f"{type(self).__name__}.checkpoint")

    def restore(self, data: bytes, ckpt_epoch: int) -> Resume:
        """Load a checkpoint written by :meth:`checkpoint`; returns where training stands."""
        raise NotImplementedError(f"{type(self).__name__}.restore")

    def finalize(self) -> None:
        """Called on every rank once training ended (after a best state was restored), before
        :meth:`weights` / :meth:`model_files` on rank 0: a sharded model gathers itself here."""

    def weights(self) -> bytes:
        """The trained model for the driver (what :meth:`ModelCodec.load` reads)."""
        raise NotImplementedError(f"{type(self).__name__}.weights")

    def model_files(self) -> dict[str, bytes]:
        """The trained model as :meth:`ModelCodec.serialize` writes it (for callbacks that log it)."""
        raise NotImplementedError(f"{type(self).__name__}.model_files")

    # framework-native callbacks (Keras callbacks ...) -------------------------------------
    def on_train_begin(self) -> None:
        """Before the first epoch (framework callbacks)."""

    def on_epoch_begin(self, epoch: int) -> None:
        """Before each epoch (framework callbacks)."""

    def on_batch_end(self, step: int, loss: float) -> None:
        """After each training batch (framework callbacks)."""

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> bool:
        """After each epoch with the rank-averaged logs; True asks to stop training."""
        return False

    def on_train_end(self, history: list[dict[str, float]]) -> None:
        """After the last epoch (framework callbacks)."""

    def fit_run(self, run: Any) -> dict[str, Any] | None:
        """Train with the framework's own loop (``drives_loop``), through the hooks of
        :class:`hora.estimators.worker.loop.WorkerRun` (batches, epoch ends, checkpoints); returns ``run.result()``."""
        raise NotImplementedError(f"{type(self).__name__}.fit_run")

    def close(self) -> None:
        """Release what :meth:`open` acquired."""


@dataclass(frozen=True)
class Framework:
    """One framework: its codec, its session class and its configuration class.

    Attributes:
        name: short name (``"torch"``), the key of :func:`get_framework`.
        codec: the driver-side :class:`ModelCodec` instance.
        session: the worker-side :class:`TrainingSession` subclass.
        config: the :class:`~hora.estimators.params.EstimatorConfig` subclass declaring
            the framework's extra parameters.
        model_kind: what ``model`` must be, for docstrings (``"a torch.nn.Module"``).
        prepare: optional ``params -> params`` applied before the config is built
            (Keras resolves ``loss="mse"`` to a loss object).
        modules: what a worker imports to train (checked on Spark executors when a fit fails).
    """

    name: str
    codec: ModelCodec
    session: type[TrainingSession]
    config: type
    model_kind: str = "a model"
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    modules: tuple[str, ...] = ()

    def make_config(self, params: dict[str, Any]) -> "EstimatorConfig":
        """The validated configuration from ``{name: value}`` (see ``EstimatorConfig.from_params``)."""
        if self.prepare is not None:
            params = self.prepare(dict(params))
        return self.config.from_params(params)

    def __reduce__(self) -> Any:
        # a descriptor travels by name: workers import the framework's module themselves
        return (get_framework, (self.name,))


def register(framework: Framework) -> Framework:
    """Make ``framework`` findable by :func:`get_framework` (each framework module does this once)."""
    _REGISTRY[framework.name] = framework
    return framework


def get_framework(name: str) -> Framework:
    """The registered framework called ``name`` (importing a built-in framework's module on first use).

    Raises:
        ConfigError: no framework of that name (the message lists the known ones).
    """
    if name not in _REGISTRY and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"no hora estimator framework named {name!r}; known: {sorted(set(BUILTIN) | set(_REGISTRY))}") from None


__all__ = ["Framework", "ModelCodec", "TrainingSession", "CheckResult", "Resume", "register", "get_framework"]
