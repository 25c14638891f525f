"""The LM recipes: confs load and split the paper's model exactly; a 2-worker launch; exact resume."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gossip_accel.bin.train_lm import build_model, load_conf
from gossip_accel.sync.components import split_components
from gossip_accel.sync.config import load_sync_config
from gossip_accel.data.lm import Vocabulary
from gossip_accel.train.process_group import free_port

ROOT = Path(__file__).resolve().parent.parent
RECIPES = [ROOT / "recipes" / "wikitext103" / "lm1", ROOT / "recipes" / "gutenberg" / "lm1"]


def fake_vocab(size: int) -> Vocabulary:
    words = [f"w{i}" for i in range(size - 2)] + ["<unk>", "<eos>"]
    return Vocabulary(words, [size - i for i in range(size)])


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.parts[-2])
@pytest.mark.parametrize("model_conf", ["lstmp.yaml", "mini.yaml"])
@pytest.mark.parametrize("periods", ["8", "16_128"])
def test_component_split_covers_every_parameter_once(recipe, model_conf, periods):
    conf = load_conf([str(recipe / "conf" / model_conf), str(recipe / "conf" / f"period_{periods}.yaml")], [])
    model = build_model(conf, fake_vocab(12000))
    from omegaconf import OmegaConf

    sync = load_sync_config(OmegaConf.to_container(conf.sync))
    comps = split_components(model.named_parameters(), sync.components, sync.period)
    covered: dict[str, int] = {}
    for c in comps:
        for piece in c.pieces:
            base = piece.name.split("[")[0]
            covered[base] = covered.get(base, 0) + piece.view.numel()
    assert covered == {n: p.numel() for n, p in model.named_parameters()}
    names = [c.name for c in comps]
    n_tails = conf.model.num_tails
    assert names == [f"embedding.shard{j}" for j in range(8)] + ["lstm", "projection", "softmax_head"] + [
        f"softmax_tail.{j}" for j in range(n_tails)]
    want = {"8": {8}, "16_128": {16, 128}}[periods]
    assert {c.period for c in comps} == want
    if periods == "16_128":
        assert all((c.period == 128) == c.name.startswith("embedding") for c in comps)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.parts[-2])
def test_recipe_help(recipe):
    proc = subprocess.run(["bash", str(recipe / "run.sh"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "--algorithms" in proc.stdout + proc.stderr and "--num-workers" in proc.stdout + proc.stderr


TINY = ["train.max_steps_per_epoch=12", "model.hidden_size=64", "model.projection_size=32",
        "model.embedding_dim=32", "sync.components.0.period=8", "sync.period=4"]


def run_recipe(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = ["bash", str(RECIPES[0] / "run.sh"), "--data", str(tmp / "data"), "--port", str(free_port()), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def launch_train(tmp: Path, exp: Path, *overrides: str) -> None:
    recipe = RECIPES[0]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = ["bash", str(ROOT / "utils" / "launch.sh"), "--num-workers", "2", "--port", str(free_port()), "--",
           "-m", "gossip_accel.bin.train_lm", "--config", str(recipe / "conf" / "mini.yaml"),
           "--config", str(recipe / "conf" / "period_16_128.yaml"), "--exp-dir", str(exp),
           f"data.dir={tmp / 'data'}", "sync.algorithm=bmuf", *TINY, *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=recipe)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_two_worker_recipe_run_and_exact_resume(tmp_path):
    # the mini recipe, stages 0-3, 2 workers, BMUF (16,128) scaled to a few steps
    proc = run_recipe(tmp_path, "--stop-stage", "3", "--algorithms", "bmuf", "--num-workers", "2",
                      "--epochs", "2", "--exp", str(tmp_path / "exp"), "--", *TINY)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "MINI corpus" in proc.stderr
    full = tmp_path / "exp" / "bmuf-16_128-n2"
    res = json.loads((full / "results.json").read_text())
    assert res["workers"] == 2 and res["epochs"] == 2 and res["steps_per_worker"] == 24
    assert res["final_test_ppl"] > 1 and [h["epoch"] for h in res["history"]] == [1, 2]
    assert (full / "checkpoints" / "epoch2" / "done").is_file()

    # checkpoint averaging of an LM run: its epoch-end checkpoints ranked by valid ppl, then eval_lm --model
    for cmd in (["gossip_accel.bin.average_checkpoints", "--exp-dir", str(full), "--avg", "2", "--avg-mode", "best"],
                ["gossip_accel.bin.eval_lm", "--exp-dir", str(full), "--model", str(full / "avg_best2.pt"), "--every-epoch"]):
        r = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    averaged = json.loads((full / "results.json").read_text())
    assert averaged["avg_best2_test_ppl"] > 1 and averaged["final_test_ppl"] == res["final_test_ppl"]
    assert json.loads((full / "avg_best2.json").read_text())["epochs"] == [1, 2]
    assert list(averaged["epoch_test_ppl"]) == ["1", "2"]                       # the epoch-end checkpoints' models
    assert averaged["epoch_valid_ppl"]["2"] == pytest.approx(res["final_valid_ppl"], rel=1e-6)  # the last is final.pt
    res = averaged

    # the same run stopped after epoch 1 and resumed: identical model and perplexity
    part = tmp_path / "exp" / "resumed"
    launch_train(tmp_path, part, "train.epochs=1")
    launch_train(tmp_path, part, "train.epochs=2")
    resumed = json.loads((part / "results.json").read_text())
    assert resumed["final_valid_ppl"] == pytest.approx(res["final_valid_ppl"], rel=1e-6)
    assert resumed["history"] == res["history"]
    a = torch.load(full / "final.pt", weights_only=True)
    b = torch.load(part / "final.pt", weights_only=True)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)

    # a tagged variant of the same algorithm sits beside the untagged run; the comparison holds both,
    # and without a DDP or single run it has no baseline (no run compared with itself)
    tagged = run_recipe(tmp_path, "--stage", "2", "--algorithms", "bmuf", "--num-workers", "2", "--epochs", "1",
                        "--tag", "lr05", "--exp", str(tmp_path / "exp"), "--", *TINY, "train.lr=0.05")
    assert tagged.returncode == 0, tagged.stdout[-2000:] + tagged.stderr[-4000:]
    variant = json.loads((tmp_path / "exp" / "bmuf-16_128-n2-lr05" / "results.json").read_text())
    assert variant["name"] == "bmuf-16_128-n2-lr05" and variant["epochs"] == 1
    assert json.loads((full / "results.json").read_text()) == res          # the untagged run is untouched
    table = (tmp_path / "exp" / "compare" / "RESULTS.md").read_text()
    assert "| bmuf-16_128-n2 | 2 |" in table and "| bmuf-16_128-n2-lr05 | 2 |" in table
    assert "No baseline" in table and " vs " not in table
