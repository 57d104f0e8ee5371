"""Fault injection from outside the library: ranks that never start.

A test puts this folder first on ``PYTHONPATH`` and names the ranks in
``HANG_AT_START_RANKS`` (a comma list); every rank process it starts then imports this
module at interpreter start. The hook wraps ``hora.runners.rank.main.run_rank`` when that
module is imported: a listed rank sleeps instead of running (it never registers with the
driver, so the monitor names it), until the launcher stops it or ``HANG_AT_START_SECONDS``
(default 300) pass.
"""

import importlib.abc
import importlib.machinery
import os
import sys
import time

TARGET = "hora.runners.rank.main"


class _WrappingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # get_code, is_package, ...: runpy's ``-m`` reads the module through them
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        real = module.run_rank
        ranks = {r.strip() for r in os.environ.get("HANG_AT_START_RANKS", "").split(",") if r.strip()}

        def run_rank(spec, ctx, result_path):
            if ctx is not None and str(ctx.rank) in ranks:
                time.sleep(float(os.environ.get("HANG_AT_START_SECONDS", "300")))
                return 1
            return real(spec, ctx, result_path)

        module.run_rank = run_rank


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _WrappingLoader(spec.loader)
        return spec


if os.environ.get("HANG_AT_START_RANKS"):
    sys.meta_path.insert(0, _Finder())
