"""The README's first command, shrunk: ./run.sh end to end (data, DDP and gossip-BMUF training, report)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(["bash", str(ROOT / "run.sh"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_run_sh_all_stages(tmp_path):
    data, exp = tmp_path / "data", tmp_path / "exp"
    args = ["--data", str(data), "--exp", str(exp), "--num-workers", "3", "--epochs", "1",
            "--port", str(free_port()), "--", "train.max_steps_per_epoch=20", "model.hidden_size=64", "model.projection_size=32",
            "sync.components.0.period=16"]  # so that the embedding syncs within 20 steps
    proc = run(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert (data / "vocab.txt").is_file() and (data / "wiki.train.tokens").is_file()
    ddp = json.loads((exp / "ddp-n3" / "results.json").read_text())
    gossip = json.loads((exp / "gossip_bmuf-16_128-n3" / "results.json").read_text())
    assert ddp["workers"] == gossip["workers"] == 3
    assert ddp["steps_per_worker"] == gossip["steps_per_worker"] == 20
    # gossip-BMUF (16,16 here) sends far less than DDP's all-reduce of every gradient
    assert 0 < gossip["bytes_sent_per_step_per_worker"] < ddp["bytes_sent_per_step_per_worker"] / 5
    assert ddp["final_test_ppl"] > 1 and gossip["final_test_ppl"] > 1  # stage 3 (eval) ran
    table = (exp / "compare" / "RESULTS.md").read_text()
    assert "| ddp-n3 | 3 |" in table and "| gossip_bmuf-16_128-n3 | 3 |" in table
    assert (exp / "compare" / "RESULTS.png").stat().st_size > 0
    # stages are idempotent: a rerun skips the finished work
    again = run(args)
    assert again.returncode == 0 and "already trained" in again.stderr


def test_run_sh_help_and_unknown_option():
    ok = run(["--help"])
    assert ok.returncode == 0 and "--num-workers" in ok.stdout + ok.stderr
    bad = run(["--num-wrokers", "3"])
    assert bad.returncode == 1 and "--num-wrokers" in bad.stderr
