"""Compute Kaldi-compatible log-mel filterbank features of a data dir in parallel jobs.

    python -m gossip_accel.bin.compute_fbank --data data/train --out fbank/train --nj 4 [--num-mel-bins 80] [--on-error skip]
    python -m gossip_accel.bin.compute_fbank --data data/dev data/test --out-root fbank --nj 4   # fbank/dev, fbank/test

Reads ``<data>/wav.scp`` (``<utt> <file>``, the rest of the line, spaces and quotes included;
or ``<utt> <command> |``, which is refused, naming its line, unless ``--allow-pipes``: then it is
run by ``bash -c`` as in Kaldi, so only opt in for data dirs you trust); a ``segments`` file is honoured; a two-channel recording gives the channel its
``reco2file_and_channel`` line names, ``A``/``1`` = first; SPHERE files are read whether
shortened or not, as LDC ships Switchboard), splits the utterances into ``--nj`` contiguous parts computed by one process each,
and writes ``<out>/raw_fbank.<j>.ark/.scp`` (j = 1..nj), then ``<data>/feats.scp`` (sorted)
and ``<data>/utt2num_frames``. The features equal ``torchaudio.compliance.kaldi.fbank`` on
16-bit-scaled samples (Kaldi's ``compute-fbank-feats`` with the same options).

Unreadable, empty or too short audio: ``--on-error fail`` (default) stops with the utterance
id and path; ``--on-error skip`` reports it on stderr, lists it in ``<out>/skipped.txt`` and
leaves it out of feats.scp and utt2num_frames (other files of the data dir are untouched; run
``utils/fix_data_dir.sh`` or rely on the trainer, which only uses utterances with features).
A failed run exits 1 with one line naming the file (and line or utterance) and leaves the
outputs of an earlier run (archives, feats.scp, utt2num_frames) as they were. Several ``--data`` dirs
(with ``--out-root R``: each dir's archives in ``R/<dir name>``) are computed one after another in one
process (the recipes' stage 2: one start of torch for every set), stopping at the first that fails.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..data.features import FbankOptions, FeatureError, compute_fbank_dir, fbank_options_from


def str2bool(v: str) -> bool:
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {v!r}")


def build_parser() -> argparse.ArgumentParser:
    d = FbankOptions()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, nargs="+", help="Kaldi data dir(s) with wav.scp (and optionally segments)")
    ap.add_argument("--out", default=None, help="where the archives go (default <data>/data; one --data dir only)")
    ap.add_argument("--out-root", default=None, help="the archives of each --data dir go to <out-root>/<its name>")
    ap.add_argument("--nj", type=int, default=1, help="parallel jobs (processes)")
    ap.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                    help="unreadable/empty audio: stop (fail) or leave the utterance out (skip)")
    ap.add_argument("--on-rate-mismatch", choices=("error", "resample"), default="error",
                    help="audio whose rate differs from --sample-rate: stop, or resample it")
    ap.add_argument("--channel", type=int, default=-1,
                    help="-1: mono audio, or the channel reco2file_and_channel names (A/1 = first); "
                         "N: use channel N (0-based) of every recording")
    ap.add_argument("--allow-pipes", action="store_true",
                    help="run wav.scp commands ('<utt> sph2pipe ... |') with bash, as Kaldi does; default: refuse "
                         "them (a data dir's text is never executed unless you opt in)")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    g = ap.add_argument_group("fbank options (Kaldi names)")
    g.add_argument("--sample-rate", dest="sample_frequency", type=float, default=d.sample_frequency)
    g.add_argument("--num-mel-bins", type=int, default=d.num_mel_bins, help="80 (default) or 40, ...")
    g.add_argument("--frame-length", type=float, default=d.frame_length, help="ms")
    g.add_argument("--frame-shift", type=float, default=d.frame_shift, help="ms")
    g.add_argument("--dither", type=float, default=d.dither,
                   help="0 = deterministic (default); Kaldi's default is 1 (seeded per utterance here)")
    g.add_argument("--low-freq", type=float, default=d.low_freq)
    g.add_argument("--high-freq", type=float, default=d.high_freq, help="<= 0: offset from Nyquist")
    g.add_argument("--preemphasis-coefficient", type=float, default=d.preemphasis_coefficient)
    g.add_argument("--window-type", default=d.window_type,
                   choices=("povey", "hamming", "hanning", "rectangular", "blackman"))
    g.add_argument("--snip-edges", type=str2bool, default=d.snip_edges)
    g.add_argument("--remove-dc-offset", type=str2bool, default=d.remove_dc_offset)
    g.add_argument("--round-to-power-of-two", type=str2bool, default=d.round_to_power_of_two)
    g.add_argument("--use-energy", type=str2bool, default=d.use_energy)
    g.add_argument("--energy-floor", type=float, default=d.energy_floor)
    g.add_argument("--use-log-fbank", type=str2bool, default=d.use_log_fbank)
    g.add_argument("--use-power", type=str2bool, default=d.use_power)
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.nj < 1:
        raise SystemExit(f"compute_fbank: --nj must be >= 1, got {args.nj}")
    if args.out and (args.out_root or len(args.data) > 1):
        raise SystemExit("compute_fbank: --out names one data dir's archives: give --out-root with several --data dirs")
    names = [Path(d).name for d in args.data]
    if args.out_root and len(set(names)) < len(names):
        raise SystemExit(f"compute_fbank: --out-root needs --data dirs of different names, got {' '.join(args.data)}")
    opts = fbank_options_from(args)
    for data in args.data:
        out = args.out or (str(Path(args.out_root) / Path(data).name) if args.out_root else f"{data}/data")
        try:
            result = compute_fbank_dir(data, out, opts, nj=args.nj, channel=args.channel,
                                       on_rate_mismatch=args.on_rate_mismatch, on_error=args.on_error,
                                       progress=not args.no_progress, allow_pipes=args.allow_pipes)
        except (FeatureError, OSError, ValueError) as e:
            raise SystemExit(f"compute_fbank: {e}") from None
        n, frames = len(result.frames), sum(result.frames.values())
        print(f"compute_fbank: {data}/feats.scp: {n} utterances, {frames} frames "
              f"({frames * opts.frame_shift / 3.6e6:.2f} h), {opts.num_mel_bins} mel bins", file=sys.stderr)
        for utt, reason in result.skipped:
            print(f"compute_fbank: skipped {utt}: {reason}", file=sys.stderr)
        if result.skipped:
            print(f"compute_fbank: WARNING: {len(result.skipped)} utterance(s) skipped (listed in {out}/skipped.txt) "
                  f"and left out of {data}/feats.scp", file=sys.stderr)


if __name__ == "__main__":
    main()
