"""The quality cost of an elastic resume: an uninterrupted n-worker run of the LM recipe against the
same run whose workers are lost after epoch E and which continues on fewer (train.elastic).

    python bench/elastic.py                       # wikitext mini, gossip_bmuf, 3 epochs, 4 -> 3 and 4 -> 2
    python bench/elastic.py --to 3 2 --after 1 --epochs 3

The uninterrupted run is bench/quality.py's ``gossip_bmuf`` setting (conf/mini.yaml +
conf/period_16_128.yaml, ``--workers`` workers); each elastic run starts from a copy of its
epoch-E checkpoint in a new exp dir and is launched with m workers (the m new ranks average the
n replicas, docs/RELIABILITY.md "Elastic resume"); on 2 workers it goes on as ``bmuf`` (a ring
needs 3 nodes). Every run is evaluated by ``eval_lm`` (test perplexity of the final averaged
model). For reference, each --to count also runs uninterrupted from the start (``--no-references``
skips them): the resume's cost beyond that of having m workers. Prints a table and writes ``bench/results/elastic_<corpus>_e<epochs>.json``. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality  # noqa: E402  (bench/quality.py: run_one, ensure_data, RECIPES, SETTINGS)

ROOT = quality.ROOT


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=sorted(quality.RECIPES), default="wikitext")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4, help="the uninterrupted run's workers")
    ap.add_argument("--to", type=int, nargs="+", default=[3, 2], help="worker counts to continue on")
    ap.add_argument("--after", type=int, default=1, help="the epoch whose checkpoint the elastic runs resume")
    ap.add_argument("--no-references", dest="references", action="store_false",
                    help="skip the uninterrupted runs on each --to worker count")
    ap.add_argument("--work", type=Path, default=ROOT / "exp" / "elastic")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    recipe = quality.RECIPES[args.corpus]
    data = quality.ensure_data(recipe)
    work = args.work.resolve() / args.corpus / f"e{args.epochs}-n{args.workers}"
    qargs = quality.parse_args(["--settings", "gossip_bmuf", "--epochs", str(args.epochs), "--workers",
                                str(args.workers), "--work", str(work)])
    base_dir = work / "gossip_bmuf-s1"
    rows = [(f"{args.workers} workers, uninterrupted", args.workers, "gossip_bmuf",
             quality.run_one(recipe, data, base_dir, "gossip_bmuf", 1, qargs))]
    for m in args.to:
        algorithm = "gossip_bmuf" if m >= 3 else "bmuf"
        if args.references:  # the same world from the start: what the resume costs beyond having m workers
            name = f"uninterrupted_{m}"
            quality.SETTINGS[name] = (f"{m} workers from the start", [f"sync.algorithm={algorithm}"])
            qargs.workers = m
            rows.append((f"{m} workers, uninterrupted", m, algorithm,
                         quality.run_one(recipe, data, work / name, name, 1, qargs)))
        name = f"elastic_{args.workers}to{m}"
        quality.SETTINGS[name] = (f"{args.workers} -> {m} after epoch {args.after}", [f"sync.algorithm={algorithm}"])
        run_dir = work / name
        ckpt = run_dir / "checkpoints" / f"epoch{args.after}"
        if not ckpt.is_dir() and not (run_dir / "results.json").is_file():
            shutil.copytree(base_dir / "checkpoints" / f"epoch{args.after}", ckpt)
        qargs.workers = m
        rows.append((f"{args.workers} -> {m} workers after epoch {args.after}", m, algorithm,
                     quality.run_one(recipe, data, run_dir, name, 1, qargs)))
    print(f"\n### {args.corpus} mini, {args.epochs} epochs: elastic resume after epoch {args.after}\n")
    print("| run | workers after | algorithm after | valid ppl | test ppl | test vs uninterrupted | MB sent/worker "
          "| MB sent/step/worker |")
    print("|---|---|---|---|---|---|---|---|")
    base_test = rows[0][3].get("final_test_ppl")
    out = []
    for what, m, algorithm, res in rows:
        if "final_test_ppl" not in res:
            print(f"| {what} | {m} | {algorithm} | failed: {res.get('failed')} | | | | |")
            continue
        print(f"| {what} | {m} | {algorithm} | {res['final_valid_ppl']:.2f} | {res['final_test_ppl']:.2f} | "
              f"{res['final_test_ppl'] / base_test:.3f} | {res['bytes_sent_per_worker'] / 1e6:.1f} | "
              f"{res['bytes_sent_per_step_per_worker'] / 1e6:.3f} |")
        out.append({"run": what, "workers_after": m, "algorithm_after": algorithm,
                    **{k: res.get(k) for k in ("final_valid_ppl", "final_test_ppl", "bytes_sent_per_worker",
                                               "bytes_sent_per_step_per_worker", "steps_per_worker", "train_seconds",
                                               "bench")}})
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"elastic_{args.corpus}_e{args.epochs}.json"
    path.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "loadavg": os.getloadavg(),
                                "after_epoch": args.after, "runs": out}, indent=2))
    print(f"\n[elastic] {path}")


if __name__ == "__main__":
    main()
