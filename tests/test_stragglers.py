"""Straggler resilience of the asynchronous algorithms, without any assertion on wall time.

A worker is *held* before its first step until every other worker has finished all of its
steps (or, with bounded staleness, until the others are parked at the bound). If an
algorithm made the fast workers wait for the straggler, the held worker would wait forever
and the run would fail on its timeout. The asynchronous algorithms must pass: ADPSGD
(fixed, randomized, delay-by-one) with an active or a passive straggler, ASGD and async EASGD
with the straggler on the server's own rank. Then bench/stragglers.py runs once, shrunk.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from harness import WORLD, async_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELD = {"hold_adpsgd_fixed": 1, "hold_adpsgd_random": 2, "hold_adpsgd_delay": 3, "hold_asgd": 0,
        "hold_easgd_async": 0}


@pytest.fixture(scope="module")
def res():
    return async_results()


@pytest.mark.parametrize("name", list(HELD))
def test_fast_workers_finish_while_the_straggler_has_not_started(res, name):
    held = HELD[name]
    probe = res[held][name]["probe"]
    assert probe["others_done_before_start"] == [r for r in range(WORLD) if r != held]
    steps = res[0][name]["steps"]
    for r in range(WORLD):
        rep = res[r][name]["report_final"]
        done = rep.get("round", rep.get("pushes"))
        assert done == steps  # the straggler too caught up and finished
    for r in range(1, WORLD):  # and the run ended with one model everywhere
        for k, v in res[r][name]["final"].items():
            if k.startswith("norm.running") or k.endswith("num_batches_tracked"):
                continue
            torch.testing.assert_close(v, res[0][name]["final"][k], atol=1e-6, rtol=0)


def test_adpsgd_partners_of_a_held_passive_see_its_lag(res):
    # the held passive (rank 1) answered every round from its RPC threads at step 0
    lags = [res[r]["hold_adpsgd_fixed"]["report"]["lag_max"] for r in (0, 2)]
    assert max(lags) == res[0]["hold_adpsgd_fixed"]["steps"]


def test_straggler_benchmark_runs_and_writes_its_table(tmp_path):
    out = tmp_path / "stragglers.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "stragglers.py"), "--steps", "3", "--step-ms", "1",
           "--algorithms", "ma,adpsgd_fixed", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [r["algorithm"] for r in data["table"]] == ["ma", "adpsgd_fixed"]
    assert len(data["runs"]) == 2 * 2 * 4  # algorithms x (with, without straggler) x workers
    assert len(data["loadavg_before"]) == 3 and data["straggler_rank"] == 3
    for r in data["table"]:
        assert r["steps_per_second_per_worker"] > 0 and r["relative"] > 0
    # rank 0 recorded the machine's load around each of the 4 runs (algorithm x slowdown)
    loads = [r["load"] for r in data["runs"] if "load" in r]
    assert len(loads) == 4 and all({"before", "after", "quiet"} <= set(ld) for ld in loads)
    assert data["load"]["settings"] == 4
    for r in data["table"]:
        assert r["quiet"] == all(x["load"]["quiet"] for x in data["runs"] if x["algorithm"] == r["algorithm"] and "load" in x)
    assert "| ma |" in proc.stdout and "| adpsgd_fixed |" in proc.stdout
