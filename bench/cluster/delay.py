"""A userspace delay line on a TUN device, for kernels without the ``netem`` qdisc.

    python -m bench.cluster.delay --dev gbt0 --delay-ms 1

Attaches to the (persistent) TUN device ``--dev``, reads every packet the namespace's stack
routes into it and writes it back into the same device ``--delay-ms`` later; the kernel then
forwards it out of the worker's veth (policy routing set up by :mod:`bench.cluster.shaping`).
The delay is constant, so a FIFO keeps the packets in order. Prints ``ready`` once attached;
on SIGTERM/SIGINT prints one JSON line of statistics (packets, bytes, how late packets left
against their due time: the forwarder's own jitter, which grows when the CPU is busy).
Runs with real-time priority (SCHED_FIFO 10; niceness -10 where that is not permitted): it
emulates hardware, which does not wait for the CPU the workers use.
Standard library only, so that it starts in milliseconds.
"""
from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import select
import signal
import struct
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_PACKET = 65536
READ_BATCH = 64  # packets read per wake-up before writing due ones again


def open_tun(name: str) -> int:
    """A non-blocking fd attached to TUN device ``name`` (created if it does not exist)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


class DelayLine:
    """FIFO of (due time, packet); :meth:`run` moves packets from the fd back to it when due."""

    def __init__(self, fd: int, delay_s: float):
        self.fd = fd
        self.delay = delay_s
        self.queue: collections.deque = collections.deque()
        self.packets = 0
        self.bytes = 0
        self.late_sum = 0.0
        self.late_max = 0.0
        self.running = True

    def _release_due(self) -> None:
        now = time.monotonic()
        q = self.queue
        while q and q[0][0] <= now:
            due, pkt = q.popleft()
            try:
                os.write(self.fd, pkt)
            except BlockingIOError:  # the stack's backlog is full: drop, as a full link would
                continue
            late = now - due
            self.late_sum += late
            self.late_max = max(self.late_max, late)
            self.packets += 1
            self.bytes += len(pkt)

    def _read_ready(self) -> None:
        due = time.monotonic() + self.delay
        for _ in range(READ_BATCH):
            try:
                self.queue.append((due, os.read(self.fd, MAX_PACKET)))
            except BlockingIOError:
                return

    def run(self) -> None:
        while self.running:
            self._release_due()
            timeout = max(0.0, self.queue[0][0] - time.monotonic()) if self.queue else 0.5
            try:
                ready, _, _ = select.select([self.fd], [], [], timeout)
            except InterruptedError:
                continue
            if ready:
                self._read_ready()

    def stats(self) -> dict:
        return {"packets": self.packets, "bytes": self.bytes, "delay_ms": self.delay * 1e3,
                "late_mean_ms": self.late_sum / max(self.packets, 1) * 1e3, "late_max_ms": self.late_max * 1e3}


def set_priority(kind: str) -> str:
    """Raise the forwarder's scheduling priority as far as allowed; returns what was set."""
    if kind == "realtime":
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
            return kind
        except (OSError, AttributeError):
            kind = "nice"  # not permitted here: fall back
    if kind == "nice":
        try:
            os.setpriority(os.PRIO_PROCESS, 0, -10)
            return kind
        except OSError:
            pass
    return "normal"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dev", required=True, help="TUN device name (inside this namespace)")
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay added to every packet")
    ap.add_argument("--priority", choices=["realtime", "nice", "normal"], default="realtime",
                    help="the forwarder plays the network hardware, so it should not wait for the CPU the workers "
                         "use: realtime = SCHED_FIFO priority 10 (the kernel's RT throttling keeps 5%% for the "
                         "rest), nice = niceness -10")
    args = ap.parse_args()
    set_priority(args.priority)
    line = DelayLine(open_tun(args.dev), args.delay_ms / 1e3)

    def stop(_signum, _frame):
        line.running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    line.run()
    print(json.dumps(line.stats()), flush=True)


if __name__ == "__main__":
    main()
