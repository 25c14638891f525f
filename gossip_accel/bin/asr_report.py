"""One RESULTS.md row per (run, test set, decoding method): WER with Kaldi's counts, and CER.

    python -m gossip_accel.bin.asr_report --out exp/RESULTS.md [--baseline ddp] exp/dnn_ddp-n4 exp/dnn_gossip_bmuf-n4 ...

Reads each run's ``results.json`` (training) and its ``decode_*/summary.json`` (decoding); each
row's %WER is compared with the baseline run's on the same test set and decoding method
(``--baseline`` as in gossip_accel.bin.compare_runs: ``ddp`` = the DDP run, else the single run;
the baseline's own rows say "baseline"; without one the column is left out). Also plots every
run's CV loss against epoch, MB sent per worker and training time beside the table (``RESULTS.png``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .compare_runs import choose_baseline, plot


def load(run: Path) -> dict:
    res_file = run / "results.json"
    if not res_file.is_file():
        raise SystemExit(f"asr_report: {res_file} not found (training of {run} did not finish)")
    return json.loads(res_file.read_text())


def decodes(run: Path) -> dict[tuple[str, str], dict]:
    """The run's decode summaries by (test set, decoding method as written in the table)."""
    out = {}
    for summ in sorted(run.glob("decode_*/summary.json")):
        d = json.loads(summ.read_text())
        method = d["method"] + (f" (beam {d['beam']})" if d.get("beam") else "") + (" + LM" if d.get("lm") else "")
        out[(Path(d["data"]).name, method)] = d
    return out


def _cer(summary: dict) -> str:
    """The %CER of a decode (``-`` for a summary written before CER was scored)."""
    return f"{summary['cer']:.2f}" if "cer" in summary else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--baseline", default="ddp",
                    help="ddp (default: the DDP run, else the single run), single, a run name, or none")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()
    results = [load(Path(run)) for run in args.runs]
    base, said = choose_baseline(results, args.baseline)
    base_decodes = decodes(Path(args.runs[results.index(base)])) if base is not None else {}
    vs = [f"%WER vs {base['name']}"] if base is not None else []
    cols = ["run", "model", "workers", "periods", "epochs", "test set", "decoding", "%WER", *vs, "%CER", "errors",
            "MB sent/step/worker", "train time (s)"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for run, res in zip(args.runs, results):
        for (test_set, method), d in decodes(Path(run)).items():
            ref = base_decodes.get((test_set, method))
            cmp = ([] if base is None else ["baseline"] if res is base else ["-"] if ref is None or not ref["wer"]
                   else [f"{(d['wer'] / ref['wer'] - 1) * 100:+.1f}%"])
            lines.append("| " + " | ".join([
                res["name"], str(res.get("model", "-")), str(res["workers"]), str(res.get("periods", "-")),
                str(res["epochs"]), test_set, method, f"{d['wer']:.2f}", *cmp, _cer(d),
                f"{d['errors']} / {d['ref_words']}, {d['ins']} ins, {d['del']} del, {d['sub']} sub",
                f"{res['bytes_sent_per_step_per_worker'] / 1e6:.3f}", f"{res['train_seconds']:.0f}"]) + " |")
    text = "\n".join(lines) + f"\n\n{said}\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    plot(results, out.with_suffix(".png"), key="cv_loss", fallback="cv_loss_replicas",
         quantity="CV CTC loss per token", log=False)
    print(text, end="")


if __name__ == "__main__":
    main()
