"""Where a worker's time goes: forward, backward, optimizer step and sync per training step.

    .venv/bin/python bench/step_profile.py [--workers 4] [--steps 256] [--workload synthetic:10M | lm]
        [--settings no-comm "gossip_bmuf-(16,128)" ...] [--ddp-wrapper auto|always|both]
        [--json bench/results/step_profile.json] [--plot docs/img/step_profile.png] [--report JSON]
        [--profile DIR]

Spawns real gloo workers on this machine (localhost, no link shaping: what remains is the CPU cost of
communicating) on a workload of ``bench/cluster_bench.py`` (``synthetic:SIZE``: an embedding table
of about SIZE parameters and a small MLP body, the (16,128) split with 8 embedding shards; ``lm``: the
LM recipe's mini LSTMP LM on wiki_mini, 4 streams x 40 tokens a step) and times every phase of each step on each rank, after ``--warmup`` untimed steps (the
recipes' 32 warm-up steps). A setting is ``no-comm`` or a name of ``bench/sync_traffic.py``'s SETTINGS.
``--ddp-wrapper always`` wraps the synchronized model in DDP (with the synchronizer's no-op hook) as
every run did before the trainers skipped it; ``both`` measures each setting both ways. Prints a table
(ms per step per phase, mean over ranks; steps/s of the slowest rank; the longest syncs), writes JSON and a
stacked-bar plot.

Each rank also counts CPU time over the timed steps: its process's (``cpu ms``: every thread, the
gloo work threads and an overlapped sync's included) and the training thread's within the sync
phase (``sync cpu ms``). CPU time, unlike wall time, does not grow when other processes share the
cores, so ``cpu vs no-comm`` (no-comm's CPU per step over the setting's) is the speed a setting would
keep, on a core per worker with the network hidden, if it were bound by its own compute alone.

``--profile DIR`` also runs cProfile (timer: the training thread's CPU time, ``time.thread_time``) over the
sync phase of every timed step and writes one pstats file per setting and rank,
``DIR/<setting>[-ddp]-rank<k>.pstats`` (read them with ``python -m pstats`` or :mod:`pstats`; the profiler's
own overhead inflates the Python share, so take the CPU ms/step of a run without it as the measure).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import statistics
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
from bench.cluster.runs import NO_COMM, SETTINGS, SettingRun  # noqa: E402
from bench.cluster.workloads import make_workload  # noqa: E402
from bench.quality import free_port  # noqa: E402

PHASES = ("forward", "backward", "optimizer", "sync")


def _worker(rank: int, world: int, port: int, job: dict, out: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"})
    torch.set_num_threads(1)
    from gossip_accel import shutdown

    wl = make_workload(job["workload"], ROOT / "local" / "data" / "wiki_mini", 4, 40, 256, 256, 2)
    model, opt = wl.build()
    setting = job["setting"]
    if setting == NO_COMM:
        dist.init_process_group("gloo")
    run = SettingRun(setting, model, opt, wl.sync_base(), Path(tempfile.mkdtemp()), torch.device("cpu"),
                     ddp_wrapper=job["ddp_wrapper"])
    batches = wl.batches(rank, world, torch.device("cpu"))
    spent = {p: 0.0 for p in PHASES}
    syncs = []
    sync_cpu = [0.0]
    prof = cProfile.Profile(time.thread_time) if job.get("profile") else None

    def step(record: bool) -> None:
        t, c = [time.perf_counter()], [time.thread_time()]

        def mark(phase: str = "") -> None:
            if prof is not None and record and phase == "sync":
                prof.disable()
            t.append(time.perf_counter())
            c.append(time.thread_time())
            if prof is not None and record and phase == "optimizer":  # the sync phase follows
                prof.enable()

        loss = wl.loss(run.model, next(batches))
        mark()
        run.step(loss, mark)
        if record:
            for p, t0, t1 in zip(PHASES, t, t[1:]):
                spent[p] += t1 - t0
            syncs.append(t[-1] - t[-2])
            sync_cpu[0] += c[-1] - c[-2]

    for _ in range(job["warmup"]):
        step(False)
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(job["steps"]):
        step(True)
    mine, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    dist.barrier()
    if prof is not None:
        Path(job["profile"]).mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(Path(job["profile"]) / f"{_slug(job)}-rank{rank}.pstats"))
    row = {"seconds": mine, "wrapped": isinstance(run.model, torch.nn.parallel.DistributedDataParallel),
           "cpu_ms": 1e3 * cpu / job["steps"], "sync_cpu_ms": 1e3 * sync_cpu[0] / job["steps"],
           **{p: 1e3 * v / job["steps"] for p, v in spent.items()}, "longest_syncs_ms": sorted(1e3 * s for s in syncs)[-4:]}
    gathered = [None] * world
    dist.all_gather_object(gathered, row)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    run.close()
    shutdown()


def _slug(job: dict) -> str:
    """The file name stem of a job's profiles: the setting, ``-ddp`` when it is wrapped in DDP."""
    name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in job["setting"])
    return name + ("-ddp" if job["ddp_wrapper"] else "")


def measure(job: dict, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ranks.json")
        before = machine_load.snapshot()
        mp.start_processes(_worker, args=(workers, free_port(), job, out), nprocs=workers, start_method="spawn")
        ranks = json.loads(Path(out).read_text())
    row = {**job, "steps_per_s": job["steps"] / max(r["seconds"] for r in ranks),
           "wrapped": ranks[0]["wrapped"], **{p: statistics.mean(r[p] for r in ranks) for p in PHASES},
           **{k: statistics.mean(r[k] for r in ranks) for k in ("cpu_ms", "sync_cpu_ms")},
           "longest_syncs_ms": ranks[0]["longest_syncs_ms"], "load": machine_load.assess(before, machine_load.snapshot())}
    return row


def table(rows: list[dict]) -> str:
    base = next((r for r in rows if r["setting"] == NO_COMM), None)
    lines = ["| setting | DDP wrapper | steps/s | vs no-comm | forward ms | backward ms | optimizer ms | sync ms | "
             "cpu ms | sync cpu ms | cpu vs no-comm | longest syncs ms (rank 0) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rel = f"{r['steps_per_s'] / base['steps_per_s']:.2f}" if base else "-"
        if "cpu_ms" not in r:  # a JSON of before the CPU counts
            cpu = "- | - | -"
        else:
            ratio = f"{base['cpu_ms'] / r['cpu_ms']:.3f}" if base and base.get("cpu_ms") and r["cpu_ms"] else "-"
            cpu = f"{r['cpu_ms']:.1f} | {r['sync_cpu_ms']:.1f} | {ratio}"
        lines.append(f"| {r['setting']} | {'yes' if r['wrapped'] else 'no'} | {r['steps_per_s']:.2f} | {rel} | "
                     + " | ".join(f"{r[p]:.1f}" for p in PHASES)
                     + f" | {cpu} | {', '.join(f'{x:.0f}' for x in r['longest_syncs_ms'])} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["setting"].replace(")-", ")\n") + ("\nDDP wrapper" if r["wrapped"] else "\nbare model") for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    bottom = [0.0] * len(rows)
    for p in PHASES:
        vals = [r[p] for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=p)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("ms per step (mean over workers)")
    ax.set_title("Where a worker's time goes (localhost, no link shaping)")
    ax.legend()
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=256, help="timed steps (256: two (16,128) cycles)")
    ap.add_argument("--warmup", type=int, default=33, help="untimed steps first (the recipes' 32 warm-up steps)")
    ap.add_argument("--workload", default="synthetic:10M",
                    help="synthetic:SIZE (an embedding table of SIZE parameters) or lm (the mini LSTMP LM)")
    ap.add_argument("--settings", nargs="+", default=[NO_COMM, "gossip_bmuf-(16,128)"])
    ap.add_argument("--ddp-wrapper", choices=("auto", "always", "both"), default="both")
    ap.add_argument("--json", default=str(ROOT / "bench/results/step_profile.json"))
    ap.add_argument("--plot", default=str(ROOT / "docs/img/step_profile.png"))
    ap.add_argument("--report", metavar="JSON", help="only print the table and plot from this script's JSON")
    ap.add_argument("--profile", metavar="DIR",
                    help="cProfile the sync phase (thread CPU time): one pstats file per setting and rank in DIR")
    args = ap.parse_args(argv)
    if args.report:
        rows = json.loads(Path(args.report).read_text())["rows"]
        print(table(rows))
        plot(rows, Path(args.plot))
        return
    if args.workload != "lm":  # a bad spec is refused here; the LM reads its data in each worker
        try:
            make_workload(args.workload, ROOT, 1, 1, 1, 1, 1)
        except ValueError as e:
            ap.error(str(e))
    unknown = [s for s in args.settings if s != NO_COMM and s not in SETTINGS]
    if unknown:
        ap.error(f"unknown settings {unknown}; choose no-comm or one of {', '.join(SETTINGS)}")
    wraps = {"auto": [None], "always": [True], "both": [True, None]}[args.ddp_wrapper]
    rows = []
    for setting in args.settings:
        for wrap in ([None] if setting == NO_COMM else wraps):
            job = {"setting": setting, "ddp_wrapper": wrap, "workload": args.workload, "steps": args.steps,
                   "warmup": args.warmup, "profile": args.profile}
            rows.append(measure(job, args.workers))
            r = rows[-1]
            print(f"[step_profile] {setting} ({'DDP wrapper' if r['wrapped'] else 'bare model'}): "
                  f"{r['steps_per_s']:.2f} steps/s", flush=True)
            if (w := machine_load.warning(r["load"], setting)):
                print(f"[step_profile] {w}", flush=True)
    print(table(rows))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "workers": args.workers,
                                           "workload": args.workload, "rows": rows}, indent=2))
    plot(rows, Path(args.plot))
    print(f"[step_profile] wrote {args.json} and {args.plot}" + (f"; profiles in {args.profile}" if args.profile else ""))


if __name__ == "__main__":
    main()
