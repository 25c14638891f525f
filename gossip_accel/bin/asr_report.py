"""One RESULTS.md row per (run, test set, decoding method): WER with Kaldi's counts, and CER.

    python -m gossip_accel.bin.asr_report --out exp/RESULTS.md exp/dnn_single-n1 exp/dnn_gossip_bmuf-n4 ...

Reads each run's ``results.json`` (training) and its ``decode_*/summary.json`` (decoding);
also plots every run's CV loss per epoch beside the table (``RESULTS.png``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .compare_runs import plot


def rows(run: Path) -> list[str]:
    res_file = run / "results.json"
    if not res_file.is_file():
        raise SystemExit(f"asr_report: {res_file} not found (training of {run} did not finish)")
    res = json.loads(res_file.read_text())
    out = []
    for summ in sorted(run.glob("decode_*/summary.json")):
        d = json.loads(summ.read_text())
        method = d["method"] + (f" (beam {d['beam']})" if d.get("beam") else "") + (" + LM" if d.get("lm") else "")
        out.append(f"| {res['name']} | {res.get('model', '-')} | {res['workers']} | {res.get('periods', '-')} | "
                   f"{res['epochs']} | {Path(d['data']).name} | {method} | {d['wer']:.2f} | {_cer(d)} | "
                   f"{d['errors']} / {d['ref_words']}, {d['ins']} ins, {d['del']} del, {d['sub']} sub | "
                   f"{res['bytes_sent_per_step_per_worker'] / 1e6:.3f} | {res['train_seconds']:.0f} |")
    return out


def _cer(summary: dict) -> str:
    """The %CER of a decode (``-`` for a summary written before CER was scored)."""
    return f"{summary['cer']:.2f}" if "cer" in summary else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()
    lines = ["| run | model | workers | periods | epochs | test set | decoding | %WER | %CER | errors | "
             "MB sent/step/worker | train time (s) |", "|" + "---|" * 12]
    for run in args.runs:
        lines += rows(Path(run))
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    histories = [json.loads((Path(r) / "results.json").read_text()) for r in args.runs]
    plot(histories, out.with_suffix(".png"), key="cv_loss", ylabel="CV CTC loss per token", log=False)
    print(text, end="")


if __name__ == "__main__":
    main()
