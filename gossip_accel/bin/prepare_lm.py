"""Build an LM data dir: the wikitext-style splits plus ``vocab.txt`` from the training split.

    python -m gossip_accel.bin.prepare_lm --src local/data/wiki_mini --out data/lm --min-count 3

``--src`` must hold ``wiki.train.tokens`` and ``wiki.valid.tokens`` (``wiki.test.tokens``
optional). The vocabulary keeps words seen ``--min-count`` times (others count as <unk>),
most frequent first; ``vocab.txt`` lines are ``<word> <count>``.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ..data.lm import Vocabulary, read_lines

SPLITS = ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-count", type=int, default=1)
    ap.add_argument("--max-size", type=int, default=None)
    args = ap.parse_args()
    src, out = Path(args.src), Path(args.out)
    missing = [s for s in SPLITS[:2] if not (src / s).is_file()]
    if missing:
        raise SystemExit(f"prepare_lm: {src} lacks {', '.join(missing)} (expected the wikitext layout: {', '.join(SPLITS)})")
    out.mkdir(parents=True, exist_ok=True)
    for s in SPLITS:
        if (src / s).is_file():
            shutil.copyfile(src / s, out / s)
    vocab = Vocabulary.build(read_lines(out / SPLITS[0]), args.min_count, args.max_size)
    vocab.save(out / "vocab.txt")
    n = sum(vocab.counts)
    print(f"prepare_lm: {out}/vocab.txt: {len(vocab)} words (min count {args.min_count}), "
          f"{n} training tokens, <unk> rate {vocab.counts[vocab.index['<unk>']] / max(n, 1):.2%}")


if __name__ == "__main__":
    main()
