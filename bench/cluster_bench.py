"""Emulated-cluster benchmark: speed against the no-communication limit, bytes per step, overhead.

    . path.sh && python bench/cluster_bench.py          # 4 workers; networks slow, cross-site; lm + synthetic:10M
    python bench/cluster_bench.py --networks rack slow cross-site --seconds 10
    python bench/cluster_bench.py --workers 8 --networks 1gbit/1ms 100mbit/20ms --workloads synthetic:50M --seconds 10
    python bench/cluster_bench.py --cleanup             # remove namespaces a killed run left behind
    python bench/cluster_bench.py --report bench/results/cluster.json   # table, markdown, plots from a JSON

Builds N network namespaces joined by veth pairs to a bridge (``bench/cluster/netns.py``),
shapes every link to each ``--networks`` spec in turn (rate by tbf, one-way delay by netem or a
userspace TUN forwarder), measures what the links really give (TCP RTT, one stream, all
workers at once), then starts one worker per namespace through ``utils/launch.sh`` (gloo over
TCP between the namespaces) which trains every ``--settings`` entry on every ``--workloads``
entry for ``--seconds``. Prints a table, writes JSON (``--json``) and plots (``--plots``).
Needs root, iproute2 and procps; removes everything it created, also on errors and Ctrl-C.
Benchmarks assert nothing; see bench/README.md for what the numbers mean on 2 shared cores.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import machine_load  # noqa: E402
from bench.cluster import netns, probe, report  # noqa: E402
from bench.cluster.launch import run_workers  # noqa: E402
from bench.cluster.links import DEFAULT_PRESETS, LinkSpecError, parse_link  # noqa: E402
from bench.cluster.shaping import Shaper  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--workers", type=int, default=4, help="namespaces, one worker each (ring gossip needs >= 3)")
    ap.add_argument("--networks", nargs="+", default=list(DEFAULT_PRESETS),
                    help="presets (rack=10gbit/0.1ms, slow=1gbit/1ms, cross-site=100mbit/20ms) or RATE/DELAY; "
                         "rack is not in the default: the userspace delay forwarder cannot give it (bench/README.md)")
    ap.add_argument("--workloads", nargs="+", default=["lm", "synthetic:10M"], help="lm and/or synthetic:SIZE")
    ap.add_argument("--settings", nargs="+", default=None,
                    help="no-comm, ddp, local_bmuf-(8), the names of bench/sync_traffic.py's SETTINGS, or all (default: "
                         "bench.cluster.runs.DEFAULT_SETTINGS: no-comm ddp ma-(8) bmuf-(8) local_bmuf-(8) "
                         "gossip_bmuf-(8) gossip_bmuf-(16,128))")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="training time per setting; quality (LM perplexity) is taken there, speed and bytes over "
                         "the run continued to a whole sync cycle (128 steps for (16,128))")
    ap.add_argument("--steps", type=int, default=None, help="exactly this many timed steps per setting instead")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before each setting")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the list of settings this many times in turn; a row's 'vs no-comm' is the median "
                         "of its rounds' ratios to the same round's no-comm, with their range")
    ap.add_argument("--launcher", choices=["accelerate", "torchrun"], default="accelerate")
    ap.add_argument("--delay-mode", choices=["auto", "netem", "tun", "none"], default="auto",
                    help="how one-way delay is added: netem where the kernel has it, else the TUN forwarder")
    ap.add_argument("--probe-seconds", type=float, default=1.0, help="length of each bulk throughput probe")
    ap.add_argument("--no-probe", action="store_true", help="skip measuring the links")
    ap.add_argument("--overhead", choices=["first", "all", "none"], default="first",
                    help="on which networks to time syncs against a raw exchange of the same bytes (first: "
                         "the first --networks entry, the fastest by default, where the synchronizer's own cost shows)")
    ap.add_argument("--lm-streams", type=int, default=4, help="LM batch: streams x bptt tokens per step and worker")
    ap.add_argument("--lm-bptt", type=int, default=40)
    ap.add_argument("--synthetic-batch", type=int, default=256, help="token ids per step and worker")
    ap.add_argument("--synthetic-width", type=int, default=256)
    ap.add_argument("--synthetic-depth", type=int, default=2, help="Linear+Tanh layers of the fixed body")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "cluster.json"))
    ap.add_argument("--plots", default=str(ROOT / "docs" / "img" / "bench_cluster"),
                    help="prefix of <prefix>_efficiency.png and <prefix>_bytes.png")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--markdown", default=None, help="also write the tables as markdown to this file")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per network for all workloads")
    ap.add_argument("--keep-work", action="store_true", help="keep the worker logs and per-network JSON")
    ap.add_argument("--cleanup", action="store_true", help="remove namespaces of harnesses that are gone, then exit")
    ap.add_argument("--force", action="store_true", help="with --cleanup: also those of running harnesses")
    ap.add_argument("--report", metavar="JSON", nargs="+",
                    help="only render table, markdown and plots: from this script's JSON, or from the JSON of "
                         "bench.cluster.worker runs on real clusters (one network each, labelled by their --label)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.workers < 2:
        ap.error("--workers must be >= 2 (3 or more for the ring gossip settings)")
    return args


def machine_info() -> dict:
    """Where and when: CPU, cores, memory, kernel, versions, commit, load."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), None)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True)
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "kernel": platform.release(),
            "python": platform.python_version(), "torch": metadata.version("torch"),
            "accelerate": metadata.version("accelerate"), "commit": commit.stdout.strip() or None,
            "uncommitted_changes": bool(dirty.stdout.strip()), "loadavg_start": os.getloadavg()}


def worker_args(args: argparse.Namespace, label: str, out: Path, overhead: bool) -> list[str]:
    wa = ["--out", str(out), "--label", label, "--workloads", *args.workloads,
          "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--rounds", str(args.rounds), "--lm-streams", str(args.lm_streams),
          "--lm-bptt", str(args.lm_bptt), "--synthetic-batch", str(args.synthetic_batch),
          "--synthetic-width", str(args.synthetic_width), "--synthetic-depth", str(args.synthetic_depth)]
    if args.settings:
        wa += ["--settings", *args.settings]
    if args.steps is not None:
        wa += ["--steps", str(args.steps)]
    if not overhead:
        wa.append("--no-overhead")
    return wa


def run_network(cluster: netns.Cluster, shaper: Shaper, link, args, work: Path, k: int) -> dict:
    """Shape, probe, run every workload and setting on one network; the network's result."""
    shaping = shaper.apply(link)
    measured = None
    if not args.no_probe:
        seconds = max(args.probe_seconds, 50 * link.rtt_s)  # long enough to leave slow start on slow links
        measured = probe.measure(cluster, link.rtt_s, seconds, env=netns.python_env(ROOT))
    net = {"link": {**link.as_dict(), "label": link.label}, "shaping": shaping, "measured": measured,
           "loadavg_before": os.getloadavg()}
    print("[cluster_bench] " + report.network_line({**net, "workers": {"workers": cluster.n}}), flush=True)
    out = work / f"network{k}.json"
    overhead = args.overhead == "all" or (args.overhead == "first" and k == 0)
    run_workers(cluster, ROOT, work, args.launcher, worker_args(args, link.spec, out, overhead), args.timeout)
    net["delay_forwarders"] = shaper.close()
    net["loadavg_after"] = os.getloadavg()
    net["workers"] = json.loads(out.read_text())
    report.add_ratios(net["workers"])
    net["load"] = machine_load.summary(setting_loads([net]))
    return net


def setting_loads(networks: list[dict]) -> list[dict]:
    """The load records the workers took around each setting (bench/machine_load.py)."""
    return [row["load"] for net in networks for wl in net["workers"]["workloads"].values()
            for row in wl["rows"].values() if "load" in row]


def load_reports(paths: list[str]) -> dict:
    """One result from this script's JSON files and/or worker JSONs of real clusters."""
    result: dict = {"networks": []}
    for p in paths:
        d = json.loads(Path(p).read_text())
        if "networks" in d:
            result = {**d, "networks": result["networks"] + d["networks"]}
        else:
            result["networks"].append(report.from_worker_json(d, d.get("label") or Path(p).stem))
    return result


def render(result: dict, args: argparse.Namespace) -> None:
    print(report.text_tables(result))
    if args.markdown:
        Path(args.markdown).write_text(report.markdown_tables(result))
        print(f"[cluster_bench] markdown tables: {args.markdown}")
    if not args.no_plots:
        for p in report.plot(result, Path(args.plots)):
            print(f"[cluster_bench] plot: {p}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        render(load_reports(args.report), args)
        return 0
    missing = netns.missing_requirements(need_tun=args.delay_mode in ("auto", "tun"))
    if missing:
        print("cluster_bench: this machine lacks:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2
    if args.cleanup:
        netns.remove_leftovers(args.force)
        return 0
    netns.remove_leftovers(quiet=True)  # namespaces of harnesses killed before they could clean up
    why = netns.netns_works()
    if why:
        print(f"cluster_bench: network namespaces do not work here: {why}", file=sys.stderr)
        return 2
    try:
        links = [parse_link(x) for x in args.networks]
    except LinkSpecError as e:
        print(f"cluster_bench: {e}", file=sys.stderr)
        return 2
    result = {"command": " ".join(["python bench/cluster_bench.py", *(sys.argv[1:] if argv is None else argv)]),
              "machine": machine_info(), "config": {k: v for k, v in vars(args).items()
                                                    if k not in ("cleanup", "force", "report")},
              "networks": []}
    work = Path(tempfile.mkdtemp(prefix="gab_bench_"))
    machine_load.mark_root()  # the workers sample the load around each setting, leaving out this job
    ok = False
    try:
        with netns.signals_raise(), netns.Cluster(args.workers) as cluster:
            shaper = Shaper(cluster, args.delay_mode, root=str(ROOT))
            try:
                for k, link in enumerate(links):
                    result["networks"].append(run_network(cluster, shaper, link, args, work, k))
            finally:
                shaper.close()
        ok = True
    except KeyboardInterrupt:
        print("[cluster_bench] interrupted; namespaces removed", file=sys.stderr)
        return 130
    except netns.HarnessError as e:
        print(f"cluster_bench: {e}", file=sys.stderr)
        return 1
    finally:
        if ok and not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"[cluster_bench] worker logs kept in {work}", file=sys.stderr)
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["load"] = machine_load.summary(setting_loads(result["networks"]))
    if (w := machine_load.summary_warning(result["load"], "each row's 'load'")):
        print(w, flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    render(result, args)
    print(f"[cluster_bench] JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
