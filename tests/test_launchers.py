"""`accelerate launch` and `torchrun` with 4 CPU processes, end to end, against the simulator."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import WORLD, simulate_scenario
from harness import assert_matches_oracle
from gossip_accel.train.process_group import free_port

SCRIPT = Path(__file__).parent / "scripts" / "train_toy.py"
BIN = Path(sys.executable).parent


def launch(cmd: list[str], out: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert sorted(p.name for p in out.glob("rank*.pt")) == [f"rank{r}.pt" for r in range(WORLD)]


def accelerate_cmd(out: Path, *args: str) -> list[str]:
    return [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", str(WORLD), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
            str(SCRIPT), str(out), *args]


def check_against_simulator(out: Path, overrides: list[str], steps: int, accum: int = 1) -> None:
    sim_before, sim_final = simulate_scenario(overrides, steps, accum=accum)
    for r in range(WORLD):
        got = torch.load(out / f"rank{r}.pt", weights_only=True)
        assert got["world_size"] == WORLD, "the launcher did not start 4 ranks in one process group"
        assert got["t"] == steps, "the synchronizer must count optimizer steps, not micro-batches"
        assert_matches_oracle(got, sim_before[r], sim_final[r], f"rank {r} ")


GOSSIP = ["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.block_momentum=0.9"]


def test_accelerate_launch_gossip_bmuf(tmp_path):
    launch(accelerate_cmd(tmp_path, "--steps", "20", *GOSSIP), tmp_path)
    check_against_simulator(tmp_path, GOSSIP, 20)


def test_accelerate_launch_gradient_accumulation(tmp_path):
    overrides = ["sync.algorithm=bmuf", "sync.block_momentum=0.5"]
    launch(accelerate_cmd(tmp_path, "--steps", "12", "--accum", "2", *overrides), tmp_path)
    check_against_simulator(tmp_path, overrides, 12, accum=2)


def test_torchrun(tmp_path):
    cmd = [str(BIN / "torchrun"), "--nnodes", "1", "--nproc_per_node", str(WORLD), "--master_port", str(free_port()),
           str(SCRIPT), str(tmp_path), "--steps", "16", *GOSSIP]
    launch(cmd, tmp_path)
    check_against_simulator(tmp_path, GOSSIP, 16)


def test_launch_sh_help_and_bad_launcher():
    root = Path(__file__).parent.parent
    ok = subprocess.run(["bash", str(root / "utils/launch.sh"), "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "--num-workers" in ok.stdout + ok.stderr
    bad = subprocess.run(["bash", str(root / "utils/launch.sh"), "--launcher", "mpi", "--", "x.py"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "accelerate or torchrun" in bad.stderr
