"""Where hora puts things inside a Store: a pure path layout, no I/O.

Every path returned here is an fsspec path (no ``scheme://`` prefix) below the
store root, joined with ``/`` on every filesystem::

    <root>/datasets/<fingerprint>/_metadata.json        dataset sidecar (schema, shapes, files, rows)
    <root>/datasets/<fingerprint>/_COMMITTED            commit marker, written last
    <root>/datasets/<fingerprint>/train/part-*.parquet  training split
    <root>/datasets/<fingerprint>/val/part-*.parquet    validation split
    <root>/datasets/<fingerprint>/_tmp-<token>/...      a materialization in progress
    <root>/datasets/<fingerprint>/_lease-<token>.json   its lease (heartbeat; see hora.store.lease)
    <root>/runs/<run_id>/checkpoints/epoch-000007.ckpt  checkpoints, one per epoch
    <root>/runs/<run_id>/logs/                          logs (e.g. TensorBoard)
    <root>/runs/<run_id>/history.json                   per-epoch metrics
    <root>/runs/<run_id>/model/                         the final model
    <root>/runs/<run_id>/channel/                       reports of ranks that cannot reach the client (while it runs)

Run ids follow the one rule of :func:`hora.names.check_run_id` (as everywhere in hora).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hora.errors import ConfigError
from hora.names import check_run_id

DATASETS = "datasets"
RUNS = "runs"
METADATA_FILE = "_metadata.json"
COMMIT_MARKER = "_COMMITTED"
TMP_PREFIX = "_tmp-"
LEASE_PREFIX = "_lease-"
CHECKPOINT_PREFIX = "epoch-"
CHECKPOINT_SUFFIX = ".ckpt"
SPLITS = ("train", "val")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}$")


def _check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value) or ".." in value:
        raise ConfigError(
            f"invalid {kind} {value!r}: use 1-200 characters of letters, digits, '.', '_', '=', '-' "
            "(no '/', no leading '.' or '_')"
        )
    return value


def join(*parts: str) -> str:
    """Join path parts with ``/``, dropping empty parts and duplicate separators."""
    out = ""
    for part in parts:
        if not part:
            continue
        if not out:
            out = part.rstrip("/") if part != "/" else "/"
        else:
            out = out.rstrip("/") + "/" + part.strip("/")
    return out


@dataclass(frozen=True)
class StoreLayout:
    """The path layout below one store root (a pure object: computes paths, does no I/O).

    Args:
        root: the store root as an fsspec path (``/tmp/hora``, ``bucket/prefix``, ``/x``).
    """

    root: str

    def __post_init__(self) -> None:
        if not isinstance(self.root, str) or not self.root:
            raise ConfigError(f"StoreLayout root must be a non-empty path string, got {self.root!r}")

    # datasets -------------------------------------------------------------------------
    def datasets_dir(self) -> str:
        """The folder holding every materialized dataset."""
        return join(self.root, DATASETS)

    def dataset_dir(self, fingerprint: str) -> str:
        """The folder of the dataset with this fingerprint."""
        return join(self.datasets_dir(), _check_name("fingerprint", fingerprint))

    def split_dir(self, fingerprint: str, split: str) -> str:
        """The folder of one split (``"train"`` or ``"val"``) of a dataset."""
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        return join(self.dataset_dir(fingerprint), split)

    def train_dir(self, fingerprint: str) -> str:
        """The folder of the training split's Parquet files."""
        return self.split_dir(fingerprint, "train")

    def val_dir(self, fingerprint: str) -> str:
        """The folder of the validation split's Parquet files."""
        return self.split_dir(fingerprint, "val")

    def metadata_path(self, fingerprint: str) -> str:
        """The JSON sidecar describing a dataset (columns, shapes, files, rows)."""
        return join(self.dataset_dir(fingerprint), METADATA_FILE)

    def commit_marker(self, fingerprint: str) -> str:
        """The marker written last; a dataset without it is incomplete and never reused."""
        return join(self.dataset_dir(fingerprint), COMMIT_MARKER)

    def tmp_dir(self, fingerprint: str, token: str) -> str:
        """The staging folder of one materialization attempt (``token`` is unique per attempt)."""
        return join(self.dataset_dir(fingerprint), TMP_PREFIX + _check_name("token", token))

    def lease_path(self, fingerprint: str, token: str) -> str:
        """The lease of one materialization attempt (its heartbeat tells others it is alive)."""
        return join(self.dataset_dir(fingerprint), f"{LEASE_PREFIX}{_check_name('token', token)}.json")

    # runs -----------------------------------------------------------------------------
    def runs_dir(self) -> str:
        """The folder holding every training run."""
        return join(self.root, RUNS)

    def run_dir(self, run_id: str) -> str:
        """The folder of one training run."""
        return join(self.runs_dir(), check_run_id(run_id))

    def checkpoint_dir(self, run_id: str) -> str:
        """The folder of a run's per-epoch checkpoints."""
        return join(self.run_dir(run_id), "checkpoints")

    def checkpoint_path(self, run_id: str, epoch: int) -> str:
        """The checkpoint file of one epoch (zero-padded so names sort by epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"checkpoint epoch must be an int >= 0, got {epoch!r}")
        return join(self.checkpoint_dir(run_id), f"{CHECKPOINT_PREFIX}{epoch:06d}{CHECKPOINT_SUFFIX}")

    def channel_dir(self, run_id: str) -> str:
        """The folder through which a run's ranks report to a client they cannot reach (hora.runners.driver.store_channel)."""
        return join(self.run_dir(run_id), "channel")

    def logs_dir(self, run_id: str) -> str:
        """The folder of a run's logs (TensorBoard event files and the like)."""
        return join(self.run_dir(run_id), "logs")

    def history_path(self, run_id: str) -> str:
        """The JSON file of a run's per-epoch metrics."""
        return join(self.run_dir(run_id), "history.json")

    def model_dir(self, run_id: str) -> str:
        """The folder of a run's final model."""
        return join(self.run_dir(run_id), "model")

    @staticmethod
    def parse_checkpoint_epoch(name: str) -> int | None:
        """The epoch of a checkpoint file name (basename or path), or None if it is not one."""
        base = name.rstrip("/").rsplit("/", 1)[-1]
        if not (base.startswith(CHECKPOINT_PREFIX) and base.endswith(CHECKPOINT_SUFFIX)):
            return None
        digits = base[len(CHECKPOINT_PREFIX) : -len(CHECKPOINT_SUFFIX)]
        return int(digits) if digits.isdigit() else None


__all__ = ["StoreLayout", "join", "SPLITS", "METADATA_FILE", "COMMIT_MARKER", "TMP_PREFIX", "LEASE_PREFIX"]
