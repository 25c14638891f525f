"""gossip_accel.train: the shared epoch loop's records. The sync settings line and results.json's
``sync_settings``, the per-epoch validation of the replicas' average beside the replicas' mean,
and ``train.warmup_epochs``."""
from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.train import checkpoint as ckpt
from gossip_accel.train.config import warmup_in_steps
from gossip_accel.train.describe import settings_line, sync_settings
from gossip_accel.train.process_group import free_port

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "recipes" / "wikitext103" / "lm1" / "conf"
TINY = ["model.hidden_size=32", "model.projection_size=16", "model.embedding_dim=16", "model.head_size=40",
        "model.num_tails=1", "train.streams=4", "train.bptt=8", "train.max_steps_per_epoch=10", "train.epochs=2",
        "sync.period=4", "sync.components.0.period=8"]


# -- train.warmup_epochs ---------------------------------------------------------------------------------
def test_warmup_epochs_become_warmup_steps():
    cfg = load_sync_config(None, ["sync.algorithm=bmuf", "sync.warmup_period=2"])
    assert warmup_in_steps(cfg, 0.5, 10).warmup_steps == 5
    assert warmup_in_steps(cfg, 1.25, 7).warmup_steps == 9          # round(8.75)
    assert warmup_in_steps(cfg, 2, 10).warmup_period == 2            # the rest of sync.* unchanged
    assert warmup_in_steps(cfg, None, 10) is cfg                     # null: sync.warmup_steps as it is
    assert cfg.warmup_steps == 0                                     # a copy, not an edit


def test_warmup_epochs_and_steps_together_or_for_another_algorithm_are_errors():
    both = load_sync_config(None, ["sync.algorithm=bmuf", "sync.warmup_steps=40"])
    with pytest.raises(ConfigError, match=r"train.warmup_epochs=1.0 and sync.warmup_steps=40 both set the warm-up"):
        warmup_in_steps(both, 1.0, 10)
    with pytest.raises(ConfigError, match=r"train.warmup_epochs=-1 must be >= 0"):
        warmup_in_steps(load_sync_config(None), -1, 10)
    with pytest.raises(ConfigError, match=r"^train.warmup_epochs=1: a warm-up is defined for ma, bmuf, .*; "
                                          r"add train.warmup_epochs=null for easgd$"):
        warmup_in_steps(load_sync_config(None, ["sync.algorithm=easgd"]), 1, 10)
    assert warmup_in_steps(load_sync_config(None, ["sync.algorithm=easgd"]), 0, 10).warmup_steps == 0
    # DDP and one worker (the synchronizer off) take a conf's warm-up as it is: it never runs
    assert warmup_in_steps(load_sync_config(None, ["sync.enabled=false"]), 10, 40).warmup_steps == 400


def test_epoch_caps_are_one_of_two_positive_numbers():
    from gossip_accel.train.config import RunConf, check_epoch_caps

    check_epoch_caps(RunConf(max_batches_per_epoch=157))
    with pytest.raises(ConfigError, match=r"train.max_steps_per_epoch=40 and train.max_batches_per_epoch=157: give one"):
        check_epoch_caps(RunConf(max_steps_per_epoch=40, max_batches_per_epoch=157))
    with pytest.raises(ConfigError, match=r"train.max_batches_per_epoch=0: must be >= 1"):
        check_epoch_caps(RunConf(max_batches_per_epoch=0))


# -- the sync settings ----------------------------------------------------------------------------------
def test_sync_settings_resolve_eta_p_q_for_the_replicas():
    cfg = load_sync_config(None, ["sync.algorithm=gossip_bmuf", "sync.exchange_dtype=bfloat16",
                                  "sync.components=[{name: embedding, pattern: '^emb', period: 128}, {name: rest}]"])
    s = sync_settings(SimpleNamespace(cfg=cfg, world_size=4), 4)
    assert s == {"algorithm": "gossip_bmuf", "workers": 4, "replicas": 4, "eta": cfg.resolved_block_momentum(4),
                 "zeta": 1.0, "nesterov": True, "p": 1, "q": 1, "periods": "(16,128)", "warmup_steps": 0,
                 "warmup_period": 1, "wire": "bfloat16", "warmup_kind": "average", "inner_state": "keep"}
    assert s["eta"] == pytest.approx(0.75)                           # eq. 6 of 001: 1 - 1 / (zeta n)
    assert settings_line(s) == ("gossip_bmuf eta=0.75 zeta=1 (NBM) p=1 q=1, periods (16,128), warm-up 0 steps "
                                "(period 1), wire bfloat16, 4 replicas")
    ma = sync_settings(SimpleNamespace(cfg=load_sync_config(None, ["sync.algorithm=ma"]), world_size=8), 8)
    assert ma["eta"] is ma["zeta"] is ma["p"] is ma["q"] is None and settings_line(ma).startswith("ma, periods (16)")
    assert settings_line(sync_settings(None, 3)) == "ddp: gradient all-reduce every step over 3 workers, no model sync"
    assert sync_settings(None, 1) == {"algorithm": "single", "workers": 1}
    grads = sync_settings(SimpleNamespace(cfg=load_sync_config(None, [
        "sync.warmup_steps=32", "sync.warmup_kind=gradients", "sync.inner_state=average"]), world_size=4), 4)
    assert settings_line(grads).endswith("warm-up 32 steps (gradients, period 1), wire float32, 4 replicas, "
                                         "inner optimizer state: average")


# -- a 2-worker run: the line, results.json, the averaged model's validation --------------------------
@pytest.fixture(scope="module")
def bmuf_run(tmp_path_factory) -> tuple[Path, Path, str]:
    from gossip_accel.data.lm import Vocabulary, read_lines

    d = tmp_path_factory.mktemp("lm_data")
    rng = random.Random(1)
    words = [f"w{i}" for i in range(100)]
    for name, lines in (("wiki.train.tokens", 200), ("wiki.valid.tokens", 20), ("wiki.test.tokens", 10)):
        (d / name).write_text("".join(" ".join(rng.choices(words, k=rng.randint(5, 15))) + "\n" for _ in range(lines)))
    Vocabulary.build(read_lines(d / "wiki.train.tokens")).save(d / "vocab.txt")
    exp = tmp_path_factory.mktemp("exp") / "bmuf"
    cmd = ["bash", str(ROOT / "utils" / "launch.sh"), "--num-workers", "2", "--port", str(free_port()), "--",
           "-m", "gossip_accel.bin.train_lm", "--config", str(CONF / "mini.yaml"), "--config",
           str(CONF / "period_16_128.yaml"), "--exp-dir", str(exp), f"data.dir={d}", "sync.algorithm=bmuf",
           "sync.block_momentum=null", "sync.warmup_steps=0", "sync.warmup_period=1",
           "sync.exchange_dtype=float32", "train.warmup_epochs=0.5", *TINY,
           # the epoch as batches of both workers: ceil(19 / 2) = 10 steps each (the asserts below)
           "train.max_steps_per_epoch=null", "train.max_batches_per_epoch=19"]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return d, exp, proc.stdout + proc.stderr


def test_run_states_its_sync_settings_in_the_log_and_results(bmuf_run):
    _, exp, log = bmuf_run
    res = json.loads((exp / "results.json").read_text())
    eta = load_sync_config(None, ["sync.algorithm=bmuf"]).resolved_block_momentum(2)
    assert res["sync_settings"] == {"algorithm": "bmuf", "workers": 2, "replicas": 2, "eta": eta, "zeta": 1.0,
                                    "nesterov": True, "p": None, "q": None, "periods": "(4,8)", "warmup_steps": 5,
                                    "warmup_period": 1, "wire": "float32", "warmup_kind": "average",
                                    "inner_state": "keep"}
    assert res["sync"]["warmup_steps"] == 5                          # round(0.5 epochs * 10 steps)
    line = "[train_lm] bmuf sync: bmuf eta=0.5 zeta=1 (NBM), periods (4,8), warm-up 5 steps (period 1), wire float32"
    assert log.count(line) == 1, log[-3000:]


def test_each_epoch_logs_the_bytes_sent_so_far(bmuf_run):
    """history[*].bytes_sent_per_worker: the curve against traffic (compare_runs.epoch_ends) without
    spreading the warm-up's bytes over the run."""
    _, exp, _ = bmuf_run
    res = json.loads((exp / "results.json").read_text())
    sent = [row["bytes_sent_per_worker"] for row in res["history"]]
    assert 0 < sent[0] <= sent[1] <= res["bytes_sent_per_worker"]    # the final average comes after the last row
    assert sent[0] > sent[1] - sent[0]          # epoch 1 holds the 5 warm-up averages (every step), epoch 2 none


def test_each_epoch_validates_the_average_of_the_replicas(bmuf_run):
    from gossip_accel.bin.train_lm import build_model, load_conf, perplexity
    from gossip_accel.data.lm import Vocabulary, batchify, read_lines

    data, exp, log = bmuf_run
    res = json.loads((exp / "results.json").read_text())
    conf = load_conf([str(exp / "config.yaml")], [])
    vocab = Vocabulary.load(data / "vocab.txt")
    valid = batchify(vocab.encode(read_lines(data / "wiki.valid.tokens")), conf.train.streams)
    model = build_model(conf, vocab)
    for row in res["history"]:
        entry = next(e for e in ckpt.list_complete(exp / "checkpoints") if e.epoch_end and e.epoch == row["epoch"])
        replicas = [ckpt.verify_and_load(entry.path / f"rank{r}.pt")[0]["model"] for r in range(2)]
        # the replicas themselves were left alone: they still differ (the embedding's period 8 did not end)
        assert not all(torch.equal(replicas[0][k], replicas[1][k]) for k in replicas[0])
        ppl = []
        for state in (*replicas, ckpt.average_model(exp / "checkpoints", entry)):
            model.load_state_dict(state)
            ppl.append(perplexity(model, valid, conf.train.bptt))
        assert row["valid_ppl_replicas"] == pytest.approx((ppl[0] + ppl[1]) / 2, rel=1e-9)
        assert row["valid_ppl"] == pytest.approx(ppl[2], rel=1e-9) and row["valid_ppl"] != row["valid_ppl_replicas"]
        assert f"epoch {row['epoch']}: 10 steps" in log and f"valid ppl {row['valid_ppl']:.2f} (averaged model)" in log
    # the last epoch's averaged model is the model the run returns (the final average, Algorithm 1 line 20)
    assert res["history"][-1]["valid_ppl"] == pytest.approx(res["final_valid_ppl"], rel=1e-9)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(exp / "tensorboard")).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"valid/ppl", "valid/ppl_replicas", "valid/ppl_final"} <= tags
    assert [e.value for e in events.Scalars("valid/ppl")] == pytest.approx([r["valid_ppl"] for r in res["history"]])
