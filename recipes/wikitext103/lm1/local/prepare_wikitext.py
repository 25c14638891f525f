#!/usr/bin/env python3
"""Validate a WikiText-103 directory and build the LM data dir (splits, vocab.txt, stats.json).

    python local/prepare_wikitext.py --src /corpora/wikitext-103 --out data/lm

``--src`` must be the real WikiText-103 layout (what ``wikitext-103-v1.zip`` unpacks to):

    wiki.train.tokens  wiki.valid.tokens  wiki.test.tokens

UTF-8 text, one paragraph or heading per line, tokens separated by spaces, out-of-vocabulary
words already replaced by ``<unk>``. Each file must exist, be valid UTF-8 and hold at least one
token; otherwise the script stops with an error that names the file (and the line, for bad
bytes). A warning is printed when ``<unk>`` never occurs in the training split (real WikiText-103
has OOVs mapped already: this is probably raw text, see ``--unk-threshold``).

Writes into ``--out`` (every file through a temporary file and a rename, so a rerun or an
interrupted run never leaves a half-written file; reruns give identical bytes):

* ``wiki.{train,valid,test}.tokens``: byte-for-byte copies of the inputs, or, with
  ``--unk-threshold N`` (N > 0), copies in which every word seen fewer than N times in the
  training split (including words absent from it) is replaced by ``<unk>`` in all three splits,
  whitespace and line structure kept.
* ``vocab.txt``: ``<word> <count>`` per line, most frequent first, from
  ``gossip_accel.data.lm.Vocabulary.build(read_lines(train), min_count=1)``: every training token
  (the WikiText-103 vocabulary is all training tokens) plus ``<eos>`` (one per non-empty line)
  and ``<unk>``.
* ``stats.json``: per split the lines (all, blank, non-empty), tokens (whitespace-separated),
  tokens with one ``<eos>`` per non-empty line (what the trainer reads), ``<unk>`` tokens
  (literal ``<unk>`` plus words that are not in vocab.txt and so are read as ``<unk>``) and the
  ``<unk>`` rate = ``<unk>`` tokens / tokens with ``<eos>``; the vocabulary size.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

try:
    from gossip_accel.data.lm import UNK, Vocabulary, read_lines
except ImportError:  # run from a checkout without path.sh: the repository root is 4 levels up
    sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
    from gossip_accel.data.lm import UNK, Vocabulary, read_lines

PROG = "prepare_wikitext.py"
SPLITS = ("train", "valid", "test")
LAYOUT = "wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens (the WikiText-103 layout)"
_WORD = re.compile(r"\S+")


class DataError(Exception):
    """Bad input: the message names the file and says what was expected."""


def split_file(split: str) -> str:
    return f"wiki.{split}.tokens"


def warn(msg: str) -> None:
    print(f"{PROG}: warning: {msg}", file=sys.stderr)


def check_layout(src: Path) -> dict[str, Path]:
    if not src.exists():
        raise DataError(f"{src}: no such directory (expected a directory with {LAYOUT})")
    if not src.is_dir():
        raise DataError(f"{src}: not a directory (expected a directory with {LAYOUT})")
    paths = {s: src / split_file(s) for s in SPLITS}
    missing = [p for p in paths.values() if not p.is_file()]
    if missing:
        hint = ""
        if (src / "wikitext-103" / "wiki.train.tokens").is_file():
            hint = f"; the files are in {src / 'wikitext-103'}: pass that as --src"
        elif (src / "wiki.train.raw").is_file():
            hint = ("; found wiki.*.raw: that is WikiText-103-raw, this recipe wants the "
                    "tokenized wiki.*.tokens files")
        raise DataError(f"{missing[0]}: missing split file (expected {LAYOUT} in {src}){hint}")
    return paths


def scan(path: Path) -> dict[str, int]:
    """Check that ``path`` is non-empty UTF-8; count lines, blank lines, tokens and <unk>."""
    lines = blank = tokens = unk = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}:{lineno}: invalid UTF-8 byte 0x{raw[e.start]:02x} at byte {e.start + 1} "
                    f"of the line (expected UTF-8 text)") from None
            toks = line.split()
            lines += 1
            if toks:
                tokens += len(toks)
                unk += toks.count(UNK)
            else:
                blank += 1
    if lines == 0:
        raise DataError(f"{path}: empty file (expected tokenized text, one paragraph per line)")
    if tokens == 0:
        raise DataError(f"{path}: no tokens in {lines} line(s), only whitespace "
                        "(expected tokenized text, one paragraph per line)")
    return {"lines": lines, "blank_lines": blank, "tokens": tokens, "unk_in_input": unk}


def tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def map_rare(src: Path, dst: Path, keep: set[str]) -> int:
    """Copy ``src`` to ``dst`` with every word not in ``keep`` replaced by <unk>; whitespace kept."""
    n = 0

    def sub(m: re.Match) -> str:
        nonlocal n
        w = m.group(0)
        if w in keep or w == UNK:
            return w
        n += 1
        return UNK

    with open(src, encoding="utf-8", newline="") as fi, open(dst, "w", encoding="utf-8", newline="") as fo:
        for line in fi:
            fo.write(_WORD.sub(sub, line))
    return n


def split_stats(path: Path, vocab: Vocabulary) -> dict[str, int]:
    """Counts as the trainer sees the file: read_lines (tokens + <eos> per non-empty line)."""
    paragraphs = tokens = unk_literal = oov = 0
    index = vocab.index
    for toks in read_lines(path):
        paragraphs += 1
        tokens += len(toks) - 1
        for w in toks:
            if w == UNK:
                unk_literal += 1
            elif w not in index:
                oov += 1
    return {"paragraph_lines": paragraphs, "tokens_with_eos": tokens + paragraphs,
            "unk_literal": unk_literal, "oov": oov}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        epilog="Input layout, outputs and counts: see the module docstring (head of this file).")
    ap.add_argument("--src", type=Path, required=True,
                    help="directory with wiki.{train,valid,test}.tokens (WikiText-103 layout)")
    ap.add_argument("--out", type=Path, required=True, help="output directory (created if needed)")
    ap.add_argument("--unk-threshold", type=int, default=0, metavar="N",
                    help="map words seen fewer than N times in train to <unk> in all splits "
                         "(for raw text without <unk>; default 0 = off, copy as is)")
    args = ap.parse_args(argv)
    if args.unk_threshold < 0:
        ap.error(f"--unk-threshold must be >= 0, got {args.unk_threshold}")
    try:
        return run(args)
    except DataError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None


def run(args: argparse.Namespace) -> int:
    src, out = args.src, args.out
    paths = check_layout(src)
    scans = {s: scan(p) for s, p in paths.items()}  # validate everything before writing anything
    if args.unk_threshold == 0 and scans["train"]["unk_in_input"] == 0:
        warn(f"{paths['train']}: no <unk> token in the training split; real WikiText-103 has its "
             "OOVs mapped to <unk> already: is this raw text? (--unk-threshold 3 does that mapping)")

    out.mkdir(parents=True, exist_ok=True)
    finals = {s: out / split_file(s) for s in SPLITS}
    tmps = {s: tmp_path(p) for s, p in finals.items()}
    vocab_tmp, stats_tmp = tmp_path(out / "vocab.txt"), tmp_path(out / "stats.json")
    mapped: dict[str, int] = {}
    try:
        if args.unk_threshold > 0:
            counts: Counter[str] = Counter()
            for toks in read_lines(paths["train"]):
                counts.update(toks[:-1])
            keep = {w for w, c in counts.items() if c >= args.unk_threshold}
            for s in SPLITS:
                mapped[s] = map_rare(paths[s], tmps[s], keep)
        else:
            for s in SPLITS:
                shutil.copyfile(paths[s], tmps[s])
        vocab = Vocabulary.build(read_lines(tmps["train"]), min_count=1)
        vocab.save(vocab_tmp)
        splits = {}
        for s in SPLITS:
            st = {"file": split_file(s), "lines": scans[s]["lines"], "blank_lines": scans[s]["blank_lines"],
                  "tokens": scans[s]["tokens"]}
            st.update(split_stats(tmps[s], vocab))
            if args.unk_threshold > 0:
                st["mapped_to_unk"] = mapped[s]
            st["unk"] = st["unk_literal"] + st["oov"]
            st["unk_rate"] = round(st["unk"] / st["tokens_with_eos"], 6)
            splits[s] = st
        stats = {
            "corpus": "wikitext-103",
            "src": str(src),
            "unk_threshold": args.unk_threshold,
            "vocab_size": len(vocab),
            "vocab_note": "all training tokens plus <eos> and <unk> (Vocabulary.build, min_count=1)",
            "unk_rate_note": "(literal <unk> + words not in vocab.txt) / tokens incl. one <eos> per non-empty line",
            "splits": splits,
        }
        with open(stats_tmp, "w", encoding="utf-8") as f:
            json.dump(stats, f, indent=2, sort_keys=True)
            f.write("\n")
        for s in SPLITS:
            os.replace(tmps[s], finals[s])
        os.replace(vocab_tmp, out / "vocab.txt")
        os.replace(stats_tmp, out / "stats.json")
    finally:
        for p in (*tmps.values(), vocab_tmp, stats_tmp):
            if p.exists():
                p.unlink()

    for s in SPLITS:
        st = splits[s]
        if s != "train" and st["oov"]:
            warn(f"{paths[s]}: {st['oov']} tokens are not in the training vocabulary and will be "
                 "read as <unk> (real WikiText-103 has none)")
        extra = f", {st['mapped_to_unk']} mapped to <unk>" if "mapped_to_unk" in st else ""
        print(f"{PROG}: {s:5s}: {st['lines']} lines ({st['blank_lines']} blank), {st['tokens']} tokens, "
              f"{st['tokens_with_eos']} with <eos>{extra}, <unk> rate {st['unk_rate']:.2%}")
    print(f"{PROG}: {out}/vocab.txt: {len(vocab)} words; wrote {', '.join(split_file(s) for s in SPLITS)}, "
          "vocab.txt, stats.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
