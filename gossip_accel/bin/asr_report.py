"""RESULTS.md of the ASR runs: a table at a glance (one row per run: %WER and %CER of each test set,
MB sent per step, both against the baseline), then one row per (run, test set, decoding, model).

    python -m gossip_accel.bin.asr_report --out exp/RESULTS.md [--baseline ddp] [--checkpoint avg_best5] \\
        exp/dnn_ddp-n4 exp/dnn_gossip_bmuf-n4 ...

Reads each run's ``results.json`` (training) and its ``decode_*/summary.json`` (decoding; its
``checkpoint`` names the model decoded: ``final`` or an average such as ``avg_best5``, whose
epochs ``<run>/<checkpoint>.json`` lists). Each %WER is compared with the baseline run's on the
same test set, decoding method and model (``--baseline`` as in gossip_accel.bin.compare_runs:
``ddp`` = the DDP run, else the single run; the baseline's own rows say "baseline"; without one
the column is left out). The glance table shows one decoding of one model for every run: the
``--checkpoint`` model where every run has it, and the strongest decoding every run has (beam +
LM, else beam, else greedy). Also plots every run's CV loss against epoch, MB sent per worker
and training time beside the table (``RESULTS.png``, compare_runs' plot).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .compare_runs import choose_baseline, plot

Key = tuple[str, str, str]   # (test set, decoding method as written in the table, checkpoint)


def load(run: Path) -> dict:
    res_file = run / "results.json"
    if not res_file.is_file():
        raise SystemExit(f"asr_report: {res_file} not found (training of {run} did not finish)")
    return json.loads(res_file.read_text())


def decodes(run: Path) -> dict[Key, dict]:
    """The run's decode summaries by (test set, decoding method, checkpoint decoded)."""
    out = {}
    for summ in sorted(run.glob("decode_*/summary.json")):
        d = json.loads(summ.read_text())
        words = f" + {Path(d['word_list']).name}" if d.get("word_list") else ""  # the lexicon's dictionary
        lm = f" + word LM{words}" if d.get("word_lm") else " + LM" if d.get("lm") else ""
        tokens = f", {d['beam_size_token']} units a frame" if d.get("beam_size_token") else ""
        method = d["method"] + (f" (beam {d['beam']}{tokens})" if d.get("beam") else "") + lm
        out[(Path(d["data"]).name, method, d.get("checkpoint", "final"))] = d
    return out


def describe_checkpoint(run: Path, name: str) -> str:
    """``final``, or an average with its epochs (``avg_best5: epochs 4 6 7 8 9``)."""
    rec = run / f"{name}.json"
    if name == "final" or not rec.is_file():
        return name
    return f"{name}: epochs {' '.join(map(str, json.loads(rec.read_text()).get('epochs', [])))}"


def _cer(summary: dict) -> str:
    """The %CER of a decode (``-`` for a summary written before CER was scored)."""
    return f"{summary['cer']:.2f}" if "cer" in summary else "-"


def lm_pair(summary: dict) -> str:
    """A word decode's LM weight and word score, and the dev set they were tuned on (``3 / +1 (dev_other)``);
    ``-`` for other decodes."""
    if summary.get("word_lm_weight") is None:
        return "-"
    tuned = f" ({Path(summary['tuned_on']).name})" if summary.get("tuned_on") else ""
    return f"{summary['word_lm_weight']:g} / {summary['word_score']:+g}{tuned}"


def _strength(method: str) -> int:
    """0 for the word LM's lexicon decoding (1 without the --word-list words when it has them), then the unit
    LM's, plain beam search, greedy."""
    return (0 if "+ word LM +" in method else 1 if method.endswith("+ word LM") else 2 if method.endswith("+ LM") else
            3 if method.startswith("beam") else 4)


def glance_choice(all_decodes: list[dict[Key, dict]], checkpoint: str) -> tuple[str, str] | None:
    """(decoding method, checkpoint) for the glance table: one every run decoded (else any), the
    ``checkpoint`` asked for first, then the strongest decoding."""
    pairs = [{(m, c) for _, m, c in d} for d in all_decodes]
    common = set.intersection(*pairs) if pairs else set()
    pool = common or set().union(*pairs)
    return min(pool, key=lambda p: (p[1] != checkpoint, _strength(p[0]), p), default=None)


def glance_table(results: list[dict], all_decodes: list[dict[Key, dict]], base: dict | None,
                 checkpoint: str) -> list[str]:
    """One row per run: %WER and %CER of each test set (one decoding, one model: :func:`glance_choice`),
    MB sent per step and worker, and the %WER and MB/step against ``base``; then a line saying which."""
    choice = glance_choice(all_decodes, checkpoint)
    if choice is None:
        return []
    method, ckpt = choice
    sets = list(dict.fromkeys(t for d in all_decodes for t, m, c in d if (m, c) == choice))
    bi = next((i for i, r in enumerate(results) if r is base), None)
    vs = [] if base is None else [f"%WER vs {base['name']}", f"MB/step vs {base['name']}"]
    cols = ["run", *(f"%WER {t}" for t in sets), *(f"%CER {t}" for t in sets), "MB sent/step/worker", *vs]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for i, (res, dec) in enumerate(zip(results, all_decodes)):
        got = [dec.get((t, method, ckpt)) for t in sets]
        sent = res["bytes_sent_per_step_per_worker"]
        cells = [res["name"], *(f"{d['wer']:.2f}" if d else "-" for d in got), *(_cer(d) if d else "-" for d in got),
                 f"{sent / 1e6:.4f}"]
        if base is not None:
            if i == bi:
                cells += ["baseline", "baseline"]
            else:
                ref = [all_decodes[bi].get((t, method, ckpt)) for t in sets]
                cells.append(" / ".join(f"{(d['wer'] / r['wer'] - 1) * 100:+.1f}%" if d and r and r["wer"] else "-"
                                        for d, r in zip(got, ref)))
                base_sent = base["bytes_sent_per_step_per_worker"]
                cells.append(f"{sent / base_sent:.3g}x" if base_sent > 0 else "-")
        lines.append("| " + " | ".join(cells) + " |")
    what = "final model" if ckpt == "final" else f"model {ckpt} (the epochs it averages: below)"
    return lines + ["", f"At a glance: {method} decoding of each run's {what}; every decode below.", ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--baseline", default="ddp",
                    help="ddp (default: the DDP run, else the single run), single, a run name, or none")
    ap.add_argument("--checkpoint", default="final",
                    help="the model the glance table shows where every run decoded it (final, avg_best5, ...)")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()
    runs = [Path(run) for run in args.runs]
    results = [load(run) for run in runs]
    all_decodes = [decodes(run) for run in runs]
    base, said = choose_baseline(results, args.baseline)
    base_decodes = all_decodes[results.index(base)] if base is not None else {}
    vs = [f"%WER vs {base['name']}"] if base is not None else []
    cols = ["run", "model", "workers", "periods", "epochs", "test set", "decoding", "checkpoint",
            "LM weight / word score (tuned on)", "%WER", *vs, "%CER",
            "errors", "MB sent/step/worker", "train time (s)"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for run, res, decs in zip(runs, results, all_decodes):
        for key, d in decs.items():
            test_set, method, ckpt = key
            ref = base_decodes.get(key)
            cmp = ([] if base is None else ["baseline"] if res is base else ["-"] if ref is None or not ref["wer"]
                   else [f"{(d['wer'] / ref['wer'] - 1) * 100:+.1f}%"])
            lines.append("| " + " | ".join([
                res["name"], str(res.get("model", "-")), str(res["workers"]), str(res.get("periods", "-")),
                str(res["epochs"]), test_set, method, describe_checkpoint(run, ckpt), lm_pair(d), f"{d['wer']:.2f}", *cmp,
                _cer(d),
                f"{d['errors']} / {d['ref_words']}, {d['ins']} ins, {d['del']} del, {d['sub']} sub",
                f"{res['bytes_sent_per_step_per_worker'] / 1e6:.3f}", f"{res['train_seconds']:.0f}"]) + " |")
    glance = glance_table(results, all_decodes, base, args.checkpoint)
    text = "\n".join(glance + lines) + f"\n\n{said}\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    plot(results, out.with_suffix(".png"), key="cv_loss", fallback="cv_loss_replicas",
         quantity="CV CTC loss per token", log=True)   # CTC loss falls 30-fold: the last epochs show only on a log scale
    print(text, end="")


if __name__ == "__main__":
    main()
