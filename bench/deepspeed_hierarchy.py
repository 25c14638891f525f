"""DDP, DeepSpeed ZeRO-0, gossip-BMUF flat and hierarchical: bytes per step per worker and steps/s.

    .venv/bin/python bench/deepspeed_hierarchy.py [--workers 6] [--group-size 2] [--steps 128] [--warmup 36]
        [--settings ddp,deepspeed,gossip_bmuf,gossip_bmuf_hier,deepspeed_gossip_bmuf] [--json ...]

Every setting trains the quick-start LM (recipes/wikitext103/lm1/conf/mini.yaml, the (16,128)
component split of conf/lm/period_16_128.yaml) on random token batches of the quick-start shape
(16 streams x 40 tokens per worker), with the same launch: ``torchrun --standalone`` of
``--workers`` CPU processes (gloo). Two byte counts are reported per worker and step:

* **counted**: the synchronizer's own counters (ring model for all-reduces, exact payload for
  neighbour exchanges; see gossip_accel/sync/comm.py), DDP's counting all-reduce hook, and for
  DeepSpeed's own gradient all-reduce the same ring model on the gradient bytes it reduces;
* **on the wire**: what really crossed the interfaces (TCP payload and headers, rendezvous and
  store traffic included), read from /proc/net/dev. Each setting runs in network namespaces of
  its own (needs root) so no other process on the machine adds to it; without root the
  columns are left empty.

Two networks (``--link``):

* ``none`` (default): one namespace (``unshare --net``), every byte on its loopback;
* a rate such as ``100mbit``: one namespace per *node* of ``--group-size`` workers (the
  hierarchical setting's groups), joined by veth pairs to a bridge (bench/cluster/netns.py), each
  node's veth shaped to the rate with ``tbf`` (bench/cluster/shaping.py, no delay). Workers of a
  node talk over their namespace's loopback (fast, unshaped), nodes over the shaped links: the
  cluster hierarchical sync is made for. Every setting then runs as ``torchrun --nnodes G
  --nproc_per_node g`` per node, and "between nodes" counts the bytes on the veths.

The hierarchical settings count cross-group traffic (the slow links between nodes) apart from
the intra-group gradient all-reduce (fast links inside a node). Steps/s is measured after
``--warmup`` steps (36 by default: the recipe conf's sync warm-up, 32 steps of full averages, is not
timed or counted), on this machine's cores: on 2 shared cores it says more about compute
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

from bench import machine_load  # noqa: E402

SETTINGS = ("ddp", "deepspeed", "gossip_bmuf", "gossip_bmuf_bf16", "gossip_bmuf_hier", "deepspeed_gossip_bmuf")
DESCRIPTION = {
    "ddp": "DDP (all-reduce every step)",
    "deepspeed": "DeepSpeed ZeRO-0 (all-reduce every step)",
    "gossip_bmuf": "gossip-BMUF (16,128), flat, fp32 exchange",
    "gossip_bmuf_bf16": "gossip-BMUF (16,128), flat, bf16 exchange",
    "gossip_bmuf_hier": "gossip-BMUF (16,128), hierarchical, bf16",
    "deepspeed_gossip_bmuf": "DeepSpeed ZeRO-0 + gossip-BMUF (16,128), bf16",
}


def net_bytes() -> tuple[float, float]:
    """Bytes transmitted in this network namespace: (loopback, every other interface)."""
    lo = other = 0.0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, _, rest = line.partition(":")
        tx = float(rest.split()[8])  # transmit bytes
        if name.strip() == "lo":
            lo += tx
        else:
            other += tx
    return lo, other


# -- worker side -------------------------------------------------------------------------------
def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from gossip_accel import shutdown
    from gossip_accel.sync.comm import Counter, ring_allreduce_bytes
    from gossip_accel.sync.config import load_sync_config
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

        from gossip_accel.sync.integrations.accelerate import counting_allreduce_hook

        net = DDP(model)
        net.register_comm_hook(counter, counting_allreduce_hook)
    elif uses_ds:
        ds_config = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
                     "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 9}
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
        net = engine
        if setting == "deepspeed_gossip_bmuf":
            from gossip_accel.sync.integrations.deepspeed import DeepSpeedSynchronizer

            sync = DeepSpeedSynchronizer(engine, load_sync_config(sync_conf, ["algorithm=gossip_bmuf"]))
    else:
        net = model
        # the recipe conf's wire is bf16; the flat setting sends fp32 so that the _bf16 row shows what bf16 saves
        overrides = ["algorithm=gossip_bmuf", "exchange_dtype=" + ("float32" if setting == "gossip_bmuf" else "bfloat16")]
        if setting == "gossip_bmuf_hier":
            from gossip_accel.sync.hierarchical import HierarchicalSynchronizer

            sync = HierarchicalSynchronizer(model, load_sync_config(
                sync_conf, [*overrides, f"hierarchy.group_size={args.group_size}"]))
        else:
            from gossip_accel import Synchronizer

            sync = Synchronizer(model, load_sync_config(sync_conf, overrides))
    hierarchical = setting == "gossip_bmuf_hier"
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
            if hierarchical:
                sync.allreduce_gradients()
            opt.step()
            opt.zero_grad()
        if sync is not None:
            sync.step()

    for _ in range(args.warmup):
        one_step()
    dist.barrier()
    base_counted = _counted(sync, counter)
    base_net = net_bytes()
    start = time.perf_counter()
    for _ in range(args.steps):
        one_step()
    dist.barrier()
    seconds = time.perf_counter() - start
    # one worker per namespace (node) reads its interfaces; the sum over nodes, per worker
    node_reader = int(os.environ.get("LOCAL_RANK", "0")) == 0
    lo, wire = ((b - a) if node_reader else 0.0 for a, b in zip(base_net, net_bytes()))
    counted = {k: v - base_counted.get(k, 0.0) for k, v in _counted(sync, counter).items()}
    t = torch.tensor([counted.get("sent", 0.0), counted.get("cross_sent", 0.0), counted.get("intra_sent", 0.0),
                      seconds, lo * n, wire * n], dtype=torch.float64)
    dist.all_reduce(t)
    t /= n
    if rank == 0:
        row = {"setting": setting, "description": DESCRIPTION[setting], "workers": n, "parameters": n_params,
               "steps": args.steps, "counted_bytes_per_step": t[0].item() / args.steps,
               "cross_group_bytes_per_step": t[1].item() / args.steps if setting == "gossip_bmuf_hier" else None,
               "intra_group_bytes_per_step": t[2].item() / args.steps if setting == "gossip_bmuf_hier" else None,
               "lo_bytes_per_step": t[4].item() / n / args.steps,
               "between_nodes_bytes_per_step": t[5].item() / n / args.steps,
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


def worker_argv(setting: str, args, out: str) -> list[str]:
    return [__file__, "--worker", "--setting", setting, "--out", out, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--group-size", str(args.group_size)]


def run_setting(setting: str, args, tmp: str, cluster=None) -> dict:
    out = os.path.join(tmp, f"{setting}.json")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    print(f"[bench] {setting}: {DESCRIPTION[setting]}", flush=True)
    before = machine_load.snapshot()
    if cluster is not None:  # one torchrun per node namespace, as on a real cluster
        nodes = args.workers // args.group_size
        procs = [cluster.adopt(subprocess.Popen(cluster.exec_argv(i, [
            "env", f"GLOO_SOCKET_IFNAME={cluster.veth(i)}", sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nodes), "--node_rank", str(i), "--nproc_per_node", str(args.group_size),
            "--master_addr", cluster.address(0), "--master_port", "29500", *worker_argv(setting, args, out)]),
            env=env, cwd=str(ROOT))) for i in range(nodes)]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"[bench] {setting}: a node failed (exit codes {codes})")
    else:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                    str(args.workers), *worker_argv(setting, args, out)]
        cmd = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *torchrun] if args.lo else torchrun
        subprocess.run(cmd, check=True, env=env, cwd=str(ROOT))
    row = json.loads(Path(out).read_text())
    row["load"] = machine_load.assess(before, machine_load.snapshot())
    if (w := machine_load.warning(row["load"], setting)):
        print(w, flush=True)
    row["link"] = args.link
    if not args.lo:  # the machine's own lo carries other processes' traffic too
        row["lo_bytes_per_step"] = row["between_nodes_bytes_per_step"] = None
    return row


def print_table(rows: list[dict]) -> None:
    print(f"\n{rows[0]['workers']} workers, {rows[0]['parameters'] / 1e6:.2f}M-parameter quick-start LM, "
          f"{rows[0]['steps']} timed steps")
    print(f"link between nodes: {rows[0]['link']}; MB per step and worker")
    print(f"{'setting':<42}{'counted':>9}{'cross-group':>13}{'on lo':>8}{'between nodes':>15}{'steps/s':>9}")

    def mb(v) -> str:
        return f"{v / 1e6:.4f}" if v is not None else "-"

    for r in rows:
        print(f"{r['description']:<42}{mb(r['counted_bytes_per_step']):>9}{mb(r.get('cross_group_bytes_per_step')):>13}"
              f"{mb(r.get('lo_bytes_per_step')):>8}{mb(r.get('between_nodes_bytes_per_step')):>15}"
              f"{r['steps_per_second']:>9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--group-size", type=int, default=2,
                    help="ranks per group of the hierarchical setting (gossip needs a ring of >= 3 groups)")
    ap.add_argument("--steps", type=int, default=128, help="timed steps; 128 covers one whole (16,128) cycle")
    ap.add_argument("--warmup", type=int, default=36,
                    help="untimed steps first; past the recipe conf's 32 steps of sync warm-up (full averages every 8)")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--json", default=str(ROOT / "bench/results/deepspeed_hierarchy.json"))
    ap.add_argument("--link", default="none",
                    help="none: all workers in one namespace; a rate (100mbit, 1gbit): one namespace per node of "
                         "--group-size workers, nodes joined by links shaped to it")
    ap.add_argument("--no-lo", dest="lo", action="store_false", help="do not measure wire bytes (no netns, no root)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    machine_load.mark_root()  # the workers of every setting are this bench's own, not load
    settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        ap.error(f"unknown --settings {unknown}; choose from {', '.join(SETTINGS)}")
    if args.workers % args.group_size:
        ap.error(f"--group-size {args.group_size} does not divide --workers {args.workers}")
    if args.link != "none":
        return run_on_nodes(args, settings)
    if args.lo and not can_unshare():
        print("[bench] not root or no unshare/ip: wire bytes are not measured (--no-lo)")
        args.lo = False
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_setting(s, args, tmp) for s in settings]
    report(rows, args)


def run_on_nodes(args, settings: list[str]) -> None:
    """Every setting on G node namespaces whose links are shaped to ``--link``."""
    from cluster.links import parse_link
    from cluster.netns import Cluster, missing_requirements, signals_raise
    from cluster.shaping import Shaper

    missing = missing_requirements(need_tun=False)
    if missing:
        raise SystemExit("[bench] --link needs: " + "; ".join(missing))
    link = parse_link(args.link if "/" in args.link else f"{args.link}/0ms")
    with signals_raise(), Cluster(args.workers // args.group_size) as cluster, tempfile.TemporaryDirectory() as tmp:
        shaper = Shaper(cluster, mode="none")
        shaper.apply(link)
        print(f"[bench] {cluster.n} nodes x {args.group_size} workers, links {link.spec}", flush=True)
        rows = [run_setting(s, args, tmp, cluster) for s in settings]
        shaper.close()
    report(rows, args)


def report(rows: list[dict], args) -> None:
    print_table(rows)
    load = machine_load.summary([r["load"] for r in rows])
    if (w := machine_load.summary_warning(load, "rows[].load")):
        print(w)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"workers": args.workers, "group_size": args.group_size, "link": args.link,
                                           "steps": args.steps, "load": load, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
