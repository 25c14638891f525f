"""Pronunciations for words a lexicon lacks (grapheme-to-phoneme), as Kaldi's ``local/g2p.sh`` gives
LibriSpeech's lexicon the words CMUdict lacks.

``flite``: Flite's own text-to-phones program ``t2p`` (Debian's ``flite`` package): its CMU lexicon
and letter-to-sound rules, i.e. exactly how the flite voices of the mini LibriSpeech say a word.
Phones are CMU ARPAbet in lower case without stress marks (``drumheller`` -> ``d r ah m hh eh l er``),
as ``flite -ps`` prints what a voice speaks. Words go to ``t2p`` in batches, one sentence per word
(``w1. ; ; w2. ; ; ...``), and the phones between its pauses are split back into words; a batch whose count of
pauses does not match its words is redone one word per call. The two ``;`` cut flite's part-of-speech context
between the words (without them ``will. record.`` reads ``r ax k ao r d`` and ``will. use.`` ``y uw z``; one ``;``
still lets 54 of 65 homographs of the mini corpus's lexicon change with a modal before them), so every word is
read as alone (a homograph: flite's first reading, ``r eh k er d``) and a lexicon does not depend on the order of
its words. The separators cost ``t2p`` time (no other separator tried cuts the context): stage 5's 357k words take
52 s instead of 32 s on 2 cores, otherwise idle; the batches run in parallel, one ``t2p`` per CPU. A word alone is
said as in isolation, so the article ``a`` would be the letter (``ey``); it gets the reduced ``ax``
that the voices say in running text first, and ``ey`` second (as LibriSpeech's lexicon: ``A AH0``, ``A EY1``).

Switchboard's transcript tokens get Kaldi's swbd lexicon's non-speech phones whatever the method:
``[noise]`` -> ``nsn``, ``[laughter]`` -> ``lau``, ``[vocalized-noise]`` and any other bracketed token or word
fragment (``th-``) -> ``spn``; a word said laughing (``[laughter-yeah]``) is pronounced as the word.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

G2P_METHODS = ("flite",)
_BATCH = 200
_RUNNING_TEXT = {"a": [["ax"], ["ey"]]}   # words whose isolated reading is not their running-text one


def _t2p(text: str) -> list[list[str]]:
    """The phone groups ``t2p`` prints for ``text``, split at its pauses (stress digits dropped)."""
    out = subprocess.run(["t2p", text], capture_output=True, text=True, check=True).stdout
    groups, cur = [], []
    for p in out.split():
        if p == "pau":
            if cur:
                groups.append(cur)
            cur = []
        else:
            cur.append(re.sub(r"\d", "", p))
    if cur:
        groups.append(cur)
    return groups


def _t2p_batch(batch: list[str]) -> list[list[str]]:
    """The phones of each word of ``batch`` (empty for a word flite says nothing for)."""
    groups = _t2p(" ".join(f"{w.lower()}. ; ;" for w in batch))
    if len(groups) != len(batch):   # a word said as two phrases, or as nothing: one call each
        groups = [sum(_t2p(f"{w.lower()}."), []) for w in batch]
    return groups


def flite_g2p(words: Iterable[str], jobs: int = 0) -> dict[str, list[list[str]]]:
    """Flite's pronunciations of each word (case-insensitive); a word it says nothing for is left out.
    ``jobs`` ``t2p`` processes at a time (0: one per CPU this process may use); the result does not depend on it."""
    if shutil.which("t2p") is None:
        raise FileNotFoundError("flite's t2p not found (the g2p of --g2p flite): apt-get install flite "
                                "(utils/install_system_deps.sh flite)")
    words = list(dict.fromkeys(w for w in words if w))
    batches = [words[i:i + _BATCH] for i in range(0, len(words), _BATCH)]
    prons: dict[str, list[list[str]]] = {}
    with ThreadPoolExecutor(max_workers=jobs or len(os.sched_getaffinity(0))) as pool:   # threads wait on t2p
        for batch, groups in zip(batches, pool.map(_t2p_batch, batches)):
            prons.update((w, _RUNNING_TEXT.get(w.lower(), [g])) for w, g in zip(batch, groups) if g)
    return prons


NON_SPEECH = {"[noise]": "nsn", "[laughter]": "lau", "[vocalized-noise]": "spn"}   # Kaldi's swbd lexicon
SPOKEN_NOISE = "spn"


def g2p(method: str, words: Iterable[str]) -> dict[str, list[list[str]]]:
    """Pronunciations of ``words`` by ``method`` (one of :data:`G2P_METHODS`), Switchboard's tokens by the
    conventions of the module doc."""
    if method != "flite":
        raise ValueError(f"g2p method must be one of {G2P_METHODS}, got {method!r}")
    prons: dict[str, list[list[str]]] = {}
    said_laughing: dict[str, str] = {}
    plain = []
    for w in dict.fromkeys(words):
        low = w.lower()
        if low.startswith("[laughter-") and low.endswith("]"):
            said_laughing[w] = w[len("[laughter-"):-1]
        elif low in NON_SPEECH:
            prons[w] = [[NON_SPEECH[low]]]
        elif low.startswith("[") or low.endswith("-") or low.startswith("-"):
            prons[w] = [[SPOKEN_NOISE]]
        else:
            plain.append(w)
    found = flite_g2p(plain + list(said_laughing.values()))
    prons.update((w, found[w]) for w in plain if w in found)
    prons.update((w, found[inner]) for w, inner in said_laughing.items() if inner in found)
    return prons
