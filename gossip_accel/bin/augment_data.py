"""Noise- and reverberation-augmented copy of a Kaldi data dir (Kaldi's reverberate_data_dir.py, offline).

    python -m gossip_accel.bin.augment_data --src data/train --dst data/train_aug [--copies 1] \\
        [--rt60 0.2,0.8] [--drr 0,10] [--reverb-probability 0.5] [--snr 5,20] [--noise babble,pink,white] \\
        [--noise-probability 1] [--seed 1]

Writes ``<dst>`` with the utterances of ``<src>`` and ``--copies`` copies of each (``aug<i>-``
prefixed utterance, speaker and recording ids) and ``<dst>/utt2augment``, one line per copy with
its drawn reverberation (Polack's statistical impulse response: RT60, direct-to-reverberant ratio)
and noise (white/pink/brown or babble of 3-7 other speakers, at an SNR); gossip_accel.bin.compute_fbank
applies them on the fly. Ranges are uniform draws ("5,20"; one number: always that). See
:mod:`gossip_accel.data.augment`.
"""
from __future__ import annotations

import argparse
import sys

from ..data.augment import AugmentOptions, augment_data_dir, parse_kinds, parse_range


def main(argv: list[str] | None = None) -> int:
    d = AugmentOptions()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--src", required=True, help="Kaldi data dir (wav.scp, text, utt2spk)")
    ap.add_argument("--dst", required=True, help="the augmented data dir to write")
    ap.add_argument("--copies", type=int, default=d.copies, help="augmented copies of each utterance")
    ap.add_argument("--rt60", default="%g,%g" % d.rt60, help="reverberation time, seconds")
    ap.add_argument("--drr", default="%g,%g" % d.drr, help="direct-to-reverberant ratio, dB")
    ap.add_argument("--reverb-probability", type=float, default=d.reverb_probability,
                    help="share of copies reverberated")
    ap.add_argument("--snr", default="%g,%g" % d.snr, help="signal-to-noise ratio, dB")
    ap.add_argument("--noise", default=",".join(d.noise), help="noise kinds drawn from (white pink brown babble)")
    ap.add_argument("--noise-probability", type=float, default=d.noise_probability,
                    help="share of copies with additive noise")
    ap.add_argument("--seed", type=int, default=d.seed, help="seed of every draw")
    args = ap.parse_args(argv)
    try:
        opts = AugmentOptions(args.copies, args.reverb_probability, parse_range(args.rt60, "--rt60", 0.01, 5.0),
                              parse_range(args.drr, "--drr", -30.0, 40.0), args.noise_probability,
                              parse_range(args.snr, "--snr", -20.0, 60.0), parse_kinds(args.noise), args.seed)
        stats = augment_data_dir(args.src, args.dst, opts)
    except (ValueError, FileNotFoundError) as e:
        print(f"augment_data: error: {e}", file=sys.stderr)
        return 1
    noise = ", ".join(f"{k} {n}" for k, n in stats["noise"].items())
    print(f"augment_data: {args.src} -> {args.dst}: {stats['utterances']} utterances, {stats['speakers']} speakers; "
          f"copies reverberated {stats['reverberated']}, with noise: {noise}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
