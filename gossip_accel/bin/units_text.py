"""Write transcripts as unit strings, one utterance per line (LM training text).

    python -m gossip_accel.bin.units_text --lang-dir data/lang_bpe300 --text data/train/text --out lm/wiki.train.tokens
    python -m gossip_accel.bin.units_text --lang-dir data/lang_bpe300 --plain-text librispeech-lm-norm.txt.gz --out ...

``--text`` is a Kaldi ``text`` file (``<utt> <words>``); ``--plain-text`` is one sentence per
line with no id (LibriSpeech's ``librispeech-lm-norm.txt``; ``.gz`` is read as gzip).

Each line holds the utterance's units (e.g. ``▁THE ▁CAT S``), the utterance id dropped, so
that gossip_accel.bin.prepare_lm / train_lm build a unit-level LM for shallow fusion.
"""
from __future__ import annotations

import argparse
import gzip
from pathlib import Path

from ..data.kaldi.tables import read_table
from ..data.units import load_units


def read_plain(path: Path) -> list[str]:
    """Non-empty lines of a plain text file (gzip when it ends in .gz)."""
    if not path.is_file():
        raise SystemExit(f"units_text: {path} not found")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError as e:
        raise SystemExit(f"units_text: {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lang-dir", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="Kaldi text file (<utt> <words>)")
    src.add_argument("--plain-text", help="one sentence per line, no utterance id (.gz allowed)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        tok = load_units(args.lang_dir)
        if args.text and not Path(args.text).is_file():
            raise FileNotFoundError(f"{args.text} not found: give a Kaldi text file (<utt> <words>)")
        texts = read_table(Path(args.text)).values() if args.text else read_plain(Path(args.plain_text))
    except (FileNotFoundError, ValueError) as e:   # DataDirError is a ValueError
        raise SystemExit(f"units_text: {e}") from None
    lines = [" ".join(tok.id_to_token(i) for i in tok.encode(t)) for t in texts]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines if line), encoding="utf-8")
    tmp.replace(out)
    print(f"units_text: {len(lines)} utterances -> {out}")


if __name__ == "__main__":
    main()
