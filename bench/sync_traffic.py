"""Bytes per step per worker of every algorithm on the quick-start LM, measured against analytic.

    .venv/bin/python bench/sync_traffic.py [--workers 4] [--steps 256] [--json bench/results/sync_traffic.json]

Spawns real gloo workers holding the quick-start model (recipes/wikitext103/lm1/conf/mini.yaml
with conf/lm/period_16_128.yaml, vocabulary of the embedded wiki_mini text). For each setting it runs ``--steps`` synchronizer steps
(the exchanged bytes do not depend on the values, so no training is needed) and, for the DDP
baseline, real backward passes with the counting all-reduce hook. It prints a table (with the most
bytes a worker sent in one step after the warm-up: the burst that ``sync.stagger`` spreads) and
writes JSON. Analytic values (docs/ALGORITHMS.md; |theta_i| in the wire's bytes, int8/int4: the coded
payload): MA/BMUF sum_i 2(n-1)/n |theta_i| / H_i,
local sum_i 2p |theta_i| / H_i, gossip sum_i q |theta_i| / H_i, DDP 2(n-1)/n |theta| per step;
EASGD/ASGD (parameter server) 2(n-1)/n |theta_i| / H_i on average over the workers (the
server's rank sends (n-1) |theta_i| / H_i, the others |theta_i| / H_i), ADPSGD |theta_i| / H_i.
The asynchronous algorithms run in their real asynchronous mode (RPC).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gossip_accel import Synchronizer, shutdown  # noqa: E402
from gossip_accel.sync.comm import Counter, ring_allreduce_bytes  # noqa: E402
from gossip_accel.sync.config import load_sync_config  # noqa: E402
from gossip_accel.sync.precision import wire_dtype  # noqa: E402
from gossip_accel.sync.quantize import allreduce_bytes, codec_of  # noqa: E402
from gossip_accel.data.lm import Vocabulary, read_lines  # noqa: E402
from gossip_accel.models.lstm_lm import LSTMPLanguageModel, frequency_cutoffs  # noqa: E402

RECIPE = ROOT / "recipes" / "wikitext103" / "lm1"
CONFS = [RECIPE / "conf" / "mini.yaml", ROOT / "conf" / "lm" / "period_16_128.yaml"]
# the quick-start conf warms up (sync.warmup_steps=32) and sends bf16, which config.py defines only for
# the averaging family (registry.names(warmup=True), low_precision_wire=True): the parameter-server and
# AD-PSGD settings run without the warm-up, on their fp32 wire
NO_WARMUP_FP32_WIRE = ("warmup_steps=0", "exchange_dtype=float32")
SETTINGS = {  # name -> sync overrides (the quick-start conf is (16,128))
    "ma-(8)": ["algorithm=ma", "period=8", "components.0.period=8"],
    "bmuf-(8)": ["algorithm=bmuf", "period=8", "components.0.period=8"],
    "bmuf-(16,128)": ["algorithm=bmuf"],
    "local_bmuf-(16,128)": ["algorithm=local_bmuf", "q=null"],
    "gossip_bmuf-(8)": ["algorithm=gossip_bmuf", "period=8", "components.0.period=8"],
    "gossip_bmuf-(16,128)": ["algorithm=gossip_bmuf"],
    # issue 17: the shards of a period at different steps (sync.stagger), the exchange overlapped with tau steps
    "gossip_bmuf-(16,128)-stagger": ["algorithm=gossip_bmuf", "stagger=true"],
    "gossip_bmuf-(16,128)-overlap4": ["algorithm=gossip_bmuf", "overlap_steps=4"],
    "gossip_bmuf-(16,128)-stagger-overlap4": ["algorithm=gossip_bmuf", "stagger=true", "overlap_steps=4"],
    # the int8/int4 wire (quantize.py): outer gradients in blocks of 256 with error feedback
    "bmuf-(16,128)-int4": ["algorithm=bmuf", "exchange_dtype=int4", "broadcast_initial=true"],
    "gossip_bmuf-(16,128)-int4": ["algorithm=gossip_bmuf", "exchange_dtype=int4", "broadcast_initial=true"],
    "gossip_bmuf-(16,128)-stagger-int4": ["algorithm=gossip_bmuf", "stagger=true", "exchange_dtype=int4", "broadcast_initial=true"],
    # the int4 ring overlapped (coded from theta_t at t, applied at t + tau < 16, the smallest period)
    **{f"gossip_bmuf-(16,128)-int4-stagger-overlap{tau}": ["algorithm=gossip_bmuf", "stagger=true", "exchange_dtype=int4",
                                                          "broadcast_initial=true", f"overlap_steps={tau}"]
       for tau in (4, 8)},
    "gossip_bmuf-(12,96)": ["algorithm=gossip_bmuf", "period=12", "components.0.period=96"],
    "easgd-(16,128)": ["algorithm=easgd", *NO_WARMUP_FP32_WIRE],
    "easgd_async-(16,128)": ["algorithm=easgd_async", *NO_WARMUP_FP32_WIRE],
    "asgd-(16,128)": ["algorithm=asgd", *NO_WARMUP_FP32_WIRE],
    "adpsgd_fixed-(16,128)": ["algorithm=adpsgd_fixed", *NO_WARMUP_FP32_WIRE],
    "adpsgd_delay-(16,128)": ["algorithm=adpsgd_delay", *NO_WARMUP_FP32_WIRE],
}


def load_conf():
    return OmegaConf.merge(*[OmegaConf.load(c) for c in CONFS])


def build_model() -> torch.nn.Module:
    conf = load_conf()
    prepared = RECIPE / "data" / "lm" / "vocab.txt"  # the quick start's vocabulary, once ./run.sh ran
    if prepared.is_file():
        vocab = Vocabulary.load(prepared)
    else:
        print(f"[sync_traffic] {prepared} not found (run ./run.sh --stop-stage 1 for the exact quick-start "
              "model); building a vocabulary from the raw wiki_mini text instead")
        vocab = Vocabulary.build(read_lines(ROOT / "local/data/wiki_mini/wiki.train.tokens"), min_count=3)
    m = conf.model
    cutoffs = frequency_cutoffs(vocab.counts, m.head_size, m.num_tails)
    torch.manual_seed(0)
    return LSTMPLanguageModel(len(vocab), cutoffs, m.embedding_dim, m.hidden_size, m.projection_size,
                              m.num_layers, m.dropout, m.div_value)


def analytic(sync: Synchronizer, n: int) -> float:
    """Bytes per step one worker sends by docs/ALGORITHMS.md, on the run's wire (``sync.exchange_dtype``):
    a component of L elements is L x 4 bytes in fp32, L x 2 in bf16/fp16, and int8/int4 its coded payload
    (codes + per-block scales; an all-reduce sends 2 (n-1) chunk payloads, quantize.allreduce_bytes)."""
    spec, topo, cfg = sync.cfg.spec, sync.topology, sync.cfg
    codec, size = codec_of(cfg), torch.empty((), dtype=wire_dtype(cfg.exchange_dtype)).element_size()

    def per_sync(numel: int) -> float:
        if spec.graph in ("full", "server"):  # an all-reduce; the server's collectives: the mean over ranks
            return allreduce_bytes(codec, numel, n) if codec else ring_allreduce_bytes(numel * size, n)
        factor = 1.0 if spec.family == "pairwise" else topo.q  # one partner per round; the ring: q copies received
        return factor * (codec.payload_bytes(numel) if codec else numel * size)

    return sum(per_sync(c.numel) / c.period for c in sync.components)


def worker(rank: int, n: int, init: str, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=n)
    base = OmegaConf.to_container(load_conf().sync)
    model = build_model()
    rows = {}
    for name, overrides in SETTINGS.items():
        sync = Synchronizer(model, load_sync_config(base, overrides))
        peak = 0.0  # the most bytes sent in one step after the warm-up (sync.stagger flattens the (16,128) bursts)
        for _ in range(steps):
            before = sync.comm.stats.total().bytes_sent
            sync.step()
            if sync.t > sync.cfg.warmup_steps:
                peak = max(peak, sync.comm.stats.total().bytes_sent - before)
        sync.finalize()  # one-off traffic only; closes the RPC session of the asynchronous algorithms
        total = sync.comm.stats.total()
        rows[name] = {"sent": total.bytes_sent / steps, "recv": total.bytes_recv / steps, "peak": peak,
                      "analytic": analytic(sync, n), "seconds_per_step": total.seconds / steps}
    # DDP baseline: real backward passes through DDP with the counting all-reduce hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gossip_accel.sync.integrations.accelerate import counting_allreduce_hook

    ddp, counter, ddp_steps = DDP(model), Counter(), 4
    ddp.register_comm_hook(counter, counting_allreduce_hook)
    g = torch.Generator().manual_seed(rank)
    for _ in range(ddp_steps):
        ids = torch.randint(0, model.embedding.num_embeddings, (4, 36), generator=g)
        loss, _ = ddp(ids[:, :-1], ids[:, 1:])
        loss.backward()
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rows["ddp"] = {"sent": counter.bytes_sent / ddp_steps, "recv": counter.bytes_recv / ddp_steps,
                   "peak": counter.bytes_sent / ddp_steps,
                   "analytic": ring_allreduce_bytes(n_bytes, n), "seconds_per_step": None}
    torch.save(rows, os.path.join(out, f"rank{rank}.pt"))
    shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=256, help="a multiple of 128 counts every (16,128) round fully")
    ap.add_argument("--json", default=str(ROOT / "bench/results/sync_traffic.json"))
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(args.workers, os.path.join(tmp, "init"), args.steps, tmp), nprocs=args.workers)
        per_rank = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=True) for r in range(args.workers)]
    ddp_sent = sum(r["ddp"]["sent"] for r in per_rank) / len(per_rank)
    table = []
    for name in [*SETTINGS, "ddp"]:
        sent = sum(r[name]["sent"] for r in per_rank) / len(per_rank)
        table.append({"setting": name, "sent_bytes_per_step": sent,
                      "max_rank_sent_bytes_per_step": max(r[name]["sent"] for r in per_rank),
                      "peak_step_sent_bytes": max(r[name]["peak"] for r in per_rank),
                      "recv_bytes_per_step": sum(r[name]["recv"] for r in per_rank) / len(per_rank),
                      "analytic_bytes_per_step": per_rank[0][name]["analytic"], "vs_ddp": sent / ddp_sent})
    print(f"{args.workers} workers, {sum(p.numel() for p in build_model().parameters()) / 1e6:.2f}M-parameter "
          f"quick-start LM, {args.steps} steps")
    print(f"{'setting':<38}{'MB sent/step':>14}{'max rank':>10}{'peak step':>11}{'analytic':>10}{'vs DDP':>9}")
    for r in table:
        print(f"{r['setting']:<38}{r['sent_bytes_per_step'] / 1e6:>14.4f}{r['max_rank_sent_bytes_per_step'] / 1e6:>10.4f}"
              f"{r['peak_step_sent_bytes'] / 1e6:>11.4f}{r['analytic_bytes_per_step'] / 1e6:>10.4f}{r['vs_ddp']:>9.4f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"workers": args.workers, "steps": args.steps, "rows": table}, indent=2))


if __name__ == "__main__":
    main()
