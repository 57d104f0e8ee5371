"""PyTorch on the estimator seam: :class:`TorchCodec` and :class:`TorchConfig` (driver), :data:`TORCH`;
the rank side, :class:`~hora.estimators.frameworks.torch.session.TorchSession`, is in :mod:`hora.estimators.frameworks.torch.session`.

Conventions for users of ``TorchEstimator``:

* the model is called as ``model(*inputs)``, one tensor per ``feature_cols`` entry (a
  column, or a feature group stacked into ``(rows, k)``), each reshaped to its
  ``input_shapes`` entry when given (``[-1, 1, 8, 8]``);
* floating features are cast to the model's parameter dtype, integer features stay int64;
* the model returns one tensor, or a tuple/list with one tensor per label column;
* a label is aligned to its output: class ids (integers, or whole-number floats such as
  Spark's double labels) with an output of shape ``(n, classes)`` (classes > 1) become
  int64 (classification, e.g. ``CrossEntropyLoss``);
  otherwise the label is cast to the output dtype and reshaped to the output's shape
  when both hold the same number of values per row (``(n,)`` vs ``(n, 1)``);
* with ``sample_weight_col``, loss modules with a ``reduction`` attribute are run with
  ``reduction="none"`` and the per-row losses averaged with the weights; plain
  callables must then return one loss per row;
* the options of a modern loop (each a ``TorchConfig`` parameter): ``lr_scheduler``, a
  factory ``optimizer -> torch.optim.lr_scheduler`` object, stepped after each optimizer
  step (``lr_scheduler_interval="step"``) or each epoch (``"epoch"``, the default;
  ``ReduceLROnPlateau`` is stepped with ``val_loss``, else ``loss``), its state in every
  checkpoint, so a resume or relaunch continues the schedule; ``precision``: ``"32"``,
  ``"bf16-mixed"`` (``torch.autocast`` to bfloat16, on the CPU or the GPU) or
  ``"16-mixed"`` (float16 autocast with a ``GradScaler`` on the rank's device, the CPU or
  the GPU; the scaler unscales the allreduced gradients, so an inf/NaN on any rank skips the
  step on every rank alike; its state is in every checkpoint; on the CPU it needs a torch with
  float16 CPU autocast and ``GradScaler("cpu")``, checked on the driver);
  ``gradient_clip_value`` / ``gradient_clip_norm``:
  applied to the gradients as allreduced, before the step (``optimizer.synchronize()``,
  unscaled by the GradScaler, clipped by value then by norm, then
  ``with optimizer.skip_synchronize(): optimizer.step()``, as Horovod prescribes);
  ``class_weight`` (a classifier's, ``{class: weight}`` or one weight per class): each
  row's loss weighted by its label's class weight (times its ``sample_weight_col``
  weight), the weighted mean as ``CrossEntropyLoss(weight=...)`` computes it;
* ``strategy``: ``"hora"`` (hora's DistributedOptimizer), ``"zero1"`` / ``"zero2"`` (the same,
  sharded), ``"ddp"`` or ``"fsdp"`` (torch's, on the group :func:`hora.torch.init_process_group`
  builds): see :mod:`hora.estimators.frameworks.torch.strategies`;
* ``train_minibatch_fn`` (Horovod's): ``fn(model, optimizer, transform_outputs, loss_fn,
  inputs, labels, sample_weights, backward_passes_per_step, batch_idx) -> (outputs,
  loss)`` replaces the default step; it calls ``zero_grad``/``backward``/``step`` itself
  (Horovod's default steps at the start of each accumulation window), and hora steps
  once more after an epoch whose last gradients were not applied, as Horovod does.
"""

from __future__ import annotations

import io
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import numpy as np

from hora.errors import ConfigError
from hora.estimators.frameworks.torch import strategies as torch_strategies
from hora.estimators.data.frames import hint_grouping
from hora.estimators.framework import CheckResult, Framework, ModelCodec, register
from hora.estimators.params import EstimatorConfig, param
from hora.estimators.spec import freeze, thaw
from hora.estimators.frameworks.torch.session import TorchSession, class_weight_list, classes_of, serialize_model
from hora.estimators.frameworks.torch.strategies import STRATEGIES, TORCH_DISTRIBUTED
from hora.estimators.frameworks.torch.tensors import (
    _stack, _tensor, align_label, as_outputs, first_state_mismatch, is_torchmetric, normalize_metrics,
    per_row_loss_fn, to_inputs, weighted,
)

logger = logging.getLogger(__name__)


@dataclass
class TorchConfig(EstimatorConfig):
    """The Torch estimator's parameters: the shared ones and Horovod's Torch-only ones."""

    # widened for torch only (the shared parameter's Literal has no 'causal_lm')
    task: Literal["classification", "regression", "causal_lm"] | None = param(  # type: ignore[assignment]
        None, "'classification' (the model gives one logit per class, or one for two classes; the fitted model "
        "outputs rawPrediction, probability and a class index as prediction), 'regression' (outputs as they are), "
        "'causal_lm' (a Hugging Face causal language model with tokenizer=: no label column, the labels are the "
        "input ids; history has perplexity; transform writes each row's mean token loss, and with generate_kwargs "
        "the generated text), or None: inferred from the loss (cross-entropy / NLL / BCE: classification), logged "
        "once")
    train_minibatch_fn: Callable | None = param(None, "Horovod's custom training step: fn(model, optimizer, "
                                                "transform_outputs, loss_fn, inputs, labels, sample_weights, "
                                                "backward_passes_per_step, batch_idx) -> (outputs, loss)", "pickle")
    loss_constructors: Sequence[Callable] | None = param(None, "functions returning the losses (Horovod's; instead "
                                                         "of loss)", "pickle")
    lr_scheduler: Callable | None = param(None, "a factory optimizer -> torch.optim.lr_scheduler object; its state is "
                                          "checkpointed and a resume or relaunch continues it", "pickle")
    lr_scheduler_interval: Literal["epoch", "step"] = param(
        "epoch", "step lr_scheduler after each epoch ('epoch'; ReduceLROnPlateau with val_loss, else loss) or after "
        "each optimizer step ('step')")
    precision: Literal["32", "bf16-mixed", "16-mixed"] = param(
        "32", "'32', 'bf16-mixed' (autocast to bfloat16, CPU or GPU) or '16-mixed' (float16 autocast with a "
        "GradScaler, CPU or GPU; its state is checkpointed)")
    gradient_clip_norm: float | None = param(None, "clip the allreduced gradients to this total norm before each "
                                             "optimizer step")
    gradient_clip_value: float | None = param(None, "clip each allreduced gradient value to [-v, v] before each "
                                              "optimizer step")
    class_weight: dict[int, float] | Sequence[float] | None = param(
        None, "a classifier's class weights ({class: weight}, missing classes 1.0, or one weight per class): each "
        "row's loss is weighted by its class (times sample_weight_col)", "pickle")
    strategy: Literal["hora", "zero1", "zero2", "ddp", "fsdp"] = param(
        "hora", "how ranks share the work: 'hora' (hora's DistributedOptimizer; every rank holds everything), "
        "'zero1' / 'zero2' (each rank keeps the optimizer state / and the gradients of its shard of the "
        "parameters), 'ddp' (torch's DistributedDataParallel) or 'fsdp' (FSDP2's fully_shard: parameters too); "
        "checkpoints hold the whole state, so a resume at another size reshards")
    tokenizer: Any = param(None, "a Hugging Face tokenizer or a callable list[str] -> dict of arrays: string feature "
                           "columns are tokenized per batch on the ranks (padded to the batch's longest row, at most "
                           "max_length tokens; two string columns as a text pair) and the model called with keyword "
                           "tensors (see hora.estimators.frameworks.torch.hf)", "pickle")
    merge_adapters: bool = param(True, "a peft (LoRA) model: merge the trained adapters into the base model of the "
                                 "fitted model (False: keep them; save_pretrained then writes the adapters)")
    generate_kwargs: dict[str, Any] | None = param(
        None, "task='causal_lm': keyword arguments of the model's generate() (e.g. {'max_new_tokens': 8}); transform "
        "then also writes each row's continuation, decoded by the tokenizer, in a 'generated' column")

    def __post_init__(self) -> None:
        if self.task == "causal_lm":
            self._check_causal_lm()
        elif self.generate_kwargs is not None:
            raise ConfigError("generate_kwargs applies to task='causal_lm' (text generated in transform); set "
                              f"task='causal_lm' or drop it (task is {self.task!r})")
        if self.loss_constructors is not None:
            if self.loss is not None:
                raise ConfigError("only one of loss and loss_constructors can be given (as in Horovod)")
            try:
                built = [make() for make in self.loss_constructors]
            except Exception as exc:
                raise ConfigError(f"loss_constructors failed: {type(exc).__name__}: {exc}") from exc
            self.loss = built[0] if len(built) == 1 else built
        # the torch parameters first (they read the shared ones, none rewrites them), then the shared checks:
        # the config is checked from this module down to params.py, without coming back
        if self.train_minibatch_fn is not None and not callable(self.train_minibatch_fn):
            raise ConfigError(f"train_minibatch_fn must be callable, got {self.train_minibatch_fn!r}")
        self._check_loop_options()
        super().__post_init__()

    def supports_task(self, task: str) -> bool:
        """TorchEstimator takes every task, ``"causal_lm"`` included."""
        return True

    def _check_causal_lm(self) -> None:
        """task='causal_lm' (see :func:`hora.estimators.frameworks.torch.hf.check_causal_lm`)."""
        from hora.estimators.frameworks.torch.hf import check_causal_lm

        check_causal_lm(self)

    def needs_loss(self) -> bool:
        """A Hugging Face model (or one given a tokenizer) may train on its own loss (loss=None)."""
        from hora.estimators.frameworks.torch.hf import wants_adapter

        return not wants_adapter(self)

    def _check_loop_options(self) -> None:
        """lr_scheduler, precision, gradient clipping and class_weight (what can be checked without the data)."""
        if self.lr_scheduler is not None and not callable(self.lr_scheduler):
            raise ConfigError(f"lr_scheduler must be a factory optimizer -> scheduler (e.g. lambda opt: "
                              f"torch.optim.lr_scheduler.StepLR(opt, 10)), got {self.lr_scheduler!r}")
        if self.lr_scheduler_interval not in SCHEDULER_INTERVALS:
            raise ConfigError(f"lr_scheduler_interval must be 'epoch' or 'step', got {self.lr_scheduler_interval!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {self.precision!r}")
        if self.precision == "16-mixed" and not self.use_gpu:
            missing = cpu_float16_missing()
            if missing is not None:
                raise ConfigError(f"precision='16-mixed' on the CPU (use_gpu=False): {missing}; use "
                                  "precision='bf16-mixed' on the CPU, or use_gpu=True")
        self._check_strategy()
        for name in ("gradient_clip_norm", "gradient_clip_value"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ConfigError(f"{name} must be a number > 0, got {value!r}")
        if self.train_minibatch_fn is not None:
            custom = [n for n, v in (("precision", self.precision != "32"), ("gradient_clip_norm",
                      self.gradient_clip_norm), ("gradient_clip_value", self.gradient_clip_value),
                      ("class_weight", self.class_weight is not None)) if v]
            if custom:
                raise ConfigError(f"{', '.join(custom)} apply to hora's training step, but train_minibatch_fn "
                                  "replaces it: do them in the function")
        cw = self.class_weight
        if cw is not None:
            items = cw.items() if isinstance(cw, dict) else enumerate(cw) if isinstance(cw, (list, tuple)) else None
            if items is None:
                raise ConfigError(f"class_weight must be a dict {{class: weight}} or a list of weights, got {cw!r}")
            for k, w in items:
                if not isinstance(k, int) or isinstance(k, bool) or k < 0:
                    raise ConfigError(f"class_weight keys must be class indices (ints >= 0), got {k!r}")
                if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0 or not math.isfinite(w):
                    raise ConfigError(f"class_weight[{k}] must be a number >= 0, got {w!r}")
            if self.task == "regression":
                raise ConfigError("class_weight applies to a classifier, but task='regression'")

    def _check_strategy(self) -> None:
        strategy = self.strategy
        if strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}")
        if strategy == "hora":
            return
        if strategy in ("zero2", "fsdp") and self.precision == "16-mixed":
            raise ConfigError(f"strategy={strategy!r} with precision='16-mixed': each rank holds only its shard of "
                              "the gradients, so the GradScaler's overflow check would differ between ranks; use "
                              "strategy='zero1' or precision='bf16-mixed'")
        if strategy in TORCH_DISTRIBUTED and self.gradient_compression is not None:
            raise ConfigError(f"gradient_compression applies to hora's allreduce; strategy={strategy!r} reduces "
                              "through torch.distributed: use strategy='hora', 'zero1' or 'zero2'")
        from hora.torch.sharded_optimizer import NOT_PER_PARAMETER

        if isinstance(self.optimizer, NOT_PER_PARAMETER):  # (a factory's optimizer: DistributedOptimizer says so)
            raise ConfigError(f"strategy={self.strategy!r} shards the optimizer state per parameter; "
                              f"{type(self.optimizer).__name__} keeps state across parameters: use strategy='hora'")

    def class_weights(self, classes: int) -> list[float] | None:
        """``class_weight`` as one weight per class (None without one).

        Raises:
            ConfigError: a class index beyond ``classes``, or a list of another length.
        """
        return class_weight_list(self.class_weight, classes)


def cpu_float16_missing() -> str | None:
    """None when this torch trains ``precision="16-mixed"`` on the CPU (float16 autocast of a linear
    layer and a ``torch.amp.GradScaler("cpu")``), else what is missing."""
    import warnings

    import torch

    try:
        torch.amp.GradScaler("cpu")
    except Exception as exc:  # torch < 2.3
        return f"torch {torch.__version__} has no CPU GradScaler ({type(exc).__name__}: {exc})"
    with warnings.catch_warnings():  # an older torch warns and disables CPU autocast to float16
        warnings.simplefilter("ignore")
        try:
            with torch.autocast(device_type="cpu", dtype=torch.float16):
                dtype = torch.nn.functional.linear(torch.ones(1, 2), torch.ones(1, 2)).dtype
        except Exception as exc:
            return f"torch {torch.__version__} cannot autocast to float16 on the CPU ({type(exc).__name__}: {exc})"
    if dtype != torch.float16:
        return f"torch {torch.__version__} does not autocast to float16 on the CPU"
    return None


#: ``precision=`` values, and ``lr_scheduler_interval=`` values
PRECISIONS = ("32", "bf16-mixed", "16-mixed")
SCHEDULER_INTERVALS = ("epoch", "step")


class TorchCodec(ModelCodec):
    """Driver side of PyTorch (see :class:`~hora.estimators.framework.ModelCodec`)."""

    name = "torch"

    def check(self, config: Any, sample: dict[str, np.ndarray]) -> CheckResult:
        import torch

        model = config.model
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        params = list(model.parameters())
        if not params:
            raise ConfigError("model has no parameters to train")
        _check_optimizer(config.optimizer, model, params)
        metrics = normalize_metrics(config.metrics)
        features = config.features
        inputs = to_inputs(model, [sample[k] for k in features.keys], config.input_shapes)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                try:
                    raw = model(*inputs)
                except Exception as exc:
                    shapes = [tuple(t.shape) for t in inputs]
                    hint = hint_grouping(features) if isinstance(exc, TypeError) else ""
                    raise ConfigError(
                        f"the model's forward pass failed on a sample of the data (inputs of shapes {shapes} "
                        f"from feature_cols {config.feature_cols}): {type(exc).__name__}: {exc}{hint}"
                    ) from exc
                if config.task == "causal_lm":  # one output (the logits); labels are the input ids
                    outs = as_outputs(raw, 1)
                    from hora.estimators.frameworks.torch.hf import check_model_loss

                    check_model_loss(config.loss, outs[0])
                else:
                    outs = as_outputs(raw, len(config.label_cols))
                losses = config.loss if isinstance(config.loss, (list, tuple)) else [config.loss] * len(outs)
                for i, (out, name) in enumerate(zip(outs, config.label_cols)):
                    label = align_label(out, _tensor(_stack(sample[name])), name)
                    fn = per_row_loss_fn(losses[i]) if config.sample_weight_col is not None else losses[i]
                    try:
                        value = fn(out, label)
                    except Exception as exc:
                        raise ConfigError(
                            f"loss for label {name!r} failed on the model output (shape {tuple(out.shape)}) "
                            f"and the label (shape {tuple(label.shape)}): {type(exc).__name__}: {exc}"
                        ) from exc
                    if config.sample_weight_col is not None:
                        weighted(value, torch.ones(out.shape[0]))
                    elif value.dim() != 0:
                        raise ConfigError(f"loss for label {name!r} must return a scalar, got shape {tuple(value.shape)}")
                    for mname, m in metrics:
                        if is_torchmetric(m):
                            continue
                        try:
                            m(out, label)
                        except Exception as exc:
                            raise ConfigError(f"metric {mname!r} failed on label {name!r}: {type(exc).__name__}: {exc}") from exc
        finally:
            model.train(was_training)
        shapes = [tuple(int(d) for d in o.shape[1:]) for o in outs]
        if getattr(config, "class_weight", None) is not None:
            from hora.estimators.tasks import CLASSIFICATION, loss_task

            task = config.task or (loss_task("torch", config.loss)[0] if len(config.label_cols) == 1 else None)
            if task != CLASSIFICATION:
                raise ConfigError("class_weight applies to a classifier: pass task='classification' or a "
                                  "classification loss (CrossEntropyLoss, NLLLoss, BCEWithLogitsLoss, BCELoss)")
            config.class_weights(classes_of(shapes[0]))
        return CheckResult(output_shapes=shapes)

    def freeze(self, config: Any) -> bytes:
        # model and optimizer in one pickle: the optimizer stays bound to the model's parameters
        return freeze({"model": config.model, "optimizer": config.optimizer, "loss": config.loss,
                       "metrics": config.metrics, "compression": config.gradient_compression,
                       "minibatch_fn": config.train_minibatch_fn, "lr_scheduler": config.lr_scheduler,
                       "class_weight": config.class_weight})

    def prepare_model(self, source: Any, config: Any, dataset: Any = None) -> None:
        """Before the sample check: a Hugging Face model's keyword adapter and tokenizer
        (:func:`hora.estimators.frameworks.torch.hf.prepare`); ``source``: the frame's Source (None with the
        materialized ``dataset``)."""
        from hora.estimators.frameworks.torch import hf

        hf.prepare(source, config, dataset)

    #: the entry of the run's checkpoint dict that holds the model's state_dict
    checkpoint_state_key = "model"

    def check_checkpoint(self, config: Any, data: bytes, where: str) -> None:
        import torch

        try:
            ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        except Exception as exc:
            raise ConfigError(f"{where} cannot be read as a Torch checkpoint: {type(exc).__name__}: {exc}") from exc
        if isinstance(ckpt, dict) and "dcp" in ckpt:  # an FSDP run's: its shards' metadata tells the shapes
            path = f"{config.store.layout.checkpoint_dir(config.run_id)}/{ckpt['dcp']}"
            try:
                mismatch = torch_strategies.dcp_mismatch(config.model, config.store, path)
            except Exception as exc:
                raise ConfigError(f"{where} names the distributed checkpoint {config.store.url_for(path)}, which "
                                  f"cannot be read: {type(exc).__name__}: {exc}") from exc
        else:
            saved = ckpt.get(self.checkpoint_state_key) if isinstance(ckpt, dict) else None
            if saved is None:
                raise ConfigError(f"{where} holds no model state (no {self.checkpoint_state_key!r} entry)")
            mismatch = first_state_mismatch(config.model.state_dict(), saved)
        if mismatch is not None:
            raise ConfigError(f"{where} belongs to another model: {mismatch}; fit with another run_id, or the "
                              "model that wrote it")

    def load(self, payload: bytes, weights: bytes) -> Any:
        model = _with_weights(thaw(payload)["model"], weights)
        after_fit = getattr(model, "after_fit", None)  # a Hugging Face model's (hora.estimators.frameworks.torch.hf)
        return after_fit() if callable(after_fit) else model

    def serialize(self, model: Any) -> dict[str, bytes]:
        return serialize_model(model)

    def deserialize(self, files: dict[str, bytes]) -> Any:
        return _with_weights(thaw(files["model.pkl"]), files["weights.pt"])

    def predict(self, model: Any, inputs: Sequence[np.ndarray], input_shapes: Any, batch_size: int,
                device: Any = None) -> list[np.ndarray]:
        """Run ``model`` on ``inputs`` ``batch_size`` rows at a time, on ``device`` (a ``torch.device``; the
        model is moved there, each batch copied there, outputs returned on the CPU) or where the model is."""
        import torch

        from hora.estimators.data.columns import rows_per_forward

        n = len(inputs[0]) if inputs else 0
        fixed = rows_per_forward(inputs, input_shapes) if n else None  # input_shapes without -1: Horovod's [[2]]
        if fixed is not None:
            batch_size = fixed
        if device is not None:
            model.to(device)
        model.eval()
        if device is not None and torch.device(device).type == "cuda":
            return _predict_fed(model, inputs, input_shapes, batch_size, device, n)
        chunks: list[list[np.ndarray]] = []
        with torch.inference_mode():
            for start in range(0, n, batch_size):
                outs = model(*to_inputs(model, [a[start:start + batch_size] for a in inputs], input_shapes,
                                        device=device))
                outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
                rows = min(batch_size, n - start)
                chunks.append([o.detach().cpu().double().numpy().reshape((rows, -1) if fixed else o.shape)
                               for o in outs])
        if not chunks:
            return []
        return [np.concatenate([c[i] for c in chunks]) for i in range(len(chunks[0]))]


    def causal_lm_outputs(self, model: Any, inputs: Sequence[np.ndarray], input_shapes: Any, batch_size: int,
                          generate_kwargs: dict | None, device: Any = None) -> list[np.ndarray]:
        """task='causal_lm': each row's mean token loss (and generated text); see
        :func:`hora.estimators.frameworks.torch.hf.causal_lm_outputs`."""
        from hora.estimators.frameworks.torch.hf import causal_lm_outputs

        return causal_lm_outputs(model, inputs, batch_size, generate_kwargs, input_shapes, device=device)


#: bytes of outputs kept on the GPU before they are copied back together (one wait per copy)
OUTPUT_FLUSH_BYTES = 64 << 20


def _predict_fed(model: Any, inputs: Sequence[np.ndarray], input_shapes: Any, batch_size: int, device: Any,
                 n: int) -> list[np.ndarray]:
    """:meth:`TorchCodec.predict` on a CUDA device: the batches made tensors in pinned memory and
    copied on a side stream one batch ahead (:class:`~hora.estimators.worker.feed.DeviceFeed`); the
    outputs stay on the device until :data:`OUTPUT_FLUSH_BYTES` of them are there, then come back
    in one copy (not one wait per batch)."""
    import torch

    from hora.estimators.worker.feed import DeviceFeed
    from hora.estimators.frameworks.torch.tensors import _param_dtype

    dtype = _param_dtype(model)

    def make(start: int) -> tuple[list, None]:
        return to_inputs(model, [a[start:start + batch_size] for a in inputs], input_shapes, None, dtype=dtype), None

    host: list[list[np.ndarray]] = []
    held: list[list[Any]] = []
    held_bytes = 0

    def flush() -> None:
        nonlocal held, held_bytes
        if held:
            host.append([torch.cat([c[i] for c in held]).cpu().double().numpy() for i in range(len(held[0]))])
        held, held_bytes = [], 0

    with torch.inference_mode():
        for fed in DeviceFeed(device, name="transform").batches(range(0, n, batch_size), make):
            outs = model(*fed.tensors)
            outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
            held.append([o.detach() for o in outs])
            held_bytes += sum(o.numel() * o.element_size() for o in outs)
            if held_bytes >= OUTPUT_FLUSH_BYTES:
                flush()
        flush()
    if not host:
        return []
    return [np.concatenate([c[i] for c in host]) for i in range(len(host[0]))]


def _check_optimizer(opt: Any, model: Any, params: list) -> None:
    import torch

    if isinstance(opt, torch.optim.Optimizer):
        model_ids = {id(p) for p in params}
        opt_params = [p for g in opt.param_groups for p in g["params"]]
        foreign = [p for p in opt_params if id(p) not in model_ids]
        if not opt_params or foreign:
            raise ConfigError(
                f"optimizer {type(opt).__name__} is not bound to the model's parameters ({len(foreign)} of its "
                f"{len(opt_params)} parameters are not the model's); create it with model.parameters(), or pass a "
                "factory params -> optimizer"
            )
    elif callable(opt):
        try:
            built = opt(model.parameters())
        except Exception as exc:
            raise ConfigError(f"optimizer factory failed on the model's parameters: {type(exc).__name__}: {exc}") from exc
        if not isinstance(built, torch.optim.Optimizer):
            raise ConfigError(f"optimizer factory must return a torch.optim.Optimizer, got {type(built).__name__}")
    else:
        raise ConfigError(f"optimizer must be a torch.optim.Optimizer or a factory params -> optimizer, got {opt!r}")


def _with_weights(model: Any, weights: bytes) -> Any:
    import torch

    model.load_state_dict(torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True))
    model.eval()
    return model


TORCH = register(Framework(name="torch", codec=TorchCodec(), session=TorchSession, config=TorchConfig,
                           model_kind="a torch.nn.Module", modules=("torch",)))

__all__ = ["TORCH", "TorchConfig", "TorchCodec", "TorchSession"]
