"""The machine's load around a benchmark setting: load averages and the busiest other processes.

A speed measured while other jobs ran is not a quiet-machine number (docs/RESULTS.md: the same
cluster bench gave 0.94 of the no-communication speed under load and 0.70 on a quiet machine,
because the load slowed the baseline). Every bench takes :func:`snapshot` before and after each
setting and keeps :func:`assess`'s record in its JSON; :func:`warning` is the line it prints when
the machine was not quiet.

CPU use per process is measured, not taken from ``ps``'s %CPU (an average over the process's
whole life): utime + stime from ``/proc/<pid>/stat`` sampled twice, ``interval`` seconds apart.
The bench's own processes are left out: the descendants of the process named by the environment
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

#: the machine is quiet when the 1-minute load average before a setting is at most this share of the
#: cores and no other process used more than MAX_OTHER_CPU percent of one core before or after it
MAX_LOAD_PER_CORE = 0.5
MAX_OTHER_CPU = 25.0


def _stat(pid: str) -> Optional[tuple[int, float, str]]:
    """(parent pid, CPU seconds so far, command name) of ``pid``; None when it is gone."""
    try:
        text = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()  # state ppid ... utime(12) stime(13)
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS, name


def _all() -> dict[int, tuple[int, float, str]]:
    out = {}
    for d in PROC.iterdir() if PROC.is_dir() else ():
        if d.name.isdigit() and (s := _stat(d.name)) is not None:
            out[int(d.name)] = s
    return out


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return ""


ROOT_PID_VAR = "MACHINE_LOAD_ROOT_PID"


def mark_root() -> None:
    """Call in a bench driver: the workers it starts count as its own processes, not as load."""
    os.environ[ROOT_PID_VAR] = str(os.getpid())


def _own(procs: dict[int, tuple[int, float, str]]) -> set[int]:
    """This process, the bench's root process (:func:`mark_root`) and their descendants."""
    own, grew = {os.getpid(), int(os.environ.get(ROOT_PID_VAR) or os.getpid())}, True
    while grew:
        new = {pid for pid, (ppid, _, _) in procs.items() if ppid in own and pid not in own}
        own |= new
        grew = bool(new)
    return own


def busy_processes(interval: float = 0.5, top: int = 5) -> list[dict]:
    """The ``top`` other processes by CPU use (percent of one core) over ``interval`` seconds."""
    first = _all()
    time.sleep(interval)
    second = _all()
    own = _own(first) | _own(second)
    rows = []
    for pid, (_, cpu, name) in second.items():
        if pid in own or pid not in first:
            continue
        pct = 100.0 * (cpu - first[pid][1]) / interval
        if pct > 0:
            rows.append({"pid": pid, "cpu_percent": round(pct, 1), "name": name, "command": _cmdline(pid)})
    return sorted(rows, key=lambda r: -r["cpu_percent"])[:top]


def snapshot(interval: float = 0.5, top: int = 5) -> dict:
    """Load averages (1, 5, 15 min), the cores and the busiest other processes, now."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"time": time.time(), "loadavg": [round(x, 2) for x in load], "cores": os.cpu_count() or 1,
            "busy": busy_processes(interval, top)}


def assess(before: dict, after: dict, max_load_per_core: float = MAX_LOAD_PER_CORE,
           max_other_cpu: float = MAX_OTHER_CPU) -> dict:
    """``{"before", "after", "quiet", "why"}`` for one setting: quiet when the 1-minute load before
    it was at most ``max_load_per_core`` x cores and no other process used more than
    ``max_other_cpu`` percent of a core at either end (the load after includes the setting's own
    workers, so only the other processes count there)."""
    why = []
    limit = max_load_per_core * before["cores"]
    if before["loadavg"][0] > limit:
        why.append(f"load average {before['loadavg'][0]:.2f} before (> {limit:g} on {before['cores']} cores)")
    for when, snap in (("before", before), ("after", after)):
        hogs = [p for p in snap["busy"] if p["cpu_percent"] > max_other_cpu]
        if hogs:
            why.append(f"busy {when}: " + ", ".join(f"{p['name']} (pid {p['pid']}) {p['cpu_percent']:.0f}%" for p in hogs[:3]))
    return {"before": before, "after": after, "quiet": not why, "why": "; ".join(why)}


def warning(record: dict, label: str) -> Optional[str]:
    """The line a bench prints for a setting measured on a machine that was not quiet (None if quiet)."""
    if record["quiet"]:
        return None
    return f"WARNING: {label} was measured on a busy machine ({record['why']}): its times are not quiet-machine times"


def summary(records: list[dict]) -> dict:
    """For a bench's JSON top level: how many settings ran on a busy machine, and the peak load."""
    return {"settings": len(records), "not_quiet": sum(not r["quiet"] for r in records),
            "max_loadavg_1min": max((s["loadavg"][0] for r in records for s in (r["before"], r["after"])), default=None)}


def summary_warning(summ: dict, where: str) -> Optional[str]:
    """The closing line of a bench whose settings were not all measured on a quiet machine."""
    if not summ["not_quiet"]:
        return None
    return (f"WARNING: {summ['not_quiet']} of {summ['settings']} settings were measured on a busy machine (peak "
            f"1-minute load {summ['max_loadavg_1min']}): not quiet-machine numbers (JSON: {where})")
