#!/usr/bin/env python3
"""LM training text for the mini corpus, in the format of LibriSpeech's ``librispeech-lm-norm.txt``.

    python local/make_lm_text.py --corpus data/mini_librispeech --out data/mini_librispeech/librispeech-lm-norm.txt

The real LibriSpeech ships an LM corpus (openslr.org/11: ~800M words of normalized book text,
one upper-case sentence per line, books of dev/test left out). This makes its counterpart for the
mini corpus from the same Wikipedia text the corpus was spoken from: every sentence of
``wiki.train.tokens`` that normalizes as the transcripts do (``make_mini_librispeech.normalize``),
leaving out each article that lends a sentence to dev-clean, test-clean or test-other (their
transcripts are read from the corpus's ``*.trans.txt``), so no evaluation sentence is in the LM.
The training transcripts are in it, as LibriSpeech's training books are in its LM corpus.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_mini_librispeech import DEFAULT_TEXT, BuildError, eligible_sentences, read_articles  # noqa: E402

EVAL_SUBSETS = ("dev-clean", "test-clean", "test-other")
PROG = "make_lm_text.py"


def eval_transcripts(corpus: Path) -> set[str]:
    """Every transcript of the corpus's evaluation subsets (``<id> <WORDS>`` lines of ``*.trans.txt``)."""
    out: set[str] = set()
    for subset in EVAL_SUBSETS:
        files = sorted((corpus / subset).glob("*/*/*.trans.txt"))
        if not files:
            raise BuildError(f"{corpus / subset}: no *.trans.txt found (is --corpus a LibriSpeech-layout root?)")
        for f in files:
            for line in f.read_text(encoding="utf-8").splitlines():
                parts = line.split(maxsplit=1)
                if len(parts) == 2:
                    out.add(parts[1].strip())
    return out


def lm_sentences(text_dir: Path, held_out: set[str], max_words: int = 100) -> tuple[list[str], int]:
    """Normalized sentences of wiki.train.tokens, without the articles that hold a held-out sentence.

    Returns (sentences in document order, number of articles left out)."""
    per_article = eligible_sentences(read_articles(text_dir / "wiki.train.tokens"), 1, max_words)
    kept, dropped = [], 0
    for sents in per_article:
        transcripts = [s.transcript for s in sents]
        if any(t in held_out for t in transcripts):
            dropped += 1
            continue
        kept.extend(transcripts)
    return kept, dropped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="the mini corpus root (its dev/test subsets are held out)")
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT, help=f"wikitext-format text (default {DEFAULT_TEXT})")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        held_out = eval_transcripts(args.corpus)
        sents, dropped = lm_sentences(args.text, held_out)
    except BuildError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    leaked = held_out.intersection(sents)
    assert not leaked, f"evaluation sentences in the LM text: {sorted(leaked)[:3]}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text("".join(s + "\n" for s in sents), encoding="utf-8")
    os.replace(tmp, args.out)
    words = sum(len(s.split()) for s in sents)
    print(f"{PROG}: {len(sents)} sentences, {words} words -> {args.out} "
          f"({dropped} articles left out: they hold dev/test sentences)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
