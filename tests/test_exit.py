"""gossip_accel.shutdown's last step: wait until the gloo work threads are idle before the
interpreter finalizes (gossip_accel/sync/comm.py, wait_for_idle_gloo_workers; bench/exit_loop.py
measures the exit aborts it prevents). Threads named like gloo's stand in for them here: one that
computes (runnable, GIL released) keeps the wait going, one that sleeps on a lock ends it."""
from __future__ import annotations

import ctypes
import hashlib
import sys
import threading
import time

import pytest

from gossip_accel.sync import comm

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")


def named_thread(work, stop: threading.Event) -> threading.Thread:
    def run():
        ctypes.CDLL(None).prctl(15, comm.GLOO_WORKER_THREAD.encode(), 0, 0, 0)  # PR_SET_NAME: this thread
        while not stop.is_set():
            work()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_wait_for_idle_gloo_workers_waits_while_one_runs_and_returns_when_all_sleep():
    stop, idle = threading.Event(), threading.Event()
    data = b"x" * (16 << 20)
    busy = named_thread(lambda: hashlib.sha256(data).digest() if not idle.is_set() else stop.wait(0.05), stop)
    try:
        deadline = time.monotonic() + 10
        while not comm._gloo_worker_states() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert comm._gloo_worker_states(), "the named thread is not seen in /proc/self/task"
        assert comm.wait_for_idle_gloo_workers(timeout=0.5) is False  # hashing (no GIL): runnable throughout
        idle.set()                                                   # now it waits on an event: asleep
        assert comm.wait_for_idle_gloo_workers(timeout=10) is True
    finally:
        stop.set()
        idle.set()
        busy.join(5)
    assert comm.wait_for_idle_gloo_workers(timeout=1) is True        # none left: nothing to wait for
