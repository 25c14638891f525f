"""Decode a data dir with a trained CTC model and score it (Kaldi's %WER format).

    python -m gossip_accel.bin.decode_asr --exp-dir exp/dnn_gossip_bmuf-n4 --data data/test_clean \\
        --out exp/dnn_gossip_bmuf-n4/decode_test_clean_greedy [--method beam --beam 8] \\
        [--lm-dir exp/lm_bpe --lm-weight 0.3 --insertion-bonus 1.0] \\
        [--model exp/dnn_gossip_bmuf-n4/avg_best5.pt]   # default: <exp-dir>/final.pt
    python -m gossip_accel.bin.decode_asr ... --method word --word-lm-dir data/word_lm3_lang_char \\
        --beam 400 --beam-size-token 6 [--word-lm-weight 1 2 3 --word-score -1 0 1 --tune-data data/dev_clean]

Greedy (best path) decoding is batched; beam search is CTC prefix beam search
(gossip_accel.asr.ctc_decode), optionally with shallow fusion of a unit-level LSTMP LM
trained by gossip_accel.bin.train_lm on the training transcripts written as units (the
ASR recipe's LM stage). ``word`` is lexicon-constrained beam search with a KenLM word n-gram
(gossip_accel.asr.word_lm; the LM dir of gossip_accel.bin.make_word_lm): only lexicon words
are output. Given several LM weights and word scores, ``--tune-data`` (a dev set, never the
test set) picks the pair of lowest WER there, as Kaldi's scoring picks its LM weight; the grid's
WERs are kept in ``<exp-dir>/word_tuning_<model>_on_<dev set>.json`` (``word_tuning_<model>_<list name>_on_<dev
set>.json`` for a lexicon widened by a word list) and reused for every test set.
Writes ``hyp.txt`` and the scoring files (``wer``, ``per_utt``) to ``--out``, and appends the %WER line to ``--out``/../RESULTS-style summaries via stdout.
``summary.json`` names the model decoded (``checkpoint``: its file's stem, ``final`` or an
average of gossip_accel.bin.average_checkpoints such as ``avg_best5``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable, Optional

import torch
from tqdm import tqdm

from ..asr.ctc_decode import greedy_decode, prefix_beam_search
from ..asr.scoring import compute_wer, write_scoring_dir
from ..asr.word_lm import LexiconTrie, WordDecoder
from ..data.asr import collate, load_utterances, make_batches
from ..data.kaldi.tables import read_table
from ..data.units import LexiconTokenizer, Units, load_units
from .train_asr import build_model, feature_dim, load_cmvn, load_conf


class UnitLM:
    """log P(next unit | prefix) from a unit-level LSTMP LM, cached per prefix.

    The LM's vocabulary holds unit strings (e.g. ``▁THE``); ASR ids map to it by string, units
    it lacks to ``<unk>``. The context starts with ``<eos>``, as the LM saw between sentences.
    """

    def __init__(self, lm_dir: Path, id_to_unit: Callable[[int], str]):
        from .train_lm import build_model as build_lm, load_conf as load_lm_conf
        from ..data.lm import EOS, UNK, Vocabulary

        conf = load_lm_conf([str(lm_dir / "config.yaml")], [])
        self.vocab = Vocabulary.load(Path(conf.data.dir) / conf.data.vocab)
        self.model = build_lm(conf, self.vocab)
        load_weights(self.model, lm_dir / "final.pt", lm_dir / "config.yaml")
        self.model.eval()
        self.unk, self.eos = self.vocab.index[UNK], self.vocab.index[EOS]
        self.id_to_unit = id_to_unit
        self.cache: dict[tuple, tuple[torch.Tensor, tuple]] = {}

    def _lm_id(self, asr_id: int) -> int:
        return self.vocab.index.get(self.id_to_unit(asr_id), self.unk)

    @torch.no_grad()
    def _state(self, prefix: tuple) -> tuple[torch.Tensor, tuple]:
        """(log-probs over the LM vocabulary after ``prefix``, recurrent state)."""
        if prefix in self.cache:
            return self.cache[prefix]
        if prefix:
            _, state = self._state(prefix[:-1])
            token = self._lm_id(prefix[-1])
        else:
            state, token = None, self.eos
        m = self.model
        h, state = m.lstm(m.embedding(torch.tensor([[token]])), state)
        logp = m.softmax.log_prob(h[:, -1])[0]
        self.cache[prefix] = (logp, state)
        return logp, state

    def __call__(self, prefix: tuple, token: int) -> float:
        return float(self._state(prefix)[0][self._lm_id(token)])


def load_weights(model: torch.nn.Module, path: Path, conf_path: Path) -> None:
    """``model.load_state_dict`` of ``path`` (``weights_only=True``); a checkpoint of another model
    is a ValueError in one line naming both files."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - unpickling errors have many types
        raise ValueError(f"{path}: cannot be loaded with weights_only=True ({str(e).strip().splitlines()[0]}); "
                         f"it is not a model written by gossip_accel's training") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        raise ValueError(f"{path} does not fit the model of {conf_path} ({' '.join(lines[1:3])[:300]}); decode "
                         f"with the config it was trained with") from None


def load_run(exp: Path, weights: Path, data: Path):
    """A training run's conf, units, the utterances of ``data`` (and the counts left out), the CMVN, and its
    model with ``weights`` in eval mode: what decoding ``data`` needs (also bench/word_beam.py)."""
    conf = load_conf([str(exp / "config.yaml")], [])
    tok = load_units(conf.data.lang)
    utts, dropped = load_utterances(data, tok.encode)
    model = build_model(conf, feature_dim(utts[0]), tok.vocab_size)
    load_weights(model, weights, exp / "config.yaml")
    cmvn = load_cmvn(conf)
    cmvn.add_speakers(data)
    return conf, tok, utts, dropped, cmvn, model.eval()


def log_probs(model: torch.nn.Module, utts, cmvn, max_frames: int, desc: str):
    """(utterance ids, log-probs (B, T, V), output lengths) of each length-bucketed batch."""
    with torch.no_grad():
        for b in tqdm(make_batches(utts, max_frames), desc=desc, mininterval=2.0):
            batch = collate(b, cmvn)
            logp, olens = model(batch["feats"], batch["lengths"])
            yield batch["utts"], logp, olens


def decode_words(decoder, emissions) -> dict[str, str]:
    """Each utterance's words from ``decoder`` (a :class:`WordDecoder`) over ``emissions`` (:func:`log_probs`'s
    batches of utterance ids, log-probs, output lengths)."""
    return {u: h for ids, lp, ol in emissions for u, h in zip(ids, decoder(lp, ol))}


def word_list_of(word_lm: Path) -> str:
    """The dictionary whose words widened the word LM dir's lexicon (make_word_lm --word-list), or ''."""
    info = word_lm / "info.json"
    return json.loads(info.read_text()).get("word_list", "") if info.is_file() else ""


def tuning_record(exp: Path, weights: Path, word_lm: Path, tune_data: Path) -> Path:
    """Where the tuning of ``weights`` with ``word_lm`` on ``tune_data`` is kept: ``word_tuning_<model>_on_<dev
    set>.json``, or ``word_tuning_<model>_<list name>_on_<dev set>.json`` for a lexicon widened by a word list (each
    lexicon and each dev set tuned apart, none overwriting another)."""
    words = word_list_of(word_lm)
    return exp / f"word_tuning_{weights.stem}{'_' + Path(words).name if words else ''}_on_{tune_data.name}.json"


def tune_word_decoding(model, tok: Units, cmvn, tune_data: Path, beam: int,
                       beam_size_token: Optional[int],
                       grid: list[tuple[float, float]], record: Path, weights: Path, max_frames: int,
                       lexicon: LexiconTrie) -> dict:
    """The (LM weight, word score) of ``grid`` with the lowest WER on ``tune_data``, with every pair's WER; each
    pair's decoder on the one ``lexicon`` trie (of the word LM dir ``lexicon.lm_dir``).

    Kept in ``record`` and reused while the model file, the word LM, the data and the grid are the same."""
    word_lm = lexicon.lm_dir
    key = {"model_file": str(weights), "model_mtime": weights.stat().st_mtime_ns, "tune_data": str(tune_data),
           "word_lm": str(word_lm), "word_lm_mtime": (word_lm / "lexicon.txt").stat().st_mtime_ns, "beam": beam,
           "beam_size_token": beam_size_token, "grid": [list(g) for g in grid]}
    if record.is_file():
        old = json.loads(record.read_text())
        if {k: old.get(k) for k in key} == key:
            return old
    utts, _ = load_utterances(tune_data, tok.encode)
    cmvn.add_speakers(tune_data)
    emissions = list(log_probs(model, utts, cmvn, max_frames, f"tune on {tune_data.name}"))
    refs = read_table(tune_data / "text")
    wers = []
    for lm_weight, word_score in tqdm(grid, desc=f"tune {len(grid)} (LM weight, word score)", mininterval=2.0):
        dec = WordDecoder(word_lm, tok, beam=beam, lm_weight=lm_weight, word_score=word_score,
                          beam_size_token=beam_size_token, lexicon=lexicon)
        hyps = decode_words(dec, emissions)
        wers.append(round(compute_wer(refs, hyps)[0].wer, 2))
    best = min(range(len(grid)), key=lambda i: (wers[i], i))
    result = {**key, "wer": wers, "chosen": list(grid[best]), "chosen_wer": wers[best]}
    record.write_text(json.dumps(result, indent=2))
    print(f"decode_asr: word LM weight {grid[best][0]}, word score {grid[best][1]}: %WER {wers[best]:.2f} on "
          f"{tune_data} (best of {len(grid)}; {record})")
    return result


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exp-dir", required=True, help="the training run (its config.yaml; final.pt by default)")
    ap.add_argument("--model", help="the model state to decode (default <exp-dir>/final.pt), e.g. an average "
                                    "written by gossip_accel.bin.average_checkpoints")
    ap.add_argument("--data", required=True, help="Kaldi data dir with feats.scp, utt2num_frames, text")
    ap.add_argument("--out", required=True)
    ap.add_argument("--method", choices=["greedy", "beam", "word"], default="greedy")
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--beam-size-token", type=int, default=0,
                    help="--method word: the units tried at each frame, the best first (flashlight's beam_size_token; "
                         "default 0: every unit)")
    ap.add_argument("--lm-dir", help="a unit-level LM run dir (config.yaml, final.pt) for shallow fusion")
    ap.add_argument("--lm-weight", type=float, default=0.3)
    ap.add_argument("--insertion-bonus", type=float, default=0.0)
    ap.add_argument("--word-lm-dir", help="--method word: a word LM dir (lexicon.txt, lm.bin/lm.arpa) of make_word_lm")
    ap.add_argument("--word-lm-weight", type=float, nargs="+", default=[1.0], help="--method word: LM weight(s)")
    ap.add_argument("--word-score", type=float, nargs="+", default=[0.0],
                    help="--method word: score(s) added per word (insertion score)")
    ap.add_argument("--tune-data", help="--method word with several weights or scores: the Kaldi data dir (dev set) "
                                        "on which the pair of lowest WER is chosen")
    ap.add_argument("--max-frames", type=int, default=20000)
    args = ap.parse_args(argv)

    exp, data, out = Path(args.exp_dir), Path(args.data), Path(args.out)
    token_beam = args.beam_size_token or None   # flashlight's "every unit"
    weights = Path(args.model) if args.model else exp / "final.pt"
    for f in (exp / "config.yaml", weights):
        if not f.is_file():
            raise SystemExit(f"decode_asr: {f} not found; run the training stage first"
                             + (" (and gossip_accel.bin.average_checkpoints)" if f == weights and args.model else ""))
    try:   # expected bad input: one line, no traceback (ConfigError and DataDirError are ValueErrors)
        conf, tok, utts, dropped, cmvn, model = load_run(exp, weights, data)
        if isinstance(tok, LexiconTokenizer) and args.method != "word":
            raise ValueError(f"{conf.data.lang} holds phone units: they decode to words only through a lexicon "
                             f"(--method word), not --method {args.method}")
        lm = UnitLM(Path(args.lm_dir), tok.id_to_token) if args.lm_dir else None
        words = tuning = None
        if args.method == "word":
            if not args.word_lm_dir:
                raise ValueError("--method word needs --word-lm-dir (a word LM dir of gossip_accel.bin.make_word_lm)")
            grid = [(w, ws) for w in args.word_lm_weight for ws in args.word_score]
            if len(grid) > 1 and not args.tune_data:
                raise ValueError(f"{len(grid)} (--word-lm-weight, --word-score) pairs need --tune-data (a dev set) "
                                 f"to choose one")
            lexicon = LexiconTrie(Path(args.word_lm_dir), tok)
            if len(grid) > 1:
                tuning = tune_word_decoding(model, tok, cmvn, Path(args.tune_data), args.beam,
                                            token_beam, grid,
                                            tuning_record(exp, weights, Path(args.word_lm_dir), Path(args.tune_data)),
                                            weights, args.max_frames, lexicon)
                grid = [tuple(tuning["chosen"])]
            words = WordDecoder(Path(args.word_lm_dir), tok, beam=args.beam, lm_weight=grid[0][0],
                                word_score=grid[0][1], beam_size_token=token_beam, lexicon=lexicon)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"decode_asr: {' '.join(str(e).split())}") from None
    if lm is not None and args.method != "beam":
        raise SystemExit("decode_asr: --lm-dir needs --method beam (shallow fusion happens in the beam search)")

    hyps: dict[str, str] = {}
    for utt_ids, logp, olens in log_probs(model, utts, cmvn, args.max_frames, f"decode {data.name} ({args.method})"):
        if words is not None:
            hyps.update(zip(utt_ids, words(logp, olens)))
            continue
        if args.method == "greedy":
            seqs = greedy_decode(logp, olens)
        else:
            seqs = [prefix_beam_search(logp[i], int(olens[i]), beam=args.beam, lm_score=lm,
                                       lm_weight=args.lm_weight if lm else 0.0,
                                       insertion_bonus=args.insertion_bonus)[0].tokens
                    for i in range(len(utt_ids))]
        hyps.update(zip(utt_ids, map(tok.decode, seqs)))
    refs = read_table(data / "text")
    stats = write_scoring_dir(out, refs, hyps)
    summary = {"data": str(data), "checkpoint": weights.stem, "model_file": str(weights), "method": args.method, "beam": args.beam if args.method != "greedy" else None,
               "lm": args.lm_dir, "lm_weight": args.lm_weight if lm else None,
               **({"word_lm": args.word_lm_dir, "word_list": word_list_of(Path(args.word_lm_dir)),
                   "word_lm_weight": words.lm_weight, "word_score": words.word_score,
                   "beam_size_token": token_beam,
                   "tuned_on": tuning["tune_data"] if tuning else None} if words is not None else {}),
               **stats.as_dict(),
               "left_out_before_decoding": dropped}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"{stats.kaldi_lines()[0]} {out}")


if __name__ == "__main__":
    main()
