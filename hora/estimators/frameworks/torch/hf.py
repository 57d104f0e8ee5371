"""Hugging Face ``transformers`` models (and any module whose forward takes keyword tensors) in
``TorchEstimator``: :class:`HFModule`, the adapter the estimator trains, and :class:`ModelLoss`.

``TorchEstimator(model=hf_model, tokenizer=tok, feature_cols=["text"], label_cols=["label"])``:
the estimator wraps the model in an :class:`HFModule` on the driver (:func:`prepare`). Its
``forward(*inputs)`` takes hora's positional inputs, one per ``feature_cols`` entry, and calls the
model with keyword tensors: a tokenized text column (see :mod:`hora.estimators.data.text`) becomes the
tokenizer's names (``input_ids``, ``attention_mask``, ``token_type_ids``, ...), a numeric column
its own name. It returns the output's ``logits``, so classification heads, metrics and
``transform`` work as for any torch model. With ``loss=None`` the model's own loss is used: the
training session hands the batch's labels to the adapter before the forward pass
(:attr:`HFModule.takes_labels`), the model is called with ``labels=``, and :class:`ModelLoss`
returns ``output.loss``. With ``task="causal_lm"`` every forward pass is given ``labels=`` the
input ids (padding -100) and there is no label column; :func:`causal_lm_outputs` gives ``transform``'s
per-row mean token loss and generated text, and a ``train_minibatch_fn`` is given the causal LM's
``transform_outputs`` and ``loss_fn`` (:class:`CausalMinibatch`). Nothing here imports ``transformers``.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Sequence

import torch

from hora.errors import ConfigError

logger = logging.getLogger(__name__)


def is_hf_model(model: Any) -> bool:
    """Whether ``model`` is a ``transformers`` ``PreTrainedModel`` or a ``peft`` model (by its class's module)."""
    return any(c.__module__.split(".")[0] in ("transformers", "peft") for c in type(model).__mro__
               if c is not torch.nn.Module and c is not object)


class HFModule(torch.nn.Module):
    """Adapter: hora's positional inputs in, the model called with keyword tensors, ``logits`` out.

    Args:
        model: the Hugging Face model (or any module taking keyword tensors).
        layout: one entry per feature input: ``("tokens", names)`` for a packed tokenized text
            column, ``("skip", ())`` for the second column of a text pair, ``("input", (name,))``
            for a numeric column passed as ``name=``.
        own_loss: call the model with ``labels=`` and use ``output.loss`` (``loss=None``).
        tokenizer: kept for :meth:`save_pretrained`.
        causal_lm: ``task="causal_lm"``: every forward pass is given ``labels=`` the input ids (padding
            positions -100, so they do not count; the model shifts them) and keeps ``output.loss``.
    """

    def __init__(self, model: torch.nn.Module, layout: Sequence[tuple[str, tuple[str, ...]]], own_loss: bool,
                 tokenizer: Any = None, merge_adapters: bool = True, causal_lm: bool = False) -> None:
        super().__init__()
        self.model = model
        #: a model with frozen parameters (a peft LoRA model): checkpoints and weights hold the trainable ones
        self.trainable_only = any(not p.requires_grad for p in model.parameters())
        self.merge_adapters = merge_adapters
        self.layout = [(kind, tuple(names)) for kind, names in layout]
        self.own_loss = own_loss
        self.causal_lm = causal_lm
        self.tokenizer = tokenizer
        self.pending_labels: Any = None
        self.last_loss: Any = None
        self._last_kwargs: dict[str, Any] | None = None
        self._checked = False

    @property
    def takes_labels(self) -> bool:
        """Whether the session passes each batch's labels (:attr:`pending_labels`) before the forward pass."""
        return self.own_loss and not getattr(self, "causal_lm", False)

    @staticmethod
    def causal_labels(kwargs: dict[str, torch.Tensor]) -> torch.Tensor:
        """A causal LM's ``labels=``: its input ids, padding positions (``attention_mask`` 0) set to -100."""
        if "input_ids" not in kwargs:
            raise ConfigError(f"task='causal_lm' needs the tokenizer's input_ids; the batch has {sorted(kwargs)}")
        labels = kwargs["input_ids"].clone()
        mask = kwargs.get("attention_mask")
        if mask is not None:
            labels[mask == 0] = -100
        return labels

    def keywords(self, inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model's keyword tensors for hora's positional ``inputs``."""
        if len(inputs) != len(self.layout):
            raise ConfigError(f"the model adapter takes {len(self.layout)} inputs (one per feature_cols entry), "
                              f"got {len(inputs)}")
        kwargs: dict[str, torch.Tensor] = {}
        for (kind, names), tensor in zip(self.layout, inputs):
            if kind == "tokens":
                packed = tensor.long()
                for i, name in enumerate(names):
                    kwargs[name] = packed[:, i]
            elif kind == "input":
                kwargs[names[0]] = tensor
        return kwargs

    def _check_arguments(self, kwargs: dict[str, Any]) -> None:
        try:
            sig = inspect.signature(self.model.forward)
        except (TypeError, ValueError):
            return
        params = sig.parameters.values()
        if any(p.kind == p.VAR_KEYWORD for p in params) and not any(
                p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params):
            return
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and p.name not in kwargs:
                raise ConfigError(f"the model's forward needs argument {p.name!r}, which the batch does not have "
                                  f"(its keys: {sorted(kwargs)}); add a feature column named {p.name!r} or a "
                                  "tokenizer that returns it")
        names = {p.name for p in params}
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            extra = sorted(set(kwargs) - names)
            if extra:
                raise ConfigError(f"the model's forward takes no argument(s) {extra} of the batch (its keys: "
                                  f"{sorted(kwargs)}; it takes {sorted(names)})")

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        kwargs = self.keywords(inputs)
        if not self._checked:
            self._check_arguments(kwargs)
            self._checked = True
        labels, self.pending_labels = self.pending_labels, None
        if getattr(self, "causal_lm", False):
            out = self.model(**kwargs, labels=self.causal_labels(kwargs))
            self.last_loss, self._last_kwargs = out.loss, None
            return _logits_of(out)
        if self.own_loss and labels is not None:
            kwargs["labels"] = self._labels_for_model(labels, kwargs)
        out = self.model(**kwargs)
        self.last_loss = getattr(out, "loss", None) if labels is not None else None
        self._last_kwargs = kwargs if self.own_loss and labels is None else None
        return _logits_of(out)

    def _labels_for_model(self, label: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        """A label column as the model takes ``labels=``: class ids as int64 for a classifier of
        ``num_labels > 1``, else floats."""
        config = getattr(self.model, "config", None)
        num_labels = getattr(config, "num_labels", None)
        label = label.reshape(label.shape[0], *label.shape[2:]) if label.dim() > 1 and label.shape[1] == 1 else label
        if num_labels is not None and num_labels > 1 and getattr(config, "problem_type", None) != \
                "multi_label_classification":
            return label.long()
        return label.float()

    def loss_from(self, label: torch.Tensor) -> torch.Tensor:
        """``output.loss`` of the last forward pass; when it ran without labels (the driver's check, a
        custom step), the model is called again on the same inputs with ``labels=``."""
        if self.last_loss is not None:
            loss, self.last_loss = self.last_loss, None
            return loss
        if getattr(self, "causal_lm", False):
            raise ConfigError("task='causal_lm': the model returned no loss given labels= (its input ids); pass a "
                              "causal language model (e.g. a transformers ...ForCausalLM)")
        if self._last_kwargs is None:
            raise ConfigError("loss=None uses the model's own loss, but the model was not run on this batch")
        kwargs = dict(self._last_kwargs, labels=self._labels_for_model(label, self._last_kwargs))
        out = self.model(**kwargs)
        if getattr(out, "loss", None) is None:
            raise ConfigError(f"loss=None uses the model's own loss, but {type(self.model).__name__} returned no "
                              "loss given labels=; pass loss= (a callable (logits, label) -> scalar)")
        return out.loss

    def shard_units(self) -> list[torch.nn.Module]:
        """The modules ``strategy="fsdp"`` shards one by one: those of the classes a ``transformers`` model lists
        in ``_no_split_modules`` (its transformer blocks, as accelerate wraps them), else each direct child
        of the model holding parameters."""
        names: set[str] = set()
        for module in self.modules():
            names.update(getattr(module, "_no_split_modules", None) or ())
        units = [m for m in self.model.modules() if type(m).__name__ in names and any(True for _ in m.parameters())]
        if units:
            return units
        return [m for m in self.model.children() if any(True for _ in m.parameters())]

    def _trainable_keys(self, prefix: str = "") -> set[str]:
        return {prefix + name for name, p in self.named_parameters() if p.requires_grad}

    def state_dict(self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Any:
        """The model's state; of a model with frozen parameters (LoRA), the trainable parameters only
        (the frozen ones travel once, in the fit's payload)."""
        state = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        if not self.trainable_only:
            return state
        keep = self._trainable_keys(prefix)
        for key in [k for k in state if k.startswith(prefix) and k not in keep]:
            del state[key]
        return state

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load :meth:`state_dict`'s state; with frozen parameters, the frozen ones may be absent.

        Raises:
            RuntimeError: (``strict``) a trainable parameter is missing, or a key is unknown.
        """
        if not self.trainable_only:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        missing = sorted(set(result.missing_keys) & self._trainable_keys())
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(f"state of {type(self.model).__name__}: missing trainable {missing[:5]}, unexpected "
                               f"{sorted(result.unexpected_keys)[:5]}")
        return result

    def after_fit(self) -> "HFModule":
        """The fitted model: a peft model's adapters merged into its base model (``merge_adapters=True``)."""
        merge = getattr(self.model, "merge_and_unload", None)
        if self.merge_adapters and callable(merge):
            self.model = merge()
            self.trainable_only = False
        self.eval()
        return self

    def save_pretrained(self, path: str, **kwargs: Any) -> None:
        """Write the model in the Hugging Face format at ``path`` (weights in safetensors, its config, and the
        tokenizer when it is a Hugging Face one), loadable with ``AutoModel...from_pretrained(path)``.

        Raises:
            ConfigError: the model has no ``save_pretrained`` (it is not a ``transformers``/``peft`` model).
        """
        save = getattr(self.model, "save_pretrained", None)
        if save is None:
            raise ConfigError(f"{type(self.model).__name__} has no save_pretrained: only transformers and peft "
                              "models are written in the Hugging Face format")
        os.makedirs(path, exist_ok=True)
        save(path, safe_serialization=True, **kwargs)
        if self.tokenizer is not None and hasattr(self.tokenizer, "save_pretrained"):
            self.tokenizer.save_pretrained(path)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["pending_labels"] = state["last_loss"] = state["_last_kwargs"] = None
        return state


def _logits_of(out: Any) -> torch.Tensor:
    logits = getattr(out, "logits", None)
    if logits is None:
        logits = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(logits, torch.Tensor):
        raise ConfigError(f"the model returned {type(out).__name__} without logits; hora reads output.logits")
    return logits


class ModelLoss:
    """``loss=None`` with a Hugging Face model: the loss is the model's own ``output.loss`` (its
    adapter is given the labels; see :meth:`HFModule.loss_from`). Pickled with the model (the
    adapter is the same object on the ranks)."""

    def __init__(self, adapter: HFModule) -> None:
        self.adapter = adapter

    def __call__(self, output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return self.adapter.loss_from(label)

    def __repr__(self) -> str:
        return f"ModelLoss({type(self.adapter.model).__name__})"


class CausalMinibatch:
    """``train_minibatch_fn`` with ``task="causal_lm"``: the user's function called with the causal LM's
    ``transform_outputs`` and ``loss_fn``, so that ``loss_fn(outputs, labels, weights)`` is the model's own
    loss on its input ids (there is no label column: ``labels`` is empty). Pickled with the model (the
    adapter is the same object on the ranks), as :class:`ModelLoss`."""

    def __init__(self, fn: Any, adapter: HFModule) -> None:
        self.fn = fn
        self.adapter = adapter

    def __call__(self, model: Any, optimizer: Any, transform_outputs: Any, loss_fn: Any, inputs: Any, labels: Any,
                 sample_weights: Any, backward_passes_per_step: int, batch_idx: int) -> Any:
        return self.fn(model, optimizer, self.transform_outputs, self.loss_fn, inputs, labels, sample_weights,
                       backward_passes_per_step, batch_idx)

    @staticmethod
    def transform_outputs(outputs: Any, labels: Any) -> tuple[list, list]:
        """The logits as the one output; no labels (they are the input ids, which the model shifts)."""
        from hora.estimators.frameworks.torch.tensors import as_outputs

        return as_outputs(outputs, 1), []

    def loss_fn(self, outputs: Any, labels: Any = None, sample_weights: Any = None) -> torch.Tensor:
        """The model's own mean token loss of the last forward pass (see :meth:`HFModule.loss_from`)."""
        if self.adapter.last_loss is None:
            raise ConfigError("task='causal_lm' with train_minibatch_fn: loss_fn gives the model's own loss of its "
                              "last forward pass; call model(*inputs) in the function before loss_fn")
        return self.adapter.loss_from(None)

    def __repr__(self) -> str:
        return f"CausalMinibatch({getattr(self.fn, '__name__', self.fn)!r})"


def causal_lm_outputs(model: HFModule, inputs: Sequence[Any], batch_size: int, generate_kwargs: dict | None,
                      input_shapes: Any = None, device: Any = None) -> list[Any]:
    """A causal LM's ``transform`` outputs for hora's positional ``inputs`` (a tokenized text column):
    each row's mean token loss (float64; NaN for a row with no token to predict) and, with
    ``generate_kwargs``, its continuation from ``model.generate`` decoded by the tokenizer (an object
    array of strings). Rows are generated one at a time, without their padding."""
    import numpy as np

    from hora.estimators.frameworks.torch.tensors import to_inputs

    if device is not None:
        model.to(device)
    model.eval()
    n = len(inputs[0]) if inputs else 0
    losses: list[Any] = []
    texts: list[str] = []
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            tensors = to_inputs(model, [a[start:start + batch_size] for a in inputs], input_shapes, device=device)
            kwargs = model.keywords(tensors)
            logits = _logits_of(model.model(**kwargs))[:, :-1].float()
            labels = model.causal_labels(kwargs)[:, 1:]
            per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                          ignore_index=-100, reduction="none").reshape(labels.shape)
            count = (labels != -100).sum(dim=1)
            mean = per_token.sum(dim=1) / count.clamp(min=1)
            mean[count == 0] = float("nan")
            losses.append(mean.double().cpu().numpy())
            if generate_kwargs is not None:
                texts.extend(_generate(model, kwargs, generate_kwargs))
    out = [np.concatenate(losses) if losses else np.zeros((0,), dtype=np.float64)]
    if generate_kwargs is not None:
        out.append(np.array(texts, dtype=object))
    return out


def _generate(model: HFModule, kwargs: dict[str, torch.Tensor], generate_kwargs: dict) -> list[str]:
    """Each row's continuation (``generate`` on the row without its padding), decoded without special tokens."""
    tokenizer = model.tokenizer
    ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
    options = dict(generate_kwargs)
    if getattr(tokenizer, "pad_token_id", None) is not None:
        options.setdefault("pad_token_id", tokenizer.pad_token_id)
    texts = []
    for i in range(ids.shape[0]):
        row = ids[i][mask[i].bool()] if mask is not None else ids[i]
        prompt = row.unsqueeze(0)
        made = model.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), **options)
        texts.append(tokenizer.decode(made[0, prompt.shape[1]:].tolist(), skip_special_tokens=True))
    return texts


def check_causal_lm(config: Any) -> None:
    """The checks of ``task='causal_lm'`` on the driver: a tokenizer, the model's own loss, no metrics
    or sample weights, JSON ``generate_kwargs``.

    Raises:
        ConfigError: saying what to set or drop.
    """
    import json

    if config.tokenizer is None:
        raise ConfigError("task='causal_lm' tokenizes a text feature column: set tokenizer= (a Hugging Face "
                          "tokenizer with a pad token)")
    if config.loss is not None or config.loss_constructors is not None:
        raise ConfigError("task='causal_lm' trains on the model's own loss (labels are the input ids): drop loss=")
    if config.metrics:
        raise ConfigError("task='causal_lm' reports loss and perplexity; drop metrics= (they take a label column)")
    if config.sample_weight_col is not None or config.class_weight is not None:
        raise ConfigError("task='causal_lm' takes no sample_weight_col or class_weight")
    if config.generate_kwargs is not None:
        if not callable(getattr(config.tokenizer, "decode", None)):
            raise ConfigError("generate_kwargs decodes the generated ids with the tokenizer: pass a Hugging Face "
                              "tokenizer (one with decode)")
        if not isinstance(config.generate_kwargs, dict):
            raise ConfigError(f"generate_kwargs must be a dict of generate() arguments, got "
                              f"{type(config.generate_kwargs).__name__}")
        try:
            json.dumps(config.generate_kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"generate_kwargs must be JSON values (it is saved with the model): {exc}") from exc


def check_model_loss(loss: Any, out: Any) -> None:
    """task='causal_lm': the model computes a scalar loss given ``labels=`` (its input ids)."""
    try:
        value = loss(out, None)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"task='causal_lm': the model's own loss failed on a sample of the data: "
                          f"{type(exc).__name__}: {exc}") from exc
    if getattr(value, "dim", lambda: 1)() != 0:
        raise ConfigError("task='causal_lm': the model's loss given labels= is not a scalar; pass a causal language "
                          "model (e.g. a transformers ...ForCausalLM)")


def wants_adapter(config: Any) -> bool:
    """Whether a fit's model is trained through :class:`HFModule`: a ``tokenizer`` is given, or the model is a
    ``transformers``/``peft`` model."""
    return getattr(config, "tokenizer", None) is not None or is_hf_model(config.model)


def prepare(df: Any, config: Any, dataset: Any = None) -> None:
    """On the driver, before the sample check: wrap ``config.model`` in an :class:`HFModule`, make the
    tokenizer the batches' column operation (``collate_fn``), and with ``loss=None`` the model's own
    loss. A no-op for other models and for a model already wrapped.

    Raises:
        ConfigError: a tokenizer together with ``collate_fn``, a tokenizer without a text column,
            an unpicklable tokenizer or one without a pad token.
    """
    from hora.estimators.data.text import check_tokenizer, make_tokenize, text_columns

    if isinstance(config.model, HFModule) or not wants_adapter(config):
        return
    tokenizer = getattr(config, "tokenizer", None)
    keys = config.features.keys
    texts: list[str] = []
    if tokenizer is not None:
        check_tokenizer(tokenizer)
        if config.collate_fn is not None:
            raise ConfigError("give tokenizer or collate_fn, not both: the tokenizer is the batches' column operation")
        texts = text_columns(df, [k for k in keys if k in config.features.columns], dataset)
        if not texts:
            raise ConfigError(f"tokenizer is given but no feature column of {list(keys)} holds strings")
        tokenize = make_tokenize(tokenizer, texts, config.max_length, config.truncation)
        config.collate_fn = tokenize
        names = tokenize.names
    layout = []
    for k in keys:
        if texts and k == texts[0]:
            layout.append(("tokens", names))
        elif k in texts:
            layout.append(("skip", ()))
        else:
            layout.append(("input", (k,)))
    own = config.loss is None
    causal = config.task == "causal_lm"
    if causal and not texts:
        raise ConfigError("task='causal_lm' needs a text feature column and tokenizer=")
    adapter = HFModule(config.model, layout, own_loss=own, tokenizer=tokenizer,
                       merge_adapters=getattr(config, "merge_adapters", True), causal_lm=causal)
    config.model = adapter
    if causal and config.train_minibatch_fn is not None and not isinstance(config.train_minibatch_fn,
                                                                            CausalMinibatch):
        config.train_minibatch_fn = CausalMinibatch(config.train_minibatch_fn, adapter)
    if own:
        config.loss = ModelLoss(adapter)
        if config.task is None and getattr(getattr(adapter.model, "config", None), "num_labels", 1) > 1:
            config.task = "classification"
    logger.info("training %s through hora's keyword adapter (inputs %s; %s loss)", type(adapter.model).__name__,
                layout, "the model's own" if own else "the given")


__all__ = ["CausalMinibatch", "HFModule", "ModelLoss", "causal_lm_outputs", "check_causal_lm", "check_model_loss",
           "is_hf_model", "prepare", "wants_adapter"]
