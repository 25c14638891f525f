"""Shared pieces of the multi-process tests: scenarios, spawning real gloo workers, the oracle.

Workers are real processes (torch.multiprocessing.spawn) in a gloo process group; nothing of
torch.distributed is mocked. One spawn runs every scenario so that process start-up is paid
once. The oracle is gossip_accel.sync.simulate.SimulatedCluster with the same seeds and data.
"""
from __future__ import annotations

import functools
import os
import tempfile
import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gossip_accel import Synchronizer, shutdown
from gossip_accel.sync import toy
from gossip_accel.sync.simulate import SimulatedCluster
from gossip_accel.train.process_group import free_port  # noqa: F401  (re-exported for the tests)

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
    "gossip_bmuf_pair": (["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.seed=2"], 20),
    "gossip_bmuf_warmup": (["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.warmup_steps=6",
                            "sync.warmup_period=2", "sync.seed=3"], 22),
    "bmuf_slots_cpu_bcast_buffers": (["sync.algorithm=bmuf", "sync.slots_on_cpu=true",
                                      "sync.buffers=broadcast"], 17),
    "gossip_bmuf_local_buffers": (["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.buffers=local"], 16),
    # issue 7: the deterministic modes of the other algorithms of 001 and of ADPSGD
    "easgd": (["sync.algorithm=easgd", "sync.easgd_alpha=0.2"], 18),
    "easgd_async_lockstep": (["sync.algorithm=easgd_async", "sync.lockstep=true", "sync.easgd_alpha=0.3"], 17),
    "asgd_lockstep": (["sync.algorithm=asgd", "sync.lockstep=true", "sync.server_lr=0.25", "sync.server_rank=2"], 19),
    "adpsgd_fixed_lockstep": (["sync.algorithm=adpsgd_fixed", "sync.lockstep=true", "sync.period=1",
                               "sync.components.0.period=2"], 14),
    "adpsgd_random_lockstep": (["sync.algorithm=adpsgd_random", "sync.lockstep=true", "sync.period=2",
                                "sync.seed=5"], 16),
    "adpsgd_delay_lockstep": (["sync.algorithm=adpsgd_delay", "sync.lockstep=true", "sync.period=1"], 15),
    "ma_ngsgd": (["sync.algorithm=ma"], 16),  # Kaldi nnet3: NG-SGD + model averaging
    "gossip_bmuf_ngsgd": (["sync.algorithm=gossip_bmuf", "sync.q=1"], 16),
    # issue 14: a torch optimizer as the outer (block) optimizer (sync.outer_optimizer, algorithms/outer.py)
    # Adam's eps 1e-3, not 1e-8: g / (sqrt(v) + eps) would blow the all-reduce's last-bit rounding of an
    # outer gradient near 0 up to a step of size lr, beyond the oracle's tolerance
    "bmuf_outer_adam": (["sync.algorithm=bmuf", "sync.slots_on_cpu=true",
                         "sync.outer_optimizer={name: Adam, lr: 0.05, betas: [0.8, 0.9], eps: 1.0e-3}"], 18),
    "gossip_bmuf_outer_nesterov": (["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.warmup_steps=6",
                                    "sync.warmup_period=2", "sync.seed=4",
                                    "sync.outer_optimizer={name: SGD, lr: 0.7, momentum: 0.9, nesterov: true}"], 22),
    # issue 17: staggered components (sync.stagger) and overlapped syncs (sync.overlap_steps, overlap.py)
    "gossip_bmuf_stagger": (["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.stagger=true", "sync.seed=1"], 22),
    # the embedding shards sync at steps 10/18 and 14/22 and the last one is still in flight at the end
    "gossip_bmuf_overlap": (["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.stagger=true", "sync.overlap_steps=2",
                             "sync.warmup_steps=6", "sync.warmup_period=2", "sync.exchange_dtype=bfloat16"], 23),
    "bmuf_overlap_mix": (["sync.algorithm=bmuf", "sync.block_momentum=0.9", "sync.overlap_steps=3",
                          "sync.overlap_merge=mix"], 21),
    "bmuf_overlap_slots_cpu": (["sync.algorithm=bmuf", "sync.slots_on_cpu=true", "sync.overlap_steps=2"], 18),
    "local_ma_overlap_replace": (["sync.algorithm=local_ma", "sync.p=1", "sync.overlap_steps=1",
                                  "sync.overlap_merge=replace"], 17),
    # issue 14: the warm-up's kind (schedule.py, warmup.py) and the inner optimizer's state (inner_state.py)
    "gossip_bmuf_warmup_grads": (["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.warmup_steps=6",
                                  "sync.warmup_kind=gradients", "sync.seed=3"], 22),
    "bmuf_warmup_ramp": (["sync.algorithm=bmuf", "sync.warmup_steps=2", "sync.warmup_period=1",
                          "sync.warmup_kind=ramp"], 22),
    "gossip_bmuf_state_average": (["sync.algorithm=gossip_bmuf", "sync.q=1", "sync.warmup_steps=4",
                                   "sync.warmup_period=2", "sync.inner_state=average", "sync.seed=1"], 20),
    "ma_state_reset_adam": (["sync.algorithm=ma", "sync.inner_state=reset"], 14),
    "local_ma_state_average_adagrad": (["sync.algorithm=local_ma", "sync.p=1", "sync.inner_state=average"], 13),
    # issue 17: the int8/int4 wire (quantized outer gradients; ring: per-edge public copies)
    "bmuf_int4": (["sync.algorithm=bmuf", "sync.exchange_dtype=int4", "sync.quant_block=32"], 17),
    "gossip_bmuf_pair_int4": (["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.seed=2",
                               "sync.exchange_dtype=int4", "sync.warmup_steps=4", "sync.warmup_period=2"], 20),
}
# scenarios whose workers use another optimizer than make_optimizer's default
OPTIMIZER = {"ma_ngsgd": "ngsgd", "gossip_bmuf_ngsgd": "ngsgd", "ma_state_reset_adam": "adam",
             "local_ma_state_average_adagrad": "adagrad"}


def initial_model(rank: int) -> torch.nn.Module:
    """Ranks start from different weights on purpose: the synchronizer must broadcast rank 0's."""
    return toy.ToyModel(seed=rank)


def make_optimizer(model: torch.nn.Module, kind: str = "sgd") -> torch.optim.Optimizer:
    if kind == "ngsgd":
        from gossip_accel.train.ngsgd import NGSGD

        return NGSGD(model, lr=LR, momentum=0.5)
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=LR / 5, eps=1e-3)  # eps: as bmuf_outer_adam
    if kind == "adagrad":
        return torch.optim.Adagrad(model.parameters(), lr=LR, initial_accumulator_value=0.1)
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


#: parameters of a distributed run and of the simulator agree to this (float32, other summation order)
ATOL = 1e-5


def assert_states_close(a: dict, b: dict, what: str, atol: float = ATOL) -> None:
    """Two state dicts hold the same keys, float tensors within ``atol``, the others equal."""
    assert a.keys() == b.keys()
    for k in a:
        if a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-5, msg=lambda m: f"{what} {k}: {m}")
        else:
            assert torch.equal(a[k], b[k]), f"{what} {k}"


def assert_matches_oracle(got: dict, before: dict, final: dict, what: str) -> None:
    """A rank's state before and after the final average (``got["before"]``, ``got["final"]``)
    equals the oracle's; ``what`` prefixes the failure message (e.g. ``"ma rank 2 "``)."""
    assert_states_close(got["before"], before, f"{what}before final average")
    assert_states_close(got["final"], final, f"{what}final")


def build(rank: int, overrides: Sequence[str], init_seed: int | None = None, optimizer: str = "sgd"):
    """A worker's model, optimizer and synchronizer (which watches the optimizer: sync.inner_state and a
    gradient warm-up need it)."""
    model = initial_model(rank if init_seed is None else init_seed)
    opt = make_optimizer(model, optimizer)
    sync = Synchronizer(model, BASE, overrides)
    sync.watch(opt)
    return model, opt, sync


def train(rank: int, model, opt, sync, until: int) -> None:
    """Local steps t = sync.t + 1 .. until, each followed by sync.step()."""
    for t in range(sync.t + 1, until + 1):
        toy.train_step(model, opt, DATA_SEED, rank, t)
        sync.step()


def finish(model, sync) -> dict:
    before = model_state(model)
    sync.finalize()
    return {"before": before, "final": model_state(model), "metrics": sync.metrics()}


def run_scenario(rank: int, overrides: Sequence[str], steps: int, optimizer: str = "sgd") -> dict:
    model, opt, sync = build(rank, overrides, optimizer=optimizer)
    train(rank, model, opt, sync, steps)
    return finish(model, sync)


def run_resumed(rank: int, overrides: Sequence[str], steps: int, stop: int, ckpt_dir: str,
                optimizer: str = "sgd") -> dict:
    """Train to ``stop``, save model/optimizer/synchronizer, rebuild everything, resume to ``steps``."""
    model, opt, sync = build(rank, overrides, optimizer=optimizer)
    train(rank, model, opt, sync, stop)
    path = os.path.join(ckpt_dir, f"rank{rank}.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sync": sync.state_dict()}, path)
    del model, opt, sync
    model, opt, sync = build(rank, overrides, init_seed=rank + 100, optimizer=optimizer)  # other weights first
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sync.load_state_dict(state["sync"])
    train(rank, model, opt, sync, steps)
    return finish(model, sync)


def ddp_gradients(rank: int) -> dict:
    """Gradients after one backward through DDP, with and without the no-op comm hook."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gossip_accel.sync.integrations.accelerate import noop_allreduce_hook

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


def refused_without_optimizer(rank: int) -> str:
    """sync.inner_state without a watched optimizer: the error of the first step() (before any collective)."""
    from gossip_accel.sync.usage import UsageError

    sync = Synchronizer(initial_model(rank), BASE, ["sync.algorithm=ma", "sync.inner_state=reset"])
    try:
        sync.step()
    except UsageError as e:
        return str(e)
    finally:
        sync.close()
    return ""


def plans_seen(rank: int) -> list:
    """Each rank's view of the neighbour choices of several rounds (must agree everywhere)."""
    from gossip_accel.sync.topology import RingTopology

    topo = RingTopology(WORLD, 1, 1, seed=5)
    mine = [topo.plan(c, r) for c in range(3) for r in range(1, 6)]
    views: list = [None] * dist.get_world_size()
    dist.all_gather_object(views, [(p.recv_from, p.send_to) for p in mine])
    return views


def _worker(rank: int, world: int, init_file: str, outdir: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {name: run_scenario(rank, ov, steps, OPTIMIZER.get(name, "sgd")) for name, (ov, steps) in SCENARIOS.items()}
    for name, stop in RESUMED.items():
        ov, steps = SCENARIOS[name]
        results[f"resumed_{name}"] = run_resumed(rank, ov, steps, stop=stop, ckpt_dir=outdir,
                                                 optimizer=OPTIMIZER.get(name, "sgd"))
    results["ddp_gradients"] = ddp_gradients(rank)
    results["plans"] = plans_seen(rank)
    results["no_optimizer"] = refused_without_optimizer(rank)
    torch.save(results, os.path.join(outdir, f"results{rank}.pt"))
    shutdown()


# scenario -> step at which it is checkpointed and resumed (run_resumed)
RESUMED = {"gossip_bmuf": 13, "bmuf_nbm": 7, "adpsgd_delay_lockstep": 8, "easgd": 9, "asgd_lockstep": 6,
           "ma_ngsgd": 11, "bmuf_outer_adam": 9, "gossip_bmuf_outer_nesterov": 15, "gossip_bmuf_warmup_grads": 4,
           "bmuf_warmup_ramp": 9, "gossip_bmuf_state_average": 11, "ma_state_reset_adam": 7, "gossip_bmuf_pair_int4": 11,
           # checkpoints with an exchange in flight (posted at 10 / 12, applied at 12 / 15)
           "gossip_bmuf_overlap": 11, "bmuf_overlap_mix": 13}


def spawn_with_timeout(fn: Callable, args: tuple, nprocs: int, timeout: float) -> None:
    """mp.spawn that cannot hang a test: after ``timeout`` seconds the workers are killed and it raises."""
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers still running after {timeout:.0f} s (a hang or deadlock)")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)


def spawn_all(outdir: str, world: int = WORLD) -> list[dict]:
    init_file = tempfile.mktemp(prefix="gloo_init_", dir=outdir)
    spawn_with_timeout(_worker, (world, init_file, outdir), world, timeout=900)
    return [torch.load(os.path.join(outdir, f"results{r}.pt"), weights_only=True) for r in range(world)]


def simulate_scenario(overrides: Sequence[str], steps: int, world: int = WORLD, accum: int = 1,
                      optimizer: str = "sgd"):
    """The oracle for run_scenario: returns (states before final average, state after)."""
    models = [initial_model(k) for k in range(world)]
    opts = [make_optimizer(m, optimizer) for m in models]
    cluster = SimulatedCluster(models, BASE, overrides, optimizers=opts)
    for t in range(1, steps + 1):
        for k in range(world):
            opts[k].zero_grad(set_to_none=True)
            toy.backward(models[k], DATA_SEED, k, t, accum=accum)
        cluster.allreduce_gradients()  # sync.warmup_kind=gradients: DDP's average during the warm-up
        for k in range(world):
            opts[k].step()
        cluster.step()
    before = [model_state(m) for m in models]
    cluster.finalize()
    return before, [model_state(m) for m in models]


# -- the asynchronous algorithms over RPC: invariants, convergence, stragglers -------------------
CONST = 1.0 / 1024  # a constant "local step": every parameter += (rank + 1) * CONST

# name -> overrides, steps, update ("const" | "train"), per-rank sleep per step (s), held straggler rank
ASYNC_SCENARIOS: dict[str, dict] = {
    "asgd_const": dict(overrides=["sync.algorithm=asgd", "sync.period=2", "sync.components.0.period=3"],
                       steps=13, update="const", sleep={2: 0.004}),
    "asgd_ssp": dict(overrides=["sync.algorithm=asgd", "sync.period=1", "sync.components.0.period=1",
                                "sync.max_staleness=1"], steps=16, update="const", sleep={3: 0.01}),
    "easgd_async_const": dict(overrides=["sync.algorithm=easgd_async", "sync.easgd_alpha=0.25", "sync.period=2"],
                              steps=12, update="const", sleep={1: 0.005}),
    "adpsgd_fixed_const": dict(overrides=["sync.algorithm=adpsgd_fixed", "sync.period=1"], steps=12,
                               update="const", sleep={0: 0.005}),
    "adpsgd_random_const": dict(overrides=["sync.algorithm=adpsgd_random", "sync.period=1", "sync.seed=3"],
                                steps=12, update="const", sleep={3: 0.005}),
    "adpsgd_delay_const": dict(overrides=["sync.algorithm=adpsgd_delay", "sync.period=1",
                                          "sync.components.0.period=2"], steps=13, update="const", sleep={1: 0.005}),
    "asgd_train": dict(overrides=["sync.algorithm=asgd", "sync.period=1", "sync.components.0.period=1"],
                       steps=64, update="train", sleep={1: 0.002}),
    "easgd_async_train": dict(overrides=["sync.algorithm=easgd_async", "sync.period=2"], steps=96, update="train",
                              sleep={2: 0.002}),
    "adpsgd_fixed_train": dict(overrides=["sync.algorithm=adpsgd_fixed", "sync.period=1"], steps=64,
                               update="train", sleep={3: 0.002}),
    "adpsgd_random_train": dict(overrides=["sync.algorithm=adpsgd_random", "sync.period=1"], steps=64,
                                update="train", sleep={0: 0.002}),
    "adpsgd_delay_train": dict(overrides=["sync.algorithm=adpsgd_delay", "sync.period=1"], steps=64,
                               update="train", sleep={1: 0.002}),
    # a straggler held before its first step until every other worker has finished training
    "hold_adpsgd_fixed": dict(overrides=["sync.algorithm=adpsgd_fixed", "sync.period=1"], steps=10,
                              update="const", hold=1),
    "hold_adpsgd_random": dict(overrides=["sync.algorithm=adpsgd_random", "sync.period=1"], steps=10,
                               update="const", hold=2),
    "hold_adpsgd_delay": dict(overrides=["sync.algorithm=adpsgd_delay", "sync.period=1"], steps=10,
                              update="const", hold=3),
    "hold_asgd": dict(overrides=["sync.algorithm=asgd", "sync.period=1"], steps=10, update="const", hold=0),
    "hold_easgd_async": dict(overrides=["sync.algorithm=easgd_async", "sync.period=1"], steps=10,
                             update="const", hold=0),
    # checkpoint at step `resume_at` (a consistent cut), end RPC, rebuild everything, load, continue
    "resume_asgd_const": dict(overrides=["sync.algorithm=asgd", "sync.period=1", "sync.max_staleness=3"], steps=12,
                              update="const", sleep={1: 0.003}, resume_at=5),
    "resume_adpsgd_delay_const": dict(overrides=["sync.algorithm=adpsgd_delay", "sync.period=1"], steps=12,
                                      update="const", sleep={2: 0.003}, resume_at=7),
    # with max_staleness = 2 the others must stop 3 pushes ahead of the held worker
    "hold_asgd_ssp": dict(overrides=["sync.algorithm=asgd", "sync.period=1", "sync.max_staleness=2"], steps=8,
                          update="const", hold=3, ssp_probe=True),
}
ASYNC_ADAM_LR = 1e-2
HOLD_TIMEOUT = 240.0  # seconds a held straggler waits for the others before it fails the run


def const_step(model: torch.nn.Module, rank: int) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_((rank + 1) * CONST)


def _wait_for(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HOLD_TIMEOUT
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.02)


def run_async_scenario(rank: int, name: str, spec: dict, outdir: str) -> dict:
    from gossip_accel.sync.engines.server import server_report

    model = initial_model(rank)
    opt = torch.optim.Adam(model.parameters(), lr=ASYNC_ADAM_LR)
    sync = Synchronizer(model, BASE, spec["overrides"])
    initial = model_state(model)  # theta_0 (rank 0's weights, broadcast)
    marks = os.path.join(outdir, f"{name}_done")
    hold = spec.get("hold")
    probe = None
    if rank == hold:
        world = sync.world_size
        _wait_for(lambda: all(os.path.exists(f"{marks}{r}") for r in range(world) if r != hold)
                  if not spec.get("ssp_probe") else server_report(sync)["waiting"] == world - 1,
                  "the other workers to finish (or to block at the staleness bound)")
        probe = server_report(sync) if spec.get("ssp_probe") else {
            "others_done_before_start": [r for r in range(world) if r != hold and os.path.exists(f"{marks}{r}")]}
    sleep = spec.get("sleep", {}).get(rank, 0.0)
    for t in range(1, spec["steps"] + 1):
        if spec["update"] == "const":
            const_step(model, rank)
        else:
            toy.train_step(model, opt, DATA_SEED, rank, t)
        if sleep:
            time.sleep(sleep)
        sync.step()
        if t == spec.get("resume_at"):  # what a restarted training run does
            saved_model, saved_sync = model_state(model), sync.state_dict()
            sync.engine.session.shutdown(graceful=True)
            model = initial_model(rank + 100)
            sync = Synchronizer(model, BASE, spec["overrides"])
            model.load_state_dict(saved_model)
            sync.load_state_dict(saved_sync)
    if hold is not None and rank != hold:
        open(f"{marks}{rank}", "w").close()
    before = model_state(model)
    report = sync.report()
    sync.finalize()
    out = {"initial": initial, "before": before, "final": model_state(model), "report": report,
           "report_final": sync.report(), "metrics": sync.metrics(), "probe": probe, "steps": spec["steps"]}
    if spec["update"] == "train":
        out["heldout"] = toy.heldout_loss(model)
        out["heldout_initial"] = toy.heldout_loss(initial_model(0))
    return out


def _async_worker(rank: int, world: int, init_file: str, outdir: str, names: Sequence[str]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {}
    for name in names:
        results[name] = run_async_scenario(rank, name, ASYNC_SCENARIOS[name], outdir)
        dist.barrier()
    torch.save(results, os.path.join(outdir, f"async{rank}.pt"))
    shutdown()


@functools.lru_cache(maxsize=None)
def async_results(names: tuple[str, ...] = tuple(ASYNC_SCENARIOS), world: int = WORLD) -> list[dict]:
    """Run the asynchronous scenarios once per test session (shared by test_asgd/easgd/adpsgd/stragglers)."""
    outdir = tempfile.mkdtemp(prefix="gossip_async_")
    init_file = os.path.join(outdir, "gloo_init")
    spawn_with_timeout(_async_worker, (world, init_file, outdir, list(names)), world, timeout=900)
    return [torch.load(os.path.join(outdir, f"async{r}.pt"), weights_only=True) for r in range(world)]
