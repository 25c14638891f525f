"""WER and decoder time of the word-level CTC decoder (``beam_word``) against its search settings.

    .venv/bin/python bench/word_beam.py --exp-dir exp/quickstart/tdnn_ddp-n4 --model exp/quickstart/tdnn_ddp-n4/avg_best5.pt \\
        --data data/dev_clean --word-lm-dir data/word_lm3_lang_phone_american-english-huge --lm-weight 3 --word-score -1 \\
        [--settings 200:0:25 400:6:25 ...] [--json <repo>/bench/results/word_beam.json] [--plot <repo>/docs/img/bench_word_beam.png]

Run in a recipe dir (the paths of the run's config). The model's log-probabilities are computed once; then each
``beam:units:threshold`` setting (``units`` = flashlight's ``beam_size_token``, 0 = every unit; ``threshold`` =
its ``beam_threshold``) builds a :class:`gossip_accel.asr.word_lm.WordDecoder` on the one lexicon trie and decodes
the whole set. Seconds are the decoder's own wall time (building the lexicon trie is timed apart, once). Prints a
table, writes JSON and a plot of %WER against seconds; run it alone on the machine, the times count every other
process.

``--repeats N`` decodes the same log-probabilities N times a setting, each with a new decoder (as each decode of the
recipe is; all on the one trie, as the recipe's tuning grid), and reports the lowest and highest %WER and the
utterances whose words differ between the decodes: flashlight's decoder orders its LM states by memory address
(``LMState::compare``), so the search's ties can break differently from one decode to the next; this measures how
far one model's WER moves from that alone.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gossip_accel.asr.scoring import compute_wer  # noqa: E402
from gossip_accel.asr.word_lm import LexiconTrie, WordDecoder  # noqa: E402
from gossip_accel.bin.decode_asr import decode_words, load_run, log_probs  # noqa: E402
from gossip_accel.data.kaldi import read_table  # noqa: E402

DEFAULT_SETTINGS = ["50:0:25", "100:0:25", "200:0:25", "200:0:15", "200:12:25", "300:8:25", "400:4:25", "400:6:25",
                    "600:6:25"]


def parse_setting(text: str) -> tuple[int, int, float]:
    try:
        beam, units, threshold = text.split(":")
        return int(beam), int(units), float(threshold)
    except ValueError:
        raise SystemExit(f"word_beam: --settings {text!r}: write beam:units:threshold, e.g. 400:6:25") from None


def repeat_decodes(make_decoder, emissions, refs: dict[str, str], repeats: int) -> dict:
    """Decode ``emissions`` (batches of utterance ids, log-probs, lengths) ``repeats`` times, each with a new decoder
    of ``make_decoder()``: every decode's %WER and seconds, and the utterances whose words differ from the first's."""
    wers, seconds, first, differing = [], [], None, set()
    for _ in range(repeats):
        dec = make_decoder()
        start = time.perf_counter()
        hyps = decode_words(dec, emissions)
        seconds.append(time.perf_counter() - start)
        wers.append(round(compute_wer(refs, hyps)[0].wer, 2))
        if first is None:
            first = hyps
        differing |= {u for u in hyps if hyps[u] != first[u]}
    return {"wers": wers, "seconds": seconds, "utterances": len(first),
            "differing_utterances": sorted(differing)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exp-dir", required=True)
    ap.add_argument("--model", help="default <exp-dir>/final.pt")
    ap.add_argument("--data", required=True)
    ap.add_argument("--word-lm-dir", required=True)
    ap.add_argument("--lm-weight", type=float, default=3.0)
    ap.add_argument("--word-score", type=float, default=-1.0)
    ap.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS, help="beam:units:threshold each")
    ap.add_argument("--repeats", type=int, default=1,
                    help="decodes of each setting, each with a new decoder (> 1: the spread of %%WER between them)")
    ap.add_argument("--json", default=str(ROOT / "bench/results/word_beam.json"))
    ap.add_argument("--plot", default=str(ROOT / "docs/img/bench_word_beam.png"))
    args = ap.parse_args()
    settings = [parse_setting(s) for s in args.settings]
    if args.repeats < 1:
        raise SystemExit(f"word_beam: --repeats {args.repeats}: decode each setting at least once")
    exp, data, lm_dir = Path(args.exp_dir), Path(args.data), Path(args.word_lm_dir)
    weights = Path(args.model) if args.model else exp / "final.pt"

    _, tok, utts, _, cmvn, model = load_run(exp, weights, data)
    emissions = list(log_probs(model, utts, cmvn, 20000, f"forward {data.name}"))
    refs = read_table(data / "text")
    start = time.perf_counter()
    lexicon = LexiconTrie(lm_dir, tok)
    load_seconds = time.perf_counter() - start

    rows = []
    spread = args.repeats > 1
    print(f"{weights} on {data} (LM weight {args.lm_weight}, word score {args.word_score}); the lexicon trie "
          f"loads in {load_seconds:.1f} s\n\n| beam | units a frame | threshold | %WER | decoder seconds |"
          + (f" %WER lowest-highest of {args.repeats} decodes | utterances differing |" if spread else "")
          + "\n|---|---|---|---|---|" + ("---|---|" if spread else ""))
    for beam, units, threshold in settings:
        r = repeat_decodes(lambda: WordDecoder(lm_dir, tok, beam=beam, lm_weight=args.lm_weight,
                                               word_score=args.word_score, beam_threshold=threshold,
                                               beam_size_token=units or None, lexicon=lexicon),
                           emissions, refs, args.repeats)
        row = {"beam": beam, "units": units or "all", "threshold": threshold, "wer": r["wers"][0],
               "seconds": round(r["seconds"][0], 1)}
        if spread:
            row.update(wers=r["wers"], differing_utterances=r["differing_utterances"])
        rows.append(row)
        print(f"| {beam} | {units or 'all'} | {threshold:g} | {row['wer']:.2f} | {row['seconds']:.1f} |"
              + (f" {min(r['wers']):.2f}-{max(r['wers']):.2f} | {len(r['differing_utterances'])} of {r['utterances']} |"
                 if spread else ""), flush=True)

    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"model": str(weights), "data": str(data), "word_lm": str(lm_dir),
                                           "lm_weight": args.lm_weight, "word_score": args.word_score,
                                           "trie_load_seconds": round(load_seconds, 1), "repeats": args.repeats,
                                           "rows": rows}, indent=2))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([r["seconds"] for r in rows], [r["wer"] for r in rows])
    if spread:   # the lowest and highest %WER of the repeated decodes
        ax.vlines([r["seconds"] for r in rows], [min(r["wers"]) for r in rows], [max(r["wers"]) for r in rows])
    for r in rows:
        ax.annotate(f"{r['beam']}/{r['units']}/{r['threshold']:g}", (r["seconds"], r["wer"]), fontsize=7)
    ax.set_xlabel("decoder seconds"), ax.set_ylabel(f"%WER {data.name}")
    ax.set_title("beam_word: beam / units a frame / threshold")
    fig.tight_layout()
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=120)
    print(f"\n{args.json}, {args.plot}")


if __name__ == "__main__":
    main()
