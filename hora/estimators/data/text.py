"""Text feature columns tokenized on the ranks: :class:`Tokenize`, the column operation a ``tokenizer=``
becomes.

A fit with ``tokenizer=`` (a Hugging Face ``PreTrainedTokenizerBase`` or any callable
``list[str] -> dict of arrays``) tokenizes its string feature columns per batch, in the reader's
background thread (it runs as the batch's ``collate_fn``, see :mod:`hora.estimators.columns`), on
the driver's sample check and in ``transform`` alike. Each batch is padded to its longest row (at
most ``max_length`` tokens, longer rows cut unless ``truncation=False``); two string columns go to
the tokenizer as a text pair. The tokenizer's arrays (``input_ids``, ``attention_mask``, ...) are
packed into one ``(rows, k, length)`` int64 input under the first text column's key, which the
model adapter (:class:`hora.estimators.frameworks.torch.hf.HFModule`) unpacks into keyword tensors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from hora.errors import ConfigError, DataError

logger = logging.getLogger(__name__)


def is_hf_tokenizer(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` is a Hugging Face ``PreTrainedTokenizerBase`` (checked without importing transformers)."""
    return any(c.__name__ == "PreTrainedTokenizerBase" and c.__module__.startswith("transformers")
               for c in type(tokenizer).__mro__)


def check_tokenizer(tokenizer: Any) -> None:
    """A usable ``tokenizer=``: callable, picklable (it travels to the ranks), with a pad token when it is
    a Hugging Face tokenizer (batches are padded to their longest row).

    Raises:
        ConfigError: names the tokenizer and what to set.
    """
    name = type(tokenizer).__name__
    if not callable(tokenizer):
        raise ConfigError(f"tokenizer must be a Hugging Face tokenizer or a callable list[str] -> dict of arrays, "
                          f"got {name}")
    if is_hf_tokenizer(tokenizer) and tokenizer.pad_token is None:
        raise ConfigError(f"tokenizer {name} has no pad token, and batches are padded to their longest row: set "
                          "tokenizer.pad_token (e.g. tokenizer.pad_token = tokenizer.eos_token)")
    import cloudpickle  # (as the training payload is pickled, see hora.estimators.spec.freeze)

    try:
        cloudpickle.dumps(tokenizer)
    except Exception as exc:
        raise ConfigError(f"tokenizer {name} cannot be pickled, and it must travel to the training processes: "
                          f"{type(exc).__name__}: {exc}; define it at module level (not in a closure) or pass a "
                          "Hugging Face tokenizer") from exc


def text_columns(df: Any, columns: Sequence[str], dataset: Any = None) -> list[str]:
    """Which of ``columns`` hold strings: from a materialized ``dataset``'s specs, else from the frame
    (or its Source) as its engine tells (:meth:`hora.store.sources.Source.string_columns`: a Spark
    schema, a pandas / Dask dtype, a Ray Dataset's first row)."""
    if dataset is not None:
        return [c for c in columns if c in dataset.columns and dataset.columns[c].kind == "string"]
    from hora.estimators.data.frames import source_of

    return source_of(df).string_columns(columns)


def _texts(values: Any, column: str) -> list[str]:
    rows = list(np.asarray(values, dtype=object).reshape(-1))
    for i, v in enumerate(rows):
        if isinstance(v, bytes):
            rows[i] = v.decode("utf-8")
        elif not isinstance(v, str):
            raise DataError(f"text column {column!r} holds a {type(v).__name__} ({v!r}) in row {i} of a batch; "
                            "hora tokenizes strings only (fill or drop the nulls)")
    return rows


def _pad(values: Any, name: str) -> np.ndarray:
    """A tokenizer's output array as ``(rows, length)`` int64, ragged rows padded with 0."""
    arr = np.asarray(values) if not isinstance(values, list) or not values or np.ndim(values[0]) == 0 else None
    if arr is not None and arr.dtype != object:
        arr = arr if arr.ndim == 2 else arr.reshape(len(arr), -1)
        return arr.astype(np.int64, copy=False)
    rows = [np.asarray(r, dtype=np.int64).reshape(-1) for r in values]
    out = np.zeros((len(rows), max((len(r) for r in rows), default=0)), dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


@dataclass
class Tokenize:
    """The column operation of ``tokenizer=`` (a batch's ``collate_fn``): the text columns of a batch
    tokenized (a pair for two), packed as ``(rows, len(names), length)`` int64 under ``columns[0]``;
    a second text column's key gets a ``(rows, 0)`` placeholder; other columns pass through.

    Attributes:
        tokenizer: the Hugging Face tokenizer or callable.
        columns: the text feature column(s), one or two.
        max_length: most tokens per row (None: the tokenizer's own limit).
        truncation: cut longer rows (False: a longer row is a DataError naming the column).
        names: the tokenizer's output names in packing order (set from the first batch on the driver).
    """

    tokenizer: Any
    columns: tuple[str, ...]
    max_length: int | None = None
    truncation: bool = True
    names: tuple[str, ...] = field(default=())

    def encode(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        """The tokenizer's arrays for the text columns of ``batch`` (``(rows, length)`` int64 each)."""
        texts = [_texts(batch[c], c) for c in self.columns]
        if is_hf_tokenizer(self.tokenizer):
            limit = self.max_length
            enc = self.tokenizer(*texts, padding="longest", truncation=self.truncation, max_length=limit,
                                 return_tensors="np")
            out = {k: _pad(v, k) for k, v in enc.items()}
        else:
            try:
                enc = self.tokenizer(*texts)
            except Exception as exc:
                raise DataError(f"tokenizer failed on a batch of text column(s) {list(self.columns)}: "
                                f"{type(exc).__name__}: {exc}") from exc
            if not isinstance(enc, dict):
                raise DataError(f"tokenizer must return a dict of arrays (name -> ids), got {type(enc).__name__}")
            out = {k: _pad(v, k) for k, v in enc.items()}
            if self.max_length is not None:
                longest = max((a.shape[1] for a in out.values()), default=0)
                if longest > self.max_length and not self.truncation:
                    raise DataError(f"text column(s) {list(self.columns)} tokenize to {longest} tokens, more than "
                                    f"max_length={self.max_length}, and truncation=False")
                out = {k: a[:, :self.max_length] for k, a in out.items()}
        if self.max_length is not None and not self.truncation:
            longest = max((a.shape[1] for a in out.values()), default=0)
            if longest > self.max_length:
                raise DataError(f"text column(s) {list(self.columns)} tokenize to {longest} tokens, more than "
                                f"max_length={self.max_length}, and truncation=False")
        return out

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        enc = self.encode(batch)
        names = self.names or tuple(enc)
        missing = [n for n in names if n not in enc]
        if missing:
            raise DataError(f"the tokenizer returned {sorted(enc)} for a batch, without {missing} of its first batch")
        out = dict(batch)
        out[self.columns[0]] = np.stack([enc[n] for n in names], axis=1)
        for c in self.columns[1:]:
            out[c] = np.zeros((len(out[self.columns[0]]), 0), dtype=np.int64)
        return out


def make_tokenize(tokenizer: Any, columns: Sequence[str], max_length: Any, truncation: bool) -> Tokenize:
    """The :class:`Tokenize` of a fit, its output names learned from the tokenizer on two short texts.

    Raises:
        ConfigError: more than two text columns, a ``max_length`` dict without the text column.
    """
    if len(columns) > 2:
        raise ConfigError(f"tokenizer takes one text column or a pair, but feature_cols has {len(columns)} string "
                          f"columns {list(columns)}")
    if isinstance(max_length, dict):
        max_length = max_length.get(columns[0])
    op = Tokenize(tokenizer=tokenizer, columns=tuple(columns), max_length=max_length, truncation=bool(truncation))
    probe = {c: np.array(["a b", "c"], dtype=object) for c in columns}
    op.names = tuple(op.encode(probe))
    return op


__all__ = ["Tokenize", "make_tokenize", "check_tokenizer", "is_hf_tokenizer", "text_columns"]
