"""Build and remove the emulated cluster's network: namespaces, a bridge, veth pairs, addresses.

Layout for ``n`` workers, all names starting with a per-process tag (``gab<pid>``) so that two
harnesses (a test and a manual run) never collide::

    namespace <tag>-hub:  bridge gbbr, ports gbb0 .. gbb{n-1}          (no address)
    namespace <tag>-wK:   veth gbvK = 10.213.0.(K+1)/24, peer gbbK in the hub; lo up

Nothing is created in the machine's own (root) namespace and nothing routes out of the
cluster: the only addresses are the workers' own, on a bridge no other interface is attached
to. :meth:`Cluster.close` kills the processes the harness started in the namespaces and
deletes the namespaces (which deletes every veth, bridge, TUN device and qdisc inside);
it runs on normal exit, on exceptions, on SIGINT/SIGTERM (see :func:`signals_raise`) and at
interpreter exit. :func:`remove_leftovers` (``cluster_bench.py --cleanup``) removes what a
killed harness left behind.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional, Sequence

TAG_PREFIX = "gab"  # gossip_accel bench
SUBNET = "10.213.0"  # /24, private, unusual; exists only inside the cluster's namespaces
MTU = 65000  # large frames keep the userspace delay forwarder's packet rate low (see bench/README.md)
BRIDGE = "gbbr"


class HarnessError(RuntimeError):
    """A command of the harness failed; the message holds the command and its stderr."""


def run(argv: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run a command (``ip``, ``tc``, ``sysctl``), raising :class:`HarnessError` with its stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise HarnessError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def missing_requirements(need_tun: bool = True) -> list[str]:
    """What this machine lacks for the harness, each with how to get it (empty: all there)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces and tc need it: run as root or with sudo)")
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2"), ("sysctl", "procps")):
        if shutil.which(tool) is None:
            missing.append(f"`{tool}` (Debian/Ubuntu: apt-get install {pkg})")
    if need_tun and not os.path.exists("/dev/net/tun"):
        missing.append("/dev/net/tun (TUN devices, for the delay forwarder where the kernel has no netem: modprobe tun)")
    return missing


def namespaces() -> list[str]:
    """Names of all network namespaces (``ip netns list``)."""
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_works() -> Optional[str]:
    """None when a namespace can be created and deleted here, else why not."""
    name = f"{TAG_PREFIX}{os.getpid()}-check"
    proc = run(["ip", "netns", "add", name], check=False)
    if proc.returncode != 0:
        return f"`ip netns add` failed: {proc.stderr.strip()}"
    run(["ip", "netns", "del", name], check=False)
    return None


class Cluster:
    """n worker namespaces joined by veth pairs to a bridge in a hub namespace.

    Use as a context manager; processes started in the namespaces should be handed to
    :meth:`adopt` so that :meth:`close` ends them before deleting the namespaces.
    """

    def __init__(self, n: int, tag: Optional[str] = None, log: Callable[[str], None] = print):
        if not 2 <= n <= 250:
            raise ValueError(f"workers={n}: the cluster needs 2..250 workers")
        self.n = n
        self.tag = tag or f"{TAG_PREFIX}{os.getpid()}"
        self.hub = f"{self.tag}-hub"
        self.names = [f"{self.tag}-w{i}" for i in range(n)]
        self.log = log
        self.procs: list[subprocess.Popen] = []
        self.created: list[str] = []
        self._closed = False

    # -- names and addresses -----------------------------------------------------------
    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    @staticmethod
    def veth(i: int) -> str:
        """The worker-side interface (inside namespace i); GLOO_SOCKET_IFNAME names it."""
        return f"gbv{i}"

    @staticmethod
    def port(i: int) -> str:
        """The bridge-side end of worker i's veth (inside the hub namespace)."""
        return f"gbb{i}"

    def exec_argv(self, i: int, argv: Sequence[str]) -> list[str]:
        """argv run inside worker i's namespace."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    # -- life cycle ----------------------------------------------------------------------
    def create(self) -> "Cluster":
        clash = set(namespaces()) & {self.hub, *self.names}
        if clash:
            raise HarnessError(f"namespaces {sorted(clash)} already exist (a harness with the same tag is running, "
                               f"or run `bench/cluster_bench.py --cleanup`)")
        atexit.register(self.close)
        self._add_ns(self.hub)
        run(["ip", "-n", self.hub, "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "-n", self.hub, "link", "set", BRIDGE, "mtu", str(MTU), "up"])
        for i, ns in enumerate(self.names):
            self._add_ns(ns)
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            run(["ip", "-n", self.hub, "link", "add", self.port(i), "type", "veth", "peer", "name", self.veth(i),
                 "netns", ns])
            run(["ip", "-n", self.hub, "link", "set", self.port(i), "mtu", str(MTU), "master", BRIDGE, "up"])
            run(["ip", "-n", ns, "link", "set", self.veth(i), "mtu", str(MTU), "up"])
            run(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", self.veth(i)])
        self.log(f"[cluster] {self.n} namespaces {self.names[0]}..{self.names[-1]} on bridge {BRIDGE} "
                 f"in {self.hub}, addresses {self.address(0)}..{self.address(self.n - 1)}/24, MTU {MTU}")
        return self

    def _add_ns(self, name: str) -> None:
        run(["ip", "netns", "add", name])
        self.created.append(name)

    def adopt(self, proc: subprocess.Popen) -> subprocess.Popen:
        """Track a process started in the namespaces; :meth:`close` ends it."""
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        """End adopted processes (SIGTERM, then SIGKILL), then delete every namespace created."""
        if self._closed:
            return
        self._closed = True
        stop_processes(self.procs)
        for ns in self.created:
            kill_namespace_pids(ns)
            run(["ip", "netns", "del", ns], check=False)
        if self.created:
            self.log(f"[cluster] removed {len(self.created)} namespaces of {self.tag}")
        self.created = []
        atexit.unregister(self.close)

    def __enter__(self) -> "Cluster":
        try:
            return self.create()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()


def stop_processes(procs: Sequence[subprocess.Popen], grace: float = 5.0) -> None:
    """SIGTERM each still-running process's group (each was started with its own session),
    wait up to ``grace`` seconds, then SIGKILL."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        _signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in alive:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # our child is its group's leader (start_new_session=True)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_namespace_pids(ns: str) -> None:
    """SIGKILL whatever still runs in one of *our* namespaces (only the harness starts processes there)."""
    out = run(["ip", "netns", "pids", ns], check=False).stdout
    for pid in (int(x) for x in out.split() if x.isdigit()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def leftovers(force: bool = False) -> list[str]:
    """Namespaces of harnesses that are gone (their pid no longer runs); all of ours with ``force``."""
    pattern = re.compile(rf"^{TAG_PREFIX}(\d+)-(hub|w\d+|check)$")
    found = []
    for ns in namespaces():
        m = pattern.match(ns)
        if m and (force or not Path(f"/proc/{m.group(1)}").exists()):
            found.append(ns)
    return found


def remove_leftovers(force: bool = False, log: Callable[[str], None] = print, quiet: bool = False) -> list[str]:
    """Delete :func:`leftovers` (ending what still runs in them); returns their names."""
    gone = leftovers(force)
    for ns in gone:
        kill_namespace_pids(ns)
        run(["ip", "netns", "del", ns], check=False)
    if gone or not quiet:
        log(f"[cluster] cleanup: removed {len(gone)} namespaces" + (f": {' '.join(gone)}" if gone else ""))
    return gone


@contextmanager
def signals_raise():
    """Turn SIGTERM and SIGHUP into SystemExit and SIGINT into KeyboardInterrupt, so that
    ``with Cluster(...)`` blocks and ``finally`` clauses run when the harness is killed.

    SIGINT's handler is installed explicitly: a process started in the background by a
    non-interactive shell inherits SIGINT *ignored*, and Python then never raises
    KeyboardInterrupt, so Ctrl-C (or a test's SIGINT) would leave the namespaces behind."""
    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    saved = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    saved[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def python_env(root: Path) -> dict[str, str]:
    """Environment for the Python processes started in the namespaces (the project on PYTHONPATH,
    the venv's launchers on PATH, one thread per process)."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env
