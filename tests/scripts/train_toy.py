"""A small training script of the test suite, started by `accelerate launch` or `torchrun`.

    train_toy.py OUT_DIR [--accum K] [--steps S] [sync overrides ...]

Trains gossip_accel.sync.toy.ToyModel on rank-specific deterministic data through an
Accelerator-prepared (DDP) model with AccelerateSynchronizer, then saves each rank's
parameters before and after the final average to OUT_DIR/rank{r}.pt.
"""
import argparse
import os
import sys

import torch
from accelerate import Accelerator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import BASE, DATA_SEED, initial_model, make_optimizer, model_state  # noqa: E402

from gossip_accel import shutdown  # noqa: E402
from gossip_accel.sync import toy  # noqa: E402
from gossip_accel.sync.integrations.accelerate import AccelerateSynchronizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_intermixed_args()
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum)
    rank = accelerator.process_index
    model = initial_model(rank)
    opt = make_optimizer(model)
    model, opt = accelerator.prepare(model, opt)
    with AccelerateSynchronizer(accelerator, model, BASE, args.overrides) as sync:
        for t in range(1, args.steps + 1):
            for micro in range((t - 1) * args.accum + 1, t * args.accum + 1):
                with accelerator.accumulate(model):
                    ids, y = toy.batch(DATA_SEED, rank, micro)
                    loss = torch.nn.functional.mse_loss(model(ids), y)
                    accelerator.backward(loss)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                sync.step()
        before = model_state(accelerator.unwrap_model(model))
    torch.save({"before": before, "final": model_state(accelerator.unwrap_model(model)),
                "world_size": accelerator.num_processes, "t": sync.t, "metrics": sync.metrics()},
               os.path.join(args.out, f"rank{rank}.pt"))
    shutdown()


if __name__ == "__main__":
    main()
