#!/usr/bin/env python3
"""LM training text for the mini corpus, in the format of LibriSpeech's ``librispeech-lm-norm.txt``.

    python local/make_lm_text.py --corpus data/mini_librispeech --out data/mini_librispeech/librispeech-lm-norm.txt

The real LibriSpeech ships an LM corpus (openslr.org/11: ~800M words of normalized book text,
one upper-case sentence per line, books of dev/test left out). This makes its counterpart for the
mini corpus from the same Wikipedia text the corpus was spoken from: every sentence of
``wiki.train.tokens`` that normalizes as the transcripts do (``make_mini_librispeech.normalize``),
leaving out each article that lends a sentence to dev-clean, test-clean, test-other or dev-other (their
transcripts are read from the corpus's ``*.trans.txt``), so no evaluation sentence is in the LM.
The training transcripts are in it, as LibriSpeech's training books are in its LM corpus.

``--wordnet DIR`` adds the English of WordNet 3.0 (Debian's ``wordnet-base``: ``/usr/share/wordnet``), 1.67M
words: every synset's words (one line each: ``EDMONTON``) and its gloss, split at ``;`` into the definition and
its quoted examples (``THE PROVINCIAL CAPITAL OF ALBERTA``), normalized as the transcripts are (parentheses
dropped, hyphens as spaces; a piece with digits or symbols left out). 96 Wikipedia articles leave about one word
in nine of the mini test sets unseen by the n-gram (12.2% of test-clean's words); WordNet's lemmas and
definitions cover most of them (3.2% stay unseen). A line equal to an evaluation transcript is never written.

``--base FILE`` (instead of ``--corpus``) extends an LM text, e.g. the mini Switchboard's, with
``--held-out`` naming the Kaldi ``text`` files of its evaluation and tuning sets (their sentences are dropped from
the base too, compared in upper case) and ``--lower-case`` for a lower-case text.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_mini_librispeech import DEFAULT_TEXT, BuildError, eligible_sentences, read_articles, read_utf8  # noqa: E402

EVAL_SUBSETS = ("dev-clean", "test-clean", "test-other", "dev-other")   # dev-other: when the corpus has it
PROG = "make_lm_text.py"


def eval_transcripts(corpus: Path) -> set[str]:
    """Every transcript of the corpus's evaluation subsets (``<id> <WORDS>`` lines of ``*.trans.txt``)."""
    out: set[str] = set()
    for subset in EVAL_SUBSETS:
        files = sorted((corpus / subset).glob("*/*/*.trans.txt"))
        if not files and subset == "dev-other" and not (corpus / subset).exists():
            continue   # a corpus built without it
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


WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
_PLAIN = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")
_HEX = re.compile(r"[0-9a-fA-F]{2}")


def lm_normalize(text: str) -> str | None:
    """A free-text piece as an LM line (upper case, letters and apostrophes, hyphens and underscores as spaces,
    parentheses and edge punctuation dropped), or None when a word has digits or other symbols."""
    words = []
    for raw in re.split(r"[\s_-]+", text.replace("(", " ").replace(")", " ")):
        w = raw.strip(",.;:?!\"'`")
        if not w:
            continue
        if not _PLAIN.fullmatch(w):
            return None
        words.append(w.upper())
    return " ".join(words) or None


def wordnet_lines(wordnet_dir: Path) -> list[str]:
    """WordNet 3.0's synset words (a line each) and glosses (definition and quoted examples, a line each),
    normalized by lm_normalize, in the data files' order, repeats kept (they are counts for the n-gram)."""
    lines: list[str] = []
    for name in WORDNET_FILES:
        path = wordnet_dir / name
        if not path.is_file():
            raise BuildError(f"{path}: missing (--wordnet wants WordNet 3.0's dict folder, e.g. /usr/share/wordnet "
                             "of Debian's wordnet-base)")
        with path.open(encoding="latin-1") as f:
            for n, line in enumerate(f, 1):
                if line.startswith("  "):                 # the license header
                    continue
                head, bar, gloss = line.partition(" | ")
                fields = head.split()
                count = int(fields[3], 16) if bar and len(fields) >= 4 and _HEX.fullmatch(fields[3]) else -1
                if count < 0:
                    raise BuildError(f"{path}:{n}: not a WordNet data line "
                                     "(<offset> <lex_filenum> <ss_type> <w_cnt> ...)")
                for word in fields[4:4 + 2 * count:2]:  # word, lex_id pairs
                    norm = lm_normalize(re.sub(r"\([a-z]+\)$", "", word))   # adjective markers: (p), (a), (ip)
                    if norm:
                        lines.append(norm)
                for piece in gloss.split(";"):
                    norm = lm_normalize(piece)
                    if norm:
                        lines.append(norm)
    return lines


def kaldi_sentences(paths: list[Path]) -> set[str]:
    """The upper-case word sequences of Kaldi ``text`` files (``<utt-id> <words>`` lines)."""
    out: set[str] = set()
    for path in paths:
        for line in read_utf8(path, "--held-out's Kaldi text files: <utt-id> <words> lines").splitlines():
            parts = line.split(maxsplit=1)
            if len(parts) == 2:
                out.add(" ".join(parts[1].upper().split()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", type=Path, help="the mini corpus root (its dev/test subsets are held out)")
    src.add_argument("--base", type=Path, help="an LM text (one sentence per line) to extend (its --held-out sentences left out)")
    ap.add_argument("--held-out", type=Path, nargs="*", default=[],
                    help="Kaldi text files (<utt-id> <words>) whose sentences are never written (nor kept from --base)")
    ap.add_argument("--lower-case", action="store_true", help="WordNet's lines in lower case (for a lower-case text)")
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT, help=f"wikitext-format text (default {DEFAULT_TEXT})")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--wordnet", type=Path, help="WordNet 3.0's dict folder (e.g. /usr/share/wordnet): its words and "
                                                   "glosses join the text")
    args = ap.parse_args(argv)
    try:
        held_out = kaldi_sentences(args.held_out)
        if args.corpus:
            held_out |= eval_transcripts(args.corpus)
            sents, dropped = lm_sentences(args.text, held_out)
            leaked = held_out.intersection(sents)
            assert not leaked, f"evaluation sentences in the LM text: {sorted(leaked)[:3]}"
        else:
            lines = [line for line in read_utf8(args.base, "--base's LM text, one sentence per line").splitlines()
                     if line.strip()]
            sents = [line for line in lines if " ".join(line.upper().split()) not in held_out]
            dropped = len(lines) - len(sents)
        extra = [line for line in wordnet_lines(args.wordnet) if line not in held_out] if args.wordnet else []
    except BuildError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if args.lower_case:
        extra = [line.lower() for line in extra]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(s + "\n" for s in sents + extra)
    if not (args.out.is_file() and args.out.read_text(encoding="utf-8") == text):   # the same text keeps its time:
        tmp = args.out.with_name(f".{args.out.name}.tmp")                            # the LMs made of it stay
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, args.out)
    words = sum(len(s.split()) for s in sents)
    more = (f" + {len(extra)} lines, {sum(len(s.split()) for s in extra)} words of WordNet ({args.wordnet})"
            if extra else "")
    dropped_note = (f" ({dropped} articles left out: they hold dev/test sentences)" if args.corpus
                    else f" (base {args.base}, {dropped} of its lines left out: --held-out sentences)")
    print(f"{PROG}: {len(sents)} sentences, {words} words{more} -> {args.out}{dropped_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
