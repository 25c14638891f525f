"""Faults, for real: checkpoints (checksums, pruning, agreement, refusals), a worker killed with
SIGKILL and a worker stopped with SIGSTOP under ``utils/launch.sh --max-restarts``.

The LM trainer (gossip-BMUF, 4 CPU gloo workers, tiny data) runs twice: uninterrupted
(torchrun), and with faults (accelerate launch, --max-restarts 2): attempt 0 has rank 1 kill -9
itself after step 14, attempt 1 has rank 2 SIGSTOP itself after step 17. Both restarts must
resume from the newest checkpoint (steps 12 and 15, every 3 steps), the stopped worker's peers
must fail with a CollectiveTimeout within train.collective_timeout, and the final model must
equal the uninterrupted run's bit for bit (exact resume: data position, LSTM state, RNG
states, optimizer, scheduler, synchronizer slots).
"""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gossip_accel.train import checkpoint as ckpt
from gossip_accel.sync.faults import CollectiveTimeout, PeerLost, guard
from harness import spawn_with_timeout
from gossip_accel.train.process_group import free_port

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "recipes" / "wikitext103" / "lm1" / "conf"
FAULT_TRAIN = ROOT / "tests" / "scripts" / "fault_train.py"
TIMEOUT_S = 8
TINY = ["sync.algorithm=gossip_bmuf", "model.hidden_size=32", "model.projection_size=16", "model.embedding_dim=16",
        "model.head_size=40", "model.num_tails=1", "train.streams=4", "train.bptt=8", "train.max_steps_per_epoch=10",
        "train.epochs=2", "sync.period=3", "sync.components.0.period=6", "sync.components.0.shards=2",
        "train.checkpoint_every_steps=3"]


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory) -> Path:
    from gossip_accel.data.lm import Vocabulary, read_lines

    d = tmp_path_factory.mktemp("lm_data")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(120)]
    weights = [1 / (i + 1) for i in range(120)]
    for name, lines in (("wiki.train.tokens", 300), ("wiki.valid.tokens", 20), ("wiki.test.tokens", 20)):
        (d / name).write_text("".join(" ".join(rng.choices(words, weights, k=rng.randint(5, 15))) + "\n"
                                      for _ in range(lines)))
    Vocabulary.build(read_lines(d / "wiki.train.tokens")).save(d / "vocab.txt")
    return d


def launch(exp: Path, data: Path, *overrides: str, launcher: str = "accelerate", max_restarts: int = 0,
           fault: str = "", workers: int = 4) -> subprocess.Popen:
    """Start a 4-worker training run of utils/launch.sh; ``finish`` waits for it."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GOSSIP_FAULT=fault)
    cmd = ["bash", str(ROOT / "utils" / "launch.sh"), "--num-workers", str(workers), "--launcher", launcher,
           "--port", str(free_port()), "--max-restarts", str(max_restarts), "--",
           str(FAULT_TRAIN), "lm", "--config", str(CONF / "mini.yaml"), "--config", str(CONF / "period_16_128.yaml"),
           "--exp-dir", str(exp), f"data.dir={data}", *TINY, *overrides]
    log = open(exp / "launch.log", "w+")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def expand(ranks: str) -> set[int]:
    """ "0, 2" or "1-3" -> the set of ranks."""
    out: set[int] = set()
    for part in ranks.replace(" ", "").split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the launcher: its agent stops the workers (SIGTERM, SIGKILL after 30 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def finish(proc: subprocess.Popen, exp: Path, timeout: float = 400) -> str:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
    out = (exp / "launch.log").read_text()
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.fixture(scope="module")
def runs(lm_data, tmp_path_factory) -> dict:
    base, faulty = tmp_path_factory.mktemp("base"), tmp_path_factory.mktemp("faulty")
    # both at once: the baseline is done long before the faulty run's hang (its 8 s timeout)
    procs = (launch(base, lm_data, launcher="torchrun"),
             launch(faulty, lm_data, f"train.collective_timeout={TIMEOUT_S}", max_restarts=2,
                    fault="KILL@14:rank1,STOP@17:rank2"))
    try:
        base_log, log = finish(procs[0], base), finish(procs[1], faulty)
    finally:
        for p in procs:
            stop(p)
    return {"base": base, "faulty": faulty, "base_log": base_log, "log": log}


def test_killed_and_hung_workers_restart_and_end_exactly_like_the_uninterrupted_run(runs):
    log = runs["log"]
    assert "[fault] rank 1 sends itself SIGKILL after step 14" in log
    assert "[fault] rank 2 sends itself SIGSTOP after step 17" in log
    # each attempt resumes from the newest checkpoint written before the fault: nothing lost
    resumed = re.findall(r"\[train\] resumed from (\S+) \(step (\d+)", log)
    assert [(Path(p).name, int(s)) for p, s in resumed] == [("epoch2_step12", 12), ("epoch2_step15", 15)], log[-4000:]
    # the stopped worker's peers fail with the timeout error that names the collective and the ranks
    timeouts = re.findall(r"CollectiveTimeout: (\S+) of '([^']*)' timed out on rank (\d) after (\S+) s, "
                          r"waiting for ranks? ([\d, -]+):", log)
    assert timeouts, log[-6000:]
    for op, component, rank, configured, peers in timeouts:
        assert op in ("exchange", "all-reduce", "broadcast", "barrier") and component and rank != "2"
        assert float(configured) == TIMEOUT_S  # the message names train.collective_timeout (a setting, not a clock)
    assert any(2 in expand(peers) for *_, peers in timeouts)  # someone names the stopped rank
    res = json.loads((runs["faulty"] / "results.json").read_text())
    base = json.loads((runs["base"] / "results.json").read_text())
    assert res["restarts"] == 2 and base["restarts"] == 0
    assert res["steps_per_worker"] == base["steps_per_worker"] == 20
    assert res["history"] == base["history"] and res["final_valid_ppl"] == base["final_valid_ppl"]
    a = torch.load(runs["base"] / "final.pt", weights_only=True)
    b = torch.load(runs["faulty"] / "final.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoints_kept_pruned_and_checksummed(runs):
    root = runs["base"] / "checkpoints"
    entries = ckpt.list_complete(root)
    # every 3 steps + epoch ends, the newest 3 kept (default train.keep_checkpoints)
    assert [(e.path.name, e.step) for e in entries] == [("epoch2", 20), ("epoch2_step18", 18), ("epoch2_step15", 15)]
    assert sorted(p.name for p in root.iterdir()) == ["epoch2", "epoch2_step15", "epoch2_step18"]
    for e in entries:
        assert e.world_size == 4
        for r in range(4):
            state, problem = ckpt.verify_and_load(e.path / f"rank{r}.pt")
            assert problem is None and state["step"] == e.step and state["world_size"] == 4


# -- a corrupted newest checkpoint: reported, skipped, the same previous one on every rank -----------
def _select_worker(rank: int, world: int, init_file: str, root: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    lines: list[str] = []
    found = ckpt.select(Path(root), world, lines.append)
    torch.save({"name": found[0].path.name, "step": found[1]["step"], "lines": lines}, os.path.join(out, f"sel{rank}.pt"))
    from gossip_accel import shutdown

    shutdown()


def test_corrupted_newest_checkpoints_fall_back_on_every_rank(runs, tmp_path):
    import shutil

    root = tmp_path / "checkpoints"
    shutil.copytree(runs["base"] / "checkpoints", root)
    newest, second = root / "epoch2" / "rank2.pt", root / "epoch2_step18" / "rank0.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated
    data = bytearray(second.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit-pattern, same size
    second.write_bytes(bytes(data))
    spawn_with_timeout(_select_worker, (4, str(tmp_path / "init"), str(root), str(tmp_path)), 4, timeout=120)
    sel = [torch.load(tmp_path / f"sel{r}.pt", weights_only=True) for r in range(4)]
    assert [(s["name"], s["step"]) for s in sel] == [("epoch2_step15", 15)] * 4
    lines = "\n".join(sel[0]["lines"])
    assert f"{newest}: size check failed" in lines and f"{second}: sha256 check failed" in lines
    assert (root / "epoch2.corrupt").is_dir() and (root / "epoch2_step18.corrupt").is_dir()
    assert [e.path.name for e in ckpt.list_complete(root)] == ["epoch2_step15"]


def test_checkpoint_of_another_world_size_or_model_is_refused(runs, lm_data):
    root = runs["base"] / "checkpoints"
    with pytest.raises(ckpt.CheckpointError, match=r"epoch2 was written by 4 workers, this run has 2: resume "
                                                    r"with --num-workers 4, or start a new --exp-dir"):
        ckpt.select(root, 2)
    from gossip_accel.bin.train_lm import build_model, load_conf
    from gossip_accel.data.lm import Vocabulary

    conf = load_conf([str(CONF / "mini.yaml")], [o for o in TINY if o.startswith("model.")] + ["model.hidden_size=48"])
    model = build_model(conf, Vocabulary.load(lm_data / "vocab.txt"))
    path = root / "epoch2" / "rank0.pt"
    state, _ = ckpt.verify_and_load(path)
    with pytest.raises(ckpt.CheckpointError, match=re.escape(str(path)) + r" holds another model .*lstm.weight_hh_l0: "
                                                   r"\(128, 16\) in the file, \(192, 16\) here.*new --exp-dir"):
        ckpt.check_fits(path, model, state["model"])
    avg = ckpt.average_model(root, ckpt.list_complete(root)[0])  # a new run of any size can start from this
    assert avg.keys() == state["model"].keys()


# -- the pieces, in one process ------------------------------------------------------------------------
def test_atomic_checksummed_save_detects_damage(tmp_path):
    path = tmp_path / "c" / "rank0.pt"
    ckpt.atomic_save({"w": torch.arange(1000.0), "rng": ckpt.rng_state()}, path, checksum=True)
    assert sorted(p.name for p in path.parent.iterdir()) == ["rank0.pt", "rank0.pt.sha256"]  # no temporary left
    state, problem = ckpt.verify_and_load(path)
    assert problem is None and torch.equal(state["w"], torch.arange(1000.0))
    path.write_bytes(path.read_bytes() + b"x")
    assert "size check failed" in ckpt.verify_and_load(path)[1]
    (path.parent / "rank0.pt.sha256").unlink()
    assert "checksum file rank0.pt.sha256 missing" in ckpt.verify_and_load(path)[1]


def test_rng_states_round_trip_through_weights_only_load(tmp_path):
    import numpy as np

    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    ckpt.atomic_save(ckpt.rng_state(), tmp_path / "rng.pt")
    want = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(7), np.random.rand(7), random.random()
    ckpt.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


def test_prune_keeps_the_newest_complete_and_drops_older_partial_ones(tmp_path):
    for epoch, step, end in ((1, 3, False), (1, 5, True), (2, 8, False), (2, 10, True)):
        d = ckpt.checkpoint_dir(tmp_path, epoch, step, end)
        ckpt.atomic_save({"step": step}, d / "rank0.pt", checksum=True)
        ckpt.mark_done(d, epoch, step, 1, end)
    (tmp_path / "epoch2_step9").mkdir()   # a save that was killed: no done marker, older than the newest
    (tmp_path / "epoch3_step13").mkdir()  # newer than the newest complete: a faster rank is writing it
    ckpt.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch2", "epoch2_step8", "epoch3_step13"]
    assert ckpt.latest_complete(tmp_path) == 2


def test_timeout_and_lost_peer_errors_name_operation_component_and_ranks():
    from gossip_accel.sync import faults

    faults.set_timeout_setting("train.collective_timeout")  # what the trainers' start_accelerator sets
    try:
        with pytest.raises(CollectiveTimeout, match=r"exchange of 'lstm' timed out on rank 0 after the process group's "
                                                    r"timeout, waiting for ranks 1, 3: .*raise train.collective_timeout"):
            with guard("exchange", "lstm", [1, 3]):
                raise RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv")
    finally:
        faults.set_timeout_setting(faults.USER_TIMEOUT_SETTING)
    # in a user's own loop (no trainer) it names where that loop sets the timeout, not a trainer key
    with pytest.raises(CollectiveTimeout, match=r"raise the process group's timeout \(dist.init_process_group\(\.\.\., "
                                                r"timeout=timedelta\(seconds=S\)\) or Accelerator\(kwargs_handlers="
                                                r"\[InitProcessGroupKwargs\(timeout=") as e:
        with guard("all-reduce", "all", [1]):
            raise RuntimeError("Timed out waiting 5000ms for recv")
    assert "train.collective_timeout" not in str(e.value)
    with pytest.raises(PeerLost, match=r"all-reduce of 'softmax_head' failed on rank 0: a peer among ranks 1-3 closed"):
        with guard("all-reduce", "softmax_head", range(4)):
            raise RuntimeError("[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:1234")
    with pytest.raises(ValueError):  # anything else passes through untouched
        with guard("all-reduce", "x", [0]):
            raise ValueError("not a comm error")


def test_recipes_and_stage_drivers_expose_max_restarts():
    # declared once, in the options every recipe shares, and passed on to the launcher there
    shared = (ROOT / "utils" / "stages.sh").read_text()
    assert re.search(r"^max_restarts=0\b", shared, re.M), "utils/stages.sh: no --max-restarts option"
    assert '--max-restarts "$max_restarts"' in shared, "utils/stages.sh: does not pass --max-restarts on"
    for driver in ("run_lm.sh", "run_asr.sh"):
        assert "/stages.sh\"" in (ROOT / "utils" / driver).read_text(), f"utils/{driver} does not source utils/stages.sh"
    for script in sorted(ROOT.glob("recipes/*/*/run.sh")):
        r = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and re.search(r"--max-restarts .*default: 0", r.stdout), f"{script}: no --max-restarts option"
    bad = subprocess.run(["bash", str(ROOT / "utils" / "launch.sh"), "--max-restarts", "two", "--", "x.py"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "--max-restarts must be integers" in bad.stderr
