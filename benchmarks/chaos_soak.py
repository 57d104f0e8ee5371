"""Faults in series: one long fit per scenario while a seeded chaos
thread SIGKILLs the job's processes from outside, one after another.

Run: ``.venv/bin/python benchmarks/chaos_soak.py [--scenarios dask,spark,ssh] [--faults 10] [--epochs 30]``
(``--kinds supervisor,executor`` kills only those kinds of target; ``--timeline`` prints, per fault,
the driver's log lines after the kill and when the next attempt's ranks began training and
stepped: where the seconds of a fault go).

Scenarios (each on clusters it starts and stops itself):

* ``dask``: a ``LocalCluster`` of two worker processes under nannies; the chaos thread kills
  ranks (``hora.runners.rank.main`` processes) and their supervisors (the Dask worker process
  that runs the rank's task: its nanny starts a new one). Dask's own floor under such a fault,
  printed beside: from the kill until the nanny's new worker has registered with the scheduler.
* ``ssh``: ``hora run -H`` hosts, 127.0.0.1 (ranks started directly) and 127.0.0.2 (over ssh,
  to a throwaway OpenSSH server on a free port); the chaos thread kills ranks and the second
  host's rank supervisor (the process ssh started). Needs ``sshd`` (``make system-deps``).
* ``spark``: a Spark standalone cluster (a master and two 2-core workers on 127.0.0.1 and
  127.0.0.2) driven by a classic SparkSession; the chaos thread kills ranks, their
  supervisors (the Spark task's Python worker) and executor JVMs (the master starts new
  executors).

Each scenario runs the same fit three times: all ``--epochs`` without faults (the baseline;
it materializes the data the others reuse), one epoch without faults (the job's cold start:
launch, data reuse, an epoch, the model back; the median of ``--cold-runs`` such fits, 3 by default), and all ``--epochs`` with ``--faults`` kills (``checkpoint_every="2 steps"``,
``max_failures`` one more than the faults). The chaos thread waits for rank processes it
has not seen before (a relaunch's), lets them run a seeded 0.2-4 s, and kills one target of a
seeded kind; short waits land in a relaunch's start or restore, and with a checkpoint every
two steps many land during a checkpoint write (random, not aimed). Rank 0 logs the time and
its ``(epoch, step)`` after every batch: the time a fault cost is from the kill until the fit
is past the step it had reached when killed.

Prints, per scenario: faults injected | survived | epochs lost | duplicated epochs | orphan
processes | time lost per fault (median / max) | cold start | median lost / cold start, and
the three fits' seconds; for ``dask``, Dask's own floor per worker fault and the time lost
against it. Needs ``make install`` (the dask and spark extras) and Java for Spark.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

from hora.estimators.callbacks import Callback  # noqa: E402
from _common.processes import hora_worker_processes, rank_processes_in  # noqa: E402

TARGETS = {"dask": ("rank", "supervisor"), "spark": ("rank", "supervisor", "executor"), "ssh": ("rank", "supervisor")}


class Progress(Callback):
    """After every batch: sleep ``seconds`` (paces the fit so faults land mid-training); rank 0
    appends ``time attempt epoch step`` to ``path``. At each epoch's start every rank writes
    ``<path>.ranks/<attempt>.<rank>`` = its pid and its supervisor's (a rank forked by a warm
    server shows neither in ``/proc``: its environ there is the server's)."""

    def __init__(self, path: str, seconds: float) -> None:
        self.path, self.seconds = path, seconds

    def on_train_begin(self, ctx):
        with open(self.path + ".starts", "a") as fh:  # one short line per rank start: appends do not interleave
            fh.write(f"{time.time()} {os.environ.get('HORA_ATTEMPT', '1')} {ctx.rank}\n")

    def on_epoch_begin(self, ctx, epoch):
        folder = self.path + ".ranks"
        os.makedirs(folder, exist_ok=True)
        name = os.path.join(folder, f"{os.environ.get('HORA_ATTEMPT', '1')}.{ctx.rank}")
        with open(name + ".tmp", "w") as fh:
            fh.write(f"{os.getpid()} {os.environ.get('HORA_SUPERVISOR_PID', '')}")
        os.replace(name + ".tmp", name)

    def on_batch_end(self, ctx, step, logs):
        time.sleep(self.seconds)
        if ctx.rank == 0:
            with open(self.path, "a") as fh:
                fh.write(f"{time.time()} {os.environ.get('HORA_ATTEMPT', '1')} {ctx.epoch} {step}\n")


def _ranks(log_path: str) -> dict[int, dict[int, tuple[int, int | None]]]:
    """``{attempt: {rank: (pid, supervisor pid)}}`` as the ranks wrote them (see :class:`Progress`)."""
    out: dict[int, dict[int, tuple[int, int | None]]] = {}
    folder = log_path + ".ranks"
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.endswith(".tmp"):
            continue
        attempt, rank = (int(v) for v in name.split("."))
        pid, _, sup = Path(folder, name).read_text().partition(" ")
        out.setdefault(attempt, {})[rank] = (int(pid), int(sup) if sup.strip() else None)
    return out


def _executor(pid: int | None) -> psutil.Process | None:
    proc = psutil.Process(pid) if pid else None
    while proc is not None and "CoarseGrainedExecutorBackend" not in " ".join(proc.cmdline()):
        proc = proc.parent()
    return proc


def chaos(log_path: str, kinds: tuple[str, ...], faults: int, num_proc: int, rng: random.Random,
          stop: threading.Event, injected: list[tuple[str, int, float, int]]) -> None:
    """Kill ``faults`` targets of the run, one per attempt (see the module doc)."""
    done: set[int] = set()
    while len(injected) < faults and not stop.is_set():
        ranks = _ranks(log_path)
        attempt = max(ranks, default=0)
        if attempt in done or len(ranks.get(attempt, {})) < num_proc:
            time.sleep(0.05)
            continue
        if stop.wait(rng.uniform(0.2, 4.0)):
            return
        kind = rng.choice(kinds)
        pid, sup = ranks[attempt][rng.randrange(num_proc)]
        try:
            if sup is None:  # ssh hosts: a remote rank's supervisor is its parent, the process ssh started
                parent = psutil.Process(pid).parent()
                sup = parent.pid if parent is not None and "hora.runners.rank.remote" in " ".join(
                    parent.cmdline()) else None
            if kind != "rank" and sup is None:
                continue
            victim = psutil.Process(pid) if kind == "rank" else psutil.Process(sup) if kind == "supervisor" \
                else _executor(sup)
            if victim is None or not victim.is_running():
                continue
            if victim.pid in {os.getpid(), *(p.pid for p in psutil.Process().parents())}:
                continue  # a rank this process supervises itself (ssh hosts: the first host's)
            at = time.time()
            os.kill(victim.pid, signal.SIGKILL)
            injected.append((kind, victim.pid, at, attempt))
            done.add(attempt)
        except (psutil.Error, ProcessLookupError, ValueError, TypeError):
            continue


class WorkerWatch(threading.Thread):
    """Dask's own floor under a worker fault: polls the scheduler's workers (every 0.1 s) so that,
    per fault, the seconds from the kill until a worker that was not there at the kill (the one the
    nanny started in place of the killed one) had registered can be read (:meth:`replaced_after`)."""

    def __init__(self, client: Any, stop: threading.Event) -> None:
        super().__init__(name="soak-worker-watch", daemon=True)
        self.client, self.stop = client, stop
        self.seen: list[tuple[float, frozenset[str]]] = []

    def run(self) -> None:
        from hora.runners.launchers.dask import worker_infos

        while not self.stop.wait(0.1):
            try:
                self.seen.append((time.time(), frozenset(worker_infos(self.client))))
            except Exception:  # noqa: BLE001 - a poll that failed: the next one counts
                continue

    def replaced_after(self, at: float) -> float | None:
        """Seconds from ``at`` until a worker address unknown at ``at`` was first seen."""
        known = set().union(*(w for t, w in self.seen if t <= at))
        return next((t - at for t, w in self.seen if t > at and w - known), None)


def _lost_per_fault(log_path: str, injected: list[tuple[str, int, float, int]]) -> list[float]:
    """Per fault: seconds from the kill until the relaunched attempt's rank 0 logged a step past
    the one the fit had reached at the kill."""
    rows = []
    if os.path.exists(log_path):
        for line in Path(log_path).read_text().splitlines():
            t, attempt, epoch, step = line.split()
            rows.append((float(t), int(attempt), (int(epoch), int(step))))
    out = []
    for _, _, at, attempt in injected:
        before = [pos for t, _, pos in rows if t <= at]
        reached = max(before) if before else (-1, -1)
        after = [t for t, a, pos in rows if t > at and a > attempt and pos > reached]
        if after:
            out.append(min(after) - at)
    return out


class Timeline(logging.Handler):
    """hora's driver-side log records (time, logger, message) of the chaos fit, for ``--timeline``."""

    WATCHED = ("hora.runners.driver", "hora.runners.launchers", "hora.runners.api")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[tuple[float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING or record.name.startswith(self.WATCHED):
            self.events.append((record.created, record.name.rpartition(".")[2], record.getMessage()[:160]))


def _timeline(log_path: str, injected: list[tuple[str, int, float, int]], events: list[tuple[float, str, str]]) -> None:
    """Per fault, seconds after the kill: the driver's log lines, the next attempt's ranks
    beginning to train (after their restore) and its first step."""
    starts: dict[int, list[float]] = {}
    if os.path.exists(log_path + ".starts"):
        for line in Path(log_path + ".starts").read_text().splitlines():
            t, attempt, _ = line.split()
            starts.setdefault(int(attempt), []).append(float(t))
    steps: dict[int, float] = {}
    if os.path.exists(log_path):
        for line in Path(log_path).read_text().splitlines():
            t, attempt, *_ = line.split()
            steps.setdefault(int(attempt), float(t))
    for kind, pid, at, attempt in injected:
        nxt = attempt + 1
        end = steps.get(nxt, at + 120)
        print(f"\n## fault: {kind} pid {pid}, attempt {attempt}")
        for t, name, message in events:
            if at <= t <= end:
                print(f"  +{t - at:6.2f} {name}: {message}")
        if starts.get(nxt):
            print(f"  +{min(starts[nxt]) - at:6.2f} first rank of attempt {nxt} begins training "
                  f"(all: +{max(starts[nxt]) - at:.2f})")
        if nxt in steps:
            print(f"  +{steps[nxt] - at:6.2f} attempt {nxt}: first step")


def _frame(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8)).astype("float32")
    return pd.DataFrame({"features": list(x), "y": (x @ np.linspace(-1, 1, 8)).astype("float32")})


def _fit(face: Any, backend: Any, df: Any, store: Any, run_id: str, epochs: int, log_path: str,
         max_failures: int, pace: float) -> tuple[Any, float]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    est = face.TorchEstimator(
        num_proc=2, **({"backend": backend} if backend is not None else {}), store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
        loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=epochs,
        random_seed=0, verbose=0, max_failures=max_failures, checkpoint_every="2 steps", run_id=run_id,
        start_timeout=240, callbacks=[Progress(log_path, pace)])
    start = time.monotonic()
    model = est.fit(df)
    return model, time.monotonic() - start


def _history(model: Any) -> list[dict]:
    return model.getHistory() if hasattr(model, "getHistory") else model.history_


def _orphans(run_id: str, cwd: Path | None) -> list[int]:
    """The job's rank processes still alive: named by ``run_id`` on their command line (Dask,
    Spark), or any hora rank process started in the folder ``cwd`` (ssh hosts)."""
    found = {p.pid for p in hora_worker_processes(run_id)}
    if cwd is not None:
        found.update(p.pid for p in rank_processes_in(str(cwd)))
    return sorted(found)


def scenario(name: str, face: Any, backend: Any, df: Any, work: Path, args: argparse.Namespace,
             cwd: Path | None = None) -> dict:
    from hora.store import Store

    store = Store.create(str(work / f"store-{name}"))
    # the baseline first: it materializes the data, which the other two fits then reuse
    _, base = _fit(face, backend, df, store, f"{name}-base", args.epochs, str(work / f"{name}-base.log"), 0,
                   args.pace)
    # the cold start: the median of --cold-runs one-epoch fits (one moved 2.2-2.8 s between runs on a quiet
    # host, and the ratio with it)
    colds = [_fit(face, backend, df, store, f"{name}-cold{i}", 1, str(work / f"{name}-cold{i}.log"), 0, args.pace)[1]
             for i in range(args.cold_runs)]
    cold = statistics.median(colds)
    run_id, log_path = f"{name}-chaos", str(work / f"{name}-chaos.log")
    injected: list[tuple[str, int, float, int]] = []
    stop = threading.Event()
    kinds = tuple(args.kinds.split(",")) if args.kinds else TARGETS[name]
    thread = threading.Thread(target=chaos, args=(log_path, kinds, args.faults, 2,
                                                  random.Random(args.seed), stop, injected), daemon=True)
    timeline = Timeline() if args.timeline else None
    if timeline is not None:
        hora_log = logging.getLogger("hora")
        hora_log.addHandler(timeline)
        hora_log.setLevel(logging.DEBUG)
    watch = None
    if name == "dask":
        from distributed import get_client

        watch = WorkerWatch(get_client(), stop)
        watch.start()
    thread.start()
    survived, error, took, epochs_seen = True, "", 0.0, []
    try:
        model, took = _fit(face, backend, df, store, run_id, args.epochs, log_path, args.faults + 1, args.pace)
        epochs_seen = [h["epoch"] for h in _history(model)]
    except Exception as exc:  # the figure says it did not survive, and why
        survived, error = False, f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        stop.set()
        thread.join(timeout=30)
        if watch is not None:
            watch.join(timeout=30)
        if timeline is not None:
            logging.getLogger("hora").removeHandler(timeline)
            logging.getLogger("hora").setLevel(logging.NOTSET)
    deadline = time.monotonic() + 30
    while _orphans(run_id, cwd) and time.monotonic() < deadline:
        time.sleep(0.5)
    lost = _lost_per_fault(log_path, injected)
    if timeline is not None:
        _timeline(log_path, injected, timeline.events)
    floor = [] if watch is None else [watch.replaced_after(at) for kind, _, at, _ in injected if kind == "supervisor"]
    return {
        "floor": [f for f in floor if f is not None],
        "scenario": name, "injected": len(injected), "kinds": [k for k, *_ in injected],
        "survived": len(injected) if survived else 0, "error": error,
        "epochs_lost": len(set(range(args.epochs)) - set(epochs_seen)) if survived else None,
        "duplicated": len(epochs_seen) - len(set(epochs_seen)) if survived else None,
        "orphans": len(_orphans(run_id, cwd)), "lost": lost, "cold": cold, "colds": colds, "base": base, "chaos": took,
    }


def _dask(work: Path, args: argparse.Namespace) -> dict:
    import dask
    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    import hora.dask as face

    # A LocalCluster closes a worker's nanny for good when no worker of that name is back
    # `distributed.deploy.lost-worker-timeout` (15 s) after a removal, and the check of one removal
    # also fires during a later restart of the same name: the third kill of a worker in ~15 s
    # left the cluster with one worker (a soak failure that was the harness's, not hora's).
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                         local_directory=str(work / "dask")) as cluster, Client(cluster):
        with dask.config.set({"dataframe.convert-string": False}):
            df = dd.from_pandas(_frame(args.rows), npartitions=2)
        return scenario("dask", face, None, df, work, args)  # the default client: this cluster's


def spark_session(cluster: Any, app: str) -> Any:
    """A classic SparkSession on ``cluster`` (a ``_common.spark.StandaloneCluster``), as the
    soak's and the Spark benchmarks that share its cluster use it."""
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master(cluster.url).appName(app)
            .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false").config("spark.executor.memory", "768m").getOrCreate())


def _spark(work: Path, args: argparse.Namespace) -> dict:
    import hora.runners as hr
    import hora.spark as face
    from _common.spark import StandaloneCluster

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    cluster = StandaloneCluster(work / "spark").start()
    try:
        spark = spark_session(cluster, "hora-chaos-soak")
        try:
            pdf = _frame(args.rows)
            df = spark.createDataFrame(pdf.assign(features=[r.tolist() for r in pdf["features"]]))
            return scenario("spark", face, hr.SparkLauncher(spark, task_cpus=2), df, work, args)
        finally:
            spark.stop()
    finally:
        cluster.stop()


def _ssh(work: Path, args: argparse.Namespace) -> dict:
    import hora.dask as face
    from hora.runners import HostsLauncher
    from hora.runners.rank.ssh import SshOptions
    from _common.sshd import running_sshd

    (work / "sshd").mkdir()
    with running_sshd(work / "sshd") as sshd:
        os.environ.update(sshd.env)
        launcher = HostsLauncher("127.0.0.1:1,127.0.0.2:1", ssh=SshOptions(port=sshd.port, identity_file=sshd.key))
        here = os.getcwd()
        os.chdir(work)  # the ranks start here on both hosts: how their leftovers are found
        try:
            return scenario("ssh", face, launcher, _frame(args.rows), work, args, cwd=work)
        finally:
            os.chdir(here)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="dask,spark,ssh")
    ap.add_argument("--faults", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--pace", type=float, default=0.1, help="seconds each rank sleeps after a batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cold-runs", type=int, default=3, help="one-epoch fits whose median is the cold start")
    ap.add_argument("--kinds", default="", help="kill only these kinds of target (comma-separated: rank, "
                    "supervisor, executor; default: every kind the scenario has)")
    ap.add_argument("--timeline", action="store_true",
                    help="print, per fault, the driver's log lines and the relaunch's milestones after the kill")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for handler in logging.getLogger().handlers:  # --timeline's DEBUG records are for the timeline, not stderr
        handler.setLevel(logging.WARNING)
    results = []
    with tempfile.TemporaryDirectory(prefix="hora-soak-") as tmp:
        for name in args.scenarios.split(","):
            work = Path(tmp) / name
            work.mkdir()
            results.append({"dask": _dask, "spark": _spark, "ssh": _ssh}[name](work, args))
            print(f"# {results[-1]}", flush=True)
    print(f"\n# {os.cpu_count()} CPUs, load {' / '.join(f'{v:.1f}' for v in os.getloadavg())}; "
          f"{args.epochs} epochs, {args.faults} faults, seed {args.seed}")
    print("| scenario | faults injected | survived | epochs lost | duplicated epochs | orphan processes | "
          "time lost per fault, median / max (s) | cold start (s) | median / cold start | fits: cold / base / chaos (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        lost = r["lost"]
        med = statistics.median(lost) if lost else float("nan")
        kinds = ", ".join(f"{k} {r['kinds'].count(k)}" for k in dict.fromkeys(r["kinds"]))
        print(f"| {r['scenario']} | {r['injected']} ({kinds}) | {r['survived']} | {r['epochs_lost']} | "
              f"{r['duplicated']} | {r['orphans']} | {med:.1f} / {max(lost, default=float('nan')):.1f} | "
              f"{r['cold']:.1f} | {med / r['cold']:.2f} | {r['cold']:.1f} / {r['base']:.1f} / {r['chaos']:.1f} |")
    for r in results:
        by_kind = {k: sorted(t for kk, t in zip(r["kinds"], r["lost"]) if kk == k) for k in dict.fromkeys(r["kinds"])}
        per_kind = ("; ".join(f"{k} {' / '.join(f'{t:.2f}' for t in v)}" for k, v in by_kind.items())
                    if len(r["lost"]) == len(r["kinds"]) else "not all faults' losses were measured")
        print(f"\n{r['scenario']}: cold starts {' / '.join(f'{c:.2f}' for c in r['colds'])} s; lost per kind (s): "
              + per_kind)
        if r.get("floor"):
            lost_sup = [t for k, t in zip(r["kinds"], r["lost"]) if k == "supervisor"] \
                if len(r["lost"]) == len(r["kinds"]) else []
            print(f"{r['scenario']}: Dask's own floor per worker fault (the kill until the nanny's new worker "
                  f"registered, s): {' / '.join(f'{f:.2f}' for f in sorted(r['floor']))}; median "
                  f"{statistics.median(r['floor']):.2f}" + (
                      f"; supervisor faults' median lost / that floor: "
                      f"{statistics.median(lost_sup) / statistics.median(r['floor']):.2f}" if lost_sup else ""))
        if r["error"]:
            print(f"{r['scenario']} failed: {r['error']}")


if __name__ == "__main__":
    main()
