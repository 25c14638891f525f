"""The emulated-cluster harness of bench/cluster: it builds and removes its namespaces (also on
errors and Ctrl-C), and a tiny run writes well-formed JSON.

Benchmarks are not tests: nothing here asserts on time or speed, only on structure and on
byte counts (which are deterministic). Needs root, iproute2 and network namespaces; skips
with the reason otherwise.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import machine_load
from bench.cluster import netns, probe
from bench.cluster.links import LinkSpecError, parse_link, tbf_args
from bench.cluster.shaping import Shaper

ROOT = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, str(ROOT / "bench" / "cluster_bench.py")]
SETTINGS = ["no-comm", "ddp", "ma-(8)", "gossip_bmuf-(8)", "gossip_bmuf-(16,128)"]


@pytest.fixture(scope="module")
def netns_ok():
    # utils/run_tests.sh installs iproute2 and procps; root and /dev/net/tun come with the machine
    missing = netns.missing_requirements(need_tun=True)
    assert not missing, "emulated cluster needs: " + "; ".join(missing)
    why = netns.netns_works()
    assert not why, f"network namespaces do not work here: {why}"


def ours(tag: str) -> list[str]:
    return [ns for ns in netns.namespaces() if ns.startswith(tag + "-")]


def test_link_specs():
    rack = parse_link("rack")
    assert (rack.rate_bps, rack.delay_s, rack.name) == (10e9, 1e-4, "rack")
    assert parse_link("100mbit/20ms").rtt_s == pytest.approx(0.04)
    assert parse_link("unlimited/0").rate_bps is None
    assert parse_link("1gbit/1ms").spec == "1gbit/1ms"
    for bad in ("1gbit", "fast/1ms", "1gbit/soon"):
        with pytest.raises(LinkSpecError):
            parse_link(bad)
    args = tbf_args(1e9, 65000)
    assert args[:3] == ["tbf", "rate", "1000000000bit"] and int(args[4]) > 65000  # burst holds a full frame


def _spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def test_machine_load_counts_other_processes_not_the_benchs_own():
    """A busy process of the bench (a child) is its own load; one that is not (an orphan) is the machine's."""
    spin = [sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"]
    child = subprocess.Popen(spin)
    # an orphan: started by a shell that exits at once, so it is no descendant of this process
    orphan = int(subprocess.run(["sh", "-c", f"{shlex.join(spin)} >/dev/null 2>&1 & echo $!"],
                                capture_output=True, text=True).stdout)
    try:
        time.sleep(0.3)
        snap = machine_load.snapshot(interval=1.0, top=50)
    finally:
        child.kill()
        os.kill(orphan, signal.SIGKILL)
    busy = {p["pid"]: p for p in snap["busy"]}
    assert child.pid not in busy and orphan in busy and busy[orphan]["cpu_percent"] > 0
    assert len(snap["loadavg"]) == 3 and snap["cores"] >= 1


def test_machine_load_quiet_flag_and_warning():
    """Snapshots without CPU counters (off Linux, older records): the 1-minute load average before judges."""
    def snap(load: float, cpu: float) -> dict:
        return {"time": 0.0, "loadavg": [load, load, load], "cores": 2,
                "busy": [{"pid": 7, "cpu_percent": cpu, "name": "trainer", "command": "trainer"}]}

    quiet = machine_load.assess(snap(0.4, 3.0), snap(3.0, 3.0))     # the load after is the setting's own
    assert quiet["quiet"] and machine_load.warning(quiet, "ddp") is None and quiet["other_cores"] is None
    busy = machine_load.assess(snap(2.5, 3.0), snap(3.0, 90.0))
    assert not busy["quiet"]
    assert busy["why"] == "load average 2.50 before (> 1 on 2 cores); busy after: trainer (pid 7) 90%"
    assert machine_load.warning(busy, "ddp").startswith("WARNING: ddp was measured on a busy machine (load average 2.50")
    summ = machine_load.summary([quiet, busy])
    assert summ == {"settings": 2, "not_quiet": 1, "max_loadavg_1min": 3.0, "max_other_cores": None}
    assert "1 of 2 settings" in machine_load.summary_warning(summ, "rows")
    assert machine_load.summary_warning(machine_load.summary([quiet]), "rows") is None


def test_machine_load_judges_the_cpu_of_other_processes_not_the_load_average():
    """With CPU counters the verdict is the other processes' cores during the setting: a high load average
    made by the bench's own workers is quiet; other processes' CPU is busy whatever the load average."""
    def snap(t: float, load: float, machine: float, own: float) -> dict:
        return {"time": t, "loadavg": [load] * 3, "cores": 2, "busy": [],
                "cpu": {"machine_busy_s": machine, "own_s": own}}

    own_load = machine_load.assess(snap(0.0, 3.9, 100.0, 10.0), snap(10.0, 4.0, 119.0, 28.5))  # others: 0.5 s in 10 s
    assert own_load["quiet"] and own_load["other_cores"] == 0.05
    others = machine_load.assess(snap(0.0, 0.1, 100.0, 10.0), snap(10.0, 0.2, 125.0, 20.0))   # others: 15 s in 10 s
    assert not others["quiet"] and others["other_cores"] == 1.5
    assert others["why"] == "other processes used 1.50 cores during it (> 0.25)"
    summ = machine_load.summary([own_load, others])
    assert summ["not_quiet"] == 1 and summ["max_other_cores"] == 1.5
    assert "other processes up to 1.50 cores" in machine_load.summary_warning(summ, "rows")


def _burn(cpu_seconds: float, done: Path) -> list[str]:
    return [sys.executable, "-c", f"import time, pathlib\nt = time.process_time()\nwhile time.process_time() - t < "
            f"{cpu_seconds}: pass\npathlib.Path({str(done)!r}).write_text('done')"]


def _wait_for(path: Path) -> None:
    for _ in range(6000):
        if path.is_file():
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


@pytest.mark.skipif(machine_load.machine_busy_seconds() is None, reason="no /proc/stat")
def test_machine_load_cpu_counters_split_own_from_other(tmp_path):
    """A reaped child's CPU is the bench's own (its parent's cutime); an orphan's is the machine's."""
    before = machine_load.snapshot(interval=0.05)
    subprocess.run(_burn(0.5, tmp_path / "child"), check=True)
    mid = machine_load.snapshot(interval=0.05)
    assert mid["cpu"]["own_s"] - before["cpu"]["own_s"] >= 0.45
    subprocess.run(["sh", "-c", f"{shlex.join(_burn(0.5, tmp_path / 'orphan'))} >/dev/null 2>&1 &"], check=True)
    _wait_for(tmp_path / "orphan")
    after = machine_load.snapshot(interval=0.05)
    others_s = machine_load.other_cores(mid, after) * (after["time"] - mid["time"])
    assert others_s >= 0.45


def test_cluster_builds_shapes_and_removes_namespaces(netns_ok):
    cluster = netns.Cluster(3, log=lambda s: None)
    with pytest.raises(RuntimeError, match="boom"):
        with cluster:
            assert sorted(ours(cluster.tag)) == sorted([cluster.hub, *cluster.names])
            shaper = Shaper(cluster, "auto", root=str(ROOT))
            info = shaper.apply(parse_link("1gbit/1ms"))
            assert info["delay_mode"] in ("netem", "tun")
            qdiscs = netns.run(["tc", "-n", cluster.names[0], "qdisc", "show", "dev", cluster.veth(0)]).stdout
            assert "tbf" in qdiscs or "netem" in qdiscs
            m = probe.measure(cluster, 0.002, seconds=0.3, env=netns.python_env(ROOT))
            for key in ("rtt_ms", "one_flow_bps", "ring_bps_mean", "ring_bps_min"):
                assert math.isfinite(m[key]) and m[key] > 0, (key, m)  # measured, not judged
            forwarders = list(shaper.forwarders)
            raise RuntimeError("boom")  # an error inside the block: everything must still go
    assert ours(cluster.tag) == []
    assert all(p.poll() is not None for p in forwarders)


def test_cleanup_removes_only_dead_harnesses(netns_ok):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"gab{dead.pid}-w0", f"gab{os.getpid()}-w7"
    for ns in (stale, live):
        netns.run(["ip", "netns", "add", ns])
    try:
        out = subprocess.run([*BENCH, "--cleanup"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        names = netns.namespaces()
        assert stale not in names and live in names
    finally:
        for ns in (stale, live):
            netns.run(["ip", "netns", "del", ns], check=False)


def test_ctrl_c_removes_everything(netns_ok, tmp_path):
    # --seconds 300: the run is surely still going when Ctrl-C comes (a short one may end first)
    proc = subprocess.Popen([*BENCH, "--workers", "3", "--networks", "1gbit/1ms", "--workloads", "synthetic:0.05M",
                             "--seconds", "300", "--no-probe", "--json", str(tmp_path / "x.json"), "--no-plots"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tag = None
    for line in proc.stdout:  # wait until the namespaces exist and the workers are being started
        m = re.search(r"namespaces (gab\d+)-w0", line)
        tag = tag or (m.group(1) if m else None)
        if line.startswith("[cluster_bench] 1gbit/1ms"):
            break
    assert tag is not None and ours(tag)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert ours(tag) == []
    work = re.search(r"worker logs kept in (\S+)", err).group(1)
    shutil.rmtree(work, ignore_errors=True)
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if work in cmdline.read_bytes().decode(errors="replace"):
                left.append(cmdline.parent.name)
        except OSError:
            pass
    assert left == [], f"worker processes survived Ctrl-C: {left}"


def test_rounds_take_each_ratio_within_its_round_and_report_the_median():
    from bench.cluster.report import add_ratios, combine_rounds

    def row(speed):
        return {"steps_per_s": speed, "sent_bytes_per_step": 1.0}

    # round 2 was a slow spell for every setting: within-round ratios stay 0.9, the medians' ratio would not
    base = combine_rounds([row(10.0), row(5.0), row(10.0)])
    other = combine_rounds([row(9.0), row(4.5), row(9.0)])
    assert base["median_round"] == 0 and other["median_round"] == 0  # the lower middle of equal speeds
    workers = {"workloads": {"w": {"rows": {"no-comm": base, "x": other}}}}
    add_ratios(workers)
    assert other["vs_no_comm_rounds"] == pytest.approx([0.9, 0.9, 0.9]) and other["vs_no_comm"] == pytest.approx(0.9)
    assert base["vs_no_comm"] == 1.0
    assert combine_rounds([row(3.0)]) == row(3.0)  # one round: the row itself, no 'rounds'


def test_tiny_run_writes_wellformed_json(netns_ok, tmp_path):
    out_json, md = tmp_path / "cluster.json", tmp_path / "tables.md"
    cmd = [*BENCH, "--workers", "3", "--networks", "1gbit/1ms", "--workloads", "synthetic:0.05M",
           "--settings", *SETTINGS, "--steps", "3", "--warmup", "1", "--rounds", "2", "--no-probe", "--json", str(out_json),
           "--plots", str(tmp_path / "bench"), "--markdown", str(md)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    tag = re.search(r"namespaces (gab\d+)-w0", proc.stdout).group(1)
    assert ours(tag) == []

    result = json.loads(out_json.read_text())
    assert result["command"].startswith("python bench/cluster_bench.py")
    assert len(result["machine"]["loadavg_start"]) == 3 and result["machine"]["cores"] >= 1
    (net,) = result["networks"]
    assert net["link"]["spec"] == "1gbit/1ms" and net["link"]["asked_rtt_ms"] == pytest.approx(2.0)
    assert net["workers"]["workers"] == 3
    wl = net["workers"]["workloads"]["synthetic-50k"]
    assert list(wl["rows"]) == SETTINGS
    for name, row in wl["rows"].items():
        assert row["steps"] == 3, name
        # --rounds 2: the settings ran twice in turn; the row is the median round, its ratio the median ratio
        assert len(row["rounds"]) == 2 and row["rounds"][row["median_round"]]["steps_per_s"] == row["steps_per_s"]
        assert len(row["vs_no_comm_rounds"]) == 2 and row["vs_no_comm"] == min(row["vs_no_comm_rounds"]), name
        for key in ("steps_per_s", "tokens_per_s", "vs_no_comm", "sent_bytes_per_step", "analytic_bytes_per_step"):
            assert row[key] is not None and math.isfinite(row[key]) and row[key] >= 0, (name, key, row[key])
    rows = wl["rows"]
    assert rows["no-comm"]["sent_bytes_per_step"] == 0 and rows["no-comm"]["vs_no_comm"] == 1.0
    # DDP all-reduces every gradient every step: counter == analytic 2(n-1)/n * |theta|, and it is on the wire
    assert rows["ddp"]["sent_bytes_per_step"] == pytest.approx(rows["ddp"]["analytic_bytes_per_step"])
    assert rows["ddp"]["wire_tx_bytes_per_step"] > 0.5 * rows["ddp"]["analytic_bytes_per_step"]
    assert rows["ddp"]["vs_ddp"] == 1.0
    for name in SETTINGS[2:]:
        o = rows[name]["overhead"]
        assert o["syncs_timed"] >= 1 and o["sync_ms"] > 0 and o["raw_ms"] > 0, (name, o)
    assert rows["gossip_bmuf-(8)"]["q"] == 1 and rows["gossip_bmuf-(16,128)"]["periods"] == "(16,128)"
    assert (tmp_path / "bench_efficiency.png").stat().st_size > 0
    assert (tmp_path / "bench_bytes.png").stat().st_size > 0
    assert "| gossip_bmuf-(16,128) |" in md.read_text()
    # the machine's load around each setting (bench/machine_load.py), with the quiet flag
    for name, row in rows.items():
        load = row["load"]
        assert isinstance(load["quiet"], bool) and len(load["before"]["loadavg"]) == 3, name
        assert load["after"]["time"] > load["before"]["time"] and isinstance(load["after"]["busy"], list), name
        if not load["quiet"]:
            assert re.search(rf"WARNING: 1gbit/1ms synthetic-50k {re.escape(name)} \(round [12]/2\) was measured on "
                             r"a busy machine", proc.stdout)
    assert result["load"]["settings"] == len(SETTINGS) and net["load"] == result["load"]
    assert result["load"]["not_quiet"] == sum(not r["load"]["quiet"] for r in rows.values())


def test_coder_speed_times_every_operation_and_writes_json(tmp_path, capsys):
    from bench import coder_speed
    from gossip_accel.sync import quantize

    out = tmp_path / "coder.json"
    coder_speed.main(["--numel", "1000", "513", "--bits", "4", "--calls", "2", "--block", "64", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["numel"], r["op"]) for r in rows] == [(n, op) for n in (1000, 513)
                                                     for op in ("encode", "decode", "send_to_copy_", "compress_")]
    assert all(0 < r["min_ms"] <= r["median_ms"] for r in rows)
    assert "| 1,000 | 4 | send_to_copy_ |" in capsys.readouterr().out
    assert sys.modules["gossip_accel.sync.quantize"] is quantize   # the package the other tests use was not re-imported
