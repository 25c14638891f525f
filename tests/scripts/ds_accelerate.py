"""The Accelerate DeepSpeed-plugin path of tests/test_deepspeed.py, started by ``accelerate launch``.

    accelerate launch --config_file ACC.yaml ds_accelerate.py OUT [--steps S] [sync overrides ...]

ACC.yaml has ``distributed_type: DEEPSPEED`` and a ``deepspeed_config_file`` (ZeRO stage 0). The
model prepared by the Accelerator is a DeepSpeedEngine; AccelerateSynchronizer hands it to
DeepSpeedSynchronizer. Saves each rank's parameters before/after the final average to OUT/rank{r}.pt.
"""
import argparse
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds_worker import skip_shm_comm_build  # noqa: E402
from harness import BASE, DATA_SEED, initial_model, make_optimizer, model_state  # noqa: E402

from gossip_accel.sync import toy  # noqa: E402
from gossip_accel.sync.integrations.accelerate import AccelerateSynchronizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_intermixed_args()
    torch.set_num_threads(1)
    # on CPU the DeepSpeed plugin needs gloo named here, else every rank runs alone (ENVIRONMENT.md)
    skip_shm_comm_build()
    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    rank = accelerator.process_index
    model = initial_model(rank)
    opt = make_optimizer(model)
    engine, opt = accelerator.prepare(model, opt)
    sync = AccelerateSynchronizer(accelerator, engine, BASE, args.overrides)
    for t in range(1, args.steps + 1):
        ids, y = toy.batch(DATA_SEED, rank, t)
        loss = torch.nn.functional.mse_loss(engine(ids).float(), y)
        accelerator.backward(loss)  # DeepSpeed: engine.backward + engine.step
        opt.step()
        opt.zero_grad()
        sync.step()
    before = model_state(accelerator.unwrap_model(engine))
    sync.finalize()
    torch.save({"before": before, "final": model_state(accelerator.unwrap_model(engine)),
                "world_size": accelerator.num_processes, "t": sync.t, "kind": type(sync).__name__,
                "engine": type(engine).__name__, "allreduce_off": engine.enable_backward_allreduce is False},
               os.path.join(args.out, f"rank{rank}.pt"))
    # the gloo exit cure with DeepSpeed (shared/ENVIRONMENT.md)
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
