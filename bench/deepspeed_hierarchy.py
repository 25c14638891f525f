"""DDP, DeepSpeed ZeRO-0, gossip-BMUF flat and hierarchical: bytes per step per worker and steps/s.

    .venv/bin/python bench/deepspeed_hierarchy.py [--workers 6] [--group-size 2] [--steps 160]
        [--settings ddp,deepspeed,gossip_bmuf,gossip_bmuf_hier,deepspeed_gossip_bmuf] [--json ...]

Every setting trains the quick-start LM (recipes/wikitext103/lm1/conf/mini.yaml, the (16,128)
component split of conf/lm/period_16_128.yaml) on random token batches of the quick-start shape
(16 streams x 40 tokens per worker), with the same launch: ``torchrun --standalone`` of
``--workers`` CPU processes (gloo). Two byte counts are reported per worker and step:

* **counted**: the synchronizer's own counters (ring model for all-reduces, exact payload for
  neighbour exchanges; see gossip_accel/comm.py), DDP's counting all-reduce hook, and for
  DeepSpeed's own gradient all-reduce the same ring model on the gradient bytes it reduces;
* **on lo**: what really crossed the loopback interface (TCP payload and headers, rendezvous and
  store traffic included), read from /proc/net/dev. Each setting runs in its own network
  namespace (``unshare --net``, needs root) so no other process on the machine adds to it;
  without root the column is left empty.

The hierarchical settings count cross-group traffic (the slow links between nodes) apart from
the intra-group gradient all-reduce (fast links inside a node). Steps/s is measured after
``--warmup`` steps, on this machine's cores: on 2 shared cores it says more about compute
contention than about a network; bench/cluster_bench.py is the benchmark with emulated links.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SETTINGS = ("ddp", "deepspeed", "gossip_bmuf", "gossip_bmuf_hier", "deepspeed_gossip_bmuf")
DESCRIPTION = {
    "ddp": "DDP (all-reduce every step)",
    "deepspeed": "DeepSpeed ZeRO-0 (all-reduce every step)",
    "gossip_bmuf": "gossip-BMUF (16,128), flat",
    "gossip_bmuf_hier": "gossip-BMUF (16,128), hierarchical",
    "deepspeed_gossip_bmuf": "DeepSpeed ZeRO-0 + gossip-BMUF (16,128)",
}


def lo_bytes() -> float:
    """Bytes transmitted on the loopback interface of this network namespace."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return float(rest.split()[8])  # transmit bytes
    return float("nan")


# -- worker side -------------------------------------------------------------------------------
def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from gossip_accel import shutdown
    from gossip_accel.comm import Counter, ring_allreduce_bytes
    from gossip_accel.config import load_sync_config
    from sync_traffic import build_model, load_conf

    torch.set_num_threads(1)
    setting = args.setting
    uses_ds = setting.startswith("deepspeed")
    if uses_ds:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    model = build_model()
    n_params = sum(p.numel() for p in model.parameters())
    sync_conf = OmegaConf.to_container(load_conf().sync)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.03)
    counter, sync, engine = Counter(), None, None
    if setting == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        from gossip_accel.integrations.accelerate import counting_allreduce_hook

        net = DDP(model)
        net.register_comm_hook(counter, counting_allreduce_hook)
    elif uses_ds:
        ds_config = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
                     "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 9}
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
        net = engine
        if setting == "deepspeed_gossip_bmuf":
            from gossip_accel.integrations.deepspeed import DeepSpeedSynchronizer

            sync = DeepSpeedSynchronizer(engine, load_sync_config(sync_conf, ["algorithm=gossip_bmuf"]))
    else:
        net = model
        overrides = ["algorithm=gossip_bmuf"]
        if setting == "gossip_bmuf_hier":
            from gossip_accel.hierarchical import HierarchicalSynchronizer

            sync = HierarchicalSynchronizer(model, load_sync_config(
                sync_conf, [*overrides, f"hierarchy.group_size={args.group_size}"]))
        else:
            from gossip_accel import Synchronizer

            sync = Synchronizer(model, load_sync_config(sync_conf, overrides))
    vocab = model.embedding.num_embeddings
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(1000 + rank)

    def one_step() -> None:
        ids = torch.randint(0, vocab, (16, 41), generator=g)
        loss, _ = net(ids[:, :-1], ids[:, 1:])
        if engine is not None:
            engine.backward(loss)
            engine.step()
            if engine.enable_backward_allreduce:  # DeepSpeed's own gradient all-reduce, ring model
                moved = ring_allreduce_bytes(grad_bytes, n)
                counter.add(moved, moved, 0.0)
        else:
            loss.backward()
            if setting == "gossip_bmuf_hier":
                sync.allreduce_gradients()
            opt.step()
            opt.zero_grad()
        if sync is not None:
            sync.step()

    for _ in range(args.warmup):
        one_step()
    dist.barrier()
    base_counted = _counted(sync, counter)
    base_lo = lo_bytes()
    start = time.perf_counter()
    for _ in range(args.steps):
        one_step()
    dist.barrier()
    seconds = time.perf_counter() - start
    lo = (lo_bytes() - base_lo) / n  # every worker shares this namespace's lo
    counted = {k: v - base_counted.get(k, 0.0) for k, v in _counted(sync, counter).items()}
    t = torch.tensor([counted.get("sent", 0.0), counted.get("cross_sent", 0.0), counted.get("intra_sent", 0.0),
                      seconds], dtype=torch.float64)
    dist.all_reduce(t)
    t /= n
    if rank == 0:
        row = {"setting": setting, "description": DESCRIPTION[setting], "workers": n, "parameters": n_params,
               "steps": args.steps, "counted_bytes_per_step": t[0].item() / args.steps,
               "cross_group_bytes_per_step": t[1].item() / args.steps if setting == "gossip_bmuf_hier" else None,
               "intra_group_bytes_per_step": t[2].item() / args.steps if setting == "gossip_bmuf_hier" else None,
               "lo_bytes_per_step": lo / args.steps,
               "steps_per_second": args.steps / t[3].item()}
        Path(args.out).write_text(json.dumps(row))
    if sync is not None:
        sync.finalize()
    shutdown()
    if uses_ds:  # ENVIRONMENT.md: with DeepSpeed only an immediate exit avoids gloo's exit crash
        sys.stdout.flush()
        os._exit(0)


def _counted(sync, counter) -> dict[str, float]:
    """Bytes sent so far by this worker, split into cross-group and intra-group for hierarchical runs."""
    if sync is None:
        return {"sent": counter.bytes_sent}
    out = {"sent": sync.comm.stats.total().bytes_sent + counter.bytes_sent}
    split = getattr(sync, "traffic_split", None)
    if split is not None:
        out.update({f"{k}_sent": v for k, v in split().items()})
        out["sent"] = sum(split().values())
    return out


# -- launcher side -----------------------------------------------------------------------------
def can_unshare() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("ip") is not None


def run_setting(setting: str, args, tmp: str) -> dict:
    out = os.path.join(tmp, f"{setting}.json")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.workers),
                __file__, "--worker", "--setting", setting, "--out", out, "--steps", str(args.steps),
                "--warmup", str(args.warmup), "--group-size", str(args.group_size)]
    if args.lo:
        cmd = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *torchrun]
    else:
        cmd = torchrun
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    print(f"[bench] {setting}: {DESCRIPTION[setting]}", flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=str(ROOT))
    row = json.loads(Path(out).read_text())
    if not args.lo:  # the machine's own lo carries other processes' traffic too
        row["lo_bytes_per_step"] = None
    return row


def print_table(rows: list[dict]) -> None:
    print(f"\n{rows[0]['workers']} workers, {rows[0]['parameters'] / 1e6:.2f}M-parameter quick-start LM, "
          f"{rows[0]['steps']} timed steps")
    print(f"{'setting':<42}{'counted MB/step':>16}{'cross-group':>13}{'on lo MB/step':>15}{'steps/s':>9}")
    for r in rows:
        cross = r.get("cross_group_bytes_per_step")
        lo = r.get("lo_bytes_per_step")
        print(f"{r['description']:<42}{r['counted_bytes_per_step'] / 1e6:>16.4f}"
              f"{(f'{cross / 1e6:.4f}' if cross is not None else '-'):>13}"
              f"{(f'{lo / 1e6:.4f}' if lo is not None else '-'):>15}{r['steps_per_second']:>9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--group-size", type=int, default=2,
                    help="ranks per group of the hierarchical setting (gossip needs a ring of >= 3 groups)")
    ap.add_argument("--steps", type=int, default=128, help="timed steps; 128 covers one whole (16,128) cycle")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--json", default=str(ROOT / "bench/results/deepspeed_hierarchy.json"))
    ap.add_argument("--no-lo", dest="lo", action="store_false", help="do not measure loopback bytes (no netns)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        ap.error(f"unknown --settings {unknown}; choose from {', '.join(SETTINGS)}")
    if args.lo and not can_unshare():
        print("[bench] not root or no unshare/ip: loopback bytes are not measured (--no-lo)")
        args.lo = False
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_setting(s, args, tmp) for s in settings]
    print_table(rows)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"workers": args.workers, "group_size": args.group_size,
                                           "steps": args.steps, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
