"""The benchmark's outputs: ratios, a terminal table, markdown tables and two plots.

Input is the JSON that ``bench/cluster_bench.py`` writes: ``{"networks": [{"link": ...,
"measured": ..., "workers": {"workloads": {name: {"rows": {setting: row}}}}}], ...}``.
:func:`add_ratios` adds, per row, the speed as a fraction of ``no-comm`` on the same network
and the bytes as a fraction of ``ddp``'s.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Iterator, Optional

MB = 1e6


def combine_rounds(rounds: list[dict]) -> dict:
    """One setting's row from its rows of ``--rounds`` R: the round of median speed (the lower of the two
    middle ones for even R), with every round's row under ``rounds`` (R > 1) and the sync-vs-raw replay
    of the first round (the only one that measures it)."""
    if len(rounds) == 1:
        return rounds[0]
    order = sorted(range(len(rounds)), key=lambda r: rounds[r]["steps_per_s"])
    median = order[(len(rounds) - 1) // 2]
    return {**rounds[median], "overhead": rounds[0].get("overhead"), "median_round": median, "rounds": rounds}


def add_ratios(workers: dict) -> None:
    """``vs_no_comm`` (steps/s over no-comm's) and ``vs_ddp`` (bytes sent over ddp's) in every row.

    With rounds, each round's speed is divided by the same round's no-comm (``vs_no_comm_rounds``), and
    ``vs_no_comm`` is the median of those ratios (the lower middle one for even R): a slow spell of the machine slows a round's settings
    alike, so the ratio within a round is steadier than the ratio of two medians."""
    for wl in workers["workloads"].values():
        rows = wl["rows"]
        base_row = rows.get("no-comm", {})
        base = base_row.get("steps_per_s")
        ddp = rows.get("ddp", {}).get("sent_bytes_per_step")
        for row in rows.values():
            row["vs_no_comm"] = row["steps_per_s"] / base if base else None
            row["vs_ddp"] = row["sent_bytes_per_step"] / ddp if ddp else None
            if "rounds" in row and len(base_row.get("rounds", ())) == len(row["rounds"]):
                ratios = [r["steps_per_s"] / b["steps_per_s"] for r, b in zip(row["rounds"], base_row["rounds"])]
                row["vs_no_comm_rounds"] = ratios
                row["vs_no_comm"] = statistics.median_low(ratios)


def _spread(row: dict) -> Optional[str]:
    ratios = row.get("vs_no_comm_rounds")
    return None if not ratios else f"{min(ratios):.2f}-{max(ratios):.2f}"


def _f(value: Optional[float], fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value / scale, fmt)


def network_line(net: dict) -> str:
    """What was asked of the links, what the probes measured, how late the delay forwarders were."""
    link, m = net["link"], net.get("measured") or {}
    if link.get("asked_rtt_ms") is None:
        return f"{link['label']}: {net['shaping']['delay']}"
    rate = f"{link['rate_bps'] / 1e9:g} Gbit/s" if link["rate_bps"] else "unlimited rate"
    got = (f"measured RTT {m['rtt_ms']:.2f} ms, {m['one_flow_bps'] / 1e9:.3f} Gbit/s one stream, "
           f"{m['ring_bps_mean'] / 1e9:.3f} Gbit/s per link with all {net['workers']['workers']} sending"
           if m else "links not measured")
    line = f"{link['label']}: asked RTT {link['asked_rtt_ms']:.2f} ms and {rate} per link; {got}"
    fwd = [f for f in net.get("delay_forwarders") or [] if f.get("packets")]
    if fwd:
        means = [f["late_mean_ms"] for f in fwd]
        line += (f"; the delay forwarders released packets {min(means):.2f}-{max(means):.2f} ms late on average "
                 f"(each forwarder), {max(f['late_max_ms'] for f in fwd):.1f} ms at worst")
    return line + f" (delay: {net['shaping']['delay']})"


def from_worker_json(workers: dict, label: str) -> dict:
    """A result of ``bench.cluster.worker`` run by hand on a real cluster, as a one-network result."""
    net = {"link": {"label": label, "spec": label, "name": "", "rate_bps": None, "delay_s": None, "asked_rtt_ms": None},
           "shaping": {"delay": "real network, no emulation"}, "measured": None, "workers": workers}
    add_ratios(workers)
    return net


COLUMNS = [  # header, row -> text
    ("setting", lambda s, r: s),
    ("steps/s", lambda s, r: _f(r["steps_per_s"], ".2f")),
    ("tokens/s", lambda s, r: _f(r["tokens_per_s"], ".0f")),
    ("vs no-comm", lambda s, r: _f(r.get("vs_no_comm"), ".3f")),
    ("rounds vs no-comm", lambda s, r: _spread(r) or "-"),
    ("MB sent/step", lambda s, r: _f(r["sent_bytes_per_step"], ".4f", MB)),
    ("MB recv/step", lambda s, r: _f(r["recv_bytes_per_step"], ".4f", MB)),
    ("analytic MB", lambda s, r: _f(r["analytic_bytes_per_step"], ".4f", MB)),
    ("vs ddp", lambda s, r: _f(r.get("vs_ddp"), ".3f")),
    ("wire MB tx/step", lambda s, r: _f(r["wire_tx_bytes_per_step"], ".4f", MB)),
    ("TCP retrans", lambda s, r: _f(r.get("tcp_retransmits_per_worker"), ".0f")),
    ("sync ms", lambda s, r: _f((r.get("overhead") or {}).get("sync_ms"), ".1f")),
    ("raw ms", lambda s, r: _f((r.get("overhead") or {}).get("raw_ms"), ".1f")),
    ("sync/raw", lambda s, r: _f((r.get("overhead") or {}).get("overhead"), ".2f")),
    ("train s", lambda s, r: _f(r["seconds"], ".1f")),
    ("valid ppl", lambda s, r: _f(r.get("quality"), ".1f")),
    ("ppl at s", lambda s, r: _f(r.get("quality_seconds") if r.get("quality") is not None else None, ".1f")),
]


def _workloads(net: dict) -> Iterator[tuple[str, dict]]:
    yield from net["workers"]["workloads"].items()


def _workload_line(name: str, wl: dict, workers: int) -> str:
    return (f"{name}: {wl['parameters'] / 1e6:.2f}M parameters, {wl['tokens_per_step_per_worker']} tokens/step/worker, "
            f"{workers} workers")


def text_tables(result: dict) -> str:
    """The terminal table: one block per network and workload."""
    out = []
    for net in result["networks"]:
        out.append("== " + network_line(net))
        for name, wl in _workloads(net):
            out.append("  " + _workload_line(name, wl, net["workers"]["workers"]))
            cells = [[h for h, _ in COLUMNS]] + [[fn(s, r) for _, fn in COLUMNS] for s, r in wl["rows"].items()]
            widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
            for row in cells:
                out.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        out.append("")
    return "\n".join(out)


def markdown_tables(result: dict) -> str:
    """The same tables in markdown (for docs/RESULTS.md)."""
    out = []
    for net in result["networks"]:
        out.append(f"**{network_line(net)}**\n")
        for name, wl in _workloads(net):
            out.append(f"*{_workload_line(name, wl, net['workers']['workers'])}*\n")
            out.append("| " + " | ".join(h for h, _ in COLUMNS) + " |")
            out.append("|" + "---|" * len(COLUMNS))
            for s, r in wl["rows"].items():
                out.append("| " + " | ".join(fn(s, r) for _, fn in COLUMNS) + " |")
            out.append("")
    return "\n".join(out)


def plot(result: dict, prefix: Path) -> list[Path]:
    """``<prefix>_efficiency.png`` (speed / no-comm per network, a line per setting) and
    ``<prefix>_bytes.png`` (bytes per step per setting: measured, analytic, on the wire)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nets = result["networks"]
    names = list(nets[0]["workers"]["workloads"])
    prefix.parent.mkdir(parents=True, exist_ok=True)
    paths = [Path(f"{prefix}_efficiency.png"), Path(f"{prefix}_bytes.png")]
    workers = nets[0]["workers"]["workers"]

    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.2), squeeze=False)
    labels = [n["link"]["label"].replace(" (", "\n(") for n in nets]
    top = max([1.0] + [r.get("vs_no_comm") or 0 for n in nets for w in n["workers"]["workloads"].values()
                       for r in w["rows"].values()])
    for ax, name in zip(axes[0], names):
        settings = [s for s in nets[0]["workers"]["workloads"][name]["rows"] if s != "no-comm"]
        for s in settings:
            ys = [n["workers"]["workloads"].get(name, {}).get("rows", {}).get(s, {}).get("vs_no_comm") for n in nets]
            ax.plot(range(len(nets)), [y if y is not None else float("nan") for y in ys], marker="o", label=s)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(nets)), labels, fontsize=8)
        ax.set_ylim(0, max(1.15, 1.05 * top))
        ax.set_ylabel("steps/s relative to no communication")
        ax.set_title(f"{name}, {workers} workers (emulated links)", fontsize=10)
        ax.grid(alpha=0.3)
    handles, labels_ = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels_, fontsize=8, loc="lower center", ncol=min(len(labels_), 7))
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        rows = {s: r for s, r in nets[0]["workers"]["workloads"][name]["rows"].items() if s != "no-comm"}
        xs = range(len(rows))
        for k, (key, lab) in enumerate((("sent_bytes_per_step", "sent (synchronizer / DDP hook counters)"),
                                        ("analytic_bytes_per_step", "analytic (docs/ALGORITHMS.md)"),
                                        ("wire_tx_bytes_per_step", "on the wire (veth tx, headers included)"))):
            vals = [(r.get(key) or 0) / MB for r in rows.values()]
            ax.bar([x + (k - 1) * 0.27 for x in xs], vals, width=0.27, label=lab)
        ax.set_yscale("log")
        ax.set_xticks(list(xs), list(rows), rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("MB per step per worker")
        ax.set_title(f"{name}, {workers} workers", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths
