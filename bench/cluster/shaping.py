"""Shape every link of a :class:`~bench.cluster.netns.Cluster` to a :class:`~bench.cluster.links.LinkSpec`.

Rate: a ``tbf`` qdisc on both ends of each worker's veth (the worker side limits what it
sends, the bridge side what it receives), so each worker has a full-duplex link of the rate.

Delay, by ``mode``:

* ``netem`` (kernels that have it): ``netem delay D`` as the worker side's root qdisc, the
  ``tbf`` below it.
* ``tun`` (this project's CI kernel has no netem): in each worker namespace, packets the
  worker sends to the cluster subnet are routed (``ip rule iif lo``, table 100) into a TUN
  device ``gbtK``; :mod:`bench.cluster.delay` holds them for D and writes them back, and the
  namespace forwards them out of its veth (``ip_forward``, ``accept_local`` and no
  ``rp_filter`` on the TUN device: the packets carry the namespace's own source address).
  So every packet is delayed once, at its sender, before its sender's rate limit: the same
  place netem would delay it. Packets between a worker and itself (loopback) are not delayed.
* ``auto``: ``netem`` where the kernel has it, else ``tun``.
* ``none``: no delay at all (rates only).

A zero delay adds nothing in any mode.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Optional

from .links import LinkSpec, tbf_args
from .netns import MTU, SUBNET, Cluster, HarnessError, python_env, run, stop_processes

ROUTE_TABLE = "100"
RULE_PREF = "100"


def netem_available(cluster: Cluster) -> bool:
    """Whether this kernel has netem (tried on the hub namespace's unused loopback)."""
    ok = run(["tc", "-n", cluster.hub, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
             check=False).returncode == 0
    if ok:
        run(["tc", "-n", cluster.hub, "qdisc", "del", "dev", "lo", "root"], check=False)
    return ok


class Shaper:
    """Applies link specs to a cluster, one after another; :meth:`close` stops the forwarders."""

    def __init__(self, cluster: Cluster, mode: str = "auto", root: Optional[str] = None):
        if mode not in ("auto", "netem", "tun", "none"):
            raise ValueError(f"delay mode {mode!r}: choose auto, netem, tun or none")
        self.cluster = cluster
        self.root = root
        self.mode = mode
        if mode == "auto":
            self.mode = "netem" if netem_available(cluster) else "tun"
        elif mode == "netem" and not netem_available(cluster):
            raise HarnessError("--delay-mode netem: this kernel has no netem qdisc (tc says 'Specified qdisc kind "
                               "is unknown'); use --delay-mode tun (the userspace forwarder) or auto")
        self.forwarders: list[subprocess.Popen] = []
        self._tun_ready = False
        self.link: Optional[LinkSpec] = None

    # -- public ------------------------------------------------------------------------------
    def apply(self, link: LinkSpec) -> dict:
        """Shape every link to ``link``; returns what was done (for the results)."""
        c = self.cluster
        self._stop_forwarders()
        for i, ns in enumerate(c.names):
            for where, dev in ((ns, c.veth(i)), (c.hub, c.port(i))):
                run(["tc", "-n", where, "qdisc", "del", "dev", dev, "root"], check=False)
        delayed = link.delay_s > 0 and self.mode != "none"
        for i, ns in enumerate(c.names):
            if link.rate_bps is not None:
                run(["tc", "-n", c.hub, "qdisc", "add", "dev", c.port(i), "root", *tbf_args(link.rate_bps, MTU)])
            if delayed and self.mode == "netem":
                run(["tc", "-n", ns, "qdisc", "add", "dev", c.veth(i), "root", "handle", "1:", "netem", "delay",
                     f"{link.delay_s * 1e6:.0f}us", "limit", "100000"])
                if link.rate_bps is not None:
                    run(["tc", "-n", ns, "qdisc", "add", "dev", c.veth(i), "parent", "1:", "handle", "2:",
                         *tbf_args(link.rate_bps, MTU)])
            elif link.rate_bps is not None:
                run(["tc", "-n", ns, "qdisc", "add", "dev", c.veth(i), "root", *tbf_args(link.rate_bps, MTU)])
        if delayed and self.mode == "tun":
            self._route_through_tun(True)
            self._start_forwarders(link.delay_s)
        elif self._tun_ready:
            self._route_through_tun(False)
        self.link = link
        how = "none" if not delayed else ("netem on each worker's veth" if self.mode == "netem"
                                          else "userspace TUN forwarder per worker (bench/cluster/delay.py)")
        return {"rate": "tbf on both ends of each veth" if link.rate_bps else "unlimited", "delay": how,
                "delay_mode": self.mode if delayed else "none", "mtu": MTU}

    def close(self) -> list[dict]:
        """Stop the forwarders; returns their statistics (one dict per worker)."""
        return self._stop_forwarders()

    # -- TUN delay ---------------------------------------------------------------------------
    def _setup_tun(self) -> None:
        c = self.cluster
        for i, ns in enumerate(c.names):
            tun = f"gbt{i}"
            run(["ip", "-n", ns, "tuntap", "add", "dev", tun, "mode", "tun"])
            run(["ip", "-n", ns, "link", "set", tun, "mtu", str(MTU), "up"])
            run(c.exec_argv(i, ["sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                                "net.ipv4.conf.default.rp_filter=0", f"net.ipv4.conf.{tun}.rp_filter=0",
                                f"net.ipv4.conf.{tun}.accept_local=1", "net.ipv4.conf.all.send_redirects=0",
                                f"net.ipv4.conf.{c.veth(i)}.send_redirects=0"]))
            run(["ip", "-n", ns, "route", "add", f"{SUBNET}.0/24", "dev", tun, "src", c.address(i),
                 "table", ROUTE_TABLE])
        self._tun_ready = True

    def _route_through_tun(self, on: bool) -> None:
        if on and not self._tun_ready:
            self._setup_tun()
        for ns in self.cluster.names:
            run(["ip", "-n", ns, "rule", "del", "pref", RULE_PREF], check=False)
            if on:
                run(["ip", "-n", ns, "rule", "add", "iif", "lo", "lookup", ROUTE_TABLE, "pref", RULE_PREF])

    def _start_forwarders(self, delay_s: float) -> None:
        c = self.cluster
        env = python_env(self.root) if self.root else None
        for i in range(c.n):
            argv = c.exec_argv(i, [sys.executable, "-m", "bench.cluster.delay", "--dev", f"gbt{i}",
                                   "--delay-ms", f"{delay_s * 1e3:g}"])
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                    start_new_session=True)
            self.forwarders.append(c.adopt(proc))
        for i, proc in enumerate(self.forwarders):
            line = proc.stdout.readline().strip()  # blocks until the forwarder attached (or died)
            if line != "ready":
                raise HarnessError(f"delay forwarder of worker {i} did not start: {line} {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)

    def _stop_forwarders(self) -> list[dict]:
        procs, self.forwarders = self.forwarders, []
        stop_processes(procs)
        stats = []
        for p in procs:
            out = p.stdout.read() if p.stdout else ""
            lines = [x for x in out.splitlines() if x.startswith("{")]
            stats.append(json.loads(lines[-1]) if lines else {})
        return stats
