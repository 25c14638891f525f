"""The user docs' code blocks are run or checked: every python/json/yaml block of README.md and
docs/DEEPSPEED.md carries a marker (tests/docs_examples.py), every ``example`` has a test that runs
it, every ``file`` block equals its file. Runs README's configuration block and DEEPSPEED.md's
Accelerate + DeepSpeed script (bf16, gradient accumulation 2) as printed with 2 CPU processes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from docs_examples import DOCS, ROOT, RUN_BY, blocks, example, run_as_printed

CHECKED_LANGS = ("python", "json", "yaml")


@pytest.mark.parametrize("doc", DOCS)
def test_every_code_block_is_run_checked_or_marked_a_fragment(doc):
    for b in blocks(doc):
        if b["lang"] not in CHECKED_LANGS:
            continue
        where = f"{doc}:{b['line']}"
        assert b["kind"], f"{where}: a {b['lang']} block without '<!-- example: NAME -->', '<!-- file: PATH -->' " \
                          f"or '<!-- fragment -->' before it"
        if b["kind"] == "example":
            assert b["arg"] in RUN_BY, f"{where}: example {b['arg']!r} is run by no test (tests/docs_examples.py RUN_BY)"
            test_file, test_name = RUN_BY[b["arg"]].split("::")
            assert f"def {test_name}(" in (ROOT / test_file).read_text(), f"{RUN_BY[b['arg']]} does not exist"
        if b["kind"] == "file":
            assert (ROOT / b["arg"]).read_text() == b["code"], f"{where}: the block differs from {b['arg']}"


def test_readme_config_block_loads(tmp_path):
    from gossip_accel.sync.config import load_sync_config

    (tmp_path / "sync.yaml").write_text(example("readme-config"))
    cfg = load_sync_config(str(tmp_path / "sync.yaml"))
    assert cfg.algorithm == "gossip_bmuf" and cfg.period == 16 and [c.name for c in cfg.components] == \
        ["embedding", "tail", "rest"]


CHECK = """
import os as _os
torch.save({"state": accelerator.unwrap_model(engine).state_dict(), "t": sync.t, "world": sync.world_size,
            "global_steps": engine.global_steps, "kind": type(sync).__name__,
            "dtype": str(next(engine.module.parameters()).dtype)},
           _os.path.join(_os.environ["GUIDE_OUT"], f"rank{accelerator.process_index}.pt"))
"""


def test_deepspeed_accelerate_example_runs_as_printed(tmp_path):
    from test_launchers import free_port

    world = 2
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", "conf/accelerate_ds.yaml",
           "--num_processes", str(world), "--main_process_port", str(free_port())]
    run_as_printed(tmp_path, example("deepspeed-accelerate") + CHECK, cmd)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
    micro = 256 // (8 * world)  # Accelerate shards the 256 samples over the ranks, micro-batches of 8
    for r in ranks:  # gradient accumulation 2: one optimizer step (and one sync count) per 2 micro-batches
        assert r["world"] == world and r["kind"] == "DeepSpeedSynchronizer" and r["dtype"] == "torch.bfloat16"
        assert r["global_steps"] == micro // 2 and r["t"] == micro // 2
    for k, v in ranks[1]["state"].items():  # the final average (line 20): every replica equal
        torch.testing.assert_close(v, ranks[0]["state"][k], atol=0, rtol=0)
