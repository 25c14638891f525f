"""Make a word LM dir for lexicon decoding: a KenLM n-gram and the lexicon spelled in the model's units.

    python -m gossip_accel.bin.make_word_lm --lang-dir data/lang_char --plain-text librispeech-lm-norm.txt.gz \\
        --out data/word_lm3_lang_char [--order 3] [--max-words 200000] [--dev-text data/dev_clean/text]
    python -m gossip_accel.bin.make_word_lm --lang-dir data/lang_char --text data/train/text --out ...
        [--word-list /usr/share/dict/american-english-huge]   # more lexicon words, scored as unseen

``--plain-text`` is one sentence per line (``.gz`` read as gzip), ``--text`` a Kaldi ``text``
file; the words are used as written (LibriSpeech's text and transcripts are upper case). Needs
KenLM's ``lmplz`` (utils/install_kenlm.sh). Writes ``lm.arpa``, ``lm.bin``, ``lexicon.txt`` and
``info.json`` (see gossip_accel.asr.word_lm); with ``--dev-text``, the out-of-lexicon rate of
those transcripts (words the decoder can never output) goes to ``info.json`` and the log.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..asr.word_lm import build_word_lm, oov_rate, read_word_list
from ..data.units import load_units, read_transcripts
from .units_text import read_plain


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lang-dir", required=True, help="the ASR model's units (bpe.model)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="Kaldi text file (<utt> <words>)")
    src.add_argument("--plain-text", help="one sentence per line, no utterance id (.gz allowed)")
    ap.add_argument("--out", required=True, help="the word LM dir to write")
    ap.add_argument("--order", type=int, default=3, help="n-gram order (default 3)")
    ap.add_argument("--max-words", type=int, default=0, help="keep the N most frequent words (default 0: all)")
    ap.add_argument("--memory", default="20%", help="lmplz -S: memory for sorting (default 20%%)")
    ap.add_argument("--dev-text", help="a Kaldi text file whose out-of-lexicon rate is reported")
    ap.add_argument("--word-list", help="a dictionary (one word per line) whose words join the lexicon as unseen "
                                        "words of the n-gram (e.g. /usr/share/dict/american-english-huge)")
    args = ap.parse_args(argv)

    try:
        tok = load_units(args.lang_dir)
        if args.text:
            if not Path(args.text).is_file():
                raise FileNotFoundError(f"{args.text} not found")
            sentences, source = read_transcripts(args.text), args.text
        else:
            sentences, source = read_plain(Path(args.plain_text)), args.plain_text
        out = Path(args.out)
        word_list = read_word_list(Path(args.word_list)) if args.word_list else ()
        info = build_word_lm(sentences, tok, out, order=args.order, max_words=args.max_words,
                             memory=args.memory, source=source, word_list=word_list,
                             word_list_source=args.word_list or "")
        if args.dev_text:
            info["dev_text"] = args.dev_text
            info["dev_oov_rate"] = round(oov_rate(read_transcripts(args.dev_text), out / "lexicon.txt"), 5)
            (out / "info.json").write_text(json.dumps(info, indent=2))
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"make_word_lm: {' '.join(str(e).split())}") from None
    oov = f", {info['dev_oov_rate']:.2%} of {args.dev_text}'s words outside it" if args.dev_text else ""
    extra = f", {info['word_list_added']} of them from {args.word_list}" if args.word_list else ""
    print(f"make_word_lm: {info['order']}-gram on {info['running_words']} words of {source} -> {out} "
          f"(lexicon {info['lexicon_words']} words{extra}, {info['left_out_words']} left out{oov})")


if __name__ == "__main__":
    main()
