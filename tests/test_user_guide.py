"""README.md's synchronizer example runs as printed: its code block under torchrun with 4 CPU workers.

The block is taken from README.md (not copied here), run from the repository root (it names
conf/sync.yaml), and followed only by a few lines that save what the test checks: every rank
ran in one 4-process group, counted its optimizer steps, and ended with the same replica.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
WORLD = 4
HEADING = "### The synchronizer in an Accelerate loop"
CHECK = """
import os as _os
torch.save({"state": accelerator.unwrap_model(model).state_dict(), "t": sync.t, "world": sync.world_size,
            "finalized": sync.finalized},
           _os.path.join(_os.environ["GUIDE_OUT"], f"rank{accelerator.process_index}.pt"))
"""


def readme_block(heading: str) -> str:
    """The first ```python block after ``heading`` in README.md."""
    text = (ROOT / "README.md").read_text()
    start = text.index(heading)
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m, f"no python block after {heading!r} in README.md"
    return m.group(1)


def test_readme_block_names_files_that_exist():
    for path in re.findall(r'"(conf/[\w./-]+\.yaml)"', readme_block(HEADING)):
        assert (ROOT / path).is_file(), f"README.md's example names {path}, which does not exist"


def test_readme_accelerate_example_runs_as_printed(tmp_path):
    from test_launchers import free_port

    script = tmp_path / "train.py"
    script.write_text(readme_block(HEADING) + CHECK)
    env = dict(os.environ, OMP_NUM_THREADS="1", GUIDE_OUT=str(tmp_path), CUDA_VISIBLE_DEVICES="")
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nnodes", "1", "--nproc_per_node", str(WORLD),
           "--master_port", str(free_port()), str(script)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"README example failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    steps = 512 // (8 * WORLD)  # Accelerate shards the 512 samples over the 4 ranks, batches of 8
    for r in ranks:
        assert r["world"] == WORLD and r["t"] == steps and r["finalized"]
    for r in ranks[1:]:  # the final average (Algorithm 1, line 20): every replica equal
        for k, v in r["state"].items():
            torch.testing.assert_close(v, ranks[0]["state"][k], atol=1e-6, rtol=1e-6)
