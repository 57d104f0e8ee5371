"""``hora store verify URL``: check every committed file of a Store against its recorded checksum.

:func:`verify_store` reads each committed dataset's files and each run's checkpoints (and
the shards of its distributed checkpoints) once, whole, and reports what is damaged: a
file missing, truncated, or whose bytes changed after its commit; a dataset whose metadata
no longer matches its commit marker. Files committed before hora recorded checksums are
counted as unverified, not damaged. The CLI prints the report (``hora.cli``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import re
from dataclasses import dataclass, field

from hora.errors import DataError, StoreError
from hora.store import integrity
from hora.store.dataset import DatasetInfo
from hora.store.layout import COMMIT_MARKER, METADATA_FILE, StoreLayout, join
from hora.store.store import Store

logger = logging.getLogger(__name__)

#: the checksum record of a distributed checkpoint's folder (written by hora.estimators.frameworks.torch.dcp)
DCP_CHECKSUMS = ".hora-checksums.json"
#: a ZeRO optimizer's shard file (hora.torch.sharded_state), with its own checksum record
_ZERO_SHARD = re.compile(r"^shard-\d+-of-\d+\.pt$")


@dataclass
class Damage:
    """One damaged thing: ``where`` (a URL) and ``problem`` (what is wrong with it)."""

    where: str
    problem: str


@dataclass
class VerifyReport:
    """What :func:`verify_store` found.

    Attributes:
        url: the store.
        checked: files whose bytes were checked against a recorded checksum.
        unverified: files read that have no recorded checksum (written before hora recorded them).
        datasets, runs: how many committed datasets and runs were looked at.
        damaged: what is damaged (empty when the store is intact).
    """

    url: str
    checked: int = 0
    unverified: int = 0
    datasets: int = 0
    runs: int = 0
    damaged: list[Damage] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damaged


def _dataset(store: Store, fp_dir: str, report: VerifyReport) -> None:
    fp = posixpath.basename(fp_dir)
    marker_path, meta_path = join(fp_dir, COMMIT_MARKER), join(fp_dir, METADATA_FILE)
    if not store.exists(marker_path):
        return  # not committed (an attempt in progress or interrupted): nothing was promised
    report.datasets += 1
    try:
        marker = json.loads(store.read_bytes(marker_path))
        raw = store.read_bytes(meta_path)
    except (StoreError, ValueError) as exc:
        report.damaged.append(Damage(store.url_for(fp_dir), f"commit marker or metadata unreadable: {exc}"))
        return
    if marker.get("metadata_sha256") != hashlib.sha256(raw).hexdigest():
        report.damaged.append(Damage(store.url_for(meta_path), "does not match its commit marker (changed after "
                                                               "the commit)"))
        return
    try:
        info = DatasetInfo.from_json(raw)
    except StoreError as exc:
        report.damaged.append(Damage(store.url_for(meta_path), str(exc)))
        return
    for split in ("train", "val"):
        for fi in info.split_files(split):
            path = join(fp_dir, fi.path)
            if fi.checksum is None:
                report.unverified += 1
                if not store.exists(path):
                    report.damaged.append(Damage(store.url_for(path), "missing"))
                continue
            _check(store, path, fi.checksum, fi.size, f"Parquet file of dataset {fp}", report)


def _check(store: Store, path: str, checksum: str | None, size: int | None, what: str, report: VerifyReport) -> None:
    try:
        integrity.verify_file(store, path, checksum, size, what)
        report.checked += 1
    except DataError as exc:
        report.damaged.append(Damage(store.url_for(path), str(exc)))


def _run_files(store: Store, run_dir: str, entries: list[str], report: VerifyReport) -> None:
    """Check the checkpoints (and ZeRO shards) among ``entries`` against their checksum records."""
    for entry in entries:
        name = posixpath.basename(entry)
        if StoreLayout.parse_checkpoint_epoch(name) is None and not _ZERO_SHARD.match(name):
            continue
        try:
            integrity.read_checkpoint(store, entry, f"checkpoint of run {posixpath.basename(run_dir)}")
            if store.exists(entry + integrity.CHECKSUM_SUFFIX):
                report.checked += 1
            else:
                report.unverified += 1
        except DataError as exc:
            report.damaged.append(Damage(store.url_for(entry), str(exc)))


def _run(store: Store, run_dir: str, report: VerifyReport) -> None:
    ckpt_dir = join(run_dir, "checkpoints")
    entries = store.listdir(ckpt_dir)
    report.runs += 1
    _run_files(store, run_dir, entries, report)
    for entry in entries:
        if not store.isdir(entry):
            continue
        inside = store.listdir(entry)
        record = join(entry, DCP_CHECKSUMS)
        if record not in inside:
            if any(_ZERO_SHARD.match(posixpath.basename(e)) for e in inside):
                _run_files(store, run_dir, inside, report)  # a ZeRO optimizer's shards, each with its record
            else:
                report.unverified += len(inside)  # a distributed checkpoint written before hora recorded checksums
            continue
        try:
            sums = json.loads(store.read_bytes(record))["files"]
        except (StoreError, ValueError, KeyError, TypeError) as exc:
            report.damaged.append(Damage(store.url_for(record), f"unreadable: {exc}"))
            continue
        for rel, rec in sorted(sums.items()):
            _check(store, join(entry, rel), rec.get("checksum"), rec.get("size"),
                   f"shard of run {posixpath.basename(run_dir)}", report)


def verify_store(store: Store) -> VerifyReport:
    """Check every committed dataset file and every checkpoint of ``store`` against its checksum.

    Raises:
        StoreError: the store cannot be read.
    """
    report = VerifyReport(url=store.url)
    for fp_dir in store.listdir(store.layout.datasets_dir()):
        if store.isdir(fp_dir):
            _dataset(store, fp_dir, report)
    for run_dir in store.listdir(store.layout.runs_dir()):
        if store.isdir(run_dir):
            _run(store, run_dir, report)
    logger.debug("verified %s: %d checked, %d unverified, %d damaged", store.url, report.checked,
                 report.unverified, len(report.damaged))
    return report


__all__ = ["verify_store", "VerifyReport", "Damage", "DCP_CHECKSUMS"]
