"""Compare training runs side by side: one table (stdout + Markdown), JSON, and a plot.

    python -m gossip_accel.bin.compare_runs --out exp/compare/RESULTS exp/compare/single exp/compare/gossip_bmuf ...

Reads each run's ``results.json`` (written by gossip_accel.bin.train_lm) and writes
``<out>.md``, ``<out>.json`` and ``<out>.png`` (validation perplexity against epoch, the
paper's Figure 2). The traffic ratio is relative to the DDP run if there is one, else to the
first run that communicated (e.g. MA).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(run: Path) -> dict:
    f = run / "results.json"
    if not f.is_file():
        raise SystemExit(f"compare_runs: {f} not found (did the training stage of {run} finish?)")
    r = json.loads(f.read_text())
    r.setdefault("name", run.name)
    return r


def table(rows: list[dict]) -> list[str]:
    ref_row = next((r for r in rows if r["name"].startswith("ddp")), None) or next(
        (r for r in rows if r["bytes_sent_per_step_per_worker"] > 0), rows[0])
    ref = ref_row["bytes_sent_per_step_per_worker"] or None
    out = ["| method | workers | periods | epochs | valid ppl | test ppl | MB sent/worker | MB sent/step/worker "
           f"| traffic vs {ref_row['name']} | train time (s) |", "|" + "---|" * 10]
    for r in rows:
        test = f"{r['final_test_ppl']:.2f}" if r.get("final_test_ppl") else "-"
        ratio = f"{r['bytes_sent_per_step_per_worker'] / ref:.3f}" if ref else "-"
        out.append(
            f"| {r['name']} | {r['workers']} | {r.get('periods', '-')} | {r.get('epochs', '-')} | "
            f"{r['final_valid_ppl']:.2f} | {test} | {r.get('bytes_sent_per_worker', 0) / 1e6:.1f} | "
            f"{r['bytes_sent_per_step_per_worker'] / 1e6:.4f} | {ratio} | {r['train_seconds']:.0f} |")
    return out


def plot(rows: list[dict], path: Path, key: str = "valid_ppl", ylabel: str = "valid perplexity",
         log: bool = True) -> None:
    """Per run, ``history[*][key]`` against the epoch (LM: perplexity; ASR: CV loss): solid for the
    replicas' average (the model the run returns), dashed for the mean of the replicas
    (``<key>_replicas``, left out where it is the same, as for DDP; the only curve of a run recorded
    before the average was validated)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        h = r.get("history", [])
        epochs, label = [e["epoch"] for e in h], f"{r['name']} ({r['workers']} w)"
        color = None
        if h and key in h[0]:
            (line,) = ax.plot(epochs, [e[key] for e in h], marker="o", label=f"{label}, averaged model")
            color = line.get_color()
        same = h and key in h[0] and all(e[key] == e.get(f"{key}_replicas") for e in h)  # DDP, one worker
        if h and f"{key}_replicas" in h[0] and not same:
            ax.plot(epochs, [e[f"{key}_replicas"] for e in h], marker=".", linestyle="--", color=color,
                    label=f"{label}, mean of replicas")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="path prefix of the .md, .json and .png outputs")
    ap.add_argument("--title", default=None, help="heading of the Markdown table")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()
    rows = [load(Path(run)) for run in args.runs]
    lines = table(rows)
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = [f"# {args.title}", ""] if args.title else []
    out.with_suffix(".md").write_text("\n".join(head + lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    plot(rows, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
