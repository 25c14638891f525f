"""Shared pieces of the multi-process tests: scenarios, spawning real gloo workers, the oracle.

Workers are real processes (torch.multiprocessing.spawn) in a gloo process group; nothing of
torch.distributed is mocked. One spawn runs every scenario so that process start-up is paid
once. The oracle is gossip_accel.simulate.SimulatedCluster with the same seeds and data.
"""
from __future__ import annotations

import os
import tempfile
from typing import Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gossip_accel import Synchronizer, shutdown, toy
from gossip_accel.simulate import SimulatedCluster

WORLD = 4
LR = 0.05
DATA_SEED = 7
BASE = {"components": toy.TOY_COMPONENTS, "period": 4}

# name -> (overrides, steps)
SCENARIOS: dict[str, tuple[list[str], int]] = {
    "ma": (["sync.algorithm=ma"], 20),
    "bmuf_nbm": (["sync.algorithm=bmuf", "sync.block_momentum=0.9"], 20),
    "bmuf_cbm": (["sync.algorithm=bmuf", "sync.nesterov=false"], 20),
    "local_ma": (["sync.algorithm=local_ma", "sync.p=1"], 20),
    "local_bmuf": (["sync.algorithm=local_bmuf", "sync.p=1", "sync.block_momentum=0.9"], 20),
    "gossip_ma": (["sync.algorithm=gossip_ma", "sync.p=1", "sync.q=1"], 20),
    "gossip_bmuf": (["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.block_momentum=0.9"], 24),
    "gossip_bmuf_warmup": (["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.warmup_steps=6",
                            "sync.warmup_period=2", "sync.seed=3"], 22),
    "bmuf_slots_cpu_bcast_buffers": (["sync.algorithm=bmuf", "sync.slots_on_cpu=true",
                                      "sync.buffers=broadcast"], 17),
    "gossip_bmuf_local_buffers": (["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.buffers=local"], 16),
}


def initial_model(rank: int) -> torch.nn.Module:
    """Ranks start from different weights on purpose: the synchronizer must broadcast rank 0's."""
    return toy.ToyModel(seed=rank)


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def build(rank: int, overrides: Sequence[str], init_seed: int | None = None):
    """A worker's model, optimizer and synchronizer."""
    model = initial_model(rank if init_seed is None else init_seed)
    opt = make_optimizer(model)
    return model, opt, Synchronizer(model, BASE, overrides)


def train(rank: int, model, opt, sync, until: int) -> None:
    """Local steps t = sync.t + 1 .. until, each followed by sync.step()."""
    for t in range(sync.t + 1, until + 1):
        toy.train_step(model, opt, DATA_SEED, rank, t)
        sync.step()


def finish(model, sync) -> dict:
    before = model_state(model)
    sync.finalize()
    return {"before": before, "final": model_state(model), "metrics": sync.metrics()}


def run_scenario(rank: int, overrides: Sequence[str], steps: int) -> dict:
    model, opt, sync = build(rank, overrides)
    train(rank, model, opt, sync, steps)
    return finish(model, sync)


def run_resumed(rank: int, overrides: Sequence[str], steps: int, stop: int, ckpt_dir: str) -> dict:
    """Train to ``stop``, save model/optimizer/synchronizer, rebuild everything, resume to ``steps``."""
    model, opt, sync = build(rank, overrides)
    train(rank, model, opt, sync, stop)
    path = os.path.join(ckpt_dir, f"rank{rank}.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sync": sync.state_dict()}, path)
    del model, opt, sync
    model, opt, sync = build(rank, overrides, init_seed=rank + 100)  # different weights before loading
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sync.load_state_dict(state["sync"])
    train(rank, model, opt, sync, steps)
    return finish(model, sync)


def ddp_gradients(rank: int) -> dict:
    """Gradients after one backward through DDP, with and without the no-op comm hook."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gossip_accel.integrations.accelerate import noop_allreduce_hook

    out = {}
    for hooked in (False, True):
        model = DDP(initial_model(0), forward_sync_buffers=False)
        if hooked:
            model.register_comm_hook(None, noop_allreduce_hook)
        ids, y = toy.batch(DATA_SEED, rank, 1)
        torch.nn.functional.mse_loss(model(ids), y).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        gathered = [torch.empty_like(grads) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, grads)
        out["hooked" if hooked else "allreduce"] = torch.stack(gathered)
    return out


def plans_seen(rank: int) -> list:
    """Each rank's view of the neighbour choices of several rounds (must agree everywhere)."""
    from gossip_accel.topology import RingTopology

    topo = RingTopology(WORLD, 1, 1, seed=5)
    mine = [topo.plan(c, r) for c in range(3) for r in range(1, 6)]
    views: list = [None] * dist.get_world_size()
    dist.all_gather_object(views, [(p.recv_from, p.send_to) for p in mine])
    return views


def _worker(rank: int, world: int, init_file: str, outdir: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {name: run_scenario(rank, ov, steps) for name, (ov, steps) in SCENARIOS.items()}
    ov, steps = SCENARIOS["gossip_bmuf"]
    results["resumed_gossip_bmuf"] = run_resumed(rank, ov, steps, stop=13, ckpt_dir=outdir)
    ov, steps = SCENARIOS["bmuf_nbm"]
    results["resumed_bmuf_nbm"] = run_resumed(rank, ov, steps, stop=7, ckpt_dir=outdir)
    results["ddp_gradients"] = ddp_gradients(rank)
    results["plans"] = plans_seen(rank)
    torch.save(results, os.path.join(outdir, f"results{rank}.pt"))
    shutdown()


def spawn_all(outdir: str, world: int = WORLD) -> list[dict]:
    init_file = tempfile.mktemp(prefix="gloo_init_", dir=outdir)
    mp.spawn(_worker, args=(world, init_file, outdir), nprocs=world, join=True)
    return [torch.load(os.path.join(outdir, f"results{r}.pt"), weights_only=False) for r in range(world)]


def simulate_scenario(overrides: Sequence[str], steps: int, world: int = WORLD, accum: int = 1):
    """The oracle for run_scenario: returns (states before final average, state after)."""
    models = [initial_model(k) for k in range(world)]
    cluster = SimulatedCluster(models, BASE, overrides)
    opts = [make_optimizer(m) for m in models]
    for t in range(1, steps + 1):
        for k in range(world):
            toy.train_step(models[k], opts[k], DATA_SEED, k, t, accum=accum)
        cluster.step()
    before = [model_state(m) for m in models]
    cluster.finalize()
    return before, [model_state(m) for m in models]
