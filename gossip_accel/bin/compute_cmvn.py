"""Global CMVN statistics of a data dir's features, in Kaldi's stats layout.

    python -m gossip_accel.bin.compute_cmvn --data data/train [--out data/train/cmvn.ark]

Reads ``<data>/feats.scp`` and writes one (2, dim + 1) double matrix (row 0: per-dimension
sums and the frame count; row 1: sums of squares) with kaldiio to ``<data>/cmvn.ark``, the
file Kaldi's ``compute-cmvn-stats scp:feats.scp <file>`` writes and ``apply-cmvn`` reads.
Load it with :func:`gossip_accel.data.features.load_global_cmvn` -> (mean, std). Compute it on
the training set and use it for every set.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..data.features import accumulate_cmvn_stats, load_feats, read_kaldi_map
from ..data.kaldi.tables import DataDirError, refuse_commands


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="data dir with feats.scp")
    ap.add_argument("--out", default=None, help="stats file (default <data>/cmvn.ark)")
    args = ap.parse_args(argv)

    import kaldiio
    from tqdm import tqdm

    scp = Path(args.data) / "feats.scp"
    if not scp.is_file():
        raise SystemExit(f"compute_cmvn: {scp} not found: run gossip_accel.bin.compute_fbank --data {args.data} first")
    try:
        refuse_commands(scp, "feats.scp must name archives (file.ark:offset); recompute it with "
                             "gossip_accel.bin.compute_fbank")
        feats = read_kaldi_map(scp)
    except (DataDirError, OSError) as e:
        raise SystemExit(f"compute_cmvn: {e}") from None
    if not feats:
        raise SystemExit(f"compute_cmvn: {scp} is empty")

    stats = None
    for utt, spec in tqdm(feats.items(), desc="cmvn", unit="utt", mininterval=2.0, file=sys.stderr):
        try:
            mat = load_feats(spec, f"{scp}: {utt}")
        except DataDirError as e:
            raise SystemExit(f"compute_cmvn: {e}") from None
        except Exception as e:
            raise SystemExit(f"compute_cmvn: {scp}: cannot load features of {utt} from {spec!r}: {e}") from None
        try:
            stats = accumulate_cmvn_stats([mat], stats)
        except ValueError as e:
            raise SystemExit(f"compute_cmvn: {scp}: utterance {utt}: {e}") from None
    out = Path(args.out) if args.out else Path(args.data) / "cmvn.ark"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")   # an existing stats file stays intact until the end
    kaldiio.save_mat(str(tmp), stats)
    os.replace(tmp, out)
    print(f"compute_cmvn: {out}: {len(feats)} utterances, {int(stats[0, -1])} frames, dim {stats.shape[1] - 1}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
