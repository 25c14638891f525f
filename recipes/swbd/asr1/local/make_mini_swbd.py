#!/usr/bin/env python3
"""Build a small Switchboard offline, in the LDC layouts: two-sided telephone conversations of
synthetic speech (flite voices), 8 kHz two-channel mu-law SPHERE (shortened, as on the discs),
MS-State ``swb_ms98`` transcripts with segment times, and a Hub5'00 (eval2000) test set with its
PEM segmentation and STM reference, SWB and CallHome conversations scored apart.

    python local/make_mini_swbd.py --out data/mini_swbd --jobs 2
    python local/make_mini_swbd.py --out /tmp/mini --train-convs 4 --segs-per-side 4 --eval-convs 1   # tiny

Needs ``flite`` (Debian/Ubuntu: ``apt-get install flite``) and the project's venv (numpy,
soundfile); nothing else (no sox, no sph2pipe: gossip_accel.data.sphere writes the SPHERE files).

Output (``<out>`` plays the role of the LDC corpus directory tree):

    <out>/LDC97S62/swb1_d1/data/sw0NNNN.sph                   Switchboard-1 R2: 8 kHz, 2 channels (A = 1, B = 2),
                                                             ulaw,embedded-shorten-v2.00 (--no-shorten: plain ulaw)
    <out>/LDC97S62/swb_ms98_transcriptions/NN/NNNN/swNNNN[AB]-ms98-a-trans.text
                                                             "swNNNNA-ms98-a-0001 <start> <end> words" per segment,
                                                             [silence] segments in between (the MS-State layout)
    <out>/LDC2002S09/hub5e_00/english/{sw_NNNN,en_NNNN}.sph  eval2000 audio: sw_ = Switchboard, en_ = CallHome
    <out>/LDC2002S09/hub5e_00/english/hub5e_00.pem           "<conv> <A|B> <conv>_<A|B> <start> <end>"
    <out>/LDC2002T43/reference/hub5e00.english.000405.stm    the scoring reference (STM)
    <out>/LDC2002T43/reference/en20000405_hub5.glm           the GLM rules the filter of local/wer_filter.py follows
    <out>/lm_text.txt                                        LM text: Wikipedia sentences, eval articles held out
    <out>/mini_swbd.json                                     arguments, statistics (the stamp)

Conversations: each side is one speaker (a flite voice varied in pitch, tempo and vocal-tract
length, as make_mini_librispeech.py does); sides alternate turns of one or two segments, with
gaps and a little overlap; each side's channel carries a faint echo of the other (telephone
crosstalk), is band-limited to 300-3400 Hz, and gets its own gain and noise floor. Segments
are Wikipedia sentences (local/data/wiki_mini, CC BY-SA: train from wiki.train, eval2000 SWB
from wiki.valid, CallHome from wiki.test; each kept only if flite reads it as written) with the
events of real Switchboard transcripts mixed in:

| event | audio | swb_ms98 transcript | STM (eval2000) |
|---|---|---|---|
| hesitation | flite "uh" / "um" | ``uh`` / ``um`` | ``(%hesitation)`` |
| noise | a rustle / click burst | ``[noise]`` | (not transcribed) |
| laughter | "ha ha" with a tremolo | ``[laughter]`` | (not transcribed) |
| vocalized noise | a short voiced hum | ``[vocalized-noise]`` | (not transcribed) |
| partial word | the first half of a word, cut off, then the sentence | ``th[e]-`` | ``(th-)`` |
| word said laughing | "yeah" / "right" / "okay" with a tremolo | ``[laughter-yeah]`` | ``yeah`` |

Training speakers are variants of kal, kal16, rms and slt (a speaker talks in several
conversations, as in Switchboard); eval2000's SWB half has new variants of the same voices;
its CallHome half is spoken by voice awb (Scottish English), never heard in training, so it is
harder, as CallHome is. One segment per eval side is a noise-only segment the STM marks
``IGNORE_TIME_SEGMENT_IN_SCORING``. ``--more-train-convs N`` adds N training conversations between
speakers of other voices (``--more-train-voices``: espeak-ng's, new variants of the flite voices, ...),
named after the others and re-reading no train_dev sentence (``--dev-segments``); every file of the
build without them stays as it was.

Deterministic (a function of the arguments and the flite build); rerunning with the same
arguments does nothing (``mini_swbd.json``); other arguments rebuild. A folder not built by
this script is never deleted.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path.insert(0, str(REPO / "recipes" / "librispeech" / "asr1" / "local"))
sys.path.insert(0, str(REPO))
import make_mini_librispeech as mls  # noqa: E402  (text selection, voices, flite, resampler)
from gossip_accel.data.sphere import write_sphere  # noqa: E402

PROG = "make_mini_swbd.py"
VERSION = 1
RATE = 8000
STAMP = "mini_swbd.json"
DEFAULT_TEXT = mls.DEFAULT_TEXT
TRAIN_VOICES = ("kal", "kal16", "rms", "slt")
CALLHOME_VOICE = "awb"
LAUGH_WORDS = ("yeah", "right", "okay")
SUBDIRS = ("LDC97S62", "LDC2002S09", "LDC2002T43")


@dataclass
class Config:
    seed: int = 0
    train_convs: int = 30
    segs_per_side: int = 15
    eval_convs: int = 2                 # conversations in each half of eval2000 (SWB, CallHome)
    eval_segs_per_side: int = 12
    train_speakers_per_voice: int = 4
    min_words: int = 4
    max_words: int = 12
    shorten: bool = True
    check_with_flite: bool = True
    p_hesitation: float = 0.15
    p_noise: float = 0.08
    p_laughter: float = 0.05
    p_vocalized: float = 0.05
    p_partial: float = 0.06
    p_laughword: float = 0.05
    text: str = str(DEFAULT_TEXT)
    # more training conversations (0: none), between speakers of groups of voices (flite's, espeak-ng's, ...; never
    # CallHome's), each group's speakers dealt to its voices in turn, drawn from random streams of their own after
    # everything above, so that every conversation of the build without them stays as it was; they read the
    # sentences the others leave unused, then the others' own from the last backwards, never the first
    # dev_segments (local/data.sh's train_dev: the first segments)
    more_train_convs: int = 0
    more_train_voices: tuple = ()       # groups: ((voice, ...), ...)
    more_train_speakers: tuple = ()     # speakers of each group
    dev_segments: int = 150


MORE_KEYS = ("more_train_convs", "more_train_voices", "more_train_speakers", "dev_segments")


# ------------------------------------------------------------------------------- plan

@dataclass
class Piece:
    kind: str            # speech | hes | noise | laugh | vnoise | partial | laughword
    text: str = ""       # transcript words (speech), or the word flite says (hes, partial: whole word, laughword)
    spoken: str = ""     # speech: the punctuated sentence flite reads


@dataclass
class Segment:
    side: str
    pieces: list[Piece]
    ignore: bool = False                 # eval: a noise-only segment the STM ignores
    start: float = 0.0                   # segment bounds on the side's timeline (s)
    end: float = 0.0

    def ms98_words(self) -> str:
        out = []
        for p in self.pieces:
            if p.kind == "speech":
                out += p.text.split()
            elif p.kind == "hes":
                out.append(p.text)
            elif p.kind == "noise":
                out.append("[noise]")
            elif p.kind == "laugh":
                out.append("[laughter]")
            elif p.kind == "vnoise":
                out.append("[vocalized-noise]")
            elif p.kind == "partial":
                h = partial_split(p.text)
                out.append(f"{p.text[:h]}[{p.text[h:]}]-")
            elif p.kind == "laughword":
                out.append(f"[laughter-{p.text}]")
        return " ".join(out)

    def stm_words(self) -> str:
        if self.ignore:
            return "IGNORE_TIME_SEGMENT_IN_SCORING"
        out = []
        for p in self.pieces:
            if p.kind == "speech":
                out += p.text.split()
            elif p.kind == "hes":
                out.append("(%hesitation)")
            elif p.kind == "partial":
                out.append(f"({p.text[:partial_split(p.text)]}-)")
            elif p.kind == "laughword":
                out.append(p.text)
        return " ".join(out)


def partial_split(word: str) -> int:
    """Letters spoken of a cut-off word: about the first half (at least one)."""
    return max(1, (len(word) + 1) // 2 - 1)


@dataclass
class Conversation:
    name: str                            # sw02001 (train), sw_4390 / en_4156 (eval2000)
    corpus: str                          # train | swbd | callhome
    speakers: dict                       # side -> mls.Speaker
    segments: list[Segment] = field(default_factory=list)
    seconds: float = 0.0


def spoken_transcript(s: mls.Sentence) -> tuple[str, str]:
    """(what flite reads, the lower-case transcript words) of a selected sentence."""
    return s.spoken, s.transcript.lower()


def decorate(words: str, spoken: str, rng: random.Random, cfg: Config) -> list[Piece]:
    """A sentence with Switchboard's events around it."""
    pieces: list[Piece] = []
    first = words.split()[0]
    if rng.random() < cfg.p_laughword:
        pieces.append(Piece("laughword", rng.choice(LAUGH_WORDS)))
    if rng.random() < cfg.p_noise:
        pieces.append(Piece("noise"))
    if rng.random() < cfg.p_hesitation:
        pieces.append(Piece("hes", rng.choice(("uh", "um"))))
    if rng.random() < cfg.p_partial and len(first) >= 3 and first.isalpha():
        pieces.append(Piece("partial", first))
    pieces.append(Piece("speech", words, spoken))
    for kind, p in (("laugh", cfg.p_laughter), ("vnoise", cfg.p_vocalized), ("noise", cfg.p_noise / 2)):
        if rng.random() < p:
            pieces.append(Piece(kind))
    return pieces


def plan_conversations(cfg: Config, texts: dict[str, list[mls.Sentence]]) -> list[Conversation]:
    rng = random.Random(f"{cfg.seed}:swbd-speakers")
    train_spk, swbd_spk, ch_spk = [], [], []
    for v in TRAIN_VOICES:
        taken: list = []
        train_spk += [(v, p) for p in mls.draw_variants(v, cfg.train_speakers_per_voice, rng, taken)]
        swbd_spk += [(v, p) for p in mls.draw_variants(v, 1, rng, taken)]
    taken = []
    ch_spk = [(CALLHOME_VOICE, p) for p in mls.draw_variants(CALLHOME_VOICE, max(2, 2 * cfg.eval_convs), rng, taken)]
    ids = iter(rng.sample(range(1000, 1999), len(train_spk) + len(swbd_spk) + len(ch_spk)))

    def speaker(corpus, v, p):
        f0, stretch, warp = p
        return mls.Speaker(next(ids), corpus, v, stretch, f0, warp, round(rng.uniform(-6.0, 0.0), 1))

    train_spk = [speaker("train", v, p) for v, p in train_spk]
    swbd_spk = [speaker("swbd", v, p) for v, p in swbd_spk]
    ch_spk = [speaker("callhome", v, p) for v, p in ch_spk]
    conv_rng = random.Random(f"{cfg.seed}:swbd-conversations")
    names = {"train": [f"sw0{n}" for n in sorted(conv_rng.sample(range(2001, 4941), cfg.train_convs))],
             "swbd": [f"sw_{n}" for n in sorted(conv_rng.sample(range(4000, 5000), cfg.eval_convs))],
             "callhome": [f"en_{n}" for n in sorted(conv_rng.sample(range(4000, 7000), cfg.eval_convs))]}
    convs = []
    for corpus, pool in (("train", train_spk), ("swbd", swbd_spk), ("callhome", ch_spk)):
        nseg = cfg.segs_per_side if corpus == "train" else cfg.eval_segs_per_side
        sents = iter(texts[corpus])
        for k, name in enumerate(names[corpus]):
            if corpus == "train":
                a, b = conv_rng.sample(pool, 2)
            else:                                    # eval: each pair of speakers once
                a, b = pool[(2 * k) % len(pool)], pool[(2 * k + 1) % len(pool)]
            conv = Conversation(name, corpus, {"A": a, "B": b})
            ev = random.Random(f"{cfg.seed}:{name}:events")
            for side in ("A", "B"):
                for i in range(nseg):
                    spoken, words = spoken_transcript(next(sents))
                    conv.segments.append(Segment(side, decorate(words, spoken, ev, cfg)))
                if corpus != "train":                # one noise-only segment the scoring ignores
                    conv.segments.append(Segment(side, [Piece("noise")], ignore=True))
            convs.append(conv)
    if cfg.more_train_convs:
        convs += plan_more_conversations(cfg, texts, convs)
    return convs


def plan_more_conversations(cfg: Config, texts: dict[str, list[mls.Sentence]],
                            convs: list[Conversation]) -> list[Conversation]:
    """cfg.more_train_convs training conversations between the speakers of cfg.more_train_voices' groups (a
    group's cfg.more_train_speakers dealt to its voices in turn; each variant apart from every speaker of its voice
    so far), named after all the others (so Kaldi's train_dev, the first utterances, keeps its conversations),
    reading texts["more"] and then the training sentences from the last backwards, never the first
    cfg.dev_segments."""
    rng = random.Random(f"{cfg.seed}:swbd-more-speakers")
    spoken = [s for c in convs for s in c.speakers.values()]
    pool, drawn = [], {}
    for voices, n_all in zip(cfg.more_train_voices, cfg.more_train_speakers):
        for k, v in enumerate(voices):
            taken = drawn.setdefault(v, [(s.f0, s.stretch, s.warp) for s in spoken if s.voice == v])
            n = len(range(k, n_all, len(voices)))
            pool += [(v, p) for p in mls.draw_variants(v, n, rng, taken)]
    free = sorted(set(range(1000, 9999)) - {s.id for s in spoken})
    pool = [mls.Speaker(i, "train", v, stretch, f0, warp, round(rng.uniform(-6.0, 0.0), 1))
            for i, (v, (f0, stretch, warp)) in zip(rng.sample(free, len(pool)), pool)]
    conv_rng = random.Random(f"{cfg.seed}:swbd-more-conversations")
    first = 1 + max(int(c.name[2:]) for c in convs if c.corpus == "train")
    if 10000 - first < cfg.more_train_convs:
        raise mls.BuildError(f"{cfg.more_train_convs} more training conversations do not fit the names "
                             f"sw0{first}-sw09999; ask for fewer")
    names = [f"sw0{n}" for n in sorted(conv_rng.sample(range(first, 10000), cfg.more_train_convs))]
    again = texts["train"][cfg.dev_segments:][::-1]
    reading = texts.get("more", []) + again
    if not reading:
        raise mls.BuildError(f"no sentence left for the more training conversations: the training set's "
                             f"{len(texts['train'])} segments are all train_dev's (--dev-segments {cfg.dev_segments})")
    sents = (reading[k % len(reading)] for k in range(cfg.more_train_convs * 2 * cfg.segs_per_side))
    out = []
    for name in names:
        a, b = conv_rng.sample(pool, 2)
        conv = Conversation(name, "train", {"A": a, "B": b})
        ev = random.Random(f"{cfg.seed}:{name}:events")
        for side in ("A", "B"):
            for _ in range(cfg.segs_per_side):
                sp, words = spoken_transcript(next(sents))
                conv.segments.append(Segment(side, decorate(words, sp, ev, cfg)))
        out.append(conv)
    return out


def select_texts(cfg: Config, agree=None, stats: Optional[dict] = None) -> dict[str, list[mls.Sentence]]:
    """Sentences per corpus, disjoint: train from wiki.train, eval2000 SWB from wiki.valid, CallHome from wiki.test."""
    text = Path(cfg.text)
    src = {}
    rejected: dict = {}
    for split in ("train", "valid", "test"):
        per_article = mls.eligible_sentences(mls.read_articles(text / f"wiki.{split}.tokens"), cfg.min_words,
                                             cfg.max_words, rejected)
        src[split] = mls.Source(mls.order_articles(per_article, cfg.seed, f"swbd-{split}"))
    used: set = set()
    n_eval = cfg.eval_convs * 2 * cfg.eval_segs_per_side
    out = {"swbd": src["valid"].take(n_eval, used, agree, src["train"], "eval2000 SWB (wiki.valid.tokens)"),
           "callhome": src["test"].take(n_eval, used, agree, src["train"], "eval2000 CallHome (wiki.test.tokens)"),
           "train": src["train"].take(cfg.train_convs * 2 * cfg.segs_per_side, used, agree, None,
                                      "train (wiki.train.tokens)"),
           "more": []}
    for _ in range(cfg.more_train_convs * 2 * cfg.segs_per_side):     # as many unused ones as there are
        try:
            out["more"] += src["train"].take(1, used, agree, None, "more training conversations")
        except mls.BuildError:
            break
    if stats is not None:
        stats["articles"] = {"swbd": src["valid"].titles, "callhome": src["test"].titles, "train": src["train"].titles}
        stats["rejected_sentences"] = rejected
    return out


# ------------------------------------------------------------------------------- audio

def band_limit(x: np.ndarray, rate: int, lo: float = 300.0, hi: float = 3400.0) -> np.ndarray:
    """Telephone band: a smooth FFT mask (no numpy/scipy filters needed)."""
    n = len(x)
    if n == 0:
        return x
    spec = np.fft.rfft(x)
    f = np.fft.rfftfreq(n, 1.0 / rate)
    mask = 1.0 / (1.0 + (lo / np.maximum(f, 1.0)) ** 4) / (1.0 + (f / hi) ** 8)
    return np.fft.irfft(spec * mask, n).astype(np.float32)


def trim(x: np.ndarray, rate: int, db: float = -40.0) -> np.ndarray:
    """Cut the leading/trailing near-silence of a synthesized piece."""
    if len(x) == 0:
        return x
    frame = max(1, rate // 100)
    e = np.sqrt(np.convolve(x.astype(np.float64) ** 2, np.ones(frame) / frame, mode="same"))
    thr = np.max(e) * 10 ** (db / 20)
    idx = np.nonzero(e > thr)[0]
    return x[idx[0]:idx[-1] + 1] if len(idx) else x[:0]


def tremolo(x: np.ndarray, rate: int, hz: float = 6.0, depth: float = 0.6) -> np.ndarray:
    t = np.arange(len(x)) / rate
    return (x * (1.0 - depth * 0.5 * (1 + np.sin(2 * np.pi * hz * t)))).astype(np.float32)


def synth(text: str, spk: mls.Speaker, synthesize: Callable) -> np.ndarray:
    """flite (or the injected synthesizer) -> the speaker's voice at 8 kHz, silence trimmed."""
    x, rate = synthesize(text, spk)
    y = mls.resample(np.asarray(x, dtype=np.float32), round(rate * spk.warp), RATE)
    return trim(y, RATE)


def event_audio(kind: str, spk: mls.Speaker, rng: np.random.Generator, synthesize: Callable) -> np.ndarray:
    if kind == "noise":                      # a rustle or a click: decaying noise burst
        n = int(RATE * rng.uniform(0.15, 0.45))
        env = np.exp(-np.arange(n) / (n * rng.uniform(0.15, 0.5)))
        return (rng.standard_normal(n) * env * 0.15).astype(np.float32)
    if kind == "vnoise":                     # a voiced hum at the speaker's pitch
        n = int(RATE * rng.uniform(0.2, 0.4))
        t = np.arange(n) / RATE
        f0 = spk.f0
        y = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 8) if f0 * k < 3400)
        env = np.sin(np.pi * np.arange(n) / n) ** 2
        return (0.12 * y * env).astype(np.float32)
    if kind == "laugh":
        return tremolo(synth("ha ha", spk, synthesize), RATE, hz=7.0, depth=0.8)
    raise ValueError(kind)


def segment_audio(seg: Segment, spk: mls.Speaker, seed: int, key: str, synthesize: Callable) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{seed}:{key}".encode()))
    parts = []
    for p in seg.pieces:
        if p.kind == "speech":
            y = synth(p.spoken or p.text, spk, synthesize)
        elif p.kind == "hes":
            y = synth(p.text, spk, synthesize)
        elif p.kind == "partial":
            w = synth(p.text, spk, synthesize)
            n = max(1, int(len(w) * rng.uniform(0.35, 0.5)))
            y = w[:n] * np.minimum(1.0, (n - np.arange(n)) / (0.01 * RATE))
        elif p.kind == "laughword":
            y = tremolo(synth(p.text, spk, synthesize), RATE)
        else:
            y = event_audio(p.kind, spk, rng, synthesize)
        if parts:
            parts.append(np.zeros(int(RATE * rng.uniform(0.08, 0.22)), dtype=np.float32))
        parts.append(np.asarray(y, dtype=np.float32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def lay_out(conv: Conversation, audio: dict[int, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """Place the segments on the two sides' timelines (turns of 1-2 segments, gaps, a little
    overlap); set each segment's start/end; return the clean signal of each side."""
    rng = random.Random(f"{seed}:{conv.name}:timeline")
    queues = {s: [i for i, g in enumerate(conv.segments) if g.side == s] for s in "AB"}
    order = []
    side = rng.choice("AB")
    while queues["A"] or queues["B"]:
        if not queues[side]:
            side = "A" if side == "B" else "B"
        for _ in range(min(len(queues[side]), rng.choice((1, 1, 2)))):
            order.append((queues[side].pop(0), side))
        side = "A" if side == "B" else "B"
    t = 0.5
    last_end = {"A": 0.0, "B": 0.0}
    placed = []
    prev_side = None
    for i, s in order:
        n = len(audio[i])
        if prev_side == s:
            t += rng.uniform(0.25, 0.6)          # a pause inside a turn: a new segment
        elif prev_side is not None:
            t += rng.uniform(-0.25, 0.8)         # turn change: gap or a little overlap
        t = max(t, last_end[s] + 0.3)
        start, end = t, t + n / RATE
        placed.append((i, start, end))
        last_end[s] = end
        t = end
        prev_side = s
    total = max(e for _, _, e in placed) + 0.6
    sig = {s: np.zeros(int(total * RATE) + 1, dtype=np.float32) for s in "AB"}
    for i, start, end in placed:
        g = conv.segments[i]
        a = int(round(start * RATE))
        sig[g.side][a:a + len(audio[i])] += audio[i]
        pad_l, pad_r = rng.uniform(0.05, 0.15), rng.uniform(0.05, 0.2)
        g.start, g.end = round(max(0.0, start - pad_l), 2), round(min(total, end + pad_r), 2)
    # segments of one side must not overlap after padding
    for s in "AB":
        segs = sorted((g for g in conv.segments if g.side == s), key=lambda g: g.start)
        for x, y in zip(segs, segs[1:]):
            if x.end > y.start:
                mid = round((x.end + y.start) / 2, 2)
                x.end, y.start = mid, mid
    conv.seconds = round(total, 2)
    return sig


def channelize(sig: dict[str, np.ndarray], conv: Conversation, seed: int, noise_db: float = -52.0) -> np.ndarray:
    """(n, 2) telephone signal: each side + the other's echo, band-limited, gain, noise floor."""
    rng = np.random.default_rng(zlib.crc32(f"{seed}:{conv.name}:channel".encode()))
    out = []
    for s, o in (("A", "B"), ("B", "A")):
        spk = conv.speakers[s]
        delay = int(RATE * 0.03)
        echo = np.concatenate([np.zeros(delay, np.float32), sig[o][:-delay]]) * 10 ** (-30 / 20)
        x = (sig[s] * 10 ** (spk.gain_db / 20) + echo).astype(np.float32)
        x = band_limit(x, RATE)
        x = x + rng.standard_normal(len(x)).astype(np.float32) * 10 ** (noise_db / 20)
        out.append(x)
    y = np.stack(out, axis=1)
    peak = float(np.max(np.abs(y))) or 1.0
    return (y * min(1.0, 0.9 / peak)).astype(np.float32)


# ------------------------------------------------------------------------------- layout

def ms98_name(conv: str) -> str:
    """sw02001 -> sw2001 (the MS-State transcripts drop the leading zero)."""
    return "sw" + conv[3:] if conv.startswith("sw0") else conv


def write_ms98(root: Path, conv: Conversation) -> None:
    """swb_ms98_transcriptions/NN/NNNN/swNNNN[AB]-ms98-a-trans.text: segments and [silence] in between."""
    base = ms98_name(conv.name)
    d = root / "swb_ms98_transcriptions" / base[2:4] / base[2:]
    d.mkdir(parents=True, exist_ok=True)
    for s in "AB":
        segs = sorted((g for g in conv.segments if g.side == s), key=lambda g: g.start)
        spans, t = [], 0.0
        for g in segs:
            if g.start > t + 1e-6:
                spans.append((t, g.start, "[silence]"))
            spans.append((g.start, g.end, g.ms98_words()))
            t = g.end
        if conv.seconds > t + 1e-6:
            spans.append((t, conv.seconds, "[silence]"))
        lines = [f"{base}{s}-ms98-a-{k:04d} {a:.6f} {b:.6f} {w}" for k, (a, b, w) in enumerate(spans, 1)]
        (d / f"{base}{s}-ms98-a-trans.text").write_text("\n".join(lines) + "\n", encoding="utf-8")


GLM = """;; en20000405_hub5.glm (mini): the rules of NIST's Hub5 GLM that local/wer_filter.py applies
;; hesitations are optionally deletable: %HESITATION matches nothing or any of them
[UH] => %HESITATION / [ ] __ [ ]
[UM] => %HESITATION / [ ] __ [ ]
[EH] => %HESITATION / [ ] __ [ ]
[MM] => %HESITATION / [ ] __ [ ]
[HM] => %HESITATION / [ ] __ [ ]
[AH] => %HESITATION / [ ] __ [ ]
[HUH] => %HESITATION / [ ] __ [ ]
[HA] => %HESITATION / [ ] __ [ ]
[ER] => %HESITATION / [ ] __ [ ]
[OOF] => %HESITATION / [ ] __ [ ]
[HEE] => %HESITATION / [ ] __ [ ]
[ACH] => %HESITATION / [ ] __ [ ]
[EEE] => %HESITATION / [ ] __ [ ]
[EW] => %HESITATION / [ ] __ [ ]
;; spelling variants
[OK] => OKAY / [ ] __ [ ]
[ALRIGHT] => ALL RIGHT / [ ] __ [ ]
[UM-HUM] => UH-HUH / [ ] __ [ ]
[MHM] => UH-HUH / [ ] __ [ ]
[MM-HMM] => UH-HUH / [ ] __ [ ]
"""


def write_eval2000(root: Path, convs: list[Conversation]) -> None:
    pem, stm = [], []
    for conv in convs:
        for g in sorted(conv.segments, key=lambda g: (g.side, g.start)):
            pem.append(f"{conv.name} {g.side} {conv.name}_{g.side} {g.start:.2f} {g.end:.2f}")
            gender = conv.speakers[g.side].gender.lower()
            stm.append(f"{conv.name} {g.side} {conv.name}_{g.side} {g.start:.2f} {g.end:.2f} <O,en,{gender}> "
                       f"{g.stm_words()}")
    eng = root / "LDC2002S09" / "hub5e_00" / "english"
    eng.mkdir(parents=True, exist_ok=True)
    (eng / "hub5e_00.pem").write_text(";; mini Hub5'00 PEM: <conv> <side> <conv>_<side> <start> <end>\n"
                                      + "\n".join(pem) + "\n", encoding="utf-8")
    ref = root / "LDC2002T43" / "reference"
    ref.mkdir(parents=True, exist_ok=True)
    (ref / "hub5e00.english.000405.stm").write_text(
        ";; mini Hub5'00 reference: <conv> <side> <speaker> <start> <end> <tags> words\n"
        ";; (%hesitation) and (fragment-) are optionally deletable, as in NIST's STM\n"
        + "\n".join(stm) + "\n", encoding="utf-8")
    (ref / "en20000405_hub5.glm").write_text(GLM, encoding="utf-8")


def sph_path(root: Path, conv: Conversation) -> Path:
    if conv.corpus == "train":
        return root / "LDC97S62" / "swb1_d1" / "data" / f"{conv.name}.sph"
    return root / "LDC2002S09" / "hub5e_00" / "english" / f"{conv.name}.sph"


def build(out: Path, cfg: Config, synthesize: Callable = mls.synthesize,
          read_words: Optional[Callable] = mls.flite_words, jobs: int = 1, progress: bool = False) -> dict:
    t0 = time.time()
    stats: dict = {}
    agree = (lambda c: mls.flite_agrees(c, read_words, jobs=jobs)) if (cfg.check_with_flite and read_words) else None
    texts = select_texts(cfg, agree, stats)
    convs = plan_conversations(cfg, texts)

    def one(conv: Conversation) -> Conversation:
        audio = {i: segment_audio(g, conv.speakers[g.side], cfg.seed, f"{conv.name}:{i}", synthesize)
                 for i, g in enumerate(conv.segments)}
        sig = lay_out(conv, audio, cfg.seed)
        y = channelize(sig, conv, cfg.seed)
        path = sph_path(out, conv)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_sphere(path, y, RATE, "ulaw", shorten=cfg.shorten,
                     extra={"conversation_id": conv.name.replace("sw0", "").replace("sw_", "").replace("en_", "")})
        return conv

    done = []
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        for k, conv in enumerate(ex.map(one, convs), 1):
            done.append(conv)
            if progress and (k % 10 == 0 or k == len(convs)):
                print(f"{PROG}: {k}/{len(convs)} conversations ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    for conv in done:
        if conv.corpus == "train":
            write_ms98(out / "LDC97S62", conv)
    write_eval2000(out, [c for c in done if c.corpus != "train"])
    held_out = {s.transcript for k in ("swbd", "callhome") for s in texts[k]}
    lm = lm_sentences(Path(cfg.text), held_out)
    (out / "lm_text.txt").write_text("".join(s + "\n" for s in lm), encoding="utf-8")
    corpora = {}
    for corpus in ("train", "swbd", "callhome"):
        cs = [c for c in done if c.corpus == corpus]
        segs = [g for c in cs for g in c.segments if not g.ignore]
        corpora[corpus] = {"conversations": len(cs), "segments": len(segs),
                           "hours": round(sum(c.seconds for c in cs) / 3600, 3),
                           "speech_hours": round(sum(g.end - g.start for g in segs) / 3600, 3),
                           "words": sum(len(g.ms98_words().split()) for g in segs),
                           "voices": sorted({s.voice for c in cs for s in c.speakers.values()})}
    stats.update(corpora=corpora, lm_sentences=len(lm), build_seconds=round(time.time() - t0, 1),
                 sides={c.name: {s: c.speakers[s].name() for s in "AB"} for c in done})
    return stats


def lm_sentences(text_dir: Path, held_out: set) -> list[str]:
    """Lower-case normalized sentences of wiki.train, leaving out every article holding an eval sentence."""
    out = []
    for sents in mls.eligible_sentences(mls.read_articles(text_dir / "wiki.train.tokens"), 1, 100):
        trs = [s.transcript for s in sents]
        if not any(t in held_out for t in trs):
            out += [t.lower() for t in trs]
    return out


def _write_stamp(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def more_groups(ap: argparse.ArgumentParser, args) -> tuple[tuple, tuple]:
    """--more-train-voices' ';'-separated groups (patterns expanded) and --more-train-speakers' count for each."""
    try:
        groups, counts = mls.voice_groups(args.more_train_voices, args.more_train_speakers, "--more-train-voices",
                                          "--more-train-speakers")
    except mls.BuildError as e:
        ap.error(str(e))
    voices = [v for g in groups for v in g]
    if not groups or sum(counts) < 2:
        ap.error(f"--more-train-convs {args.more_train_convs} needs --more-train-voices and 2 or more speakers in all "
                 f"(--more-train-speakers): got {args.more_train_voices!r} and {args.more_train_speakers!r}")
    if len(set(voices)) < len(voices):
        ap.error(f"--more-train-voices names a voice in more than one group: {args.more_train_voices!r}")
    if CALLHOME_VOICE in voices:
        ap.error(f"--more-train-voices must not hold {CALLHOME_VOICE}, the voice of eval2000's CallHome half")
    return tuple(tuple(g) for g in groups), tuple(counts)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="corpus root (LDC97S62/, LDC2002S09/, LDC2002T43/ go there)")
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-convs", type=int, default=Config.train_convs)
    ap.add_argument("--segs-per-side", type=int, default=Config.segs_per_side, help="segments per training conversation side")
    ap.add_argument("--eval-convs", type=int, default=Config.eval_convs, help="conversations in each half of eval2000")
    ap.add_argument("--eval-segs-per-side", type=int, default=Config.eval_segs_per_side)
    ap.add_argument("--min-words", type=int, default=Config.min_words)
    ap.add_argument("--max-words", type=int, default=Config.max_words)
    ap.add_argument("--no-shorten", action="store_true", help="plain mu-law SPHERE instead of shortened (as on the discs)")
    ap.add_argument("--no-flite-check", action="store_true")
    ap.add_argument("--more-train-convs", type=int, default=0,
                    help="more training conversations, between speakers of --more-train-voices (0: none); the "
                         "build without them is unchanged, train_dev (the first --dev-segments segments) too")
    ap.add_argument("--more-train-voices", default="",
                    help="their voices: flite's, espeak-ng's (espeak-<accent>-<variant>, or patterns such as "
                         "'espeak-*-m1'), pico-*, piper-*; never CallHome's awb; ';' separates groups, "
                         "e.g. 'kal kal16 rms slt; espeak-*-m1 espeak-*-f2'")
    ap.add_argument("--more-train-speakers", default="0",
                    help="their speakers, one number per group ('16 40'), dealt to the group's voices in turn "
                         "(0, the default: one speaker per voice)")
    ap.add_argument("--dev-segments", type=int, default=Config.dev_segments,
                    help="the first training segments (local/data.sh's --dev-utts), which the more training "
                         "conversations never read again")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    for name in ("train_convs", "segs_per_side", "eval_convs", "eval_segs_per_side", "min_words", "jobs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("more_train_convs", "dev_segments"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    more_voices, more_speakers = more_groups(ap, args) if args.more_train_convs else ((), ())
    cfg = Config(seed=args.seed, train_convs=args.train_convs, segs_per_side=args.segs_per_side,
                 eval_convs=args.eval_convs, eval_segs_per_side=args.eval_segs_per_side, min_words=args.min_words,
                 max_words=args.max_words, shorten=not args.no_shorten, check_with_flite=not args.no_flite_check,
                 text=str(args.text), more_train_convs=args.more_train_convs, more_train_voices=more_voices,
                 more_train_speakers=more_speakers, dev_segments=args.dev_segments)
    out: Path = args.out
    stamp = out / STAMP
    want = {**asdict(cfg), "text": str(Path(cfg.text).resolve()), "version": VERSION}
    want["more_train_voices"] = [list(g) for g in cfg.more_train_voices]
    want["more_train_speakers"] = list(cfg.more_train_speakers)
    if not cfg.more_train_convs:          # the stamps of corpora built before these options stay valid
        for key in MORE_KEYS:
            del want[key]
    try:
        mls.check_synthesizers([*TRAIN_VOICES, CALLHOME_VOICE, *(v for g in cfg.more_train_voices for v in g)])
        if stamp.is_file():
            old = json.loads(stamp.read_text(encoding="utf-8"))
            if old.get("complete") and old.get("config") == want and all((out / s).is_dir() for s in SUBDIRS):
                print(f"{PROG}: {out} is up to date (built with the same arguments; {STAMP}); nothing to do")
                return 0
            print(f"{PROG}: {out} was {'unfinished' if not old.get('complete') else 'built with other arguments'}: "
                  f"rebuilding", file=sys.stderr)
            for s in SUBDIRS:
                shutil.rmtree(out / s, ignore_errors=True)
        elif any((out / s).exists() for s in SUBDIRS):
            raise mls.BuildError(f"{out} holds LDC folders not built by this script (no {STAMP}); "
                                 f"remove them or choose another --out")
        out.mkdir(parents=True, exist_ok=True)
        _write_stamp(stamp, {"config": want, "complete": False})
        print(f"{PROG}: building {out} with {args.jobs} job(s)", file=sys.stderr, flush=True)
        stats = build(out, cfg, jobs=args.jobs, progress=True)
    except mls.BuildError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None
    _write_stamp(stamp, {"config": want, "complete": True, "stats": stats})
    for corpus, s in stats["corpora"].items():
        print(f"{PROG}: {corpus:9s} {s['conversations']:3d} conversations {s['segments']:5d} segments "
              f"{s['hours']:6.3f} h ({s['speech_hours']:.3f} h in segments), voices {','.join(s['voices'])}")
    print(f"{PROG}: wrote {out} in {stats['build_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
