"""Additive noise and reverberation of a Kaldi data dir, offline (no RIR or MUSAN corpus needed).

:func:`augment_data_dir` has the shape of Kaldi's ``steps/data/reverberate_data_dir.py``
(Ko et al. 2017) and of the MUSAN augmentation of its x-vector recipes: the output holds the
original utterances and ``copies`` copies of each whose utterance, speaker and recording ids
carry the prefix ``aug<i>-`` (:mod:`gossip_accel.data.kaldi.copy`). ``wav.scp`` keeps the
original audio; ``utt2augment`` says what the feature extraction
(:func:`gossip_accel.data.features.compute_fbank_dir`) does to a copy, one line per utterance::

    aug1-1034-121119-0001 seed=1733 rt60=0.52 drr=4.1 snr=11.3 noise=babble:1089-1-0003,2300-4-0011,...

Every draw is in the table (the seed draws the impulse response's and the noise's samples), so a
copy's audio is the same on every run and machine with the same torch. Applied after the speed
change of ``utt2speed`` (a speed-perturbed dir can be augmented, and an augmented one sped up),
at the feature extraction's sample rate, in this order:

* **Reverberation** (``rt60`` s, ``drr`` dB): the signal convolved with a room impulse response of
  Polack's statistical model (Polack 1988; the reverberant tail of a diffuse field is Gaussian noise
  under an exponential envelope): h(t) = a delta(t) + b(t) exp(-3 ln(10) t / RT60), b white Gaussian,
  0 < t <= RT60, with the direct path a set so that 10 log10(a^2 / sum b(t)^2 exp(.)^2) = DRR.
  The output keeps the input's length (the direct path at lag 0, as ``wav-reverberate`` shifts it)
  and its RMS.
* **Additive noise** (``snr`` dB, ``noise``): ``white``, ``pink`` (power ~ 1/f) or ``brown``
  (~ 1/f^2) noise, or ``babble:<utt>,<utt>,...``, the sum of 3 to 7 other speakers' utterances of
  the same data dir (each tiled to the length, at equal RMS), as MUSAN's babble; added at the SNR by
  ``torchaudio.functional.add_noise`` (power over the whole utterance).
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from .kaldi.copy import PERTURBATIONS, Tables, add_prefixed_copy, read_data_dir_tables, write_data_dir
from .kaldi.tables import read_table

AUGMENT_FILE = PERTURBATIONS[1]   # utt2augment
NOISE_KINDS = ("white", "pink", "brown", "babble")
BABBLE_SPEAKERS = (3, 7)          # MUSAN babble in Kaldi's x-vector recipes: 3-7 speakers
PREFIX = "aug"


@dataclass(frozen=True)
class Augmentation:
    """What ``utt2augment`` says of one utterance (None: that part is off)."""

    seed: int
    rt60: Optional[float] = None
    drr: float = 0.0
    snr: Optional[float] = None
    noise: Optional[str] = None               # white | pink | brown | babble
    sources: tuple[str, ...] = ()             # babble's utterances

    def describe(self) -> str:
        """The ``utt2augment`` value (parsed back by :func:`parse_augmentation`)."""
        parts = [f"seed={self.seed}"]
        if self.rt60 is not None:
            parts += [f"rt60={self.rt60:g}", f"drr={self.drr:g}"]
        if self.snr is not None:
            noise = self.noise + (":" + ",".join(self.sources) if self.sources else "")
            parts += [f"snr={self.snr:g}", f"noise={noise}"]
        return " ".join(parts)


def parse_augmentation(value: str, where: str) -> Augmentation:
    """An ``utt2augment`` value; ``where`` (``<file>: <utt>``) starts the ValueError of a bad one."""
    fields: dict[str, str] = {}
    for token in value.split():
        key, eq, v = token.partition("=")
        if not eq or key not in ("seed", "rt60", "drr", "snr", "noise") or key in fields:
            raise ValueError(f"{where}: {token!r}: expected each of seed=, rt60=, drr=, snr=, noise= at most once")
        fields[key] = v
    try:
        seed = int(fields["seed"])
        rt60 = float(fields["rt60"]) if "rt60" in fields else None
        drr = float(fields.get("drr", 0.0))
        snr = float(fields["snr"]) if "snr" in fields else None
    except KeyError:
        raise ValueError(f"{where}: {value!r} has no seed=") from None
    except ValueError as e:
        raise ValueError(f"{where}: {value!r}: {e}") from None
    if rt60 is not None and not 0.0 < rt60 <= 5.0:
        raise ValueError(f"{where}: rt60={rt60}: a reverberation time in (0, 5] seconds")
    if not all(map(math.isfinite, [drr] + ([snr] if snr is not None else []))):
        raise ValueError(f"{where}: {value!r}: drr and snr must be finite dB")
    noise, _, sources = fields.get("noise", "").partition(":")
    if (snr is None) != (noise == ""):
        raise ValueError(f"{where}: {value!r}: snr= and noise= go together")
    if noise and noise not in NOISE_KINDS:
        raise ValueError(f"{where}: noise={noise}: one of {', '.join(NOISE_KINDS)}")
    srcs = tuple(s for s in sources.split(",") if s)
    if (noise == "babble") != bool(srcs):
        raise ValueError(f"{where}: {value!r}: babble names its utterances (noise=babble:<utt>,<utt>,...), "
                         f"and only babble does")
    return Augmentation(seed, rt60, drr, snr, noise or None, srcs)


def read_augmentations(data_dir: str | Path) -> dict[str, Augmentation]:
    """``<data>/utt2augment`` as {utt: Augmentation}; empty when the data dir has none."""
    path = Path(data_dir) / AUGMENT_FILE
    if not path.is_file():
        return {}
    return {utt: parse_augmentation(v, f"{path}: {utt}") for utt, v in read_table(path).items()}


# --------------------------------------------------------------------------- the signal


def polack_rir(rt60: float, drr_db: float, rate: int, generator: torch.Generator) -> torch.Tensor:
    """Polack's statistical room impulse response (module docstring): direct path at lag 0, then
    Gaussian noise under exp(-3 ln(10) t / RT60) for RT60 seconds, direct/reverberant energy = DRR."""
    n = max(2, int(round(rt60 * rate)))
    t = torch.arange(1, n, dtype=torch.float64) / rate
    tail = torch.randn(n - 1, generator=generator, dtype=torch.float64) * torch.exp(-3.0 * math.log(10.0) * t / rt60)
    direct = math.sqrt(float(tail.square().sum()) * 10.0 ** (drr_db / 10.0))
    return torch.cat([torch.tensor([direct], dtype=torch.float64), tail]).float()


def reverberate(wav: torch.Tensor, rir: torch.Tensor) -> torch.Tensor:
    """``wav`` convolved with ``rir``, cut to its length, at its RMS."""
    import torchaudio.functional as AF

    out = AF.fftconvolve(wav.double(), rir.double())[: wav.numel()]
    rms_in, rms_out = wav.double().square().mean().sqrt(), out.square().mean().sqrt()
    return (out * (rms_in / rms_out) if rms_out > 0 else out).to(wav.dtype)


def colored_noise(kind: str, n: int, generator: torch.Generator) -> torch.Tensor:
    """Unit-RMS ``white``, ``pink`` (power ~ 1/f) or ``brown`` (~ 1/f^2) noise of ``n`` samples."""
    white = torch.randn(n, generator=generator, dtype=torch.float64)
    if kind != "white":
        spectrum = torch.fft.rfft(white)
        f = torch.arange(spectrum.numel(), dtype=torch.float64)
        f[0] = 1.0   # the DC bin is zeroed below
        spectrum = spectrum / (f.sqrt() if kind == "pink" else f)
        spectrum[0] = 0
        white = torch.fft.irfft(spectrum, n=n)
    return (white / white.square().mean().sqrt().clamp_min(1e-30)).float()


def babble(sources: Sequence[torch.Tensor], n: int) -> torch.Tensor:
    """The sum of ``sources``, each tiled (repeated) or cut to ``n`` samples at unit RMS."""
    out = torch.zeros(n, dtype=torch.float64)
    for s in sources:
        s = s.double()
        s = s.repeat(-(-n // s.numel()))[:n]
        rms = s.square().mean().sqrt()
        if rms > 0:
            out += s / rms
    return out.float()


def apply_augmentation(wav: torch.Tensor, rate: int, aug: Augmentation,
                       load_source: Callable[[str], torch.Tensor]) -> torch.Tensor:
    """``wav`` (1-D, any scale) reverberated, then with noise added, as ``aug`` says (module
    docstring); ``load_source(utt)`` gives a babble utterance's samples at the same rate."""
    import torchaudio.functional as AF

    gen = torch.Generator().manual_seed(aug.seed)
    if aug.rt60 is not None:
        wav = reverberate(wav, polack_rir(aug.rt60, aug.drr, rate, gen))
    if aug.snr is not None:
        if aug.noise == "babble":
            noise = babble([load_source(u) for u in aug.sources], wav.numel())
        else:
            noise = colored_noise(aug.noise, wav.numel(), gen)
        if noise.square().sum() > 0 and wav.square().sum() > 0:
            wav = AF.add_noise(wav[None].float(), noise[None], torch.tensor([aug.snr]))[0]
    return wav


# --------------------------------------------------------------------------- the data dir


def parse_range(text: str, what: str, low: float, high: float) -> tuple[float, float]:
    """``"5 20"`` / ``"5,20"`` (a uniform draw in [5, 20]) or ``"10"`` (always 10), inside [low, high]."""
    try:
        values = [float(x) for x in re.split(r"[\s,]+", text.strip()) if x]
    except ValueError:
        raise ValueError(f"{what} {text!r}: give one number or a range 'min,max'") from None
    if len(values) == 1:
        values *= 2
    if len(values) != 2 or not low <= values[0] <= values[1] <= high:
        raise ValueError(f"{what} {text!r}: give one number or a range 'min,max' within [{low:g}, {high:g}]")
    return values[0], values[1]


def parse_kinds(text: str) -> tuple[str, ...]:
    """``"babble,pink"`` or ``"babble pink"`` -> ('babble', 'pink'), each of :data:`NOISE_KINDS`."""
    kinds = tuple(k for k in re.split(r"[\s,]+", text.strip()) if k)
    bad = [k for k in kinds if k not in NOISE_KINDS]
    if not kinds or bad or len(set(kinds)) != len(kinds):
        raise ValueError(f"noise kinds {text!r}: distinct names among {', '.join(NOISE_KINDS)}")
    return kinds


@dataclass(frozen=True)
class AugmentOptions:
    """How :func:`augment_data_dir` draws each copy's augmentation (ranges are uniform draws)."""

    copies: int = 1
    reverb_probability: float = 0.5
    rt60: tuple[float, float] = (0.2, 0.8)          # seconds
    drr: tuple[float, float] = (0.0, 10.0)          # dB
    noise_probability: float = 1.0
    snr: tuple[float, float] = (5.0, 20.0)          # dB
    noise: tuple[str, ...] = ("babble", "pink", "white")
    seed: int = 1

    def __post_init__(self):
        if not 1 <= self.copies <= 20:
            raise ValueError(f"copies {self.copies}: between 1 and 20")
        for name in ("reverb_probability", "noise_probability"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} {getattr(self, name)}: a probability in [0, 1]")


def draw_augmentation(rng: random.Random, opts: AugmentOptions, utt: str, others: Sequence[str]) -> Augmentation:
    """One copy's augmentation: reverberation and noise each with their probability (a copy that
    draws neither is its original's audio again); babble's 3-7 utterances drawn among ``others``
    (the other speakers' utterances)."""
    seed = rng.randrange(2 ** 31)
    rt60 = drr = snr = kind = None
    sources: tuple[str, ...] = ()
    if rng.random() < opts.reverb_probability:
        rt60, drr = rng.uniform(*opts.rt60), rng.uniform(*opts.drr)
    if rng.random() < opts.noise_probability:
        snr, kind = rng.uniform(*opts.snr), rng.choice(opts.noise)
        if kind == "babble":
            if not others:
                raise ValueError(f"babble noise for {utt}: the data dir has no other speaker's utterances")
            sources = tuple(sorted(rng.sample(others, min(len(others), rng.randint(*BABBLE_SPEAKERS)))))
    return Augmentation(seed, None if rt60 is None else round(rt60, 3), round(drr or 0.0, 2),
                        None if snr is None else round(snr, 2), kind, sources)


def augment_data_dir(src: str | Path, dst: str | Path, opts: AugmentOptions = AugmentOptions()) -> dict:
    """Write ``dst``: the utterances of ``src`` and ``opts.copies`` augmented copies of each
    (module docstring). Returns {"utterances", "speakers", "reverberated", "noise": {kind: n}}.
    A ``src`` that already has ``utt2augment`` is refused; ``utt2speed`` is carried over."""
    src, dst = Path(src), Path(dst)
    tables = read_data_dir_tables(src)
    if AUGMENT_FILE in tables:
        raise ValueError(f"{src / AUGMENT_FILE} exists: {src} is already augmented")
    speakers = dict(tables["utt2spk"])
    missing = sorted(set(tables["text"]) - set(speakers))
    if missing:
        raise ValueError(f"{src / 'utt2spk'}: no speaker for {missing[0]} (and {len(missing) - 1} more); "
                         f"run utils/fix_data_dir.sh {src}")
    others = {spk: sorted(u for u, s in speakers.items() if s != spk) for spk in set(speakers.values())}
    rng = random.Random(opts.seed)
    out: Tables = {}
    add_prefixed_copy(out, tables, "")
    augmentations: dict[str, str] = {}
    stats = {"reverberated": 0, "noise": {k: 0 for k in opts.noise}}
    for i in range(1, opts.copies + 1):
        prefix = f"{PREFIX}{i}-"
        add_prefixed_copy(out, tables, prefix)
        for utt in sorted(tables["text"]):
            aug = draw_augmentation(rng, opts, utt, others[speakers[utt]])
            augmentations[prefix + utt] = aug.describe()
            stats["reverberated"] += aug.rt60 is not None
            if aug.noise:
                stats["noise"][aug.noise] += 1
    out[AUGMENT_FILE] = augmentations
    return {**write_data_dir(dst, out, src), **stats}
