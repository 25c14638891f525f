"""CPU time of the int8/int4 wire's coder (gossip_accel/sync/quantize.py) on one thread.

    .venv/bin/python bench/coder_speed.py [--numel 1233664 131328] [--bits 4 8] [--block 256] [--calls 300]
        [--root .] [--json bench/results/coder_speed.json]

Times, per call on a tensor of ``--numel`` elements: ``encode`` (Q(x)), ``decode`` (D(Q(x))), and what a
sender does per message: ``send_to_copy_`` (a CHOCO public copy: Q(theta - hat), hat <- hat + D(Q(...))) and
``compress_`` (error feedback: Q(x + e), e <- x + e - D(Q(x + e))). The defaults are the sizes of the
synthetic:10M workload's components (an embedding shard of 1,233,664 elements, the 131,328-element body).
Each call is timed alone (wall clock, one thread, nothing else of ours running); the table gives the minimum,
which is what the code costs when the machine leaves it alone, and the median, which shows how much a shared
machine added. ``--root`` imports ``gossip_accel`` from another checkout (e.g. a ``git worktree`` of an older
commit) to compare two versions of the coder with the same script, one after the other.
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import machine_load  # noqa: E402


def timings(q, numel: int, bits: int, block: int, calls: int) -> dict[str, list[float]]:
    """Milliseconds per call of each operation (the first call of each is not counted)."""
    g = torch.Generator().manual_seed(numel + bits)
    theta = torch.randn(numel, generator=g)
    copy = theta + 0.01 * torch.randn(numel, generator=g)
    residual = torch.zeros(1, numel)
    codec = q.Codec(bits, block, torch.float32)
    payload = codec.encode(theta.unsqueeze(0))
    ops = {"encode": lambda: codec.encode(theta.unsqueeze(0)),
           "decode": lambda: codec.decode(payload, numel),
           "send_to_copy_": lambda: q.send_to_copy_(codec, theta, copy),
           "compress_": lambda: q.compress_(codec, theta.unsqueeze(0), residual)}
    out: dict[str, list[float]] = {name: [] for name in ops}
    for i in range(calls + 1):
        for name, op in ops.items():  # interleaved, so that a busy spell of the machine hits every operation
            start = time.perf_counter()
            op()
            if i:
                out[name].append(1e3 * (time.perf_counter() - start))
    return out


def table(rows: list[dict]) -> str:
    lines = ["| elements | bits | operation | min ms | median ms |", "|---|---|---|---|---|"]
    lines += [f"| {r['numel']:,} | {r['bits']} | {r['op']} | {r['min_ms']:.3f} | {r['median_ms']:.3f} |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=int, nargs="+", default=[1_233_664, 131_328])
    ap.add_argument("--bits", type=int, nargs="+", default=[4, 8], choices=[4, 8])
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose gossip_accel is timed")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    root = args.root.resolve()
    if root != ROOT:  # another checkout's package replaces this one's in this process (a command-line run only)
        sys.path.insert(0, str(root))
        for name in [m for m in sys.modules if m == "gossip_accel" or m.startswith("gossip_accel.")]:
            del sys.modules[name]
    q = importlib.import_module("gossip_accel.sync.quantize")
    before = machine_load.snapshot()
    rows = []
    for numel in args.numel:
        for bits in args.bits:
            for op, ms in timings(q, numel, bits, args.block, args.calls).items():
                rows.append({"numel": numel, "bits": bits, "op": op, "min_ms": min(ms), "median_ms": statistics.median(ms)})
    load = machine_load.assess(before, machine_load.snapshot())
    print(f"coder of {q.__file__} (block {args.block}, {args.calls} calls each)")
    print(table(rows))
    if (w := machine_load.warning(load, "coder_speed")):
        print(w)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": " ".join(["python bench/coder_speed.py", *(argv or sys.argv[1:])]),
                                         "coder": q.__file__, "block": args.block, "calls": args.calls,
                                         "rows": rows, "load": load}, indent=2))


if __name__ == "__main__":
    main()
