"""Compare training runs side by side: one table (stdout + Markdown), JSON, and plots.

    python -m gossip_accel.bin.compare_runs --out exp/compare/RESULTS [--baseline ddp] exp/ddp-n4 exp/gossip_bmuf-16_128-n4 ...

Reads each run's ``results.json`` (written by gossip_accel.bin.train_lm) and writes ``<out>.md``,
``<out>.json`` and ``<out>.png``: validation perplexity against epoch (the paper's Figure 2),
against the MB each worker has sent by the end of each epoch, and against training time.

Every run is compared with one baseline run (``--baseline``): ``ddp`` (the default) is the DDP
run if there is one (of several, the one with the shortest name: the untagged run), else the
single-worker run; ``single`` the single-worker run; any other
value the run of that name (or, failing that, the first run of that algorithm); ``none`` none.
Without a baseline the table says so and has no "vs" columns; the baseline's own row says
"baseline", never a comparison with itself.
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


def reference_kind(r: dict) -> str | None:
    """``"ddp"`` or ``"single"`` for the two reference runs (synchronizer off), else None."""
    sync = r.get("sync")
    if isinstance(sync, dict) and "enabled" in sync:
        if sync["enabled"]:
            return None
        return "single" if r.get("workers", 1) == 1 else "ddp"
    for kind in ("ddp", "single"):            # a results.json written before "sync" was recorded
        if r["name"].startswith(kind):
            return kind
    return None


def choose_baseline(rows: list[dict], baseline: str) -> tuple[dict | None, str]:
    """The baseline row for ``--baseline`` and a sentence saying which (or why there is none)."""
    def first(pred):
        return next((r for r in rows if pred(r)), None)

    if baseline == "none":
        return None, "No baseline (--baseline none)."
    if baseline in ("ddp", "single"):
        kinds = ("ddp", "single") if baseline == "ddp" else ("single",)
        for kind in kinds:
            found = [r for r in rows if reference_kind(r) == kind]
            if found:
                # several (tagged runs share an exp dir): the untagged one, i.e. the shortest name
                row = min(found, key=lambda r: len(r["name"]))
                said = f"Baseline: {row['name']}" + ("" if kind == baseline else " (there is no DDP run)")
                if len(found) > 1:
                    said += (f" (of {len(found)} {kind} runs: {', '.join(r['name'] for r in found)}; "
                             "--baseline NAME picks another)")
                return row, said + "."
        return None, f"No baseline: no {' or '.join(kinds)} run among the {len(rows)} compared."
    row = first(lambda r: r["name"] == baseline) or first(lambda r: r.get("algorithm") == baseline)
    if row is None:
        return None, f"No baseline: no run named '{baseline}' (nor of that algorithm)."
    return row, f"Baseline: {row['name']}."


def final_ppl(r: dict) -> float:
    """The run's test perplexity (its valid perplexity before stage 3 evaluated it)."""
    return r.get("final_test_ppl") or r["final_valid_ppl"]


def table(rows: list[dict], base: dict | None) -> list[str]:
    """The Markdown table: one row per run; "vs" columns relative to ``base`` when there is one
    (the traffic ratio only when the baseline sends anything)."""
    with_ppl = base is not None
    with_traffic = with_ppl and base["bytes_sent_per_step_per_worker"] > 0
    cols = ["run", "workers", "periods", "epochs", "valid ppl", "test ppl"]
    if with_ppl:
        cols.append(f"ppl vs {base['name']}")
    cols += ["MB sent/worker", "MB sent/step/worker"]
    if with_traffic:
        cols.append(f"traffic vs {base['name']}")
    cols.append("train time (s)")
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        sent = r["bytes_sent_per_step_per_worker"]
        cells = [r["name"], str(r["workers"]), str(r.get("periods", "-")), str(r.get("epochs", "-")),
                 f"{r['final_valid_ppl']:.2f}", f"{r['final_test_ppl']:.2f}" if r.get("final_test_ppl") else "-"]
        if with_ppl:
            cells.append("baseline" if r is base else f"{(final_ppl(r) / final_ppl(base) - 1) * 100:+.1f}%")
        cells += [f"{r.get('bytes_sent_per_worker', 0) / 1e6:.1f}", f"{sent / 1e6:.4f}"]
        if with_traffic:
            cells.append("baseline" if r is base else f"{sent / base['bytes_sent_per_step_per_worker']:.3f}")
        cells.append(f"{r['train_seconds']:.0f}")
        out.append("| " + " | ".join(cells) + " |")
    return out


def curve(r: dict, key: str, fallback: str) -> tuple[list[dict], str]:
    """The history rows of ``r`` that have ``key`` (else ``fallback``), and the key used."""
    h = r.get("history", [])
    used = key if h and all(key in e for e in h) else fallback
    return [e for e in h if used in e], used


def epoch_ends(r: dict, h: list[dict]) -> tuple[list[float], list[float]]:
    """MB sent per worker and training seconds at each epoch end of history ``h``: the bytes the
    epoch's row logged (``bytes_sent_per_worker``), else the run's bytes per step x the step count
    (``step``, else the epoch's share of all steps), which spreads a warm-up's DDP-rate bytes over
    the run; the epoch's own ``train_seconds`` if logged, else the run's training time pro rata of
    its steps."""
    total = max(r.get("steps_per_worker", 0), 1)
    epochs = max(r.get("epochs") or len(h) or 1, 1)
    steps = [e.get("step", e["epoch"] * total / epochs) for e in h]
    mb = [e.get("bytes_sent_per_worker", r["bytes_sent_per_step_per_worker"] * s) / 1e6 for e, s in zip(h, steps)]
    secs = [e.get("train_seconds", r["train_seconds"] * s / total) for e, s in zip(h, steps)]
    return mb, secs


def plot(rows: list[dict], path: Path, key: str = "valid_ppl", fallback: str = "valid_ppl_replicas",
         quantity: str = "valid perplexity", log: bool = True) -> None:
    """Three panels, one curve per run: ``history[*][key]`` (the averaged model; ``fallback``, the
    mean over replicas, where a run did not log ``key``) against epoch, against MB sent per worker
    (log scale; a run that sends nothing is a dashed line at its last value) and against time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    used_keys = set()
    for r in rows:
        h, used = curve(r, key, fallback)
        if not h:
            continue
        used_keys.add(used)
        y = [e[used] for e in h]
        mb, secs = epoch_ends(r, h)
        label = f"{r['name']} ({r['workers']} w)"
        line, = axes[0].plot([e["epoch"] for e in h], y, marker="o", label=label)
        if r["bytes_sent_per_step_per_worker"] > 0:
            axes[1].plot(mb, y, marker="o", color=line.get_color(), label=label)
        else:
            axes[1].axhline(y[-1], ls="--", color=line.get_color(), label=f"{label}: sends nothing")
        axes[2].plot(secs, y, marker="o", color=line.get_color(), label=label)
    which = ("of the averaged model" if used_keys == {key} else "mean over replicas" if used_keys == {fallback}
             else "averaged model where logged, else mean over replicas")
    axes[0].xaxis.get_major_locator().set_params(integer=True)
    axes[0].set(xlabel="epoch", title=f"{quantity} vs epoch")
    axes[1].set(xlabel="MB sent per worker (cumulative, at epoch ends)", xscale="log",
                title=f"{quantity} vs traffic")
    axes[2].set(xlabel="training time (s, at epoch ends)",
                title=f"{quantity} vs wall clock\n(wall times on shared cores: not a speed measurement)")
    for ax in axes:
        ax.set_ylabel(f"{quantity} ({which})")
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="path prefix of the .md, .json and .png outputs")
    ap.add_argument("--title", default=None, help="heading of the Markdown table")
    ap.add_argument("--baseline", default="ddp",
                    help="ddp (default: the DDP run, else the single run), single, a run name, or none")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()
    rows = [load(Path(run)) for run in args.runs]
    base, said = choose_baseline(rows, args.baseline)
    lines = table(rows, base)
    print("\n".join(lines + ["", said]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = [f"# {args.title}", ""] if args.title else []
    out.with_suffix(".md").write_text("\n".join(head + lines + ["", said]) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    plot(rows, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
