"""``tf.data.Dataset`` adapter of the reader (TensorFlow is imported when called, never before)."""

from __future__ import annotations

from typing import Any, Sequence

from hora.errors import ConfigError
from hora.store.reader import Reader


def make_tf_dataset(
    reader: Reader,
    x_cols: Sequence[str] | None = None,
    y_cols: Sequence[str] | None = None,
    sample_weight_col: str | None = None,
) -> Any:
    """A ``tf.data.Dataset`` over the reader's batches, with its cardinality set to ``len(reader)``.

    Without ``x_cols`` each element is the batch dict ``{column: tensor}``. With
    ``x_cols`` (and optionally ``y_cols``, ``sample_weight_col``) elements are
    ``x``, ``(x, y)`` or ``(x, y, w)`` as Keras ``fit`` expects; a single column is a
    tensor, several are a dict. Each pass over the dataset is one pass of the reader
    (call ``reader.set_epoch`` between epochs for a new shuffle).

    Raises:
        ConfigError: not a Reader, or columns the reader does not read.
        ImportError: TensorFlow is not installed.
    """
    import tensorflow as tf

    if not isinstance(reader, Reader):
        raise ConfigError(f"make_tf_dataset needs a hora.store Reader, got {type(reader).__name__}")
    specs = reader.specs
    wanted = [*(x_cols or ()), *(y_cols or ()), *([sample_weight_col] if sample_weight_col else [])]
    unknown = [c for c in wanted if c not in specs]
    if unknown:
        raise ConfigError(f"columns {unknown} are not read by this reader; it reads {list(specs)}")
    if y_cols and not x_cols:
        raise ConfigError("y_cols needs x_cols")
    signature = {c: tf.TensorSpec(shape=(None, *s.shape), dtype=tf.as_dtype(s.dtype)) for c, s in specs.items()}
    ds = tf.data.Dataset.from_generator(lambda: iter(reader), output_signature=signature)
    ds = ds.apply(tf.data.experimental.assert_cardinality(len(reader)))
    if not x_cols:
        return ds

    def pick(cols: Sequence[str], batch: dict) -> Any:
        return batch[cols[0]] if len(cols) == 1 else {c: batch[c] for c in cols}

    x_cols, y_list = list(x_cols), list(y_cols or ())

    def to_tuple(batch: dict) -> Any:
        parts = [pick(x_cols, batch)]
        if y_list:
            parts.append(pick(y_list, batch))
        if sample_weight_col:
            parts.append(batch[sample_weight_col])
        return parts[0] if len(parts) == 1 else tuple(parts)

    return ds.map(to_tuple)


__all__ = ["make_tf_dataset"]
