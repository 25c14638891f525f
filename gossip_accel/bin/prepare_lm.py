"""Build an LM data dir: the wikitext-style splits plus ``vocab.txt`` from the training split.

    python -m gossip_accel.bin.prepare_lm --src local/data/wiki_mini --out data/lm --min-count 3

``--src`` must hold ``wiki.train.tokens`` and ``wiki.valid.tokens`` (``wiki.test.tokens``
optional). The vocabulary keeps words seen ``--min-count`` times (others count as <unk>),
most frequent first; ``vocab.txt`` lines are ``<word> <count>``.
"""
from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from ..data.lm import LMDataError, Vocabulary, check_text, empty_text_error, read_lines

SPLITS = ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-count", type=int, default=1)
    ap.add_argument("--max-size", type=int, default=None)
    args = ap.parse_args(argv)
    src, out = Path(args.src), Path(args.out)
    if args.min_count < 1:
        raise SystemExit(f"prepare_lm: --min-count must be >= 1, got {args.min_count}")
    if args.max_size is not None and args.max_size < 2:
        raise SystemExit(f"prepare_lm: --max-size must be >= 2 (<unk> and <eos>), got {args.max_size}")
    missing = [s for s in SPLITS[:2] if not (src / s).is_file()]
    if missing:
        raise SystemExit(f"prepare_lm: {src} lacks {', '.join(missing)} (expected the wikitext layout: {', '.join(SPLITS)})")
    splits = [s for s in SPLITS if (src / s).is_file()]
    try:   # every input is checked before anything in --out is touched
        vocab = Vocabulary.build(read_lines(src / SPLITS[0]), args.min_count, args.max_size)
        if sum(vocab.counts) == 0:
            raise empty_text_error(src / SPLITS[0])
        for s in splits[1:]:
            check_text(src / s)
    except LMDataError as e:
        raise SystemExit(f"prepare_lm: {e} ({out} left unchanged)") from None
    out.mkdir(parents=True, exist_ok=True)
    for s in splits:   # each file replaced atomically
        tmp = out / f".{s}.tmp{os.getpid()}"
        shutil.copyfile(src / s, tmp)
        os.replace(tmp, out / s)
    vocab.save(out / "vocab.txt")
    n = sum(vocab.counts)
    print(f"prepare_lm: {out}/vocab.txt: {len(vocab)} words (min count {args.min_count}), "
          f"{n} training tokens, <unk> rate {vocab.counts[vocab.index['<unk>']] / max(n, 1):.2%}")


if __name__ == "__main__":
    main()
