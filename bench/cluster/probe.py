"""Measure what an emulated link really gives: TCP round-trip time and bulk throughput.

    python -m bench.cluster.probe serve --bind 10.213.0.2          # in a worker namespace
    python -m bench.cluster.probe rtt --to 10.213.0.2 --count 30   # prints JSON
    python -m bench.cluster.probe bulk --to 10.213.0.2 --seconds 1 # prints JSON

``rtt``: 1-byte TCP ping-pong (TCP_NODELAY), median and minimum over ``--count`` round trips.
``bulk``: one TCP stream for ``--seconds``; the receiver reports the rate over the last three
quarters of the transfer (after TCP's slow start). :func:`measure` runs them between the
namespaces of a cluster: one pair, and all workers sending to their ring successor at once
(what a ring all-reduce does). Standard library only; the harness side imports no torch.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Optional

PORT = 5201
CHUNK = 1 << 20


# -- the programs that run in the namespaces ------------------------------------------------
def _serve_pingpong(conn: socket.socket) -> None:
    while True:
        b = conn.recv(1)
        if not b:
            return
        conn.sendall(b)


def _serve_bulk(conn: socket.socket) -> None:
    samples, total, first = [], 0, None
    while True:
        n = len(conn.recv(CHUNK))
        if n == 0:
            break
        now = time.perf_counter()
        first = first if first is not None else now
        total += n
        samples.append((now, total))
    rate, seconds = 0.0, 0.0
    if len(samples) > 1:
        last_t = samples[-1][0]
        quarter = first + 0.25 * (last_t - first)
        t0, b0 = next((t, b) for t, b in samples if t >= quarter)
        seconds = last_t - first
        rate = (total - b0) * 8 / (last_t - t0) if last_t > t0 else 0.0
    conn.sendall(json.dumps({"bytes": total, "seconds": seconds, "bits_per_s": rate}).encode())


def serve(bind: str, port: int = PORT) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind, port))
    srv.listen(64)
    print("listening", flush=True)

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            kind = conn.recv(1)
            (_serve_pingpong if kind == b"p" else _serve_bulk)(conn)

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def rtt(to: str, count: int, port: int = PORT) -> dict:
    with socket.create_connection((to, port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"p")
        times = []
        for _ in range(count + 2):
            t = time.perf_counter()
            s.sendall(b"x")
            s.recv(1)
            times.append(time.perf_counter() - t)
    times = times[2:]  # the first round trips include connection warm-up
    return {"rtt_ms": statistics.median(times) * 1e3, "rtt_ms_min": min(times) * 1e3, "count": count}


def bulk(to: str, seconds: float, port: int = PORT) -> dict:
    buf = b"\0" * CHUNK
    with socket.create_connection((to, port), timeout=60) as s:
        s.sendall(b"b")
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            s.sendall(buf)
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while True:
            part = s.recv(4096)
            if not part:
                break
            reply += part
    return json.loads(reply)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sv = sub.add_parser("serve")
    sv.add_argument("--bind", required=True)
    r = sub.add_parser("rtt")
    r.add_argument("--to", required=True)
    r.add_argument("--count", type=int, default=30)
    b = sub.add_parser("bulk")
    b.add_argument("--to", required=True)
    b.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    if args.cmd == "serve":
        serve(args.bind)
    elif args.cmd == "rtt":
        print(json.dumps(rtt(args.to, args.count)))
    else:
        print(json.dumps(bulk(args.to, args.seconds)))


# -- the harness side ---------------------------------------------------------------------------
def measure(cluster, asked_rtt_s: float, seconds: float = 1.0, env: Optional[dict] = None) -> dict:
    """RTT between workers 0 and 1, one bulk stream 0 -> 1, and every worker to its ring successor
    at once (the per-link rate a ring all-reduce can get)."""
    from .netns import HarnessError, stop_processes

    def start(i: int, *argv: str) -> subprocess.Popen:
        return cluster.adopt(subprocess.Popen(cluster.exec_argv(i, [sys.executable, "-m", "bench.cluster.probe", *argv]),
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                              start_new_session=True))

    def result(p: subprocess.Popen) -> dict:
        out, err = p.communicate(timeout=120)
        if p.returncode != 0:
            raise HarnessError(f"link probe failed: {err.strip()[-2000:]}")
        return json.loads(out)

    servers = [start(i, "serve", "--bind", cluster.address(i)) for i in range(cluster.n)]
    try:
        for i, s in enumerate(servers):
            if s.stdout.readline().strip() != "listening":
                raise HarnessError(f"probe server in {cluster.names[i]} did not start: {s.stderr.read()[-2000:]}")
        count = int(min(50, max(10, 1.0 / max(asked_rtt_s, 1e-3))))
        out = result(start(0, "rtt", "--to", cluster.address(1), "--count", str(count)))
        one = result(start(0, "bulk", "--to", cluster.address(1), "--seconds", str(seconds)))
        ring = [start(i, "bulk", "--to", cluster.address((i + 1) % cluster.n), "--seconds", str(seconds))
                for i in range(cluster.n)]
        rates = [result(p)["bits_per_s"] for p in ring]
    finally:
        stop_processes(servers, grace=1.0)
    out.update({"one_flow_bps": one["bits_per_s"], "ring_bps_mean": statistics.mean(rates),
                "ring_bps_min": min(rates), "probe_seconds": seconds})
    return out


if __name__ == "__main__":
    main()
