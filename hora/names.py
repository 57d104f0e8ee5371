"""Names hora gives to runs: the one rule, shared by the launchers and the Store.

A run id names the run's folder in a Store (``<store>/runs/<run_id>/``), its Spark job
tag (``hora-train-<run_id>``) and its keys on the driver service, so the launchers
(:mod:`hora.runners`), the estimators and the Store's layout (:mod:`hora.store.layout`)
all check it here. This module imports nothing but :mod:`hora.errors`, so the Store
never pulls in the launchers (or an ML framework) to check one.
"""

from __future__ import annotations

import re
import secrets
import time

from hora.errors import ConfigError

RUN_ID_MAX = 128
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,%d}$" % (RUN_ID_MAX - 1))


def new_run_id() -> str:
    """A fresh run id: ``hora-<UTC timestamp>-<random hex>``."""
    return time.strftime("hora-%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a valid run id (it names folders, job tags and task keys).

    Raises:
        ConfigError: not 1-128 characters of letters, digits, ``.``, ``_``, ``=``, ``-``
            starting with a letter or digit (or it holds ``..``).
    """
    if not isinstance(run_id, str) or not _RUN_ID_RE.match(run_id) or ".." in run_id:
        raise ConfigError(
            f"run_id {run_id!r} is invalid: use 1-{RUN_ID_MAX} characters of letters, digits, '.', '_', '=', '-' "
            "starting with a letter or digit"
        )
    return run_id


__all__ = ["check_run_id", "new_run_id", "RUN_ID_MAX"]
