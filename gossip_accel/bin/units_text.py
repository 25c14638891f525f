"""Write a Kaldi ``text`` file as unit strings, one utterance per line (LM training text).

    python -m gossip_accel.bin.units_text --lang-dir data/lang_bpe300 --text data/train/text --out lm/wiki.train.tokens

Each line holds the utterance's units (e.g. ``▁THE ▁CAT S``), the utterance id dropped, so
that gossip_accel.bin.prepare_lm / train_lm build a unit-level LM for shallow fusion.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..data.kaldi_dir import read_table
from ..data.units import Tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lang-dir", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tok = Tokenizer(args.lang_dir)
    lines = [" ".join(tok.id_to_token(i) for i in tok.encode(t)) for t in read_table(Path(args.text)).values()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines if line), encoding="utf-8")
    tmp.replace(out)
    print(f"units_text: {len(lines)} utterances -> {out}")


if __name__ == "__main__":
    main()
