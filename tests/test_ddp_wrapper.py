"""DistributedRun wraps the model in DDP only where the run needs DDP (sync/integrations/accelerate.prepare).

Real gloo workers (4, spawned) under Accelerate: a synchronized run trains the bare model (DDP's no-op hook
would still copy every gradient into its buckets and back), the DDP baseline, a hierarchy and broadcast
buffers keep the wrapper; a gradient warm-up without the wrapper still all-reduces the gradients (the
replicas stay equal through it), and a synchronized run without it matches the simulator.
"""
from __future__ import annotations

import os
import tempfile
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gossip_accel import shutdown
from gossip_accel.sync import toy
from gossip_accel.sync.config import load_sync_config
from gossip_accel.sync.integrations.accelerate import ddp_wrapper_needed
from gossip_accel.sync.simulate import SimulatedCluster
from harness import BASE, DATA_SEED, LR, assert_states_close, free_port, spawn_with_timeout

WORLD = 4  # a hierarchy of 2 groups of 2
CASES = {  # name -> (sync overrides, DDP wrapper expected)
    "bmuf": (["sync.algorithm=bmuf"], False),
    "ddp": (["sync.enabled=false"], True),
    "hierarchy": (["sync.algorithm=bmuf", "sync.hierarchy.group_size=2"], True),
    "broadcast_buffers": (["sync.algorithm=bmuf", "sync.buffers=broadcast"], True),
    "gradient_warmup": (["sync.algorithm=bmuf", "sync.warmup_kind=gradients", "sync.warmup_steps=6"], False),
}
STEPS = 8


def _worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD), "OMP_NUM_THREADS": "1"})
    torch.set_num_threads(1)
    from gossip_accel.train.run import DistributedRun

    out = {}
    for name, (overrides, _) in CASES.items():
        torch.manual_seed(0)
        model = toy.ToyModel()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        cfg = load_sync_config(BASE, overrides)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = DistributedRun(model, opt, cfg, tempfile.mkdtemp(dir=outdir), cpu=True, checkpoint=False)
        states = []
        for t in range(STEPS):
            toy.train_step(run.model, run.optimizer, DATA_SEED, rank, t + 1)
            run.after_step()
            states.append({k: v.detach().clone() for k, v in run.core.named_parameters()})  # buffers are local
        out[name] = {"wrapped": isinstance(run.model, DistributedDataParallel),
                     "reason": ddp_wrapper_needed(run.accelerator, cfg), "states": states}
        dist.barrier()
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))
    shutdown()


def _results(tmp_path) -> list[dict]:
    spawn_with_timeout(_worker, (free_port(), str(tmp_path)), WORLD, timeout=300)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def test_the_model_is_wrapped_in_ddp_only_where_the_run_needs_it(tmp_path):
    ranks = _results(tmp_path)
    for name, (overrides, wrapped) in CASES.items():
        got = ranks[0][name]
        assert got["wrapped"] is wrapped, f"{name}: DDP wrapper {got['wrapped']}, expected {wrapped}"
        assert (got["reason"] is not None) is wrapped, f"{name}: {got['reason']}"
    assert "hierarchy" in ranks[0]["hierarchy"]["reason"] and "buffers" in ranks[0]["broadcast_buffers"]["reason"]
    # the gradient warm-up without DDP: all-reduced gradients keep the replicas equal for its 6 steps
    warm = [r["gradient_warmup"]["states"] for r in ranks]
    for t in range(6):
        for k, v in warm[0][t].items():
            torch.testing.assert_close(v, warm[1][t][k], msg=f"step {t + 1}: {k} differs during the warm-up")
    assert any(not torch.equal(v, warm[1][7][k]) for k, v in warm[0][7].items()), "warm-up never ended"
    # the bare model's BMUF run is the simulator's
    torch.manual_seed(0)
    models = [toy.ToyModel() for _ in range(WORLD)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    cluster = SimulatedCluster(models, BASE, CASES["bmuf"][0])
    for t in range(1, STEPS + 1):
        for k in range(WORLD):
            toy.train_step(models[k], opts[k], DATA_SEED, k, t)
        cluster.step()
    for k in range(WORLD):
        assert_states_close(ranks[k]["bmuf"]["states"][-1], dict(models[k].named_parameters()), f"rank {k} ")


def test_a_bare_model_is_refused_where_the_run_needs_ddp():
    from gossip_accel.sync.config import ConfigError
    from gossip_accel.sync.integrations.accelerate import prepare

    model = toy.ToyModel()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    cfg = load_sync_config(BASE, ["sync.enabled=false"])
    try:
        prepare(object(), model, opt, cfg, wrap=False)
    except ConfigError as e:
        assert "sync.enabled=false" in str(e)
    else:
        raise AssertionError("prepare(wrap=False) accepted the DDP baseline without DDP")


def test_step_profile_times_every_phase_with_and_without_the_wrapper(tmp_path):
    """bench/step_profile.py on 2 real gloo workers and a small synthetic model: a row per setting and wrapping."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench import step_profile

    out = tmp_path / "profile.json"
    step_profile.main(["--workers", "2", "--steps", "6", "--warmup", "2", "--workload", "synthetic:20k", "--settings", "no-comm",
                       "bmuf-(16,128)", "--json", str(out), "--plot", str(tmp_path / "profile.png")])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["setting"], r["wrapped"]) for r in rows] == [("no-comm", False), ("bmuf-(16,128)", True),
                                                            ("bmuf-(16,128)", False)]
    for r in rows:
        assert r["steps_per_s"] > 0 and r["backward"] > 0 and r["optimizer"] > 0, r
        assert r["cpu_ms"] > 0 and 0 <= r["sync_cpu_ms"] <= r["cpu_ms"], r   # process CPU holds the sync thread's
    assert "cpu vs no-comm" in step_profile.table(rows)
    assert (tmp_path / "profile.png").stat().st_size > 0


def test_step_profile_refuses_an_unknown_workload(capsys):
    import sys
    from pathlib import Path

    import pytest

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench import step_profile

    with pytest.raises(SystemExit):
        step_profile.main(["--workload", "synthetic:lots"])
    assert "parameter count 'lots'" in capsys.readouterr().err
