"""Global (or per-speaker) CMVN statistics of a data dir's features, in Kaldi's stats layout.

    python -m gossip_accel.bin.compute_cmvn --data data/train [--out data/train/cmvn.ark]
    python -m gossip_accel.bin.compute_cmvn --per-speaker --data data/dev data/test [...]

Reads ``<data>/feats.scp`` and writes one (2, dim + 1) double matrix (row 0: per-dimension
sums and the frame count; row 1: sums of squares) with kaldiio to ``<data>/cmvn.ark``, the
file Kaldi's ``compute-cmvn-stats scp:feats.scp <file>`` writes and ``apply-cmvn`` reads.
Load it with :func:`gossip_accel.data.cmvn.load_global_cmvn` -> (mean, std). Compute it on
the training set and use it for every set. ``--per-speaker`` writes an archive of one such matrix per
speaker of ``utt2spk`` to ``<data>/cmvn_spk.ark`` instead (Kaldi's ``compute-cmvn-stats
--spk2utt=ark:spk2utt scp:feats.scp ark:cmvn.ark``), for each data dir given: each set's own, read by
``data.speaker_cmvn=true`` (:func:`gossip_accel.data.cmvn.load_speaker_cmvn`).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..data.cmvn import SPEAKER_CMVN, accumulate_cmvn_stats, load_feats
from ..data.kaldi.tables import DataDirError, read_table, refuse_commands


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, nargs="+", help="data dir with feats.scp (with --per-speaker: any number)")
    ap.add_argument("--out", default=None, help=f"stats file (default <data>/cmvn.ark; --per-speaker: <data>/{SPEAKER_CMVN})")
    ap.add_argument("--per-speaker", action="store_true", help="one stats matrix per speaker of <data>/utt2spk")
    args = ap.parse_args(argv)
    if len(args.data) > 1 and (args.out or not args.per_speaker):
        raise SystemExit("compute_cmvn: several --data dirs need --per-speaker and no --out (each dir gets its own "
                         f"{SPEAKER_CMVN})")
    for data in args.data:
        stats, n = accumulate(Path(data), args.per_speaker)
        write(stats, n, Path(args.out) if args.out else Path(data) / (SPEAKER_CMVN if args.per_speaker else "cmvn.ark"),
              args.per_speaker)


def accumulate(data: Path, per_speaker: bool) -> tuple[dict, int]:
    """Kaldi-layout stats of a data dir's features: {speaker: stats} of utt2spk, or {"": stats}; and the
    number of utterances. Errors are SystemExit naming the file."""
    from tqdm import tqdm

    scp = data / "feats.scp"
    if not scp.is_file():
        raise SystemExit(f"compute_cmvn: {scp} not found: run gossip_accel.bin.compute_fbank --data {data} first")
    try:
        refuse_commands(scp, "feats.scp must name archives (file.ark:offset); recompute it with "
                             "gossip_accel.bin.compute_fbank")
        feats = read_table(scp)
    except (DataDirError, OSError) as e:
        raise SystemExit(f"compute_cmvn: {e}") from None
    if not feats:
        raise SystemExit(f"compute_cmvn: {scp} is empty")
    speaker_of = None
    if per_speaker:
        utt2spk = data / "utt2spk"
        try:
            speaker_of = read_table(utt2spk)
        except (DataDirError, OSError) as e:
            raise SystemExit(f"compute_cmvn: --per-speaker needs {utt2spk}: {e}") from None
        missing = [u for u in feats if u not in speaker_of]
        if missing:
            raise SystemExit(f"compute_cmvn: {utt2spk} has no speaker for {len(missing)} utterance(s) of {scp} "
                             f"(first: {missing[0]}); fix the data dir (gossip_accel.bin.fix_data_dir)")
    stats: dict = {}   # speaker (or "" for the global stats) -> Kaldi-layout stats
    for utt, spec in tqdm(feats.items(), desc=f"cmvn {data.name}", unit="utt", mininterval=2.0, file=sys.stderr):
        try:
            mat = load_feats(spec, f"{scp}: {utt}")
        except DataDirError as e:
            raise SystemExit(f"compute_cmvn: {e}") from None
        except Exception as e:
            raise SystemExit(f"compute_cmvn: {scp}: cannot load features of {utt} from {spec!r}: {e}") from None
        key = speaker_of[utt] if speaker_of else ""
        try:
            stats[key] = accumulate_cmvn_stats([mat], stats.get(key))
        except ValueError as e:
            raise SystemExit(f"compute_cmvn: {scp}: utterance {utt}: {e}") from None
    return stats, len(feats)


def write(stats: dict, n: int, out: Path, per_speaker: bool) -> None:
    """The stats to ``out`` (a matrix, or with ``per_speaker`` an archive keyed by speaker), atomically."""
    import kaldiio

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")   # an existing stats file stays intact until the end
    if per_speaker:
        kaldiio.save_ark(str(tmp), dict(sorted(stats.items())))
    else:
        kaldiio.save_mat(str(tmp), stats[""])
    os.replace(tmp, out)
    frames = sum(int(st[0, -1]) for st in stats.values())
    dim = next(iter(stats.values())).shape[1] - 1
    who = f", {len(stats)} speakers" if per_speaker else ""
    print(f"compute_cmvn: {out}: {n} utterances{who}, {frames} frames, dim {dim}", file=sys.stderr)


if __name__ == "__main__":
    main()
