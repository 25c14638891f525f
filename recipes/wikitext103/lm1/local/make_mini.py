#!/usr/bin/env python3
"""Turn the embedded wiki_mini corpus (raw tokens) into a mini WikiText-103 (rare words -> <unk>).

    python local/make_mini.py --src ../../../local/data/wiki_mini --out data/wiki_mini_unk

``local/data/wiki_mini`` (repository root) is in the WikiText-103 format but keeps every token.
WikiText-103 itself replaced every word seen fewer than 3 times in the training split by
``<unk>`` in all splits; this script does the same (``--min-count``, default 3), so that
``prepare_wikitext.py`` then sees a corpus like the real one. A word absent from the training
split counts 0 and becomes ``<unk>`` too (closed vocabulary, as in WikiText-103). Only the
words change: line structure and spacing are kept byte for byte.

Writes ``wiki.train.tokens``, ``wiki.valid.tokens``, ``wiki.test.tokens`` into ``--out``
(through temporary files and renames; reruns give identical bytes) and prints per split the
tokens, the tokens replaced and the resulting vocabulary size. No torch needed: stdlib only.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from pathlib import Path

PROG = "make_mini.py"
SPLITS = ("train", "valid", "test")
UNK = "<unk>"
DEFAULT_SRC = Path(__file__).resolve().parents[4] / "local" / "data" / "wiki_mini"
_WORD = re.compile(r"\S+")


class DataError(Exception):
    pass


def read_split(path: Path) -> str:
    """The file's text; checks existence, UTF-8 (with line number), non-empty."""
    if not path.is_file():
        raise DataError(f"{path}: missing split file (expected wiki.train.tokens, wiki.valid.tokens, "
                        f"wiki.test.tokens in {path.parent})")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        lineno = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{lineno}: invalid UTF-8 byte 0x{data[e.start]:02x} (expected UTF-8 text)") from None
    if not text.split():
        raise DataError(f"{path}: empty file (expected tokenized text, one paragraph per line)")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC,
                    help=f"raw wikitext-format corpus (default: {DEFAULT_SRC})")
    ap.add_argument("--out", type=Path, required=True, help="output directory (created if needed)")
    ap.add_argument("--min-count", type=int, default=3,
                    help="words seen fewer times than this in train become <unk> (default 3, as WikiText-103)")
    args = ap.parse_args(argv)
    if args.min_count < 1:
        ap.error(f"--min-count must be >= 1, got {args.min_count}")
    try:
        texts = {s: read_split(args.src / f"wiki.{s}.tokens") for s in SPLITS}
    except DataError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None

    counts = Counter(texts["train"].split())
    keep = {w for w, c in counts.items() if c >= args.min_count}
    keep.add(UNK)
    args.out.mkdir(parents=True, exist_ok=True)
    report = []
    tmps = []
    try:
        for s in SPLITS:
            replaced = 0

            def sub(m: re.Match) -> str:
                nonlocal replaced
                if m.group(0) in keep:
                    return m.group(0)
                replaced += 1
                return UNK

            tmp = args.out / f".wiki.{s}.tokens.tmp{os.getpid()}"
            tmps.append(tmp)
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                f.write(_WORD.sub(sub, texts[s]))
            report.append((s, len(texts[s].split()), replaced))
        for s, tmp in zip(SPLITS, tmps):
            os.replace(tmp, args.out / f"wiki.{s}.tokens")
    finally:
        for tmp in tmps:
            if tmp.exists():
                tmp.unlink()
    for s, tokens, replaced in report:
        print(f"{PROG}: {s:5s}: {tokens} tokens, {replaced} replaced by {UNK} ({replaced / tokens:.2%})")
    print(f"{PROG}: {len(counts)} distinct training tokens, {len(keep)} kept (count >= {args.min_count}, "
          f"incl. {UNK}); wrote {args.out}/wiki.{{train,valid,test}}.tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
