"""What runs in each namespace: every setting of every workload, timed, with traffic, overhead, quality.

Started by ``bench/cluster_bench.py`` through ``utils/launch.sh`` (one process per namespace,
rendezvous on rank 0's address); on a real cluster start it the same way on each node
(``bench/README.md``)::

    utils/launch.sh --num-workers 4 -- -m bench.cluster.worker --out results.json --seconds 4

For each workload and setting: build the model (same seed on every rank), warm up, train for
``--seconds`` and on to a whole traffic cycle (:mod:`bench.cluster.timing`), read the byte
counters (the synchronizer's, or the DDP hook's) and the interface's wire counters over exactly
that window, measure the synchronizer's overhead (:mod:`bench.cluster.overhead`) and the
quality of the model as it was when the budget was used (LM: validation perplexity of the
average of the replicas; no-comm: of each replica). Rank 0 gathers
every rank's numbers and writes one JSON; the table and the ratios are made by
:mod:`bench.cluster.report`.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from bench import machine_load
from bench.cluster import overhead, report, timing
from bench.cluster.runs import ALL_SETTINGS, DDP, DEFAULT_SETTINGS, NO_COMM, SettingRun, check_settings
from bench.cluster.workloads import ROOT, Workload, make_workload


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON written by rank 0")
    ap.add_argument("--label", default="", help="name of the network (printed with the progress)")
    ap.add_argument("--workloads", nargs="+", default=["lm", "synthetic:10M"])
    ap.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS),
                    help=f"of {', '.join(ALL_SETTINGS)}, or all")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="training time per setting: quality is taken there, speed and bytes over the run "
                         "continued to a whole sync cycle")
    ap.add_argument("--steps", type=int, default=None, help="exactly this many timed steps instead of --seconds")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the whole list of settings this many times in turn; each round's speed is taken "
                         "against the same round's no-comm, and the row reports the median round")
    ap.add_argument("--no-overhead", action="store_true", help="skip the sync-vs-raw-exchange measurement")
    ap.add_argument("--lm-data", default=str(ROOT / "local" / "data" / "wiki_mini"))
    ap.add_argument("--lm-streams", type=int, default=4)
    ap.add_argument("--lm-bptt", type=int, default=40)
    ap.add_argument("--synthetic-batch", type=int, default=256)
    ap.add_argument("--synthetic-width", type=int, default=256)
    ap.add_argument("--synthetic-depth", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", default=not torch.cuda.is_available(), help="CPU workers (default without GPUs)")
    args = ap.parse_args(argv)
    if args.settings == ["all"]:
        args.settings = list(ALL_SETTINGS)
    check_settings(args.settings)
    return args


def wire_bytes() -> Optional[tuple[int, int]]:
    """(tx, rx) bytes of the interface gloo uses (GLOO_SOCKET_IFNAME), headers and all."""
    iface = os.environ.get("GLOO_SOCKET_IFNAME")
    if not iface:
        return None
    base = Path("/sys/class/net") / iface / "statistics"
    try:
        return int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text())
    except OSError:
        return None


def tcp_retransmits() -> Optional[int]:
    """TCP segments retransmitted so far in this network namespace (/proc/net/snmp, RetransSegs):
    drops at a full link queue show up here (on a real host: all of the host's TCP traffic)."""
    try:
        lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Tcp:")]
        return int(lines[1][lines[0].index("RetransSegs")])
    except (OSError, ValueError, IndexError):
        return None


def analytic_bytes(run: SettingRun, world: int) -> float:
    """Bytes per step and worker by docs/ALGORITHMS.md (bench/sync_traffic.py's formulas)."""
    from bench.sync_traffic import analytic
    from gossip_accel.sync.comm import ring_allreduce_bytes

    if run.sync is not None:
        return analytic(run.sync, world)
    if run.setting == DDP:
        return ring_allreduce_bytes(sum(p.numel() * p.element_size() for p in run.core.parameters()), world)
    return 0.0


def describe_sync(run: SettingRun, world: int) -> dict:
    if run.sync is None:
        return {"algorithm": run.setting, "periods": "(1)" if run.setting == DDP else "-"}
    from gossip_accel.train.describe import periods_label

    cfg = run.sync.cfg
    return {"algorithm": cfg.algorithm, "periods": periods_label(cfg), "p": cfg.resolved_p(world),
            "q": cfg.resolved_q(world) if cfg.graph == "ring" else None,
            "block_momentum": run.sync.block_momentum if cfg.uses_bmuf else None}


def averaged_quality(wl: Workload, run: SettingRun, snapshot: dict) -> Optional[float]:
    """Quality of the model at the budget: for no-comm each worker's own replica (mean over
    workers, by the caller), otherwise the average of all replicas there (Algorithm 1, line 20,
    as if training had stopped at that moment)."""
    if not snapshot:
        return None
    if run.setting != NO_COMM:
        world = dist.get_world_size()
        for v in snapshot.values():
            if v.is_floating_point():
                dist.all_reduce(v)
                v.div_(world)
    run.core.load_state_dict(snapshot)
    return wl.quality(run.core)


def run_setting(wl: Workload, setting: str, args: argparse.Namespace, device: torch.device, exp: Path,
                with_overhead: bool = True) -> dict:
    """This rank's measurements of one setting (the sync-vs-raw-exchange replay only ``with_overhead``)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    wall = time.perf_counter()
    model, opt = wl.build()
    run = SettingRun(setting, model, opt, wl.sync_base(), exp, device, wl.clip_norm)
    batches = wl.batches(rank, world, device)
    snapshot: dict = {}

    def step() -> None:
        run.step(wl.loss(run.model, next(batches)))

    def at_budget() -> None:
        if wl.has_quality:
            snapshot.update({k: v.detach().clone() for k, v in run.core.state_dict().items()})

    estimate = timing.warm_up(step, args.warmup)
    traffic0, wire0, retrans0 = run.traffic(), wire_bytes(), tcp_retransmits()
    timed = timing.train_for(step, run.cycle, args.seconds, estimate, args.steps, at_budget)
    traffic1, wire1, retrans1 = run.traffic(), wire_bytes(), tcp_retransmits()
    out = {
        "steps": timed.steps, "seconds": timed.seconds, "checks": timed.checks, "cycle": run.cycle,
        "quality_steps": timed.budget_steps, "quality_seconds": timed.budget_seconds,
        "sent": traffic1.bytes_sent - traffic0.bytes_sent, "recv": traffic1.bytes_recv - traffic0.bytes_recv,
        "comm_seconds": traffic1.seconds - traffic0.seconds, "analytic": analytic_bytes(run, world),
        "wire_tx": wire1[0] - wire0[0] if wire0 else None, "wire_rx": wire1[1] - wire0[1] if wire0 else None,
        "tcp_retransmits": retrans1 - retrans0 if retrans0 is not None and retrans1 is not None else None,
        "parameters": sum(p.numel() for p in run.core.parameters()), **describe_sync(run, world),
    }
    if run.sync is not None and with_overhead and not args.no_overhead:
        out["overhead"] = overhead.measure(run.sync, device)
    out["quality"] = averaged_quality(wl, run, snapshot)
    out["quality_of"] = "each replica (mean)" if setting == NO_COMM else "average of the replicas"
    run.close()
    out["wall_seconds"] = time.perf_counter() - wall
    return out


def aggregate(per_rank: list[dict], tokens_per_step: int) -> dict:
    """One row: cluster speed (the slowest worker), traffic per step and worker (mean and max over ranks)."""
    r0 = per_rank[0]
    steps, seconds, world = r0["steps"], max(r["seconds"] for r in per_rank), len(per_rank)

    def per_step(key: str) -> Optional[float]:
        values = [r[key] for r in per_rank]
        return None if any(v is None for v in values) else statistics.mean(values) / steps

    quality = [r["quality"] for r in per_rank]
    return {
        "algorithm": r0["algorithm"], "periods": r0["periods"], "p": r0.get("p"), "q": r0.get("q"),
        "block_momentum": r0.get("block_momentum"), "parameters": r0["parameters"],
        "steps": steps, "cycle": r0["cycle"], "seconds": seconds, "stop_checks": r0["checks"],
        "steps_per_s": steps / seconds, "tokens_per_s": steps * tokens_per_step * world / seconds,
        "sent_bytes_per_step": per_step("sent"), "recv_bytes_per_step": per_step("recv"),
        "max_rank_sent_bytes_per_step": max(r["sent"] for r in per_rank) / steps,
        "analytic_bytes_per_step": r0["analytic"],
        "wire_tx_bytes_per_step": per_step("wire_tx"), "wire_rx_bytes_per_step": per_step("wire_rx"),
        "comm_seconds_per_step": per_step("comm_seconds"),
        "tcp_retransmits_per_worker": (None if any(r["tcp_retransmits"] is None for r in per_rank)
                                       else statistics.mean(r["tcp_retransmits"] for r in per_rank)),
        "quality": None if quality[0] is None else statistics.mean(quality), "quality_of": r0["quality_of"],
        "quality_steps": r0["quality_steps"], "quality_seconds": max(r["quality_seconds"] for r in per_rank),
        "overhead": r0.get("overhead"), "wall_seconds": max(r["wall_seconds"] for r in per_rank),
    }


def progress(label: str, workload: str, setting: str, row: dict) -> str:
    q = (f", ppl {row['quality']:.1f} after {row['quality_seconds']:.1f} s" if row["quality"] is not None else "")
    o = row["overhead"]
    oh = f", sync {o['sync_ms']:.1f} ms vs raw {o['raw_ms']:.1f} ms" if o and o["sync_ms"] is not None else ""
    return (f"[bench] {label} {workload} {setting}: {row['steps']} steps in {row['seconds']:.1f} s "
            f"({row['wall_seconds']:.0f} s with warm-up and measurements), "
            f"{row['steps_per_s']:.2f} steps/s, {row['sent_bytes_per_step'] / 1e6:.3f} MB sent/step "
            f"(analytic {row['analytic_bytes_per_step'] / 1e6:.3f}){oh}{q}")


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    from accelerate import Accelerator

    from gossip_accel import shutdown

    accelerator = Accelerator(cpu=args.cpu)  # joins the process group the launcher set up
    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    if world < 2:
        raise SystemExit("bench.cluster.worker: world size 1; start it with utils/launch.sh on every node")
    exp = Path(tempfile.mkdtemp(prefix="gab_worker_"))  # DistributedRun's exp dir (checkpoints are off)
    result = {"label": args.label, "workers": world, "device": str(device), "seconds_budget": args.seconds,
              "fixed_steps": args.steps, "warmup_steps": args.warmup, "workloads": {}}
    start = time.perf_counter()
    for spec in args.workloads:
        wl = make_workload(spec, Path(args.lm_data), args.lm_streams, args.lm_bptt, args.synthetic_batch,
                           args.synthetic_width, args.synthetic_depth)
        rounds: dict[str, list[dict]] = {setting: [] for setting in args.settings}
        for r in range(args.rounds):  # settings in turn, so a slow spell of the machine hits every setting
            for setting in args.settings:
                before = machine_load.snapshot() if rank == 0 else None
                mine = run_setting(wl, setting, args, device, exp, with_overhead=r == 0)
                gc.collect()  # the setting's model, optimizer and synchronizer are gone: free them before the next
                gathered: list = [None] * world
                dist.all_gather_object(gathered, mine)
                row = aggregate(gathered, wl.tokens_per_step)
                rounds[setting].append(row)
                if rank == 0:  # (accelerator.print prints on every node's local main process)
                    row["load"] = machine_load.assess(before, machine_load.snapshot())
                    label = setting if args.rounds == 1 else f"{setting} (round {r + 1}/{args.rounds})"
                    print(progress(args.label, wl.name, label, row), flush=True)
                    if (w := machine_load.warning(row["load"], f"{args.label} {wl.name} {label}")):
                        print(f"[bench] {w}", flush=True)  # echoed by the driver (bench/cluster/launch.py)
        rows = {setting: report.combine_rounds(rs) for setting, rs in rounds.items()}
        result["workloads"][wl.name] = {"spec": spec, "tokens_per_step_per_worker": wl.tokens_per_step,
                                        "parameters": next(iter(rows.values()))["parameters"], "rows": rows}
    result["worker_seconds"] = time.perf_counter() - start
    if rank == 0:
        Path(args.out).write_text(json.dumps(result, indent=2))
    shutil.rmtree(exp, ignore_errors=True)
    shutdown()


if __name__ == "__main__":
    main()
