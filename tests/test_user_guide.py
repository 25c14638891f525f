"""README.md's own-loop examples run as printed, under torchrun with 4 CPU workers.

The blocks are taken from README.md by their markers (tests/docs_examples.py), not copied here,
run in a directory that sees the repository's conf/ (they name conf/sync.yaml), and followed only
by a few lines that save what the test checks.

* ``readme-accelerate``: every rank ran in one 4-process group, counted its optimizer steps, and
  ended with the same replica;
* ``readme-checkpoint``: a run stopped after its step-12 checkpoint (mid-epoch) and resumed from it
  in new processes has, at its step-24 checkpoint and at the end, exactly the replicas of the
  uninterrupted run: order (synchronizer, then the rank's file), data position and per-rank files.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import torch

from docs_examples import ROOT, example, run_as_printed

WORLD = 4
CHECK = """
import os as _os
torch.save({"state": accelerator.unwrap_model(model).state_dict(), "t": sync.t, "world": sync.world_size,
            "finalized": sync.finalized},
           _os.path.join(_os.environ["GUIDE_OUT"], f"rank{accelerator.process_index}.pt"))
"""


def torchrun(world: int = WORLD) -> list[str]:
    from test_launchers import free_port

    return [str(Path(sys.executable).parent / "torchrun"), "--nnodes", "1", "--nproc_per_node", str(world),
            "--master_port", str(free_port())]


def test_readme_blocks_name_files_that_exist():
    for name in ("readme-accelerate", "readme-checkpoint"):
        for path in re.findall(r'"(conf/[\w./-]+\.yaml)"', example(name)):
            assert (ROOT / path).is_file(), f"README.md's example {name} names {path}, which does not exist"


def test_readme_accelerate_example_runs_as_printed(tmp_path):
    run_as_printed(tmp_path, example("readme-accelerate") + CHECK, torchrun())
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    steps = 512 // (8 * WORLD)  # Accelerate shards the 512 samples over the 4 ranks, batches of 8
    for r in ranks:
        assert r["world"] == WORLD and r["t"] == steps and r["finalized"]
    for r in ranks[1:]:  # the final average (Algorithm 1, line 20): every replica equal
        for k, v in r["state"].items():
            torch.testing.assert_close(v, ranks[0]["state"][k], atol=1e-6, rtol=1e-6)


def test_readme_checkpoint_example_resumes_exactly(tmp_path):
    script = example("readme-checkpoint") + CHECK
    ckpt = tmp_path / "exp" / "my_run"
    run_as_printed(tmp_path, script, torchrun())  # uninterrupted: checkpoints at steps 12 and 24 of 32
    assert (ckpt / "latest").read_text() == "exp/my_run/step24"
    whole = {r: torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)}
    step24 = {r: torch.load(ckpt / "step24" / f"rank{r}.pt", weights_only=True) for r in range(WORLD)}
    assert step24[0]["epoch"] == 1 and step24[0]["batches_done"] == 8       # 16 steps per epoch
    # the replicas differ at step 24 (period 8 ended at 24, but gossip only mixes neighbours)
    assert any(not torch.equal(step24[1]["model"][k], step24[0]["model"][k]) for k in step24[0]["model"])

    # stopped after the step-12 checkpoint (mid epoch 0): new processes resume from it
    shutil.rmtree(ckpt / "step24")
    (ckpt / "latest").write_text("exp/my_run/step12")
    proc = run_as_printed(tmp_path, script, torchrun())
    assert "UsageWarning" not in proc.stderr, proc.stderr[-3000:]  # loaded after the broadcast: no warning
    for r in range(WORLD):
        again = torch.load(ckpt / "step24" / f"rank{r}.pt", weights_only=True)
        assert again["epoch"] == 1 and again["batches_done"] == 8 and again["sync"]["t"] == 24
        for k, v in step24[r]["model"].items():
            assert torch.equal(again["model"][k], v), f"rank {r} {k}: the resumed step-24 replica differs"
        final = torch.load(tmp_path / f"rank{r}.pt", weights_only=True)
        assert final["t"] == 32 and final["finalized"]
        for k, v in whole[r]["state"].items():
            assert torch.equal(final["state"][k], v), f"rank {r} {k}: the resumed final model differs"
