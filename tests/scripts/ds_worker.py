"""Workers of tests/test_deepspeed.py: real gloo processes, each with a DeepSpeed engine.

Phase ``train`` runs every scenario of SCENARIOS (ZeRO-0), the refusals and ZeRO-1/2 inside
replica groups (``zero_groups``) in one process group (process start and ``import deepspeed``
paid once) and saves a DeepSpeed checkpoint of the ``fp32`` scenario at RESUME_AT; phase
``resume`` is a new set of processes that builds the engine from other weights, loads that
checkpoint and trains on to the end. Results go to OUT/<phase><rank>.pt.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import BASE, DATA_SEED, LR, initial_model, model_state  # noqa: E402

from gossip_accel.sync import toy  # noqa: E402

STEPS = 14  # not a multiple of any period: the replicas differ before the final average
RESUME_AT = 5
OVERFLOW_STEP, OVERFLOW_RANK = 6, 1  # fp16: an inf gradient on one rank only
# dynamic loss scale 2^10. The scale stays put in the "fp16" scenario (window 1000): DeepSpeed 0.19.8
# unscales with the *new* scale on a step where it grows, halving that step (an upstream bug,
# noted on deepspeedai/DeepSpeed PR #8588), which would blur the comparison with fp32.
FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 10, "loss_scale_window": 1000, "hysteresis": 1,
        "min_loss_scale": 1}
FP16_DYNAMIC = dict(FP16, loss_scale_window=3)  # grows every 3 clean steps, halves on an overflow
ACCUM = 2  # gradient accumulation steps of the fp32_accum scenario
# name -> (sync overrides, DeepSpeed config additions)
SCENARIOS: dict[str, tuple[list[str], dict]] = {
    "fp32": (["sync.algorithm=bmuf", "sync.block_momentum=0.5"], {}),
    "bf16": (["sync.algorithm=ma"], {"bf16": {"enabled": True}}),
    "fp16": (["sync.algorithm=ma"], {"fp16": FP16}),
    # OVERFLOW_RANK's gradient is inf at OVERFLOW_STEP
    "fp16_overflow": (["sync.algorithm=ma"], {"fp16": FP16_DYNAMIC}),
    "fp32_accum": (["sync.algorithm=gossip_bmuf", "sync.p=1", "sync.q=1", "sync.block_momentum=0.5"],
                   {"gradient_accumulation_steps": ACCUM}),
}


def ds_config(extra: dict) -> dict:
    return {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 0}, "gradient_clipping": 0.0, "steps_per_print": 10_000,
            "wall_clock_breakdown": False, **extra}


def skip_shm_comm_build() -> None:
    """Call before ``deepspeed.init_distributed`` (or ``Accelerator()``): DeepSpeed's CPU backend
    JIT-compiles a shared-memory op when it starts (measured 20-150 s here without the cache in
    ~/.cache/torch_extensions, 0.5 s with it). The op serves only ``inference_all_reduce``, never
    the training path these tests check, so the tests mark it incompatible and DeepSpeed falls back
    to gloo for it (docs/DEEPSPEED.md: prebuild it with DS_BUILD_SHM_COMM=1 to keep it)."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__ = dict(deepspeed.ops.__compatible_ops__, deepspeed_shm_comm=False)


def lift_fp16_gate() -> bool:
    """DeepSpeed's CPU accelerator allows fp16 only where oneDNN has native fp16 kernels
    (``torch.ops.mkldnn._is_mkldnn_fp16_supported()``: AVX512-FP16/AMX-FP16 CPUs). torch computes
    fp16 on any CPU (slower, emulated), so on others the test lifts that one gate; the fp16
    optimizer, the dynamic loss scaler and the overflow all-reduce then run unchanged.
    Returns whether the gate had to be lifted."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.is_fp16_supported():
        return False
    acc.is_fp16_supported = lambda: True
    return True


def make_engine(seed: int, extra: dict):
    import deepspeed

    model = initial_model(seed)
    for key, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        if extra.get(key, {}).get("enabled"):
            # DeepSpeed casts parameters only; BatchNorm on CPU wants its statistics in the input dtype
            model.to(dtype)
    if extra.get("fp16", {}).get("enabled"):
        lift_fp16_gate()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(extra))
    return engine


def loss_scale(engine) -> float:
    return float(getattr(engine.optimizer, "loss_scale", 1.0))


def train(engine, sync, rank: int, start: int, stop: int, log: dict, inject: bool = False) -> None:
    """Steps start..stop (inclusive), each: forward, backward, engine.step(), sync.step()."""
    from gossip_accel.sync.integrations.deepspeed import fp16_loss

    for t in range(start, stop + 1):
        accum = engine.gradient_accumulation_steps()
        for micro in range((t - 1) * accum + 1, t * accum + 1):  # toy.train_step's micro-batches
            ids, y = toy.batch(DATA_SEED, rank, micro)
            loss = torch.nn.functional.mse_loss(engine(ids).float(), y)
            engine.backward(fp16_loss(engine, loss))  # DeepSpeed divides by accum itself
            if inject and t == OVERFLOW_STEP and rank == OVERFLOW_RANK:
                with torch.no_grad():
                    next(engine.module.parameters()).grad.view(-1)[0] = float("inf")
            engine.step()
            sync.step()  # counts the optimizer step only (engine.global_steps)
        log.setdefault("scale", []).append(loss_scale(engine))
        log.setdefault("applied", []).append(engine.was_step_applied())
        if sync._synced_at(sync.t):  # master and model weights agree after each sync
            log.setdefault("master_gap", []).append(max(
                float((m.detach() - w.detach().float()).abs().max() / (m.detach().abs().max() + 1e-12))
                for _, m, w in sync._pairs))


def run_scenario(name: str, rank: int, outdir: str) -> dict:
    from gossip_accel.sync.integrations.deepspeed import DeepSpeedSynchronizer, save_checkpoint

    overrides, extra = SCENARIOS[name]
    engine = make_engine(rank, extra)
    sync = DeepSpeedSynchronizer(engine, BASE, overrides)
    log: dict[str, Any] = {"allreduce_off": engine.enable_backward_allreduce is False,
                           "optimizer": type(engine.optimizer).__name__,
                           "masters_fp32": all(m.dtype == torch.float32 for _, m, _ in sync._pairs)}
    if name == "fp32":
        train(engine, sync, rank, 1, RESUME_AT, log)
        save_checkpoint(engine, sync, os.path.join(outdir, "ckpt"), client_state={"note": "mine"})
        train(engine, sync, rank, RESUME_AT + 1, STEPS, log)
    else:
        train(engine, sync, rank, 1, STEPS, log, inject=(name == "fp16_overflow"))
    log["before"] = model_state(engine.module)
    log["before_master"] = {n: m.detach().clone() for n, m, _ in sync._pairs}
    sync.finalize()
    log["final"] = model_state(engine.module)
    log["final_master"] = {n: m.detach().clone() for n, m, _ in sync._pairs}
    log["t"] = sync.t
    log["skipped"] = int(engine.skipped_steps)
    return log


def refused(rank: int) -> dict:
    """ZeRO-1, fp16 with an asynchronous algorithm, sync.hierarchy: ConfigErrors that say what works."""
    from gossip_accel.sync.config import ConfigError
    from gossip_accel.sync.integrations.deepspeed import DeepSpeedSynchronizer

    out = {}
    for key, extra, overrides in (
        ("zero1", {"zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}, ["sync.algorithm=ma"]),
        ("fp16_async", {"fp16": FP16}, ["sync.algorithm=adpsgd_fixed"]),
        ("hierarchy", {}, ["sync.algorithm=ma", "sync.hierarchy.group_size=2"]),
    ):
        engine = make_engine(0, extra)
        try:
            DeepSpeedSynchronizer(engine, BASE, overrides)
            out[key] = None
        except ConfigError as e:
            out[key] = str(e)
        dist.barrier()
    return out


# ZeRO-1 and ZeRO-2 inside replica groups of GROUP_SIZE ranks, BMUF between the groups
GROUP_SIZE = 2
GROUPS_CONFIG = {"period": 4}  # one component: the rank's fp32 partition
GROUPS_OVERRIDES = ["sync.algorithm=bmuf", "sync.block_momentum=0.5", f"sync.hierarchy.group_size={GROUP_SIZE}"]


def zero_groups(rank: int, stage: int) -> dict:
    import deepspeed

    from gossip_accel.sync.integrations.deepspeed import DeepSpeedSynchronizer, ReplicaGroups

    groups = ReplicaGroups(GROUP_SIZE)
    model = initial_model(rank)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)
    config = ds_config({"zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True})
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config, mpu=groups)
    sync = DeepSpeedSynchronizer(engine, GROUPS_CONFIG, GROUPS_OVERRIDES)
    log: dict[str, Any] = {"dp_world_size": engine.dp_world_size, "sync_world": sync.world_size,
                           "allreduce_on": engine.enable_backward_allreduce is True}
    train(engine, sync, rank, 1, STEPS, log)
    log["before"] = model_state(engine.module)
    sync.finalize()
    log["final"] = model_state(engine.module)
    return log


def resume(rank: int, outdir: str) -> dict:
    from gossip_accel.sync.integrations.deepspeed import DeepSpeedSynchronizer, load_checkpoint

    overrides, extra = SCENARIOS["fp32"]
    engine = make_engine(rank + 100, extra)  # other weights: the checkpoint must overwrite them
    sync = DeepSpeedSynchronizer(engine, BASE, overrides)
    _, client = load_checkpoint(engine, sync, os.path.join(outdir, "ckpt"))
    log: dict[str, Any] = {"client": client, "t_loaded": sync.t}
    train(engine, sync, rank, sync.t + 1, STEPS, log)
    log["before"] = model_state(engine.module)
    sync.finalize()
    log["final"] = model_state(engine.module)
    return log


def worker(rank: int, world: int, init_file: str, outdir: str, phase: str) -> None:
    os.environ.update(OMP_NUM_THREADS="1", LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    import deepspeed

    skip_shm_comm_build()
    deepspeed.init_distributed(dist_backend="gloo")
    if phase == "train":
        results: dict[str, Any] = {name: run_scenario(name, rank, outdir) for name in SCENARIOS}
        results["refused"] = refused(rank)
        for stage in (1, 2):
            results[f"zero{stage}_groups"] = zero_groups(rank, stage)
    else:
        results = resume(rank, outdir)
    torch.save(results, os.path.join(outdir, f"{phase}{rank}.pt"))
    # the gloo exit cure with DeepSpeed (shared/ENVIRONMENT.md)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
