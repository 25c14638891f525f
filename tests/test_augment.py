"""Noise and reverberation of a Kaldi data dir: the aug<i>- copies, utt2augment, and the signal."""
from __future__ import annotations

import math
import subprocess
import sys
import zlib

import kaldiio
import numpy as np
import pytest
import soundfile as sf
import torch

from gossip_accel.data.augment import (AUGMENT_FILE, Augmentation, AugmentOptions, apply_augmentation,
                                       augment_data_dir, colored_noise, parse_augmentation, parse_kinds,
                                       parse_range, polack_rir, read_augmentations, reverberate)
from gossip_accel.data.features import FbankOptions, FeatureError, compute_fbank, compute_fbank_dir, load_utterance
from gossip_accel.data.kaldi.tables import read_table
from gossip_accel.data.speed_perturb import perturb_data_dir_speed, read_speeds

RATE = 16000
UTTS = [f"{spk}-{i}" for spk in ("a", "b", "c") for i in range(3)]


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "train"
    d.mkdir()
    rng = np.random.default_rng(0)
    for k, utt in enumerate(UTTS):
        t = np.arange(int(RATE * (0.6 + 0.1 * k))) / RATE
        sig = 0.2 * np.sin(2 * np.pi * (300 + 40 * k) * t) + 0.005 * rng.standard_normal(t.size)
        sf.write(tmp_path / f"{utt}.wav", sig.astype(np.float32), RATE)
    (d / "wav.scp").write_text("".join(f"{u} {tmp_path / u}.wav\n" for u in UTTS))
    (d / "text").write_text("".join(f"{u} WORD {u[0].upper()}\n" for u in UTTS))
    (d / "utt2spk").write_text("".join(f"{u} {u[0]}\n" for u in UTTS))
    (d / "spk2gender").write_text("a f\nb m\nc f\n")
    return d


def feats(data_dir) -> dict[str, np.ndarray]:
    return {u: kaldiio.load_mat(v) for u, v in read_table(data_dir / "feats.scp").items()}


def test_copies_have_prefixed_ids_and_every_draw_in_the_table(data_dir, tmp_path):
    opts = AugmentOptions(copies=2, reverb_probability=0.5, noise_probability=1.0, seed=3)
    stats = augment_data_dir(data_dir, tmp_path / "aug", opts)
    dst = tmp_path / "aug"
    assert stats["utterances"] == 27 and stats["speakers"] == 9
    assert sum(stats["noise"].values()) == 18 and 0 < stats["reverberated"] < 18
    text = read_table(dst / "text")
    assert sorted(text) == sorted(UTTS + [f"aug{i}-{u}" for i in (1, 2) for u in UTTS])
    assert text["aug2-b-1"] == "WORD B" and read_table(dst / "utt2spk")["aug1-c-2"] == "aug1-c"
    assert read_table(dst / "spk2gender")["aug2-b"] == "m"
    assert read_table(dst / "wav.scp")["aug1-a-0"] == read_table(data_dir / "wav.scp")["a-0"]
    augs = read_augmentations(dst)
    assert sorted(augs) == sorted(u for u in text if u.startswith("aug"))
    for utt, aug in augs.items():
        assert parse_augmentation(aug.describe(), "x") == aug
        assert aug.rt60 is None or (0.2 <= aug.rt60 <= 0.8 and 0 <= aug.drr <= 10)
        assert 5 <= aug.snr <= 20 and aug.noise in ("babble", "pink", "white")
        if aug.noise == "babble":   # 3-7 utterances of the other speakers (there are 6)
            speaker = utt.split("-")[1]
            assert 3 <= len(aug.sources) <= 6 and all(s in UTTS and s[0] != speaker for s in aug.sources)
    # the same seed draws the same table; another seed another
    augment_data_dir(data_dir, tmp_path / "again", opts)
    assert (tmp_path / "again" / AUGMENT_FILE).read_text() == (dst / AUGMENT_FILE).read_text()
    augment_data_dir(data_dir, tmp_path / "other", AugmentOptions(copies=2, seed=4))
    assert (tmp_path / "other" / AUGMENT_FILE).read_text() != (dst / AUGMENT_FILE).read_text()
    with pytest.raises(ValueError, match="already augmented"):
        augment_data_dir(dst, tmp_path / "twice")


def test_polack_impulse_response_has_its_drr_and_decay():
    rir = polack_rir(0.5, 6.0, RATE, torch.Generator().manual_seed(1)).double()
    assert rir.numel() == RATE // 2
    assert 10 * math.log10(rir[0] ** 2 / rir[1:].square().sum()) == pytest.approx(6.0, abs=1e-4)
    # energy per 100 ms falls by 60 dB per RT60: 12 dB per 100 ms at 0.5 s
    e = [rir[1 + i * 1600: 1 + (i + 1) * 1600].square().sum().item() for i in range(4)]
    for a, b in zip(e, e[1:]):
        assert 10 * math.log10(a / b) == pytest.approx(12.0, abs=1.5)


def test_reverberation_keeps_length_and_rms_and_noise_has_its_snr():
    gen = torch.Generator().manual_seed(0)
    x = torch.sin(torch.arange(8000) / 7.0) * 3000
    y = reverberate(x, polack_rir(0.4, 3.0, RATE, gen))
    assert y.shape == x.shape and y.square().mean().sqrt().item() == pytest.approx(x.square().mean().sqrt().item(), rel=1e-5)
    assert not torch.allclose(y, x)
    for kind in ("white", "pink", "brown"):
        n = colored_noise(kind, 8000, torch.Generator().manual_seed(1))
        assert n.square().mean().item() == pytest.approx(1.0, rel=1e-4)
        out = apply_augmentation(x, RATE, Augmentation(seed=5, snr=10.0, noise=kind), lambda u: None)
        snr = 10 * math.log10(x.square().sum() / (out - x).square().sum())
        assert snr == pytest.approx(10.0, abs=0.01), kind
    spectrum = {k: torch.fft.rfft(colored_noise(k, 1 << 14, torch.Generator().manual_seed(2))).abs().square()
                for k in ("white", "pink", "brown")}
    low = {k: s[1:400].mean() / s[4000:8000].mean() for k, s in spectrum.items()}   # low band over high band
    assert low["white"] < low["pink"] < low["brown"]
    # the same seed, the same audio
    aug = Augmentation(seed=9, rt60=0.3, drr=2.0, snr=8.0, noise="pink")
    assert torch.equal(apply_augmentation(x, RATE, aug, None), apply_augmentation(x, RATE, aug, None))


def test_features_of_the_copies_and_babble_of_other_utterances(data_dir, tmp_path):
    compute_fbank_dir(data_dir, tmp_path / "fb0", FbankOptions(num_mel_bins=40), nj=1, progress=False)
    dst = tmp_path / "aug"
    augment_data_dir(data_dir, dst, AugmentOptions(copies=1, noise=("babble",), reverb_probability=1.0))
    compute_fbank_dir(dst, tmp_path / "fb1", FbankOptions(num_mel_bins=40), nj=2, progress=False)
    orig, out = feats(data_dir), feats(dst)
    for u in UTTS:
        np.testing.assert_array_equal(out[u], orig[u])            # the originals are untouched
        assert out[f"aug1-{u}"].shape == orig[u].shape             # same length, other audio
        assert not np.allclose(out[f"aug1-{u}"], orig[u])
    # one copy by hand: the babble of its sources, the same samples as the feature extraction used
    aug = read_augmentations(dst)["aug1-a-1"]
    opts = FbankOptions(num_mel_bins=40)
    wav_scp = read_table(data_dir / "wav.scp")
    x = load_utterance(wav_scp["a-1"], "a-1", opts)
    y = apply_augmentation(x, RATE, aug, lambda s: load_utterance(wav_scp[s], s, opts))
    np.testing.assert_allclose(compute_fbank(y, opts, seed=zlib.crc32(b"aug1-a-1")).numpy(), out["aug1-a-1"],
                               rtol=0, atol=1e-4)
    # again: the same features
    compute_fbank_dir(dst, tmp_path / "fb2", FbankOptions(num_mel_bins=40), nj=1, progress=False)
    again = feats(dst)
    assert all(np.array_equal(again[u], out[u]) for u in out)


def test_each_babble_source_is_decoded_once_per_job(data_dir, tmp_path, monkeypatch):
    import gossip_accel.data.features as features

    dst = tmp_path / "aug"
    augment_data_dir(data_dir, dst, AugmentOptions(copies=2, noise=("babble",), reverb_probability=0.0))
    named = [u for a in read_augmentations(dst).values() for u in a.sources]
    assert len(named) > len(set(named))            # sources are shared between copies
    reads: dict[str, int] = {}
    real = features.read_audio

    def counting(spec, *args, **kwargs):
        reads[spec] = reads.get(spec, 0) + 1
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(features, "read_audio", counting)
    compute_fbank_dir(dst, tmp_path / "fb", FbankOptions(num_mel_bins=40), nj=1, progress=False)
    # each file: once for each of its three utterances (the original, aug1-, aug2-), then at
    # most once more as a babble source, however many copies name it
    assert max(reads.values()) <= 4 and sum(reads.values()) < len(UTTS) * 3 + len(named)


def test_speed_then_augmentation(data_dir, tmp_path):
    perturb_data_dir_speed(data_dir, tmp_path / "sp", (0.9, 1.0))
    augment_data_dir(tmp_path / "sp", tmp_path / "sp_aug", AugmentOptions(copies=1, noise=("white",)))
    speeds = read_speeds(tmp_path / "sp_aug")
    assert speeds["aug1-sp0.9-a-0"] == 0.9 and speeds["aug1-a-0"] == 1.0
    compute_fbank_dir(tmp_path / "sp_aug", tmp_path / "fb", FbankOptions(num_mel_bins=40), nj=1, progress=False)
    frames = {u: int(n) for u, n in read_table(tmp_path / "sp_aug" / "utt2num_frames").items()}
    assert frames["aug1-sp0.9-a-0"] == frames["sp0.9-a-0"] > frames["a-0"]
    # and an augmented dir sped up: the copy carries its augmentation
    augment_data_dir(data_dir, tmp_path / "aug_only")
    perturb_data_dir_speed(tmp_path / "aug_only", tmp_path / "aug_sp", (1.0, 1.1))
    augs = read_augmentations(tmp_path / "aug_sp")
    assert augs["sp1.1-aug1-b-2"] == augs["aug1-b-2"]


def test_bad_input_is_named(data_dir, tmp_path):
    for value, match in (("rt60=0.3", "no seed"), ("seed=1 rt60=x", "could not convert"), ("seed=1 snr=5", "go together"),
                         ("seed=1 snr=5 noise=rain", "noise=rain"), ("seed=1 snr=5 noise=babble", "names its"),
                         ("seed=1 rt60=9", "rt60=9"), ("seed=1 seed=2", "at most once"), ("seed=1 gain=2", "gain=2")):
        with pytest.raises(ValueError, match=match) as e:
            parse_augmentation(value, "data/x/utt2augment: u1")
        assert str(e.value).startswith("data/x/utt2augment: u1: ") and "\n" not in str(e.value)
    dst = tmp_path / "aug"
    augment_data_dir(data_dir, dst, AugmentOptions(noise=("babble",)))
    table = (dst / AUGMENT_FILE).read_text().replace("noise=babble:", "noise=babble:ghost-1,")
    (dst / AUGMENT_FILE).write_text(table)
    with pytest.raises(FeatureError, match=r"utt2augment: aug1-a-0: babble source ghost-1 is not an utterance"):
        compute_fbank_dir(dst, tmp_path / "fb", FbankOptions(num_mel_bins=40), progress=False)
    assert not (dst / "feats.scp").exists()
    for bad, match in (("5 x", "--snr"), ("20,5", "--snr"), ("1 2 3", "--snr")):
        with pytest.raises(ValueError, match=match):
            parse_range(bad, "--snr", -20, 60)
    assert parse_range("10", "--snr", -20, 60) == (10.0, 10.0) and parse_kinds("babble pink") == ("babble", "pink")
    with pytest.raises(ValueError, match="noise kinds"):
        parse_kinds("rain")
    cli = subprocess.run([sys.executable, "-m", "gossip_accel.bin.augment_data", "--src", str(data_dir), "--dst",
                          str(tmp_path / "c"), "--noise", "rain"], capture_output=True, text=True)
    assert cli.returncode == 1 and cli.stderr.strip().count("\n") == 0 and "noise kinds 'rain'" in cli.stderr
    ok = subprocess.run([sys.executable, "-m", "gossip_accel.bin.augment_data", "--src", str(data_dir), "--dst",
                         str(tmp_path / "c"), "--copies", "2", "--noise", "pink", "--reverb-probability", "1"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "27 utterances, 9 speakers; copies reverberated 18, with noise: pink 18" in ok.stdout
