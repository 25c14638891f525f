"""Average a run's epoch models: the last N epochs, or the N best by CV loss.

    python -m gossip_accel.bin.average_checkpoints --exp-dir exp/dnn_gossip_bmuf-n4 --avg 5 --avg-mode best
    # -> exp/dnn_gossip_bmuf-n4/avg_best5.pt (a state dict, as final.pt) and avg_best5.json (which epochs)

Every epoch's model is the replicas' global average at the epoch end (see
gossip_accel.train.average_checkpoints). Decode the result with
``gossip_accel.bin.decode_asr --model <exp-dir>/avg_best5.pt`` (the ASR recipes' stage 6 does it
by default: ``--avg 0`` decodes final.pt instead).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from ..train.average_checkpoints import MODES, average_run
from ..train.checkpoint import CheckpointError


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exp-dir", required=True, help="a training run's directory (results.json, epoch_models/)")
    ap.add_argument("--avg", type=int, default=5, help="how many epoch models to average (>= 1)")
    ap.add_argument("--avg-mode", choices=MODES, default="best",
                    help="best: the N lowest CV losses (results.json); last: the last N epochs")
    ap.add_argument("--out", help="default: <exp-dir>/avg_<mode><N>.pt")
    args = ap.parse_args(argv)
    try:
        out, rec = average_run(Path(args.exp_dir), args.avg, args.avg_mode, Path(args.out) if args.out else None)
    except (FileNotFoundError, ValueError, CheckpointError) as e:
        raise SystemExit(f"average_checkpoints: {e}") from None
    losses = ", ".join(f"{rec['cv_loss'][str(e)]:.4f}" for e in rec["epochs"] if str(e) in rec["cv_loss"])
    fewer = f" (only {len(rec['epochs'])} of {args.avg} exist)" if len(rec["epochs"]) < args.avg else ""
    print(f"average_checkpoints: {out}: mean of epochs {' '.join(map(str, rec['epochs']))}{fewer}"
          + (f", CV loss {losses}" if losses else ""))


if __name__ == "__main__":
    main()
