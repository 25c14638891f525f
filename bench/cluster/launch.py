"""Start the workers: one ``utils/launch.sh`` per namespace, as training is started on a real cluster.

Worker K runs, inside namespace K (GLOO_SOCKET_IFNAME and TP_SOCKET_IFNAME name its veth)::

    utils/launch.sh --num-workers 1 --num-nodes N --node-rank K --master-addr 10.213.0.1 --port 29500 \\
        [--launcher torchrun] -- -m bench.cluster.worker ...

Rank 0's output is streamed to the terminal, every
rank's is kept in ``<work>/worker<K>.log``; a failing or hanging worker stops all of them, and
the error shows each worker's first traceback.
"""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from .netns import Cluster, HarnessError, python_env, stop_processes

PORT = 29500  # inside the namespaces: no clash with anything on the machine


def launcher_argv(cluster: Cluster, i: int, root: Path, launcher: str, worker_args: Sequence[str]) -> list[str]:
    """The command line that starts node ``i``'s worker in its namespace."""
    if launcher not in ("accelerate", "torchrun"):
        raise ValueError(f"launcher {launcher!r}: choose accelerate or torchrun")
    cmd = ["bash", str(root / "utils" / "launch.sh"), "--num-workers", "1", "--num-nodes", str(cluster.n),
           "--node-rank", str(i), "--master-addr", cluster.address(0), "--port", str(PORT), "--launcher", launcher,
           "--", "-m", "bench.cluster.worker", *worker_args]
    # gloo (process group) and tensorpipe (RPC, the asynchronous algorithms) both use the namespace's veth
    return cluster.exec_argv(i, ["env", f"GLOO_SOCKET_IFNAME={cluster.veth(i)}", f"TP_SOCKET_IFNAME={cluster.veth(i)}",
                                 *cmd])


def _pump(stream, log: Path, echo: Optional[Callable[[str], None]]) -> None:
    with open(log, "w") as f:
        for line in stream:
            f.write(line)
            f.flush()
            if echo is not None and line.startswith("[bench]"):
                echo(line.rstrip())


def tail(path: Path, lines: int = 25) -> str:
    """The first Python traceback of a log (the worker's own error, before the launcher's
    summary), or its last lines."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    start = next((i for i, line in enumerate(text) if "Traceback (most recent call last)" in line), None)
    if start is None:
        return "\n".join(text[-lines:])
    body = [re.sub(r"^\[rank\d+\]: ?", "", line) for line in text]  # torchrun prefixes worker lines
    end = next((j for j in range(start + 1, len(text)) if body[j] and not body[j].startswith((" ", "\t"))),
               len(text) - 1)
    return "\n".join(text[start:end + 1][-3 * lines:])


def run_workers(cluster: Cluster, root: Path, work: Path, launcher: str, worker_args: Sequence[str],
                timeout_s: float, echo: Callable[[str], None] = print) -> None:
    """Start every node's launcher, wait for all; raise :class:`HarnessError` (with the logs'
    tails) if one fails or the run exceeds ``timeout_s``. All are stopped in any case."""
    env = python_env(root)
    procs, pumps, logs = [], [], []
    try:
        for i in range(cluster.n):
            logs.append(work / f"worker{i}.log")
            p = cluster.adopt(subprocess.Popen(launcher_argv(cluster, i, root, launcher, worker_args), cwd=root,
                                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                               start_new_session=True))
            procs.append(p)
            t = threading.Thread(target=_pump, args=(p.stdout, logs[-1], echo if i == 0 else None), daemon=True)
            t.start()
            pumps.append(t)
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = f"worker {failed[0]} exited with {procs[failed[0]].returncode}" if failed else \
                    f"workers still running after {timeout_s:.0f} s (--timeout)"
                stop_processes(procs)
                for t in pumps:
                    t.join(timeout=2)
                logs_text = "\n".join(f"--- {log} (tail) ---\n{tail(log)}" for log in logs)
                raise HarnessError(f"{why}\n{logs_text}")
            time.sleep(0.2)
        for t in pumps:
            t.join(timeout=5)
        bad = [i for i, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise HarnessError(f"worker {bad[0]} exited with {procs[bad[0]].returncode}\n--- {logs[bad[0]]} ---\n"
                               f"{tail(logs[bad[0]])}")
    finally:
        stop_processes(procs)
    sys.stdout.flush()
