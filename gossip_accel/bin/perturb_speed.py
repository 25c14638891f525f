"""Speed-perturbed copy of a Kaldi data dir (Kaldi's utils/data/perturb_data_dir_speed_3way.sh).

    python -m gossip_accel.bin.perturb_speed --src data/train --dst data/train_sp [--factors "0.9 1.0 1.1"]

Writes ``<dst>`` with every utterance once per factor (``sp0.9-``/``sp1.1-`` prefixed utterance,
speaker and recording ids) and ``<dst>/utt2speed``; gossip_accel.bin.compute_fbank changes the
speed on the fly (no sox). See :mod:`gossip_accel.data.speed_perturb`.
"""
from __future__ import annotations

import argparse
import sys

from ..data.speed_perturb import DEFAULT_FACTORS, parse_factors, perturb_data_dir_speed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="Kaldi data dir (wav.scp, text, utt2spk)")
    ap.add_argument("--dst", required=True, help="the perturbed data dir to write")
    ap.add_argument("--factors", default=" ".join(f"{f:g}" for f in DEFAULT_FACTORS), help="speed factors")
    args = ap.parse_args(argv)
    try:
        stats = perturb_data_dir_speed(args.src, args.dst, parse_factors(args.factors))
    except (ValueError, FileNotFoundError) as e:
        print(f"perturb_speed: error: {e}", file=sys.stderr)
        return 1
    print(f"perturb_speed: {args.src} -> {args.dst}: {stats['utterances']} utterances, {stats['speakers']} speakers "
          f"(factors {args.factors})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
