"""Multi-node launch on one machine over loopback: two `utils/launch.sh` commands (node ranks 0
and 1, 2 worker processes each, master 127.0.0.1) form ONE 4-rank gloo job, with accelerate and
with torchrun; the ranks train the toy model with gossip-BMUF and must end exactly where the
simulator of 4 workers ends (so the 2 x 2 job is the same job as 4 workers on one machine).
Also: the Slurm script's node-rank/master mapping, without Slurm (a fake srun)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from harness import WORLD
from test_launchers import GOSSIP, check_against_simulator
from gossip_accel.train.process_group import free_port

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = ROOT / "utils" / "launch.sh"
SCRIPT = Path(__file__).parent / "scripts" / "train_toy.py"
STEPS = 16


def two_nodes(launcher: str, out: Path, extra: list[str]) -> None:
    """Start node 1 then node 0 (the order must not matter), wait for both, check both exit 0."""
    assert WORLD == 4
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = []
    for rank in (1, 0):
        cmd = ["bash", str(LAUNCH), "--launcher", launcher, "--num-workers", "2", "--num-nodes", "2",
               "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--port", str(port), "--",
               str(SCRIPT), str(out), "--steps", str(STEPS), *extra]
        log = open(out / f"node{rank}.log", "w")
        procs.append((rank, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        for rank, p, log in procs:
            rc = p.wait(timeout=240)
            log.close()
            assert rc == 0, f"node {rank} exited {rc}:\n" + (out / f"node{rank}.log").read_text()[-4000:]
    finally:
        for _, p, _ in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.parametrize("launcher", ["accelerate", "torchrun"])
def test_two_nodes_two_workers_each(tmp_path, launcher):
    two_nodes(launcher, tmp_path, GOSSIP)
    assert sorted(p.name for p in tmp_path.glob("rank*.pt")) == [f"rank{r}.pt" for r in range(4)]
    finals = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(4)]
    assert all(f["world_size"] == 4 for f in finals), "the two launches did not join one 4-rank job"
    for f in finals[1:]:                     # the final average: identical parameters on every rank
        for k, v in finals[0]["final"].items():
            assert torch.equal(v, f["final"][k]), k
    check_against_simulator(tmp_path, GOSSIP, STEPS)


def test_launch_sh_rejects_bad_node_rank():
    bad = subprocess.run(["bash", str(LAUNCH), "--num-nodes", "2", "--node-rank", "2", "--", "x.py"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "--node-rank 2 must be below --num-nodes 2" in bad.stderr


def test_slurm_script_maps_nodes(tmp_path):
    """utils/slurm.sh under a fake Slurm: one srun for the job (not one per task), each node's
    launch.sh gets SLURM_NODEID as its node rank and the first host of the node list as master."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls.txt"
    # a fake srun that runs the command once per "node", as srun --ntasks-per-node=1 would
    (fake / "srun").write_text(f"""#!/usr/bin/env bash
echo "srun $*" >> {calls}
while [[ $1 == --* ]]; do shift; done        # srun's own options
for n in 0 1; do SLURM_NODEID=$n SLURM_PROCID=$n "$@" || exit 1; done
""")
    (fake / "scontrol").write_text("#!/usr/bin/env bash\n[ \"$1 $2\" = 'show hostnames' ] && printf 'node-a\\nnode-b\\n'\n")
    # a fake launch.sh records its arguments instead of starting workers
    (fake / "launch.sh").write_text(f"#!/usr/bin/env bash\necho \"launch $*\" >> {calls}\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", SLURM_JOB_NODELIST="node-[a-b]",
               SLURM_JOB_NUM_NODES="2", SLURM_JOB_ID="42", GOSSIP_LAUNCH=str(fake / "launch.sh"))
    r = subprocess.run(["bash", str(ROOT / "utils" / "slurm.sh"), "--num-workers", "3", "--port", "29999", "--",
                        "-m", "gossip_accel.bin.train_lm", "--exp-dir", "exp/x"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = calls.read_text().splitlines()
    assert sum(line.startswith("srun ") for line in lines) == 1, lines       # no doubled srun
    assert "--ntasks-per-node=1" in lines[0] and "--nodes=2" in lines[0]
    launches = [line for line in lines if line.startswith("launch ")]
    assert len(launches) == 2
    for rank, line in enumerate(launches):
        assert f"--num-nodes 2 --node-rank {rank} --master-addr node-a --port 29999" in line, line
        assert "--num-workers 3" in line and line.endswith("-- -m gossip_accel.bin.train_lm --exp-dir exp/x")


def test_slurm_script_runs_a_recipe_command_per_node(tmp_path):
    """--run "<recipe command>": each node runs it with its --num-nodes/--node-rank/--master-addr/--port."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls.txt"
    (fake / "srun").write_text(f"""#!/usr/bin/env bash
while [[ $1 == --* ]]; do shift; done
for n in 0 1 2; do SLURM_NODEID=$n "$@" || exit 1; done
""")
    (fake / "scontrol").write_text("#!/usr/bin/env bash\nprintf 'gpu7\\ngpu8\\ngpu9\\n'\n")
    (fake / "recipe.sh").write_text(f"#!/usr/bin/env bash\necho \"recipe $*\" >> {calls}\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", SLURM_JOB_NODELIST="gpu[7-9]",
               SLURM_JOB_NUM_NODES="3", SLURM_JOB_ID="20123")
    r = subprocess.run(["bash", str(ROOT / "utils" / "slurm.sh"), "--run", f"{fake / 'recipe.sh'} --stage 4 --ngpu 8"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = calls.read_text().splitlines()
    assert lines == [f"recipe --num-nodes 3 --node-rank {n} --master-addr gpu7 --port 20123 --stage 4 --ngpu 8"
                     for n in range(3)], lines
