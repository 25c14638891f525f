"""The summary file of bench/quality.py, accumulated over calls: one row per setting and seed, merged.

``bench/results/quality_<corpus>_<grid or settings>_e<E>-n<N>.json`` holds every setting run with that
corpus, epochs and workers, whichever call ran it: each call's ``seed_rows`` (one per setting and seed)
replace the file's rows of the same setting and seed and join the others; the per-setting ``rows``
(mean and spread over seeds, ratios to the DDP rows of the whole file), ``curves`` (one per seed),
``seeds``, ``load`` and ``commands`` are then made again from all of them. A setting whose definition
(its overrides, conf overlays and the call's extra overrides) changed since its old rows were written
keeps only the new ones. The rows of a file written before ``seed_rows`` existed are kept as they were
(with their curves) unless the call re-runs their setting.
"""
from __future__ import annotations

import statistics
from typing import Any, Optional


def seed_row(setting: str, what: str, seed: int, definition: list[str], res: dict) -> dict:
    """One run (its ``results.json``, or ``{"failed": log}``) as the file keeps it."""
    row = {"setting": setting, "what": what, "seed": seed, "definition": definition}
    if "failed" in res:
        return {**row, "failed": res["failed"]}
    load = res.get("bench", {}).get("load")
    return {**row, "workers": res["workers"], "algorithm": res["algorithm"], "periods": res["periods"],
            "eta": (res.get("sync") or {}).get("block_momentum"),
            "valid_ppl": res["final_valid_ppl"], "test_ppl": res["final_test_ppl"],
            "bytes_per_step": res["bytes_sent_per_step_per_worker"], "steps_per_worker": res["steps_per_worker"],
            "curve": curve(res), "curve_steps": [h["step"] for h in res["history"]],
            "load": None if load is None else {"quiet": load["quiet"], "other_cores": load.get("other_cores"),
                                               "before": {"loadavg": load["before"]["loadavg"]},
                                               "after": {"loadavg": load["after"]["loadavg"]}}}


def curve(res: dict) -> list[tuple[int, float, float]]:
    """(epoch, cumulative bytes sent per worker, valid ppl of the averaged model where recorded)."""
    per_step = res["bytes_sent_per_step_per_worker"]
    return [(h["epoch"], per_step * h["step"], h.get("valid_ppl", h.get("valid_ppl_replicas")))
            for h in res["history"]]


def spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def merge_seed_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with ``new`` in: a (setting, seed) of ``new`` replaces the old one, a setting whose
    definition changed drops its old rows; the settings keep their first order, then the new ones'."""
    defined = {r["setting"]: r["definition"] for r in new}
    redefined = {o["setting"] for o in old if o["setting"] in defined and o.get("definition") != defined[o["setting"]]}
    replaced = {(r["setting"], r["seed"]) for r in new}
    kept = [o for o in old if o["setting"] not in redefined and (o["setting"], o["seed"]) not in replaced]
    order = list(dict.fromkeys([*(r["setting"] for r in old), *(r["setting"] for r in new)]))
    rows = kept + new
    return sorted(rows, key=lambda r: (order.index(r["setting"]), r["seed"]))


def summarize(seed_rows: list[dict]) -> list[dict]:
    """One row per setting: mean and standard deviation over its seeds, ratios to the DDP rows."""
    base = [r for r in seed_rows if r["setting"] == "ddp" and "failed" not in r]
    ddp_bytes = statistics.fmean(r["bytes_per_step"] for r in base) if base else None
    ddp_ppl = statistics.fmean(r["test_ppl"] for r in base) if base else None
    rows = []
    for name in dict.fromkeys(r["setting"] for r in seed_rows):
        mine = [r for r in seed_rows if r["setting"] == name]
        failed, rs = [r for r in mine if "failed" in r], [r for r in mine if "failed" not in r]
        if failed:
            rows.append({"setting": name, "what": mine[0]["what"], "seeds": len(failed), "failed": True})
        if not rs:
            continue
        test, test_sd = spread([r["test_ppl"] for r in rs])
        valid, valid_sd = spread([r["valid_ppl"] for r in rs])
        mb = statistics.fmean(r["bytes_per_step"] for r in rs)
        rows.append({"setting": name, "what": rs[0]["what"], "seeds": len(rs), "workers": rs[0]["workers"],
                     "algorithm": rs[0]["algorithm"], "periods": rs[0]["periods"], "eta": rs[0]["eta"],
                     "valid_ppl": valid, "valid_ppl_sd": valid_sd, "test_ppl": test, "test_ppl_sd": test_sd,
                     "mb_per_step": mb / 1e6, "steps_per_worker": rs[0]["steps_per_worker"],
                     "bytes_vs_ddp": mb / ddp_bytes if ddp_bytes else None,
                     "ppl_vs_ddp": test / ddp_ppl if ddp_ppl else None})
    return rows


def load_summary(seed_rows: list[dict], legacy: Optional[dict]) -> dict:
    """How many runs were measured on a busy machine, the peak 1-minute load and the most cores other
    processes used during a run (bench/machine_load.py; with a legacy file's)."""
    loads = [r["load"] for r in seed_rows if r.get("load")]
    out = {"settings": len(loads), "not_quiet": sum(not r["quiet"] for r in loads),
           "max_loadavg_1min": max((s["loadavg"][0] for r in loads for s in (r["before"], r["after"])), default=None),
           "max_other_cores": max((r["other_cores"] for r in loads if r.get("other_cores") is not None), default=None)}
    if legacy:
        def peak(key: str) -> Optional[float]:
            return max((p for p in (out[key], legacy.get(key)) if p is not None), default=None)

        out = {"settings": out["settings"] + legacy.get("settings", 0),
               "not_quiet": out["not_quiet"] + legacy.get("not_quiet", 0),
               "max_loadavg_1min": peak("max_loadavg_1min"), "max_other_cores": peak("max_other_cores")}
    return out


def merge(old: Optional[dict], new_rows: list[dict], header: dict[str, Any], command: str) -> dict:
    """The file after this call: ``old`` (the file as it was, or None) with this call's ``new_rows``
    (:func:`seed_row`); ``header``: corpus, epochs, workers, date."""
    old = old or {}
    seed_rows = merge_seed_rows(old.get("seed_rows", []), new_rows)
    have = {r["setting"] for r in seed_rows}
    legacy = [r for r in old.get("rows", []) if r["setting"] not in have]  # kept as they were
    legacy_names = {r["setting"] for r in legacy}
    order = list(dict.fromkeys([*(r["setting"] for r in old.get("rows", [])), *(r["setting"] for r in seed_rows)]))
    rows = sorted([*legacy, *summarize(seed_rows)], key=lambda r: order.index(r["setting"]))
    curves = {n: c for n, c in old.get("curves", {}).items() if n in legacy_names}
    for r in seed_rows:
        if "failed" not in r:
            curves.setdefault(r["setting"], []).append(r["curve"])
    commands = list(dict.fromkeys([*old.get("commands", [old["command"]] if "command" in old else []), command]))
    seeds = sorted({*(r["seed"] for r in seed_rows), *(old.get("seeds", []) if legacy else [])})
    return {"command": command, "commands": commands, **header, "seeds": seeds, "rows": rows,
            "curves": {n: curves[n] for n in order if n in curves},
            "load": load_summary(seed_rows, old.get("load") if legacy and "seed_rows" not in old else None),
            "seed_rows": seed_rows}


def plot_series(summary: dict) -> list[tuple[str, str, list, Optional[list]]]:
    """(setting, its key in a cluster-bench speeds table, the first seed's curve, that curve's steps or
    None) for each setting of the file that has a curve, in the file's order. A legacy row (a file
    written before the per-seed rows) has no steps per point: they are its epochs x steps_per_worker /
    epochs, the steps a worker had taken at the end of each epoch."""
    out = []
    firsts = {}
    for r in summary.get("seed_rows", []):
        if "failed" not in r:
            firsts.setdefault(r["setting"], r)
    for row in summary["rows"]:
        name = row["setting"]
        if row.get("failed") or not summary["curves"].get(name) or any(s[0] == name for s in out):
            continue
        first = firsts.get(name)
        key = "ddp" if name == "ddp" else f"{row['algorithm']}-{row['periods']}"
        curve = first["curve"] if first else summary["curves"][name][0]
        if first:
            steps = first["curve_steps"]
        elif row.get("steps_per_worker") and summary.get("epochs"):
            steps = [round(point[0] * row["steps_per_worker"] / summary["epochs"]) for point in curve]
        else:
            steps = None
        out.append((name, key, curve, steps))
    return out
