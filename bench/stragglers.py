"""Straggler benchmark: training steps/s of every algorithm with one slow worker, relative to no straggler.

    .venv/bin/python bench/stragglers.py [--workers 4] [--slowdown 4] [--straggler 3] [--steps 30] \\
        [--step-ms 50] [--period 1] [--algorithms ddp,ma,bmuf,...] [--json bench/results/stragglers.json]

Spawns ``--workers`` gloo workers (torch.multiprocessing) that train the toy model of
:mod:`gossip_accel.sync.toy` (a few thousand parameters) with SGD. Every step of every worker
sleeps ``--step-ms`` milliseconds after its forward/backward/update, standing in for the
compute of a real model on an accelerator; the straggler (rank ``--straggler``) sleeps
``--slowdown`` times as long. Each algorithm runs twice, without and with the straggler, for
``--steps`` steps per worker; a worker's steps/s is its steps over the wall time of its
training loop (the final average/broadcast excluded). The table reports, per algorithm, the
mean steps/s per worker (= aggregate throughput / n) with and without the straggler and their
ratio, and the same ratio for the fast workers alone: synchronous algorithms wait for the
straggler at every sync (ratio ~ 1/slowdown), asynchronous ones do not (fast workers ~ 1).

``ddp`` is the gradient all-reduce baseline; the asynchronous algorithms run in their real
asynchronous mode over torch.distributed.rpc. The numbers are only meaningful on an otherwise
idle machine: rank 0 records the machine's load around every run (:mod:`bench.machine_load`, in
the JSON's ``runs[].load`` and per table row), and the bench warns when it was not quiet.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import machine_load  # noqa: E402
from gossip_accel import Synchronizer, shutdown  # noqa: E402
from gossip_accel.sync import toy  # noqa: E402

ALGORITHMS = ["ddp", "ma", "bmuf", "gossip_bmuf", "easgd", "easgd_async", "asgd", "adpsgd_fixed",
              "adpsgd_random", "adpsgd_delay"]
EXTRA = {  # per-algorithm overrides on top of sync.algorithm and the period
    "gossip_bmuf": ["sync.p=1", "sync.q=1"],
    "asgd": ["sync.server_lr=0.25"],
}
LR = 0.05


def ddp_step(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, t: int, n: int) -> None:
    """One step of the DDP baseline: local backward, gradient all-reduce (mean), update."""
    opt.zero_grad(set_to_none=True)
    ids, y = toy.batch(0, rank, t)
    torch.nn.functional.mse_loss(model(ids), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad.div_(n)
    opt.step()


def run_one(rank: int, n: int, algo: str, slowdown: float, args) -> dict:
    torch.manual_seed(0)
    model = toy.ToyModel(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sync = None
    if algo != "ddp":
        overrides = [f"sync.algorithm={algo}", f"sync.period={args.period}", f"sync.components.0.period={args.period}",
                     *EXTRA.get(algo, [])]
        sync = Synchronizer(model, {"components": toy.TOY_COMPONENTS}, overrides)
    pause = args.step_ms / 1000.0 * (slowdown if rank == args.straggler else 1.0)
    before = machine_load.snapshot() if rank == 0 else None
    dist.barrier()
    start = time.perf_counter()
    for t in range(1, args.steps + 1):
        if sync is None:
            ddp_step(model, opt, rank, t, n)
        else:
            toy.train_step(model, opt, 0, rank, t)
        time.sleep(pause)
        if sync is not None:
            sync.step()
    elapsed = time.perf_counter() - start
    if sync is not None:
        sync.finalize()
    dist.barrier()
    row = {"algorithm": algo, "slowdown": slowdown, "rank": rank, "steps": args.steps, "seconds": elapsed,
           "steps_per_second": args.steps / elapsed, "heldout_mse": toy.heldout_loss(model)}
    if before is not None:  # the bench's own workers are left out (machine_load.mark_root in main)
        row["load"] = machine_load.assess(before, machine_load.snapshot())
    return row


def worker(rank: int, n: int, init: str, out: str, args) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=n)
    rows = [run_one(rank, n, algo, slowdown, args) for algo in args.algorithms for slowdown in (1.0, args.slowdown)]
    torch.save(rows, os.path.join(out, f"rank{rank}.pt"))
    shutdown()


def summarize(rows: list[dict], args) -> list[dict]:
    table = []
    for algo in args.algorithms:
        def rate(slowdown: float, ranks) -> float:
            sel = [r["steps_per_second"] for r in rows
                   if r["algorithm"] == algo and r["slowdown"] == slowdown and r["rank"] in ranks]
            return sum(sel) / len(sel)

        everyone = range(args.workers)
        fast = [r for r in everyone if r != args.straggler]
        base, slow = rate(1.0, everyone), rate(args.slowdown, everyone)
        loads = [r["load"] for r in rows if r["algorithm"] == algo and "load" in r]
        table.append({
            "algorithm": algo,
            "quiet": all(ld["quiet"] for ld in loads),
            "steps_per_second_per_worker": base,
            "steps_per_second_per_worker_straggler": slow,
            "relative": slow / base,
            "fast_workers_relative": rate(args.slowdown, fast) / rate(1.0, fast),
            "straggler_relative": rate(args.slowdown, [args.straggler]) / rate(1.0, [args.straggler]),
            "heldout_mse": sum(r["heldout_mse"] for r in rows if r["algorithm"] == algo and r["slowdown"] == 1.0
                               and r["rank"] == 0),
        })
    return table


def markdown(table: list[dict], args) -> str:
    lines = [f"| algorithm | steps/s per worker, no straggler | with one worker {args.slowdown:g}x slower | "
             f"relative | fast workers relative |",
             "|---|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['algorithm']} | {r['steps_per_second_per_worker']:.1f} | "
                     f"{r['steps_per_second_per_worker_straggler']:.1f} | {r['relative']:.2f} | "
                     f"{r['fast_workers_relative']:.2f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--slowdown", type=float, default=4.0, help="the straggler's step takes this many times longer")
    ap.add_argument("--straggler", type=int, default=None, help="rank of the slow worker (default: the last)")
    ap.add_argument("--steps", type=int, default=30, help="training steps per worker and run")
    ap.add_argument("--step-ms", type=float, default=50.0, help="simulated compute per step (sleep), milliseconds")
    ap.add_argument("--period", type=int, default=1, help="sync period H of every algorithm (ADPSGD: 1)")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--json", default=str(ROOT / "bench/results/stragglers.json"))
    args = ap.parse_args(argv)
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    if args.straggler is None:
        args.straggler = args.workers - 1
    if not 0 <= args.straggler < args.workers:
        ap.error(f"--straggler {args.straggler} is not a rank of {args.workers} workers")
    if args.slowdown < 1.0:
        ap.error("--slowdown must be >= 1")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    machine_load.mark_root()
    load_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(args.workers, os.path.join(tmp, "init"), tmp, args), nprocs=args.workers)
        rows = [row for r in range(args.workers) for row in torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=True)]
    table = summarize(rows, args)
    result = {
        "command": "bench/stragglers.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "workers": args.workers, "slowdown": args.slowdown, "straggler_rank": args.straggler, "steps": args.steps,
        "step_ms": args.step_ms, "period": args.period, "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(), "cpu_count": os.cpu_count(), "wall_seconds": time.time() - started,
        "torch": torch.__version__, "table": table, "runs": rows,
        "load": machine_load.summary([r["load"] for r in rows if "load" in r]),
    }
    print(f"{args.workers} workers, rank {args.straggler} {args.slowdown:g}x slower ({args.step_ms:g} ms simulated "
          f"compute per step), {args.steps} steps, sync period {args.period}; "
          f"load average before {load_before[0]:.2f}, after {result['loadavg_after'][0]:.2f}")
    print(markdown(table, args))
    for r in rows:
        if "load" in r and (w := machine_load.warning(r["load"], f"{r['algorithm']} (slowdown {r['slowdown']:g})")):
            print(w)
    if (w := machine_load.summary_warning(result["load"], "runs[].load")):
        print(w)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
