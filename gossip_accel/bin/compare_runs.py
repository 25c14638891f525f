"""Compare training runs side by side: one table (stdout + Markdown), JSON, and a plot.

    python -m gossip_accel.bin.compare_runs --out exp/quickstart/compare exp/quickstart/ddp exp/quickstart/gossip_bmuf

Reads each run's ``summary.json`` (written by gossip_accel.bin.train_lm). The first run is
the reference for the traffic ratio (put DDP first).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(run: Path) -> dict:
    f = run / "summary.json"
    if not f.is_file():
        raise SystemExit(f"compare_runs: {f} not found (did the training stage of {run} finish?)")
    return json.loads(f.read_text())


def table(rows: list[dict]) -> list[str]:
    ref = rows[0]["bytes_sent_per_step_per_worker"] or 1.0
    head = ("| run | workers | valid ppl | test ppl | MB sent/step/worker | traffic vs " + rows[0]["run"]
            + " | steps/s/worker |")
    out = [head, "|" + "---|" * 7]
    for r in rows:
        test = f"{r['final_test_ppl']:.2f}" if r.get("final_test_ppl") else "-"
        mb = r["bytes_sent_per_step_per_worker"] / 1e6
        out.append(f"| {r['run']} | {r['workers']} | {r['final_valid_ppl']:.2f} | {test} | {mb:.4f} | "
                   f"{r['bytes_sent_per_step_per_worker'] / ref:.3f} | {r['steps_per_second']:.2f} |")
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        h = r.get("history", [])
        ax.plot([e["epoch"] for e in h], [e["valid_ppl_replicas"] for e in h], marker="o", label=r["run"])
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("epoch")
    ax.set_ylabel("valid perplexity (mean over replicas)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="prefix of the .md, .json and .png outputs")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()
    rows = []
    for run in map(Path, args.runs):
        r = load(run)
        r["run"] = run.name
        rows.append(r)
    lines = table(rows)
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    plot(rows, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
