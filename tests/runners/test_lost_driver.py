"""A lost driver: the process that called ``fit`` is SIGKILLed mid-training, after its first
checkpoint, on a Dask cluster started from the command line (``dask scheduler`` and two
``dask worker`` processes), on a Spark standalone cluster and on a Ray cluster started with
``ray start`` (``hora run`` on ssh hosts: tests/ssh/test_ssh_launch.py). Every rank exits within
HORA_HEARTBEAT_TIMEOUT plus a few seconds, the workers stay up, and a fit with the same
``run_id`` resumes from the last checkpoint (every epoch in its history once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from benchmarks._common import free_port
from benchmarks._common.processes import ranks_under

pytestmark = [pytest.mark.timeout(300)]

HEARTBEAT_TIMEOUT = 6

# a model slow enough (20 ms a batch) for the test to kill its driver mid-fit; the scripts log
# core's INFO (the resume line) and print the epochs of the fitted model's history
COMMON = r'''
import json, logging, sys, numpy as np, pandas as pd, torch
from hora.store import Store

class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def forward(self, x):
        import time
        time.sleep(0.02)
        return self.lin(x)

logging.basicConfig(level=logging.WARNING)
logging.getLogger("hora.estimators.driver.fit").setLevel(logging.INFO)
'''

FIT = COMMON + r'''
import dask.dataframe as dd
from distributed import Client
from hora.dask import TorchEstimator

if __name__ == "__main__":
    client = Client(sys.argv[1])
    x = np.random.default_rng(0).normal(size=(2000, 4)).astype("float32")
    pdf = pd.DataFrame({"features": list(x), "y": x.sum(axis=1)})
    net = Slow()
    est = TorchEstimator(num_proc=2, store=Store.create(sys.argv[2]), model=net, run_id="lost-driver-dask",
                         optimizer=torch.optim.SGD(net.parameters(), 0.01), loss=torch.nn.MSELoss(),
                         feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=int(sys.argv[3]),
                         verbose=0)
    model = est.fit(dd.from_pandas(pdf, npartitions=2))
    print("HISTORY=" + json.dumps([h["epoch"] for h in model.history_]), flush=True)
'''


def _kill_driver_and_wait_for(fit: subprocess.Popen, ranks: list[psutil.Process]) -> float:
    """SIGKILL the process that called fit; every rank process must end within HORA_HEARTBEAT_TIMEOUT + 20 s.
    Returns the (monotonic) time of the kill."""
    fit.send_signal(signal.SIGKILL)
    fit.wait()
    killed_at = time.monotonic()
    gone, alive = psutil.wait_procs(ranks, timeout=HEARTBEAT_TIMEOUT + 20)
    assert not alive, f"rank processes still running {time.monotonic() - killed_at:.0f} s after the driver died: " \
                      f"{[p.pid for p in alive]}"
    return killed_at


def _assert_dask_threads_free(address: str, workers: list[int], killed_at: float, run_id: str) -> None:
    """Each (1-thread) Dask worker runs a new task within HORA_HEARTBEAT_TIMEOUT + 20 s of the
    driver's death: the rank supervisor's task ended and gave its thread back (it held it for a
    minute, its log pusher retrying the dead driver, and the refit's first compute waited); and
    no task of ``run_id`` runs on a worker any more (the refit's tasks get the same keys)."""
    from distributed import Client, wait

    with Client(address, timeout=30) as client:
        addrs = list(client.scheduler_info(n_workers=-1)["workers"])
        futures = [client.submit(os.getpid, workers=[a], allow_other_workers=False, pure=False) for a in addrs]
        try:
            wait(futures, timeout=max(1.0, killed_at + HEARTBEAT_TIMEOUT + 20 - time.monotonic()))
        except TimeoutError:
            held = [a for a, f in zip(addrs, futures) if f.status != "finished"]
            pytest.fail(f"the thread of Dask worker(s) {held} still held {time.monotonic() - killed_at:.0f} s after "
                        "the driver died")
        assert len(addrs) == len(workers) and len({f.result() for f in futures}) == len(workers)  # each worker ran one

        def executing(dask_worker) -> list[str]:
            """The keys of the tasks that hold a thread of this Dask worker now. Defined here, so that it
            travels by value: the workers, started from the command line, cannot import ``tests``."""
            with dask_worker.active_threads_lock:
                return [str(k) for k in dask_worker.active_threads.values()]

        held = [k for keys in client.run(executing).values() for k in keys if k.startswith(f"hora-{run_id}-")]
        assert not held, f"the killed fit's rank tasks {held} still hold a worker's thread"


@pytest.mark.timeout(60)
def test_a_supervisors_log_pusher_gives_up_on_a_dead_driver_in_seconds_and_keeps_its_lines():
    # the unit behind the Dask test's free threads: a push to a driver that is not there gives up
    # within the pusher's timeout, never holds the supervisor's own connection (whose close() the
    # task's end waits for), and the lines it could not push reach a driver that answers again, in order
    import pickle

    from hora.native import keys
    from hora.native.rendezvous import KVClient, RendezvousServer
    from hora.runners.rank.supervise import _LogPusher

    secret, port = b"k" * 32, free_port()
    client = KVClient(f"127.0.0.1:{port}", secret)  # nothing listens there yet
    pusher = _LogPusher(client, rank=3, timeout=1.0)
    server = None
    try:
        pusher.add(3, "stdout", "first")
        start = time.monotonic()
        assert pusher.flush() is False
        assert time.monotonic() - start < 5  # two 1 s tries at most (its thread's, then this one), not 60 s
        start = time.monotonic()
        client.close()  # the pusher's thread is retrying meanwhile, on a connection of its own
        assert time.monotonic() - start < 1
        server = RendezvousServer(secret, port=port)
        server.start()
        pusher.add(3, "stderr", "second")
        pusher.close()
        found = sorted(server.keys(f"{keys.LOG}3/"))
        assert found == [keys.log_key(3, i) for i in range(len(found))]
        lines = [line for value in server.wait(found, 5) for line in pickle.loads(value)]
        assert lines == [("stdout", "first"), ("stderr", "second")]
    finally:
        pusher.close(flush=False)
        if server is not None:
            server.stop()


#: epochs the refit trains after the last checkpoint: one proves it resumes and continues
REFIT_EPOCHS = 1


def _assert_refit_resumes(argv: list[str], env: dict, cwd, total: int, timeout: float) -> None:
    """The fit script run again with the same run_id for ``total`` epochs resumes from the last
    checkpoint and its history has every epoch once (the checkpointed ones and the rest)."""
    refit = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert refit.returncode == 0, refit.stderr[-3000:]
    assert "fit resumes from the last one" in refit.stderr, refit.stderr[-3000:]
    history = json.loads(refit.stdout.split("HISTORY=", 1)[1].splitlines()[0])
    assert history == list(range(total)), history


@pytest.mark.dask
def test_ranks_exit_when_the_fit_process_is_killed_and_a_refit_resumes(tmp_path):
    from hora.store import Store

    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
               HORA_HEARTBEAT_TIMEOUT=str(HEARTBEAT_TIMEOUT))
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([os.path.join(bindir, "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", ":0"], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for i in range(2):
            procs.append(subprocess.Popen([os.path.join(bindir, "dask"), "worker", address, "--nthreads", "1",
                                           "--nworkers", "1", "--no-dashboard", "--local-directory",
                                           str(tmp_path / f"w{i}")], env=env, cwd=tmp_path,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        script = tmp_path / "fit.py"
        script.write_text(textwrap.dedent(FIT))
        store_url = f"file://{tmp_path / 'store'}"
        store = Store.create(store_url)
        fit = subprocess.Popen([sys.executable, str(script), address, store_url, "40"], env=env,
                               cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        workers = [p.pid for p in procs[1:]]
        deadline = time.monotonic() + 150
        while len(ranks_under(workers)) < 2 or not store.list_checkpoints("lost-driver-dask"):
            assert fit.poll() is None, fit.stderr.read().decode()[-3000:]  # training, one checkpoint written
            assert time.monotonic() < deadline, "the ranks never started or never wrote a checkpoint"
            time.sleep(0.5)
        ranks = ranks_under(workers)
        killed_at = _kill_driver_and_wait_for(fit, ranks)
        assert all(p.poll() is None for p in procs), "a Dask worker or the scheduler went down with the driver"
        _assert_dask_threads_free(address, workers, killed_at, "lost-driver-dask")

        total = store.latest_checkpoint("lost-driver-dask")[0] + 1 + REFIT_EPOCHS  # the same run_id resumes
        _assert_refit_resumes([sys.executable, str(script), address, store_url, str(total)], env, tmp_path, total,
                              timeout=150)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        for leftover in ranks_under([p.pid for p in procs]):
            leftover.kill()


SPARK_FIT = COMMON + r'''
from pyspark.sql import SparkSession
from hora.spark import TorchEstimator

master, store, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
spark = (SparkSession.builder.master(master).appName("hora-lost-driver")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.enabled", "false").config("spark.executor.memory", "768m").getOrCreate())
x = np.random.default_rng(0).normal(size=(2000, 4)).astype("float32")
df = spark.createDataFrame(pd.DataFrame({"features": [list(map(float, r)) for r in x], "y": x.sum(axis=1)}))
net = Slow()
est = TorchEstimator(num_proc=2, store=Store.create(store), model=net, run_id="lost-driver-spark",
                     optimizer=torch.optim.SGD(net.parameters(), 0.01), loss=torch.nn.MSELoss(),
                     feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=epochs, verbose=0)
model = est.fit(df)
print("HISTORY=" + json.dumps([h["epoch"] for h in model.history_]), flush=True)
spark.stop()
'''


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_spark_standalone_ranks_exit_when_the_fit_process_is_killed_and_a_refit_resumes(tmp_path):
    # a cluster of its own: the session's standalone cluster has its cores held by the Connect server's app;
    # one 2-core worker (both ranks in its one executor): two JVMs and one executor per app fewer than two workers
    from benchmarks._common.spark import StandaloneCluster

    cluster = StandaloneCluster(tmp_path / "cluster", worker_hosts=("127.0.0.1",)).start()
    try:
        _spark_lost_driver(cluster, tmp_path)
    finally:
        cluster.stop()


def _spark_lost_driver(standalone_cluster, tmp_path) -> None:
    from hora.store import Store

    env = dict(os.environ, HORA_HEARTBEAT_TIMEOUT=str(HEARTBEAT_TIMEOUT), PYSPARK_PYTHON=sys.executable)
    script = tmp_path / "fit.py"
    script.write_text(SPARK_FIT)
    store_url = f"file://{tmp_path / 'store'}"
    workers = [w.proc.pid for w in standalone_cluster.workers]
    fit = subprocess.Popen([sys.executable, str(script), standalone_cluster.url, store_url, "40"], env=env,
                           cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    store = Store.create(store_url)
    try:
        deadline = time.monotonic() + 240
        while len(ranks_under(workers)) < 2 or not store.list_checkpoints("lost-driver-spark"):
            assert fit.poll() is None, fit.stderr.read().decode()[-3000:]  # training, one checkpoint written
            assert time.monotonic() < deadline, "the ranks never started or never wrote a checkpoint"
            time.sleep(0.5)
        ranks = ranks_under(workers)
        _kill_driver_and_wait_for(fit, ranks)
        assert all(w.proc.poll() is None for w in standalone_cluster.workers), "a Spark worker went down with the driver"
    finally:
        if fit.poll() is None:
            fit.kill()
            fit.wait()
    done = store.latest_checkpoint("lost-driver-spark")[0]  # the last epoch checkpointed before the kill
    total = done + 1 + REFIT_EPOCHS
    _assert_refit_resumes([sys.executable, str(script), standalone_cluster.url, store_url, str(total)], env, tmp_path,
                          total, timeout=300)


RAY_FIT = COMMON + r'''
import os
import ray
from hora.dask import TorchEstimator
from hora.estimators.callbacks import Callback

class RankPid(Callback):  # every rank's process id, for the test to watch (defined here: pickled by value)
    def __init__(self, folder):
        self.folder = folder
    def on_epoch_begin(self, ctx, epoch):
        with open(os.path.join(self.folder, f"rank.{ctx.rank}"), "w") as fh:
            fh.write(str(os.getpid()))

address, store, epochs, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ray.init(address=address, logging_level=logging.WARNING, configure_logging=False)
x = np.random.default_rng(0).normal(size=(2000, 4)).astype("float32")
pdf = pd.DataFrame({"features": list(x), "y": x.sum(axis=1)})
net = Slow()
est = TorchEstimator(num_proc=2, store=Store.create(store), model=net, run_id="lost-driver-ray", backend="ray",
                     optimizer=torch.optim.SGD(net.parameters(), 0.01), loss=torch.nn.MSELoss(),
                     feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=epochs, verbose=0,
                     callbacks=[RankPid(folder)])
model = est.fit(pdf)
print("HISTORY=" + json.dumps([h["epoch"] for h in model.history_]), flush=True)
'''


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_ray_ranks_exit_when_the_fit_process_is_killed_and_a_refit_resumes(tmp_path):
    # a Ray cluster started from the command line (its own processes, as a user's would be); the
    # driver connects to it, is SIGKILLed mid-fit; the ranks (Ray actors) end, the cluster stays up
    # with its CPUs free again, and a refit with the same run_id resumes
    pytest.importorskip("ray", reason="needs the hora[ray] extra")
    import tempfile

    from hora.store import Store

    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
               HORA_HEARTBEAT_TIMEOUT=str(HEARTBEAT_TIMEOUT), RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_MODE="disabled")  # `ray start` turns token auth on and writes ~/.ray/auth_token
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="hora-rayl-")  # short: Ray's socket paths live below it
    head = subprocess.Popen([os.path.join(bindir, "ray"), "start", "--head", "--block", "--port", str(port),
                             "--node-ip-address", "127.0.0.1", "--num-cpus", "2", "--include-dashboard", "false",
                             "--disable-usage-stats", "--temp-dir", temp_dir], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"127.0.0.1:{port}"
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "fit.py"
    script.write_text(RAY_FIT)
    store_url = f"file://{tmp_path / 'store'}"
    store = Store.create(store_url)
    cluster: list[psutil.Process] = []
    try:
        fit = subprocess.Popen([sys.executable, str(script), address, store_url, "40", str(pids)], env=env,
                               cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 240
            while len(list(pids.iterdir())) < 2 or not store.list_checkpoints("lost-driver-ray"):
                assert fit.poll() is None, fit.stderr.read().decode()[-3000:]  # training, one checkpoint written
                assert time.monotonic() < deadline, "the ranks never started or never wrote a checkpoint"
                time.sleep(0.5)
            cluster = [head, *psutil.Process(head.pid).children(recursive=True)]
            time.sleep(0.3)
            ranks = [psutil.Process(int(p.read_text())) for p in pids.iterdir()]
            _kill_driver_and_wait_for(fit, ranks)
            assert head.poll() is None, "the Ray cluster went down with the driver"
        finally:
            if fit.poll() is None:
                fit.kill()
                fit.wait()
        total = store.latest_checkpoint("lost-driver-ray")[0] + 1 + REFIT_EPOCHS  # the CPUs are free: a refit resumes
        _assert_refit_resumes([sys.executable, str(script), address, store_url, str(total), str(pids)], env, tmp_path,
                              total, timeout=240)
    finally:
        if not cluster:
            try:
                cluster = [head, *psutil.Process(head.pid).children(recursive=True)]
            except psutil.Error:
                cluster = []
        head.terminate()  # --block: the CLI stops the processes it started
        gone, alive = psutil.wait_procs(cluster, timeout=30)
        for p in alive:
            p.kill()
        import shutil

        shutil.rmtree(temp_dir, ignore_errors=True)
