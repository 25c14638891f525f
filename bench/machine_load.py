"""The machine's load around a benchmark setting: what other processes used of the CPU meanwhile.

A speed measured while other jobs ran is not a quiet-machine number (docs/RESULTS.md: the same
cluster bench gave 0.94 of the no-communication speed under load and 0.70 on a quiet machine,
because the load slowed the baseline). Every bench takes :func:`snapshot` before and after each
setting and keeps :func:`assess`'s record in its JSON; :func:`warning` is the line it prints when
the machine was not quiet.

The verdict rests on the CPU the *other* processes used during the setting, in cores:
the machine's busy time (user + nice + system of ``/proc/stat``) between the two snapshots less
the CPU the bench's own process tree used (utime + stime + cutime + cstime of each of its live
processes: an exited, reaped process's time lives on in its parent's cutime, so short-lived
children count too). The 1-minute load average cannot tell: before a setting it still holds the
previous setting's workers, and the setting's own workers (4 on 2 cores) load it beyond any
threshold, so it flagged every setting of every bench. It is still recorded, and judged (as
before) only where a snapshot has no CPU counters (not Linux, or a record written before them).
The busiest other processes at each end are sampled too (utime + stime from ``/proc/<pid>/stat``
twice, ``interval`` seconds apart): a hog is named in the warning.
The bench's own processes are the descendants of the process named by the environment
variable ``MACHINE_LOAD_ROOT_PID`` (a bench driver sets it for the workers it starts, which may
sample the load themselves), else of this process.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

#: the machine is quiet when the other processes used at most MAX_OTHER_CORES cores on average during the
#: setting and none used more than MAX_OTHER_CPU percent of one core before or after it; MAX_LOAD_PER_CORE
#: (1-minute load average before the setting, per core) judges only snapshots without CPU counters
MAX_OTHER_CORES = 0.25
MAX_LOAD_PER_CORE = 0.5
MAX_OTHER_CPU = 25.0


def _stat(pid: str) -> Optional[tuple[int, float, str, float]]:
    """(parent pid, CPU seconds so far, command name, CPU seconds of its reaped children) of ``pid``;
    None when it is gone."""
    try:
        text = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()  # state ppid ... utime(12) stime(13) cutime(14) cstime(15)
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS, name, (int(fields[13]) + int(fields[14])) / TICKS


def _all() -> dict[int, tuple[int, float, str, float]]:
    out = {}
    for d in PROC.iterdir() if PROC.is_dir() else ():
        if d.name.isdigit() and (s := _stat(d.name)) is not None:
            out[int(d.name)] = s
    return out


def machine_busy_seconds() -> Optional[float]:
    """CPU seconds all cores spent in user, nice and system mode since boot (``/proc/stat``); None off Linux."""
    try:
        fields = (PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    return (int(fields[1]) + int(fields[2]) + int(fields[3])) / TICKS


def own_cpu_seconds(procs: Optional[dict[int, tuple[int, float, str, float]]] = None) -> float:
    """CPU seconds the bench's own process tree has used so far, its reaped children's included."""
    procs = _all() if procs is None else procs
    return sum(procs[pid][1] + procs[pid][3] for pid in _own(procs) if pid in procs)


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return ""


ROOT_PID_VAR = "MACHINE_LOAD_ROOT_PID"


def mark_root() -> None:
    """Call in a bench driver: the workers it starts count as its own processes, not as load."""
    os.environ[ROOT_PID_VAR] = str(os.getpid())


def _own(procs: dict[int, tuple[int, float, str, float]]) -> set[int]:
    """This process, the bench's root process (:func:`mark_root`) and their descendants."""
    own, grew = {os.getpid(), int(os.environ.get(ROOT_PID_VAR) or os.getpid())}, True
    while grew:
        new = {pid for pid, (ppid, *_) in procs.items() if ppid in own and pid not in own}
        own |= new
        grew = bool(new)
    return own


def _busy_sample(interval: float, top: int) -> tuple[list[dict], dict[int, tuple[int, float, str, float]]]:
    """:func:`busy_processes`, and the process table of its second sample (for :func:`snapshot`'s counters)."""
    first = _all()
    time.sleep(interval)
    second = _all()
    own = _own(first) | _own(second)
    rows = []
    for pid, (_, cpu, name, _) in second.items():
        if pid in own or pid not in first:
            continue
        pct = 100.0 * (cpu - first[pid][1]) / interval
        if pct > 0:
            rows.append({"pid": pid, "cpu_percent": round(pct, 1), "name": name, "command": _cmdline(pid)})
    return sorted(rows, key=lambda r: -r["cpu_percent"])[:top], second


def busy_processes(interval: float = 0.5, top: int = 5) -> list[dict]:
    """The ``top`` other processes by CPU use (percent of one core) over ``interval`` seconds."""
    return _busy_sample(interval, top)[0]


def snapshot(interval: float = 0.5, top: int = 5) -> dict:
    """Load averages (1, 5, 15 min), the cores, the busiest other processes, and the CPU counters
    :func:`assess` subtracts (``cpu``: machine busy and own-tree CPU seconds, taken together), now."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    busy, procs = _busy_sample(interval, top)
    machine = machine_busy_seconds()
    cpu = None if machine is None else {"machine_busy_s": machine, "own_s": own_cpu_seconds(procs)}
    return {"time": time.time(), "loadavg": [round(x, 2) for x in load], "cores": os.cpu_count() or 1,
            "busy": busy, "cpu": cpu}


def other_cores(before: dict, after: dict) -> Optional[float]:
    """Mean cores the other processes used between two snapshots (None without CPU counters)."""
    a, b = before.get("cpu"), after.get("cpu")
    span = after["time"] - before["time"]
    if not a or not b or span <= 0:
        return None
    others = (b["machine_busy_s"] - a["machine_busy_s"]) - (b["own_s"] - a["own_s"])
    return max(0.0, others) / span


def assess(before: dict, after: dict, max_load_per_core: float = MAX_LOAD_PER_CORE,
           max_other_cpu: float = MAX_OTHER_CPU, max_other_cores: float = MAX_OTHER_CORES) -> dict:
    """``{"before", "after", "other_cores", "quiet", "why"}`` for one setting: quiet when the other
    processes used at most ``max_other_cores`` cores on average between the snapshots
    (:func:`other_cores`; without CPU counters: when the 1-minute load before it was at most
    ``max_load_per_core`` x cores) and no other process used more than ``max_other_cpu`` percent
    of a core at either end."""
    why = []
    others = other_cores(before, after)
    if others is not None:
        if others > max_other_cores:
            why.append(f"other processes used {others:.2f} cores during it (> {max_other_cores:g})")
    elif before["loadavg"][0] > (limit := max_load_per_core * before["cores"]):
        why.append(f"load average {before['loadavg'][0]:.2f} before (> {limit:g} on {before['cores']} cores)")
    for when, snap in (("before", before), ("after", after)):
        hogs = [p for p in snap["busy"] if p["cpu_percent"] > max_other_cpu]
        if hogs:
            why.append(f"busy {when}: " + ", ".join(f"{p['name']} (pid {p['pid']}) {p['cpu_percent']:.0f}%" for p in hogs[:3]))
    return {"before": before, "after": after, "other_cores": None if others is None else round(others, 3),
            "quiet": not why, "why": "; ".join(why)}


def warning(record: dict, label: str) -> Optional[str]:
    """The line a bench prints for a setting measured on a machine that was not quiet (None if quiet)."""
    if record["quiet"]:
        return None
    return f"WARNING: {label} was measured on a busy machine ({record['why']}): its times are not quiet-machine times"


def summary(records: list[dict]) -> dict:
    """For a bench's JSON top level: how many settings ran on a busy machine, the peak load average
    and the most cores other processes used during a setting."""
    others = [r["other_cores"] for r in records if r.get("other_cores") is not None]
    return {"settings": len(records), "not_quiet": sum(not r["quiet"] for r in records),
            "max_loadavg_1min": max((s["loadavg"][0] for r in records for s in (r["before"], r["after"])), default=None),
            "max_other_cores": max(others, default=None)}


def summary_warning(summ: dict, where: str) -> Optional[str]:
    """The closing line of a bench whose settings were not all measured on a quiet machine."""
    if not summ["not_quiet"]:
        return None
    others = "" if summ.get("max_other_cores") is None else f", other processes up to {summ['max_other_cores']:.2f} cores"
    return (f"WARNING: {summ['not_quiet']} of {summ['settings']} settings were measured on a busy machine (peak "
            f"1-minute load {summ['max_loadavg_1min']}{others}): not quiet-machine numbers (JSON: {where})")
