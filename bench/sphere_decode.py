"""Speed of the two shorten decoders on SPHERE files: the pure-Python one and FFmpeg's.

    .venv/bin/python bench/sphere_decode.py [--minutes 5] [--repeats 3] [--json bench/results/sphere_decode.json]

Writes ``--minutes`` of two-channel 8 kHz speech-like audio (an amplitude-modulated harmonic
tone with noise and pauses, seeded) as shorten-compressed SPHERE files the way
:func:`gossip_accel.data.sphere.write_sphere` does: mu-law (``ulaw,embedded-shorten-v2.00``,
Switchboard's form) and 16-bit PCM (``pcm,embedded-shorten-v2.00``). Each file is read with
``read_sphere(..., use_ffmpeg=False)`` (the Python decoder) and ``use_ffmpeg=True`` (FFmpeg's
``shorten`` decoder through ``ffmpeg -f shn``, where FFmpeg has the type), best of
``--repeats``; the samples of the two are checked to be identical. Times are CPU seconds
(this process and its ffmpeg children, so other load on the machine counts little) and wall
seconds. Prints a table (CPU seconds per minute of audio, speed-up) and the projection to the 260 h of LDC97S62, and writes JSON.
FFmpeg's shorten decoder has no mu-law types, so the mu-law row has no FFmpeg time.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gossip_accel.data import sphere as S  # noqa: E402
from gossip_accel.data.ffmpeg_audio import ffmpeg_program  # noqa: E402

RATE = 8000
SWITCHBOARD_HOURS = 260


def speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """(n, 2) int16: two sides of a 'conversation', each with its own pitch, syllable rate and pauses."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    sides = []
    for pitch, syll in ((140, 4.1), (210, 3.3)):
        f0 = pitch * (1 + 0.08 * np.sin(2 * np.pi * 0.4 * t))
        phase = 2 * np.pi * np.cumsum(f0) / RATE
        voice = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.55 + 0.45 * np.sin(2 * np.pi * syll * t))
        talking = np.repeat(rng.random(n // RATE + 1) < 0.55, RATE)[:n]   # each side talks about half the time
        sides.append(voice * talking * 6000 + rng.standard_normal(n) * 120)
    return np.clip(np.stack(sides, axis=1), -32768, 32767).astype(np.int16)


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (ffmpeg), user + system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def best_time(fn, repeats: int) -> tuple[float, float, np.ndarray]:
    """(best wall seconds, best CPU seconds, result) over ``repeats`` calls of ``fn``."""
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), cpu_seconds()
        out = fn()
        wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, cpu_seconds() - c0)
    return wall, cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="length of each file (a Switchboard conversation: ~5)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=str(ROOT / "bench/results/sphere_decode.json"))
    args = ap.parse_args()
    if ffmpeg_program() is None:
        sys.exit("sphere_decode: ffmpeg is not on PATH (utils/install_system_deps.sh installs it)")
    audio = speechlike(args.minutes * 60)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for coding in ("ulaw", "pcm"):
            path = Path(tmp) / f"{coding}.sph"
            S.write_sphere(path, audio, RATE, coding, shorten=True)
            py_wall, py_s, py = best_time(lambda: S.read_sphere(path, use_sph2pipe=False, use_ffmpeg=False)[0],
                                          args.repeats)
            row = {"coding": S.read_header(path).coding, "minutes": args.minutes, "bytes": path.stat().st_size,
                   "python_wall_s": py_wall, "python_cpu_s": py_s, "python_s_per_min": py_s / args.minutes}
            try:
                ff_wall, ff_s, ff = best_time(lambda: S.read_sphere(path, use_sph2pipe=False, use_ffmpeg=True)[0],
                                     args.repeats)
            except S.SphereError as e:
                row["ffmpeg"] = f"not available: {e}"
            else:
                if not np.array_equal(ff, py):
                    sys.exit(f"sphere_decode: FFmpeg and Python decoders differ on {row['coding']}")
                row.update(ffmpeg_wall_s=ff_wall, ffmpeg_cpu_s=ff_s, ffmpeg_s_per_min=ff_s / args.minutes, speedup=py_s / ff_s,
                           identical=True)
            rows.append(row)
    print(f"CPU seconds per minute of two-channel 8 kHz audio (best of {args.repeats}; files of {args.minutes:g} min)")
    print(f"{'coding':30s} {'Python s/min':>12s} {'FFmpeg s/min':>12s} {'speed-up':>9s} "
          f"{'LDC97S62 (260 h), CPU-hours Python / FFmpeg':>45s}")
    for r in rows:
        hours = [r["python_s_per_min"] * SWITCHBOARD_HOURS / 60]
        if "ffmpeg_cpu_s" in r:
            hours.append(r["ffmpeg_s_per_min"] * SWITCHBOARD_HOURS / 60)
            ff = f"{r['ffmpeg_s_per_min']:12.4f} {r['speedup']:8.0f}x"
        else:
            ff = f"{'-':>12s} {'-':>9s}"
        print(f"{r['coding']:30s} {r['python_s_per_min']:12.3f} {ff} {' / '.join(f'{h:.2f}' for h in hours):>45s}")
    result = {"rows": rows, "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(["bench/sphere_decode.py", *sys.argv[1:]])}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
