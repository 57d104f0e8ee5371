"""The control plane at cluster scale, by simulation: N ranks reporting to one driver.

A real :class:`~hora.runners.driver.service.DriverService` runs in its own process with the
real monitor (:func:`hora.runners.driver.monitor.watch`, as every launcher runs it); N simulated
ranks run as threads in P client processes, each with its own connections, sending what a rank
and its task supervisor send on the launcher named by ``--launcher``:

* ``spark`` (the default): the rank's ``started`` key once, a heartbeat every 0.25 s, the
  abort signal watched by the rank's watchdog and by its task supervisor, metrics every 1 s;
* ``local``: a heartbeat every 1 s, the abort signal watched by the rank, metrics every 1 s.

How the abort is watched and how a heartbeat is sent follows the code under test: polled
(``keys("runner/abort")`` every second, a heartbeat ``add``) where the client has no pushed
abort, else the pushed abort and the one-way beat (metrics riding on it) of
:mod:`hora.runners.rank.beats`; a one-way beat's latency is that of a ping sent after some
beats (about 16 a second per client process) on the same connection, answered after the beat,
in order. So the same file measures the code before the event-driven control plane (run it with that code on
``PYTHONPATH``) and after it, under the same conditions.

Per N it prints: the driver's CPU (of one core) over the window, heartbeat round trip p50/p99,
the wake-up of N ranks waiting on one key (set by the driver once all registered) p50/p99, the
time for all N to register (``started`` seen by the monitor) after the clients begin to connect,
the abort's arrival at every rank p50/p99, and the ranks the monitor reported lost (no heartbeat
for ``HORA_HEARTBEAT_TIMEOUT``) during the window: a simulated rank never stops beating, so every
one is wrongly reported. Each N is bounded: ranks not all registered after ``--register-limit``
seconds are reported as such and that N ends there.

    python benchmarks/bench_control_plane.py [--ranks 64,256,1024] [--procs 4] [--window 20]
                                             [--launcher spark|local] [--register-limit 60]
                                             [--ranks-per-frame 1,8] [--driver-profile PATH]

``--ranks-per-frame K`` simulates hosts of K ranks whose beats (and metrics) go to the driver
in one frame per beat period, as :mod:`hora.runners.rank.relay` sends them (the datagrams from
the ranks to their host's relay stay on the host and are not simulated); every rank still
registers, waits and watches the abort on its own connections.

With ``--path`` it prints instead the rows of the rest of a collective's path at N ranks
(:mod:`bench_control_plane_path`: the engine's negotiation per round at ``--ranks``, the collective
groups' TCPStore rendezvous at ``--store-ranks``, Spark's barrier stage at ``local[--spark]``).

Run it on a quiet machine: the load average is printed with each row.
"""

from __future__ import annotations

import argparse
import array
import multiprocessing as mp
import os
import pickle
import resource
import selectors
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_control_plane_path  # noqa: E402
from _common import load_now, table  # noqa: E402

GO_KEY = "bench/open"  # the key every simulated rank waits on once registered (set by the driver)


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _pushed() -> bool:
    """Whether the code under test pushes the abort and batches beats (the event-driven control plane)."""
    try:
        import hora.runners.rank.beats  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------------------
# the driver process
# ------------------------------------------------------------------------------------------
def _driver(n: int, secret: bytes, conn: Any, profile: str | None = None) -> None:
    """A DriverService and the real monitor; answers the parent's commands over ``conn``. With
    ``profile``, the service's event loop is profiled (cProfile) over the window, saved there."""
    _raise_fd_limit()
    profiler = _profile_loop() if profile else None
    from hora.native import keys
    from hora.runners.driver.monitor import Policy, watch
    from hora.runners.driver.service import DriverService
    from hora.runners.launcher import Job

    service = DriverService(secret, n, "bench-control-plane", verbose=0)
    lost: set[int] = set()
    state: dict[str, float] = {}
    stop = threading.Event()
    real_stale, real_started = service.stale_heartbeats, service.started

    def stale(timeout: float, ignore: set[int]) -> list[int]:
        found = real_stale(timeout, ignore)
        lost.update(found)
        return []  # recorded; the simulated ranks are alive, the run goes on

    def started() -> dict[int, str]:
        seen = real_started()
        if len(seen) == n and "all_started" not in state:
            state["all_started"] = time.monotonic()
            service.server.set(GO_KEY, b"1")
            state["go_set"] = time.monotonic()
        return seen

    service.stale_heartbeats, service.started = stale, started  # type: ignore[method-assign]

    class _SimJob(Job):
        def poll(self) -> list[Any] | None:
            return [None] * n if stop.is_set() else None

        def cancel(self) -> None:
            stop.set()

    monitor = threading.Thread(target=watch, args=(service, _SimJob(), Policy(n, "bench", start_timeout=1e9)),
                               daemon=True)
    monitor.start()
    conn.send(service.addr)
    usage0 = wall0 = 0.0
    while True:
        cmd = conn.recv()
        if cmd == "window":
            lost.clear()
            ru = resource.getrusage(resource.RUSAGE_SELF)
            usage0, wall0 = ru.ru_utime + ru.ru_stime, time.monotonic()
            if profiler is not None:
                profiler["on"] = True
            conn.send(None)
        elif cmd == "abort":
            ru = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (ru.ru_utime + ru.ru_stime - usage0) / max(1e-9, time.monotonic() - wall0)
            state["abort"] = time.monotonic()
            if profiler is not None:
                profiler["on"] = False
                profiler["profile"].dump_stats(profile)
            service.server.set(keys.ABORT, b"1") if not hasattr(service, "abort") else service.abort()
            conn.send({"cpu": cpu, "lost": sorted(lost), **state})
        elif cmd == "state":
            conn.send(dict(state, started=len(real_started())))
        elif cmd == "stop":
            stop.set()
            monitor.join(timeout=10)
            service.close()
            conn.send(None)
            return


def _profile_loop() -> dict[str, Any]:
    """Profile the rendezvous server's event loop thread while ``["on"]`` (cProfile sees one thread)."""
    import cProfile

    from hora.native.rendezvous import loop as loop_mod

    state: dict[str, Any] = {"on": False, "profile": cProfile.Profile()}
    original = loop_mod._Loop._read  # a readable connection: its bytes read, its frames answered

    def read(self: Any, conn: Any) -> Any:
        if not state["on"]:
            return original(self, conn)
        return state["profile"].runcall(original, self, conn)

    loop_mod._Loop._read = read  # type: ignore[method-assign]
    return state


def _frame(secret: bytes, obj: Any) -> bytes:
    """The bytes :func:`~hora.native.rendezvous.protocol.send_frame` sends for ``obj``."""
    from hora.native.rendezvous.protocol import HEADER, MAGIC, sign

    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(MAGIC, len(body), sign(secret, body)) + body


# ------------------------------------------------------------------------------------------
# the simulated ranks
# ------------------------------------------------------------------------------------------
class _Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.beats = array.array("d")  # heartbeat round trips (s)
        self.woke = array.array("d")  # absolute monotonic times of the wake on GO_KEY
        self.aborted = array.array("d")  # absolute times at which a rank saw the abort
        self.errors = 0
        self.first_error = ""
        self.sent = 0  # beats sent (one-way beats: not each timed)


def _polled_rank(addr: str, secret: bytes, rank: int, launcher: str, stats: _Stats, stop: threading.Event,
                 register_limit: float) -> None:
    """One rank of the code before the event-driven control plane: heartbeat ``add``s and
    the abort polled by the rank's watchdog (and, on Spark, by its task supervisor)."""
    from hora.native import keys
    from hora.native.rendezvous import KVClient

    beat_every = 0.25 if launcher == "spark" else 1.0
    client = KVClient(addr, secret, timeout=register_limit)  # the rank's own (started, report())
    dog = KVClient(addr, secret, timeout=5.0)  # the watchdog's
    sup = KVClient(addr, secret, timeout=5.0) if launcher == "spark" else None  # the supervisor's check
    beats: list[float] = []
    sent = 0
    try:
        client.set(keys.rank_key(keys.STARTED, rank), b"sim")
        client.wait([GO_KEY], register_limit)
        with stats.lock:
            stats.woke.append(time.monotonic())
        t0 = time.monotonic()
        next_beat = next_second = t0
        seq = 0
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + beat_every
                b0 = time.monotonic()
                dog.add(keys.rank_key(keys.HEARTBEAT, rank), 1)
                beats.append(time.monotonic() - b0)
                sent += 1
            if now >= next_second:
                next_second = now + 1.0
                seq += 1
                client.set(keys.rank_key(keys.METRICS, rank), pickle.dumps((seq, {"step": seq, "loss": 0.5})))
                seen = bool(dog.keys(keys.ABORT))
                if sup is not None:
                    seen = bool(sup.keys(keys.ABORT)) or seen
                if seen:
                    with stats.lock:
                        stats.aborted.append(time.monotonic())
                    break
            stop.wait(max(0.0, min(next_beat, next_second) - time.monotonic()))
    except Exception as exc:  # noqa: BLE001 - counted and reported
        with stats.lock:
            stats.errors += 1
            stats.first_error = stats.first_error or f"rank {rank}: {exc}"
    finally:
        with stats.lock:
            stats.beats.extend(beats)
            stats.sent += sent
        for c in (client, dog, sup):
            if c is not None:
                c.close()


class _PushedRanks:
    """The ranks of one client process on the event-driven control plane, on one event loop:
    each rank sends what a rank of :mod:`hora.runners.rank.beats` sends, on connections of its
    own: ``started`` and the wait for the open key on the rank's connection, its watchdog's
    (and, on Spark, its supervisor's) abort watch parked on one connection each and renewed
    every :data:`~hora.runners.rank.beats.WATCH_PERIOD`, and one-way beats on the
    watchdog's connection, byte for byte the frames of :class:`~hora.runners.rank.beats.Beater`
    (metrics riding on one beat a second). One thread per process drives them all: 4,096 ranks
    as 12,288 threads are more than this machine's two cores schedule, and would measure that."""

    def __init__(self, addr: str, secret: bytes, ranks: list[int], launcher: str, stats: _Stats,
                 stop: threading.Event, register_limit: float, per_host: int = 1) -> None:
        host, _, port = addr.rpartition(":")
        self.addr, self.address, self.secret = addr, (host, int(port)), secret
        self.ranks, self.launcher, self.stats, self.stop = ranks, launcher, stats, stop
        self.register_limit = register_limit
        self.per_host = per_host  # ranks whose beats go in one frame (a host's relay, hora.runners.rank.relay)
        self.sel = selectors.DefaultSelector()
        self.socks: list[socket.socket] = []
        self.aborted: set[int] = set()

    def _open(self, rank: int, role: str) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if role != "beats":  # (the beats' connection answers only the sampling pings, read at once)
            self.sel.register(sock, selectors.EVENT_READ, [bytearray(), role, rank])
        self.socks.append(sock)
        return sock

    def _replies(self, sock: socket.socket, state: list) -> list[Any]:
        from hora.native.rendezvous.protocol import HEADER, sign

        try:
            data = sock.recv(1 << 16)
        except ConnectionError as exc:
            data = b""
            self._error(state[2], exc)
        if not data:
            self.sel.unregister(sock)
            return []
        buf, out = state[0], []
        buf += data
        while len(buf) >= HEADER.size:
            _, length, mac = HEADER.unpack_from(buf)
            if len(buf) < HEADER.size + length:
                break
            body = bytes(buf[HEADER.size:HEADER.size + length])
            del buf[:HEADER.size + length]
            if mac != sign(self.secret, body):
                raise RuntimeError("a reply failed its HMAC check")
            out.append(pickle.loads(body))
        return out

    def _error(self, rank: int, what: Any) -> None:
        with self.stats.lock:
            self.stats.errors += 1
            self.stats.first_error = self.stats.first_error or f"rank {rank}: {what}"

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - the whole process's ranks stop: reported
            import traceback

            self._error(-1, f"the client loop failed: {traceback.format_exc(limit=3)}")
            raise

    def _run(self) -> None:
        import heapq

        from hora.native import keys
        from hora.native.rendezvous.protocol import recv_frame, send_frame
        from hora.runners.rank import beats as rb

        jitter = getattr(rb, "parked_for", lambda period: period)  # (as the code under test parks a watch)

        def watch() -> tuple:
            return ("watch", [keys.ABORT], jitter(rb.WATCH_PERIOD))

        every = 0.25 if self.launcher == "spark" else 1.0
        # the senders: one per rank, or one per host of per_host ranks (its relay's frame carries
        # the beats of the host's ranks that beat, with their metrics)
        hosts = [self.ranks[i:i + self.per_host] for i in range(0, len(self.ranks), self.per_host)]
        host_of = {r: h for h, members in enumerate(hosts) for r in members}
        sample = max(16, len(hosts) // 4)  # about 16 timed frames a second per process
        hb = {r: ("add", keys.rank_key(keys.HEARTBEAT, r), 1) for r in self.ranks}
        awake: dict[int, list[int]] = {}  # host -> its ranks beating now
        plain: dict[int, bytes] = {}  # host -> its frame without metrics (the same bytes every time)
        with_metrics: set[int] = set()
        payload = b""
        for r in self.ranks:
            send_frame(self._open(r, "rank"), self.secret, ("set", keys.rank_key(keys.STARTED, r), b"sim"))
        phase = dict.fromkeys(self.ranks, "started")
        beaters: dict[int, socket.socket] = {}  # each host's (or rank's watchdog's) connection (its beats)
        heap: list[tuple[float, int]] = []
        beats: list[float] = []
        count = frames = seq = 0
        next_metrics = time.monotonic() + 1.0
        while not self.stop.is_set():
            wake = min(heap[0][0] if heap else time.monotonic() + 0.05, next_metrics)
            for key, _ in self.sel.select(max(0.0, min(0.05, wake - time.monotonic()))):
                sock, state = key.fileobj, key.data
                role, r = state[1], state[2]
                for status, value in self._replies(sock, state):  # type: ignore[arg-type]
                    if status != "ok":
                        self._error(r, value)
                    elif role == "rank" and phase[r] == "started":
                        phase[r] = "waiting"
                        send_frame(sock, self.secret, ("wait", [GO_KEY], self.register_limit))  # type: ignore[arg-type]
                    elif role == "rank":
                        with self.stats.lock:
                            self.stats.woke.append(time.monotonic())
                        # (its watches open now, after the wake is timed: a process opening 2,048
                        # connections one by one would otherwise read the wake late)
                        for _ in (("watchdog", "supervisor") if self.launcher == "spark" else ("watchdog",)):
                            send_frame(self._open(r, "watch"), self.secret, watch())
                        h = host_of[r]
                        awake.setdefault(h, []).append(r)
                        plain[h] = _frame(self.secret, ("post", [hb[m] for m in awake[h]]))
                        if h not in beaters:
                            beaters[h] = self._open(r, "beats")
                            beaters[h].sendall(plain[h])  # its first beat at once, as a KVClient's connect is
                            heapq.heappush(heap, (time.monotonic() + every * (1 + (h % 97) / 97), h))
                    elif value is None:  # a watch's period ended: renewed
                        send_frame(sock, self.secret, watch())  # type: ignore[arg-type]
                    elif r not in self.aborted:
                        self.aborted.add(r)
                        with self.stats.lock:
                            self.stats.aborted.append(time.monotonic())
            now = time.monotonic()
            if now >= next_metrics:  # report() once a second: rides on each rank's next beat
                next_metrics, seq = now + 1.0, seq + 1
                payload = pickle.dumps((seq, {"step": seq, "loss": 0.5}))
                with_metrics = set(beaters)
            turn_end = time.monotonic() + 0.01  # then read replies again: a late beat, never a deaf rank
            while heap and heap[0][0] <= time.monotonic() < turn_end:
                due, h = heapq.heappop(heap)
                members = [m for m in awake[h] if m not in self.aborted]
                if not members:
                    continue  # its aborted ranks exit
                b0 = time.monotonic()
                try:
                    if h in with_metrics:  # the frame Beater.beat() sends with metrics pending
                        with_metrics.discard(h)
                        writes = []
                        for m in members:
                            writes += [hb[m], ("set", keys.rank_key(keys.METRICS, m), payload)]
                        send_frame(beaters[h], self.secret, ("post", writes))
                    elif len(members) == len(awake[h]):  # the frame Beater.beat() sends: the same bytes every time
                        beaters[h].sendall(plain[h])
                    else:
                        send_frame(beaters[h], self.secret, ("post", [hb[m] for m in members]))
                    count += len(members)
                    frames += 1
                    if frames % sample == 0:  # one-way: its arrival shown by a ping answered after it, in order
                        send_frame(beaters[h], self.secret, ("ping",))
                        recv_frame(beaters[h], self.secret)
                        beats.append(time.monotonic() - b0)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    self._error(h, exc)
                heapq.heappush(heap, (max(due + every, time.monotonic()), h))
        with self.stats.lock:
            self.stats.beats.extend(beats)
            self.stats.sent += count
        for sock in self.socks:
            sock.close()


def _clients(addr: str, secret: bytes, ranks: list[int], launcher: str, pushed: bool, go: Any, stop: Any,
             register_limit: float, out: Any, per_host: int = 1) -> None:
    _raise_fd_limit()
    threading.stack_size(256 * 1024)
    stats = _Stats()
    halt = threading.Event()
    group = _PushedRanks(addr, secret, ranks, launcher, stats, halt, register_limit, per_host) if pushed else None
    if group is not None:
        threads = [threading.Thread(target=group.run, daemon=True)]
    else:
        threads = [threading.Thread(target=_polled_rank, args=(addr, secret, r, launcher, stats, halt,
                                                               register_limit), daemon=True) for r in ranks]
    go.wait()
    for t in threads:
        t.start()
    stop.wait()
    halt.set()
    deadline = time.monotonic() + 15
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    with stats.lock:
        out.put((stats.beats.tobytes(), stats.woke.tobytes(), stats.aborted.tobytes(), stats.errors,
                 stats.first_error, sum(t.is_alive() for t in threads), stats.sent))


# ------------------------------------------------------------------------------------------
# one N
# ------------------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _ms(x: float) -> str:
    return "-" if x != x else (f"{x * 1e3:.1f}" if x < 1 else f"{x * 1e3:.0f}")


def run_one(n: int, procs: int, window: float, launcher: str, register_limit: float, pushed: bool,
            per_host: int = 1, profile: str | None = None) -> tuple:
    from hora.native.rendezvous import make_secret

    ctx = mp.get_context("fork")
    secret = make_secret()
    parent, child = ctx.Pipe()
    driver = ctx.Process(target=_driver, args=(n, secret, child, profile), daemon=True)
    driver.start()
    addr = parent.recv()
    go, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    # each client process holds whole hosts of per_host ranks (ranks h*per_host .. h*per_host+per_host-1)
    hosts = [list(range(h, min(n, h + per_host))) for h in range(0, n, per_host)]
    groups = [[r for host in hosts[i::procs] for r in host] for i in range(min(procs, len(hosts)))]
    clients = [ctx.Process(target=_clients, daemon=True,
                           args=(addr, secret, g, launcher, pushed, go, stop, register_limit, out, per_host))
               for g in groups]
    for p in clients:
        p.start()
    time.sleep(1.0)  # the client processes are up, their threads not yet started
    t_go = time.monotonic()
    go.set()
    deadline = t_go + register_limit
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        parent.send("state")
        state = parent.recv()
        if "all_started" in state:
            break
        time.sleep(0.2)
    registered = "all_started" in state
    result: dict[str, Any] = {"lost": [], "cpu": float("nan")}
    if registered:
        parent.send("window")
        parent.recv()
        time.sleep(window)
        parent.send("abort")
        result = parent.recv()
        time.sleep(3.0)  # the abort reaches everyone (polled: within 1 s) before they are stopped
    stop.set()
    beats: list[float] = []
    woke: list[float] = []
    aborted: list[float] = []
    errors, first_error, stuck, beats_sent = 0, "", 0, 0
    for _ in clients:
        try:
            b, w, a, e, fe, s, sent = out.get(timeout=60)
        except Exception:  # noqa: BLE001 - a client process that never answered
            stuck += len(groups[0])
            continue
        beats += array.array("d", b).tolist()
        woke += array.array("d", w).tolist()
        aborted += array.array("d", a).tolist()
        errors, first_error, stuck, beats_sent = errors + e, first_error or fe, stuck + s, beats_sent + sent
    parent.send("stop")
    try:
        if parent.poll(30):
            parent.recv()
    except EOFError:
        pass
    for p in [*clients, driver]:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    load = load_now()
    if not registered:
        note = (f"not all registered after {register_limit:g} s ({state.get('started', '?')} of {n})")
        return (n, per_host, "-", "-", "-", "-", "-", note, "-", "-", "-", load)
    go_set = result["go_set"]
    wake = [t - go_set for t in woke]
    abort = [t - result["abort"] for t in aborted]
    beats_per_s = beats_sent / window  # the ranks beat from their wake to the abort (about the window)
    lost = result["lost"]
    note = f"{result['all_started'] - t_go:.2f}"
    extra = []
    if errors:
        extra.append(f"{errors} errors ({first_error})")
    if len(abort) < n:
        extra.append(f"abort seen by {len(abort)} of {n}")
    return (n, per_host, f"{result['cpu'] * 100:.1f}%", _ms(_pct(beats, 0.5)), _ms(_pct(beats, 0.99)),
            _ms(_pct(wake, 0.5)), _ms(_pct(wake, 0.99)), note, f"{_ms(_pct(abort, 0.5))} / {_ms(_pct(abort, 0.99))}",
            f"{len(lost)}" + (f" ({'; '.join(extra)})" if extra else ""),
            f"{beats_per_s:.0f} ({n * (4 if launcher == 'spark' else 1)})", load)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="64,256,1024", help="comma-separated N")
    ap.add_argument("--procs", type=int, default=4, help="client processes holding the simulated ranks")
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured once all ranks registered")
    ap.add_argument("--launcher", choices=("spark", "local"), default="spark")
    ap.add_argument("--register-limit", type=float, default=60.0, help="seconds for all N to register")
    ap.add_argument("--ranks-per-frame", default="1", metavar="K[,K...]",
                    help="ranks whose beats one frame carries: 1 (each rank beats on its own), or K (a host of K "
                         "ranks beating through its relay, hora.runners.rank.relay: 8 for an 8-GPU host); a "
                         "comma-separated list runs each N with each K")
    ap.add_argument("--driver-profile", default="", metavar="PATH",
                    help="save a cProfile of the service's request handling over each window to PATH.<N>.<K>")
    ap.add_argument("--profile", choices=("auto", "polled", "pushed"), default="auto",
                    help="the ranks' traffic: as the code under test sends it (auto), or forced")
    ap.add_argument("--path", action="store_true",
                    help="instead: the rest of the path at N ranks (bench_control_plane_path.py: the engine's "
                         "negotiation per round at --ranks, the collective store, Spark's barrier stage)")
    bench_control_plane_path.add_arguments(ap)
    a = ap.parse_args()
    if a.path:
        print(f"# {os.cpu_count()} CPUs, load {load_now()} at start: the rest of the path at N ranks", flush=True)
        print(table([tuple(r) for r in bench_control_plane_path.path_rows(a)], bench_control_plane_path.HEADER))
        return
    _raise_fd_limit()
    pushed = _pushed() if a.profile == "auto" else a.profile == "pushed"
    import hora

    print(f"# {os.cpu_count()} CPUs, load {load_now()} at start; hora from {Path(hora.__file__).parent}; "
          f"{a.launcher} ranks' traffic, {'pushed abort, one-way beats' if pushed else 'polled abort'}; "
          f"{a.procs} client processes; window {a.window:g} s", flush=True)
    rows = []
    header = ("ranks", "ranks per frame", "driver CPU", "beat p50 ms", "beat p99 ms", "wake p50 ms", "wake p99 ms",
              "all registered s", "abort seen p50 / p99 ms", "wrongly lost", "beats/s sent (of)", "load 1/5/15")
    for n in (int(x) for x in a.ranks.split(",")):
        for k in (int(x) for x in a.ranks_per_frame.split(",")):
            profile = f"{a.driver_profile}.{n}.{k}" if a.driver_profile else None
            row = run_one(n, a.procs, a.window, a.launcher, a.register_limit, pushed, k, profile)
            rows.append(row)
            print(table([row], header).splitlines()[-1], flush=True)
    print()
    print(table(rows, header))


if __name__ == "__main__":
    main()
