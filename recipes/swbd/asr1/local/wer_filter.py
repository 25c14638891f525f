#!/usr/bin/env python3
"""The scoring filter of the Switchboard recipe: Kaldi ``text`` lines on stdin -> filtered on stdout.

    python local/wer_filter.py < ref.txt > ref.filt.txt     (the same filter for hypotheses)

What NIST's Hub5 scoring does with its GLM (en20000405_hub5.glm) and STM conventions, and
Kaldi's swbd ``local/score_basic.sh`` filters (wer_hyp_filter / wer_ref_filter) approximate:

* removed: non-speech tokens ``[noise]``, ``[laughter]``, ``[vocalized-noise]``, ``<unk>``;
* removed: hesitations (the GLM maps them to ``%HESITATION``, which matches nothing):
  ``uh um eh mm hm ah huh ha er oof hee ach eee ew`` and ``%hesitation``;
* removed: optionally deletable STM words, written in parentheses (``(%hesitation)``,
  ``(th-)``), and partial words (ending or starting with ``-``: ``th-``, ``-cept``), which
  sclite does not count against a hypothesis either way;
* mapped (GLM spelling variants): ``ok`` -> ``okay``, ``alright`` -> ``all right``,
  ``um-hum``/``mhm``/``mm-hmm`` -> ``uh-huh``; ``[laughter-word]`` -> ``word``; lower case.

So both sides are scored on their lexical words only; the WER is what Kaldi's swbd recipes
report as "filtered" (hubscr with the GLM gives numbers within a few tenths of it).
"""
from __future__ import annotations

import re
import sys

NOISE = {"[noise]", "[laughter]", "[vocalized-noise]", "<unk>", "%hesitation"}
HESITATIONS = {"uh", "um", "eh", "mm", "hm", "ah", "huh", "ha", "er", "oof", "hee", "ach", "eee", "ew"}
MAP = {"ok": "okay", "alright": "all right", "um-hum": "uh-huh", "mhm": "uh-huh", "mm-hmm": "uh-huh"}


def filter_words(words: str) -> str:
    out = []
    for w in words.lower().split():
        m = re.fullmatch(r"\[laughter-(.+)\]", w)
        if m:
            w = m.group(1)
        if w in NOISE or w in HESITATIONS or (w.startswith("(") and w.endswith(")")):
            continue
        if w.endswith("-") or w.startswith("-"):
            continue
        out.append(MAP.get(w, w))
    return " ".join(out)


def main() -> int:
    for line in sys.stdin:
        parts = line.rstrip("\n").split(None, 1)
        if not parts:
            continue
        words = filter_words(parts[1]) if len(parts) > 1 else ""
        sys.stdout.write(f"{parts[0]} {words}\n" if words else f"{parts[0]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
