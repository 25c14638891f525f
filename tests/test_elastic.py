"""Elastic resume (train.elastic): a checkpoint of 4 workers continues on 3 and on 2.

The LM trainer (gossip-BMUF, tiny data as tests/test_faults.py) runs on 4 gloo workers through
``utils/launch.sh`` and rank 3 kills itself (SIGKILL) after step 14, with no restarts: the job
fails, leaving the epoch-1 checkpoint (step 10) and the mid-epoch one of epoch 2 (step 12). Then,
through the same launcher with fewer workers:

* 4 -> 3 from the mid-epoch checkpoint: the rest of epoch 2 is re-sharded over 3 workers, the run
  finishes its 20 steps and logs the one resume line;
* 4 -> 2 from the epoch-1 checkpoint with ``train.epochs=1`` (nothing left to train) and
  ``sync.algorithm=bmuf`` (a ring needs 3 nodes; the gossip slots go on as BMUF's): the final
  model is the model the 2 workers started from, and it equals the mean of the 4 replicas.

In one process: the re-sharding rules (every token / batch of the epoch fed once), the merge of
model, optimizer and synchronizer states, and ``select`` with and without the elastic loader
(the old refusal, ``train.elastic=false``; a damaged old rank's file falls back to the previous one).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gossip_accel.data.asr import epoch_batches
from gossip_accel.data.lm import bptt_windows, rest_of_stream, worker_streams
from gossip_accel.sync.config import ConfigError
from gossip_accel.sync.elastic import mean_tree, merge_states, slots_identical
from gossip_accel.train import checkpoint as ckpt
from gossip_accel.train import elastic
from gossip_accel.train.config import RunConf, run_options
from test_faults import finish, launch, lm_data  # noqa: F401 - lm_data is a fixture

EPOCHS2 = ["train.epochs=2", "sync.warmup_steps=0"]  # no warm-up: gossip slots differ per rank at once


@pytest.fixture(scope="module")
def killed(lm_data, tmp_path_factory) -> Path:  # noqa: F811
    """A 4-worker run whose rank 3 dies after step 14 (no restart): its checkpoints stay."""
    exp = tmp_path_factory.mktemp("killed")
    proc = launch(exp, lm_data, *EPOCHS2, fault="KILL@14:rank3")
    proc.wait(400)
    assert proc.returncode != 0
    names = [e.path.name for e in ckpt.list_complete(exp / "checkpoints")]
    assert names[:2] == ["epoch2_step12", "epoch1"], names
    return exp


def copy_run(src: Path, dst: Path, keep: list[str]) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in keep:
        shutil.copytree(src / "checkpoints" / name, dst / "checkpoints" / name)
    return dst


@pytest.fixture(scope="module")
def resumed(killed, lm_data, tmp_path_factory) -> dict:  # noqa: F811
    """4 -> 3 from the mid-epoch checkpoint and 4 -> 2 from the epoch end, at the same time."""
    three = copy_run(killed, tmp_path_factory.mktemp("three"), ["epoch2_step12", "epoch1"])
    two = copy_run(killed, tmp_path_factory.mktemp("two"), ["epoch1"])
    procs = (launch(three, lm_data, *EPOCHS2, workers=3), launch(two, lm_data, "train.epochs=1", "sync.warmup_steps=0",
                                                                        "sync.algorithm=bmuf", workers=2))
    return {"three": three, "two": two, "three_log": finish(procs[0], three), "two_log": finish(procs[1], two),
            "killed": killed}


def test_4_to_3_mid_epoch_resharded_and_finished(resumed):
    log = resumed["three_log"]
    assert ("[train] resuming a 4-worker checkpoint on 3 workers (epoch 2, step 12): replicas averaged (Algorithm 1, "
            "line 20), BMUF slots averaged over 4 ranks, optimizer state averaged, lr schedule and step counter "
            "carried, the rest of epoch 2 (after 8 batches) re-sharded over 3 workers; eta (eq. 6) re-derived for 3 "
            "workers: 0.667 (0.750 for 4)") in log, log[-4000:]
    res = json.loads((resumed["three"] / "results.json").read_text())
    assert res["workers"] == 3 and res["steps_per_worker"] == 20 and [h["epoch"] for h in res["history"]] == [1, 2]
    assert res["history"][1]["steps"] == 8  # train.max_steps_per_epoch=10 less the 2 the 4 workers ran
    assert res["sync_settings"]["eta"] == pytest.approx(2 / 3)
    # a checkpoint written after the resume carries the 4-worker segment (a same-world resume continues it)
    end = torch.load(resumed["three"] / "checkpoints" / "epoch2_step15" / "rank0.pt", weights_only=True)
    assert end["world_size"] == 3 and end["extra"]["segments"] == [[4, 2]] and end["extra"]["next_batch"] == 3


def test_4_to_2_starts_from_the_mean_of_the_4_replicas(resumed):
    log = resumed["two_log"]
    assert ("[train] resuming a 4-worker checkpoint on 2 workers (end of epoch 1): replicas averaged (Algorithm 1, "
            "line 20), BMUF slots averaged over 4 ranks (gossip_bmuf continues as bmuf)") in log, log[-4000:]
    assert "epoch 2 sharded over 2 workers; eta (eq. 6) re-derived for 2 workers: 0.500 (0.750 for 4)" in log
    killed = resumed["killed"] / "checkpoints"
    mean = ckpt.average_model(killed, next(e for e in ckpt.list_complete(killed) if e.path.name == "epoch1"))
    final = torch.load(resumed["two"] / "final.pt", weights_only=True)
    assert final.keys() == mean.keys()
    for k in mean:  # the final average of 2 equal replicas: fp32 rounding only
        torch.testing.assert_close(final[k], mean[k], rtol=1e-6, atol=1e-7)
    res = json.loads((resumed["two"] / "results.json").read_text())
    assert res["steps_per_worker"] == 10 and len(res["history"]) == 1


# -- the merge, in one process ----------------------------------------------------------------------
def old_states(killed: Path, name: str) -> list[dict]:
    return [ckpt.verify_and_load(killed / "checkpoints" / name / f"rank{r}.pt")[0] for r in range(4)]


def test_merged_state_averages_model_optimizer_and_gossip_slots(killed):
    states = old_states(killed, "epoch2_step12")
    merged = elastic.merge_run_states(states, rank=1, world=3)
    for k, v in merged["model"].items():
        want = sum(s["model"][k].double() for s in states) / 4
        torch.testing.assert_close(v, want.to(v.dtype), rtol=0, atol=0)
    opt = merged["optimizer"]["state"][0]["sum"]  # Adagrad's sum of squares, averaged
    torch.testing.assert_close(opt, (sum(s["optimizer"]["state"][0]["sum"].double() for s in states) / 4).float())
    assert merged["scheduler"] == states[0]["scheduler"] and merged["step"] == 12 and merged["world_size"] == 3
    assert merged["rng"] is states[1]["rng"] and "epoch_state" not in merged["extra"]
    assert merged["extra"]["next_batch"] == 2 and merged["elastic"] == {"from_world": 4, "algorithm": "gossip_bmuf",
                                                                  "slots_identical": False}
    sync = merged["sync"]
    assert sync["merged_from"] == 4 and sync["t"] == 12 and sync["world_size"] is None
    for name, slot in sync["slots"].items():  # gossip-BMUF: every rank has its own omega and Delta
        want = sum(s["sync"]["slots"][name]["omega"].double() for s in states) / 4
        torch.testing.assert_close(slot["omega"], want.float(), rtol=0, atol=0)
    sent = [s["sync"]["comm"]["lstm"]["bytes_sent"] for s in states]
    assert sync["comm"]["lstm"]["bytes_sent"] == pytest.approx(sum(sent) / 4)
    assert elastic.merge_run_states(states, rank=3, world=5)["rng"] is states[3]["rng"]
    assert elastic.merge_run_states(states, rank=4, world=5)["rng"] is None  # beyond the old world: own seeding


def test_identical_slots_are_carried_bit_for_bit_and_other_families_refused():
    omega = torch.randn(5)
    states = [{"version": 1, "t": 7, "algorithm": "bmuf", "outer_optimizer": None, "seed": 0, "components": {"a": 5},
               "world_size": 4, "rank": r, "slots": {"a": {"omega": omega.clone(), "delta": omega * 0.5}},
               "comm": {"a": {"bytes_sent": 10.0 * (r + 1), "bytes_recv": 1.0, "seconds": 0.1, "calls": 3}},
               "engine": {}} for r in range(4)]
    assert slots_identical(states)
    merged = merge_states(states)
    assert torch.equal(merged["slots"]["a"]["omega"], omega) and merged["comm"]["a"]["bytes_sent"] == 25.0
    assert mean_tree([0.1, 0.1, 0.1]) == 0.1 and mean_tree([1.0, 2.0]) == 1.5 and mean_tree([3, 4]) == 3
    states[2]["slots"]["a"]["omega"] = omega + 1
    assert not slots_identical(states)
    with pytest.raises(ConfigError, match=r"sync.algorithm=easgd \(server family\) .* resumes on 4 workers only"):
        merge_states([{**s, "algorithm": "easgd"} for s in states])
    with pytest.raises(ConfigError, match=r"differ in t"):
        merge_states([{**s, "t": s["rank"]} for s in states])


# -- the re-sharding rules ----------------------------------------------------------------------------
def fed_inputs(ids, world: int, streams: int, bptt: int, done: int, layout: str = "contiguous") -> list[int]:
    """The tokens the first ``done`` windows of every rank fed as inputs."""
    out = []
    for r in range(world):
        for i, (x, _) in enumerate(bptt_windows(worker_streams(ids, r, world, streams, layout), bptt)):
            if i < done:
                out.extend(x.reshape(-1).tolist())
    return out


@pytest.mark.parametrize("layout", ["contiguous", "interleaved"])
@pytest.mark.parametrize("old,new", [(4, 3), (4, 2), (3, 5)])
def test_lm_rest_of_stream_feeds_every_remaining_token_once(old, new, layout):
    ids, streams, bptt, done = torch.arange(10_000), 4, 8, 30
    before = fed_inputs(ids, old, streams, bptt, done, layout)
    rest = rest_of_stream(ids, old, streams, done * bptt, layout)
    after = fed_inputs(rest, new, streams, bptt, 10**9, layout)  # the new workers' windows to the end of the epoch
    assert len(set(before)) == len(before) and len(set(after)) == len(after) and not set(before) & set(after)
    lost = set(range(10_000)) - set(before) - set(after)
    # only tails: what shard/batchify drop and the last column of each stream (a target, never an input)
    assert len(lost) <= old * (streams + 1) + new * (2 * streams + 1), len(lost)
    # two segments: 4 workers, then 3, then 2
    rest2 = rest_of_stream(rest, new, streams, 5 * bptt, layout)
    assert not set(rest2.tolist()) & (set(before) | set(fed_inputs(rest, new, streams, bptt, 5, layout)))


def test_asr_rest_of_epoch_continues_the_shuffled_list():
    batches = [[i] for i in range(50)]
    ran = [b for r in range(4) for b in epoch_batches(batches, 2, 1, r, 4)[:6]]  # 4 workers, 6 each
    start = elastic.batches_done([(4, 6)])
    rest = [b for r in range(3) for b in epoch_batches(batches, 2, 1, r, 3, start=start)]
    assert sorted(ran + rest) == batches  # every batch once


def test_segments_and_the_step_budget():
    from gossip_accel.train.loop import local_steps

    segs = elastic.segments_after([[4, 2]], 3, 5)
    assert segs == [(4, 2), (3, 5)] and elastic.steps_done(segs) == 7 and elastic.batches_done(segs) == 23
    conf = RunConf(max_steps_per_epoch=10)
    assert local_steps(range(100), conf, segs, 2) == 3 and local_steps(range(2), conf, segs, 2) == 2
    # an epoch of 40 batches of all workers: 23 consumed, the rest shared by 2 workers, rounded up
    batches = RunConf(max_batches_per_epoch=40)
    assert local_steps(range(100), batches, segs, 2) == 9 and local_steps(range(100), batches, (), 3) == 14
    assert local_steps(range(5), batches, segs, 2) == 5 and local_steps(range(100), RunConf(), segs, 2) == 100
    assert run_options(RunConf())["elastic"] is True


# -- select: the elastic loader, and the old refusal (train.elastic=false) ------------------------------
def test_select_merges_for_the_new_world_or_refuses(killed):
    root = killed / "checkpoints"
    lines: list[str] = []
    entry, state = ckpt.select(root, 3, lines.append, elastic.loader(3, lines.append))
    assert entry.path.name == "epoch2_step12" and entry.world_size == 4 and state["world_size"] == 3
    mean = ckpt.average_model(root, entry)
    assert all(torch.equal(state["model"][k], mean[k]) for k in mean) and not lines
    with pytest.raises(ckpt.CheckpointError, match=r"epoch2_step12 was written by 4 workers, this run has 3: "
                                                    r".*train.elastic=true resumes it on 3"):
        ckpt.select(root, 3)
    broken = killed.parent / "broken"  # an old rank's file damaged: reported, the previous checkpoint merged
    shutil.copytree(root, broken)
    (broken / "epoch2_step12" / "rank2.pt").write_bytes(b"x")
    entry, _ = ckpt.select(broken, 3, lines.append, elastic.loader(3, lines.append))
    assert entry.path.name == "epoch1" and any("elastic resume reads every old rank's file" in x and "rank2.pt" in x
                                                for x in lines), lines


def test_launch_sh_elastic_nodes_need_torchrun_and_a_range():
    import subprocess

    launch_sh = str(Path(__file__).resolve().parent.parent / "utils" / "launch.sh")
    for args, message in ((["--num-nodes", "1:2"], "needs --launcher torchrun"),
                          (["--launcher", "torchrun", "--num-nodes", "3:2"], "need 1 <= MIN <= MAX"),
                          (["--launcher", "torchrun", "--num-nodes", "x:2"], "must be two integers")):
        bad = subprocess.run(["bash", launch_sh, *args, "--", "x.py"], capture_output=True, text=True)
        assert bad.returncode == 1 and message in bad.stderr, bad.stderr
