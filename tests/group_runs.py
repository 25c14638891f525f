"""Real gloo workers for the hierarchical and low-precision tests, spawned once per world size and session.

Scenarios run one after the other in the same processes (process start-up dominates on 2 cores);
tests/test_hierarchical.py and tests/test_exchange_dtype.py read the results of the same spawn.
Hierarchical scenarios use groups of 2 ranks; the loop is the one of the module docstring of
gossip_accel/sync/hierarchical.py (backward, allreduce_gradients, optimizer step, sync.step).
"""
from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from gossip_accel import shutdown
from gossip_accel.sync import toy
from gossip_accel.sync.hierarchical import make_synchronizer
from gossip_accel.sync.simulate import HierarchicalCluster, SimulatedCluster
from harness import BASE, DATA_SEED, assert_matches_oracle, initial_model, make_optimizer, model_state, spawn_with_timeout

G2 = ["sync.hierarchy.group_size=2"]
# name -> (world, overrides, steps); a name starting with "hier_" runs in groups of 2 ranks
SCENARIOS: dict[str, tuple[int, list[str], int]] = {
    "hier_ma": (4, ["sync.algorithm=ma"], 17),
    "hier_bmuf_warmup": (4, ["sync.algorithm=bmuf", "sync.warmup_steps=6", "sync.warmup_period=2"], 21),
    "hier_bmuf_cbm_round_robin": (4, ["sync.algorithm=bmuf", "sync.nesterov=false",
                                      "sync.hierarchy.carriers=round_robin", "sync.buffers=broadcast"], 17),
    "hier_ma_bf16": (4, ["sync.algorithm=ma", "sync.exchange_dtype=bfloat16"], 18),
    # a DDP model under AccelerateSynchronizer: DDP's own all-reduce hook on the group's process group
    "hier_ddp_bmuf": (4, ["sync.algorithm=bmuf"], 13),
    # gossip needs a ring of >= 3 nodes (Definition 1: 2p < n): 3 groups x 2 ranks
    "hier_gossip_bmuf_warmup": (6, ["sync.algorithm=gossip_bmuf", "sync.warmup_steps=6", "sync.warmup_period=2",
                                    "sync.seed=3"], 22),
    "hier_local_ma_fp16": (6, ["sync.algorithm=local_ma", "sync.exchange_dtype=float16"], 13),
    # issue 17: overlapped syncs between groups (the carrier applies at t + tau and shares then)
    "hier_bmuf_overlap": (4, ["sync.algorithm=bmuf", "sync.overlap_steps=2", "sync.stagger=true",
                              "sync.warmup_steps=6", "sync.warmup_period=2"], 21),
    "hier_gossip_bmuf_overlap": (6, ["sync.algorithm=gossip_bmuf", "sync.overlap_steps=3", "sync.stagger=true",
                                     "sync.seed=2"], 19),
    "hier_gossip_bmuf_int4_overlap": (6, ["sync.algorithm=gossip_bmuf", "sync.overlap_steps=3", "sync.stagger=true",
                                          "sync.seed=2", "sync.exchange_dtype=int4"], 19),
    # flat runs with a low-precision wire, and their fp32 twins for the byte counts
    "ma_fp32": (4, ["sync.algorithm=ma"], 17),
    "ma_bf16": (4, ["sync.algorithm=ma", "sync.exchange_dtype=bfloat16"], 17),
    "bmuf_fp16_warmup": (4, ["sync.algorithm=bmuf", "sync.exchange_dtype=float16", "sync.warmup_steps=4",
                             "sync.warmup_period=2"], 18),
    "gossip_bmuf_fp32": (4, ["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1"], 19),
    "gossip_bmuf_bf16": (4, ["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.exchange_dtype=bfloat16"], 19),
    # a flat DDP model under AccelerateSynchronizer with a gradient warm-up: DDP's all-reduce in the comm hook
    # for the first 6 steps, none afterwards (tests/test_warmup_kinds.py)
    "ddp_gossip_bmuf_warmup_grads": (4, ["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.warmup_steps=6",
                                         "sync.warmup_kind=gradients", "sync.seed=2"], 18),
    # the int8/int4 wire (gossip_accel/sync/quantize.py, tests/test_quantized_exchange.py)
    "ma_int4": (4, ["sync.algorithm=ma", "sync.exchange_dtype=int4"], 17),
    "bmuf_int8_warmup": (4, ["sync.algorithm=bmuf", "sync.exchange_dtype=int8", "sync.warmup_steps=4",
                             "sync.warmup_period=2", "sync.quant_block=64", "sync.quant_scale_dtype=bfloat16"], 18),
    "gossip_bmuf_int8": (4, ["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.exchange_dtype=int8"], 19),
    "gossip_bmuf_int4_params": (4, ["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.exchange_dtype=int4",
                                    "sync.quant_ring=params"], 19),
    "hier_bmuf_int8": (4, ["sync.algorithm=bmuf", "sync.exchange_dtype=int8"], 17),
}
# the coded ring overlapped (sync.overlap_steps=2 on top of each blocking twin, engines/overlap.py): syncs of
# 'rest' at 4, 8, 12, 16 (stagger: embedding.shard1 at 4, 12), applied 2 steps later; the last still in flight at 17
CODED_RING = {
    "gossip_bmuf_int4": (4, ["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.exchange_dtype=int4"], 17),
    "gossip_bmuf_int4_stagger": (4, ["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.exchange_dtype=int4",
                                     "sync.stagger=true", "sync.seed=1"], 17),
    "gossip_bmuf_int8_params_warmup": (4, ["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.exchange_dtype=int8",
                                           "sync.quant_ring=params", "sync.warmup_steps=4", "sync.warmup_period=2"], 17),
    "gossip_bmuf_int8_params_stagger": (4, ["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.exchange_dtype=int8",
                                            "sync.quant_ring=params", "sync.stagger=true", "sync.seed=2"], 17),
    "local_bmuf_int4": (4, ["sync.algorithm=local_bmuf", "sync.p=1", "sync.exchange_dtype=int4", "sync.quant_block=32"], 17),
}
#: overlapped scenario -> its blocking twin
OVERLAPPED = {f"{name}_overlap": name for name in CODED_RING}


def _overlapped(world: int, overrides: list[str], steps: int) -> tuple[int, list[str], int]:
    return world, [*overrides, "sync.overlap_steps=2"], steps


SCENARIOS.update(CODED_RING)
SCENARIOS.update({name: _overlapped(*CODED_RING[twin]) for name, twin in OVERLAPPED.items()})


def overrides_of(name: str) -> list[str]:
    world, overrides, steps = SCENARIOS[name]
    return [*G2, *overrides] if name.startswith("hier_") else list(overrides)


def local_backward(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, t: int) -> None:
    opt.zero_grad(set_to_none=True)
    ids, y = toy.batch(DATA_SEED, rank, t)
    torch.nn.functional.mse_loss(model(ids), y).backward()


class PreparedBy:
    """What AccelerateSynchronizer reads from an ``accelerate.Accelerator`` (the spawned workers have
    no launcher environment for a real one; tests/test_launchers.py runs real launches)."""

    sync_gradients = True

    @staticmethod
    def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, "module", model)


#: scenario -> step after which it is checkpointed, rebuilt from other weights and resumed
RESUMED = {"hier_bmuf_warmup": 9, "hier_bmuf_int8": 9, "hier_bmuf_overlap": 11,  # hier_bmuf_overlap: posted at 10, applied at 12
           # coded exchanges in flight: posted at 8 (applied at 10), at 12 (applied at 14)
           "gossip_bmuf_int4_stagger_overlap": 9, "gossip_bmuf_int8_params_warmup_overlap": 13}


def run_rank(rank: int, name: str, resume_at: int = 0) -> dict:
    steps = SCENARIOS[name][2]
    hier = name.startswith("hier_")
    model = initial_model(rank)
    opt = make_optimizer(model)
    net = model
    if name.startswith(("hier_ddp", "ddp_")):
        from torch.nn.parallel import DistributedDataParallel as DDP

        from gossip_accel.sync.integrations.accelerate import AccelerateSynchronizer

        net = DDP(model)
        sync = AccelerateSynchronizer(PreparedBy(), net, BASE, overrides_of(name))
    else:  # the factory chooses from sync.hierarchy
        sync = make_synchronizer(model, BASE, overrides_of(name))
    for t in range(1, steps + 1):
        local_backward(net, opt, rank, t)
        if hier and net is model:
            sync.allreduce_gradients()
        opt.step()
        sync.step()
        if t == resume_at:  # what a restarted run does: new processes' objects, then load
            saved = (model_state(model), opt.state_dict(), sync.state_dict())
            model = initial_model(rank + 100)
            opt = make_optimizer(model)
            sync = make_synchronizer(model, BASE, overrides_of(name))
            model.load_state_dict(saved[0])
            opt.load_state_dict(saved[1])
            sync.load_state_dict(saved[2])
            net = model
    before = model_state(model)
    state = sync.state_dict()
    sync.finalize()
    return {"before": before, "final": model_state(model), "metrics": sync.metrics(),
            "carriers": list(getattr(sync, "carriers", [])), "slots": sorted(state["slots"]), "class": type(sync).__name__,
            "components": {c.name: (c.index, c.nbytes, c.period) for c in sync.components}}


#: (scenario whose checkpoint after step 9 is resumed, the overrides of the resuming run): what the resume says
#: (None: it resumes), tests/test_quantized_exchange.py; "legacy:" drops the recorded wire (an older checkpoint)
REWIRED = [("gossip_bmuf_int8", ["sync.exchange_dtype=float32"]), ("gossip_bmuf_int8", ["sync.exchange_dtype=int4"]),
           ("gossip_bmuf_int8", ["sync.quant_block=64"]), ("gossip_bmuf_int8", ["sync.quant_ring=params"]),
           ("gossip_bmuf_fp32", ["sync.exchange_dtype=int4"]), ("gossip_bmuf_fp32", ["sync.exchange_dtype=bfloat16"]),
           ("gossip_bmuf_int4_overlap", ["sync.exchange_dtype=float32"]),  # coded payloads in flight
           ("legacy:gossip_bmuf_int8", ["sync.exchange_dtype=float32"]), ("legacy:gossip_bmuf_int8", ["sync.quant_ring=params"])]


def rewired_rank(rank: int, outdir: str) -> list[Optional[str]]:
    """Each REWIRED checkpoint written to a real file (atomic, checksummed), verified, loaded and resumed
    under the other overrides; the error each resume raised (None: none)."""
    from gossip_accel.train import checkpoint as ckpt

    said = []
    for source, overrides in REWIRED:
        name = source.removeprefix("legacy:")
        model = initial_model(rank)
        opt = make_optimizer(model)
        sync = make_synchronizer(model, BASE, overrides_of(name))
        for t in range(1, 10):
            local_backward(model, opt, rank, t)
            opt.step()
            sync.step()
        path = Path(outdir) / f"{source.replace(':', '_')}_{'_'.join(overrides)}" / f"rank{rank}.pt"
        state = sync.state_dict()
        if source.startswith("legacy:"):
            del state["wire"]
        ckpt.atomic_save(state, path, checksum=True)
        loaded, problem = ckpt.verify_and_load(path)
        assert problem is None, problem
        restarted = initial_model(rank + 100)  # what a restarted run does: new objects, the weights, then the state
        resumed = make_synchronizer(restarted, BASE, [*overrides_of(name), *overrides])
        restarted.load_state_dict(model_state(model))
        try:
            ckpt.load_sync_state(path, resumed, loaded)
            said.append(None)
        except ckpt.CheckpointError as e:
            said.append(str(e))
    return said


def _worker(rank: int, world: int, init_file: str, outdir: str, names: list[str]) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    out = {name: run_rank(rank, name) for name in names}
    out.update({f"resumed_{name}": run_rank(rank, name, stop) for name, stop in RESUMED.items() if name in names})
    if all(SCENARIOS[source.removeprefix("legacy:")][0] == world for source, _ in REWIRED):
        out["rewired"] = rewired_rank(rank, outdir)
    torch.save(out, os.path.join(outdir, f"runs{world}_{rank}.pt"))
    shutdown()


def results(world: int) -> dict[str, list[dict]]:
    """name -> per-rank results of every scenario of this world size (one spawn; a failed spawn
    fails every test that reads it, without spawning again)."""
    out = _results(world)
    if isinstance(out, BaseException):
        raise RuntimeError(f"the {world} spawned workers failed: {out}") from out
    return out


@functools.lru_cache(maxsize=None)
def _results(world: int):
    try:
        return _spawn(world)
    except Exception as e:  # noqa: BLE001 - cached and re-raised by results()
        return e


def _spawn(world: int) -> dict[str, list[dict]]:
    outdir = tempfile.mkdtemp(prefix="gossip_groups_")
    names = [n for n, (w, _, _) in SCENARIOS.items() if w == world]
    spawn_with_timeout(_worker, (world, os.path.join(outdir, "init"), outdir, names), world, timeout=300)
    per_rank = [torch.load(os.path.join(outdir, f"runs{world}_{r}.pt"), weights_only=True) for r in range(world)]
    keys = [*names, *(f"resumed_{n}" for n in RESUMED if n in names), *(["rewired"] if "rewired" in per_rank[0] else [])]
    return {n: [per_rank[r][n] for r in range(world)] for n in keys}


def run(name: str) -> list[dict]:
    return results(SCENARIOS[name.removeprefix("resumed_")][0])[name]


def assert_matches_simulator(name: str) -> None:
    """Every real worker of scenario ``name`` equals its simulated twin (before and after the final average)."""
    sim_before, sim_final = simulate(name)
    for rank, got in enumerate(run(name)):
        assert_matches_oracle(got, sim_before[rank], sim_final[rank], f"{name} rank {rank} ")


def largest_difference(name: str, other: str, key: str = "hidden.weight") -> float:
    """max |a - b| of ``key`` on rank 0 before the final average, between the runs of two scenarios."""
    return float((run(name)[0]["before"][key] - run(other)[0]["before"][key]).abs().max())


def rewired() -> list[list[Optional[str]]]:
    """Per rank, what each REWIRED resume said (the 4-worker spawn)."""
    return results(4)["rewired"]


def simulate(name: str) -> tuple[list[dict], list[dict]]:
    """The oracle of a scenario: (states before the final average, final states), per rank."""
    world, _, steps = SCENARIOS[name]
    hier = name.startswith("hier_")
    models = [initial_model(k) for k in range(world)]
    cluster = (HierarchicalCluster if hier else SimulatedCluster)(models, BASE, overrides_of(name))
    opts = [make_optimizer(m) for m in models]
    for t in range(1, steps + 1):
        for k in range(world):
            local_backward(models[k], opts[k], k, t)
        cluster.allreduce_gradients()  # the group's mean (hier_), or DDP's during a gradient warm-up
        for opt in opts:
            opt.step()
        cluster.step()
    before = [model_state(m) for m in models]
    cluster.finalize()
    return before, [model_state(m) for m in models]


