"""ASR front end: Kaldi fbank of a data dir (jobs, pipes, errors), global CMVN, CTC units.

Audio is generated here (chirps written with soundfile); the entry points are called in-process
through their ``main(argv)``.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi

from gossip_accel.bin import compute_cmvn, compute_fbank, train_units
from gossip_accel.data.cmvn import load_global_cmvn
from gossip_accel.data.features import (FbankOptions, FeatureError, load_utterance, read_audio, read_kaldi_map,
                                        split_contiguous)
from gossip_accel.data.units import Tokenizer


def chirp(seconds: float, rate: int = 16000, f0: float = 100.0, f1: float = 4000.0, seed: int = 0) -> np.ndarray:
    """int16 chirp plus a little noise (so no mel bin is silent)."""
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t ** 2 / (2 * seconds))
    x = 0.5 * np.sin(phase) + 0.01 * np.random.default_rng(seed).standard_normal(t.shape)
    return np.round(x * 32767).astype(np.int16)


def make_data_dir(root: Path, corrupt: bool = False) -> Path:
    """data dir with WAV, FLAC, NIST SPHERE and a pipe entry (+ a corrupt and an empty file)."""
    audio, data = root / "audio", root / "data"
    audio.mkdir(parents=True)
    data.mkdir()
    wav = {}
    for i, (fmt, ext) in enumerate([("WAV", "wav"), ("FLAC", "flac"), ("NIST", "sph"), ("WAV", "wav")]):
        p = audio / f"u{i}.{ext}"
        sf.write(p, chirp(0.5 + 0.25 * i, seed=i), 16000, subtype="PCM_16", format=fmt)
        wav[f"spk-u{i}"] = str(p)
    wav["spk-u4"] = f"cat {audio / 'u0.wav'} |"
    if corrupt:
        (audio / "bad.wav").write_bytes(b"RIFF\x00\x01garbage" * 10)
        sf.write(audio / "empty.wav", np.zeros(0, dtype=np.int16), 16000, subtype="PCM_16")
        wav["spk-bad"] = str(audio / "bad.wav")
        wav["spk-empty"] = str(audio / "empty.wav")
    (data / "wav.scp").write_text("".join(f"{u} {v}\n" for u, v in sorted(wav.items())))
    return data


def test_fbank_equals_torchaudio_and_ark_roundtrip(tmp_path):
    data = make_data_dir(tmp_path)
    compute_fbank.main(["--data", str(data), "--out", str(tmp_path / "fbank"), "--no-progress", "--allow-pipes"])
    feats = read_kaldi_map(data / "feats.scp")
    frames = read_kaldi_map(data / "utt2num_frames")
    assert sorted(feats) == [f"spk-u{i}" for i in range(5)] == list(feats)
    for i in range(4):
        samples = torch.from_numpy(sf.read(tmp_path / "audio" / ["u0.wav", "u1.flac", "u2.sph", "u3.wav"][i],
                                           dtype="int16")[0].astype(np.float32))
        ref = kaldi.fbank(samples[None], num_mel_bins=80, frame_length=25.0, frame_shift=10.0, dither=0.0,
                          sample_frequency=16000.0)
        mine = kaldiio.load_mat(feats[f"spk-u{i}"])
        assert mine.dtype == np.float32 and mine.shape == (ref.shape[0], 80)
        assert int(frames[f"spk-u{i}"]) == ref.shape[0]
        np.testing.assert_array_equal(mine, ref.numpy())
    np.testing.assert_array_equal(kaldiio.load_mat(feats["spk-u4"]), kaldiio.load_mat(feats["spk-u0"]))  # pipe
    assert (tmp_path / "fbank" / "raw_fbank.1.ark").is_file() and (tmp_path / "fbank" / "skipped.txt").read_text() == ""


def test_nj2_equals_nj1_and_options(tmp_path):
    d1 = make_data_dir(tmp_path / "a")
    d2 = tmp_path / "b"
    shutil.copytree(d1, d2)
    compute_fbank.main(["--data", str(d1), "--out", str(tmp_path / "f1"), "--nj", "1", "--num-mel-bins", "40",
                        "--no-progress", "--allow-pipes"])
    compute_fbank.main(["--data", str(d2), "--out", str(tmp_path / "f2"), "--nj", "2", "--num-mel-bins", "40",
                        "--no-progress", "--allow-pipes"])
    s1, s2 = read_kaldi_map(d1 / "feats.scp"), read_kaldi_map(d2 / "feats.scp")
    assert list(s1) == list(s2) and len(s1) == 5
    assert read_kaldi_map(d1 / "utt2num_frames") == read_kaldi_map(d2 / "utt2num_frames")
    assert {v.rsplit(":", 1)[0] for v in s2.values()} == {str((tmp_path / "f2" / f"raw_fbank.{j}.ark").resolve())
                                                          for j in (1, 2)}
    for u in s1:
        a, b = kaldiio.load_mat(s1[u]), kaldiio.load_mat(s2[u])
        assert a.shape[1] == 40
        np.testing.assert_array_equal(a, b)
    assert [len(p) for p in split_contiguous(list(range(7)), 3)] == [3, 2, 2]


def test_several_data_dirs_in_one_call_equal_one_call_each(tmp_path):
    """compute_fbank --data A B --out-root R (the recipes' stage 2): each dir as its own call would make it,
    its archives in R/<dir name>."""
    one = make_data_dir(tmp_path / "one")
    both = [tmp_path / "both" / name for name in ("dev", "test")]
    for d in both:
        shutil.copytree(one, d)
    compute_fbank.main(["--data", str(one), "--out", str(tmp_path / "f1"), "--no-progress", "--allow-pipes"])
    compute_fbank.main(["--data", *map(str, both), "--out-root", str(tmp_path / "fb"), "--nj", "2", "--no-progress",
                        "--allow-pipes"])
    ref = read_kaldi_map(one / "feats.scp")
    for d in both:
        scp = read_kaldi_map(d / "feats.scp")
        assert list(scp) == list(ref) and all(v.startswith(str((tmp_path / "fb" / d.name).resolve())) for v in scp.values())
        for u in ref:
            np.testing.assert_array_equal(kaldiio.load_mat(scp[u]), kaldiio.load_mat(ref[u]))
    with pytest.raises(SystemExit, match="give --out-root with several --data dirs"):
        compute_fbank.main(["--data", *map(str, both), "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="--out-root needs --data dirs of different names"):
        compute_fbank.main(["--data", str(both[0]), str(both[0]), "--out-root", str(tmp_path / "x")])


@pytest.mark.parametrize("nj", [1, 2])
def test_corrupt_audio_fail_or_skip(tmp_path, capsys, nj):
    data = make_data_dir(tmp_path, corrupt=True)
    with pytest.raises(SystemExit) as e:
        compute_fbank.main(["--data", str(data), "--out", str(tmp_path / "f"), "--nj", str(nj), "--no-progress",
                            "--allow-pipes"])
    assert "spk-bad" in str(e.value) and "bad.wav" in str(e.value)
    assert not (data / "feats.scp").exists()

    compute_fbank.main(["--data", str(data), "--out", str(tmp_path / "f"), "--nj", str(nj), "--on-error", "skip",
                        "--no-progress", "--allow-pipes"])
    err = capsys.readouterr().err
    assert "2 utterance(s) skipped" in err and "spk-bad" in err and "spk-empty" in err
    skipped = read_kaldi_map(tmp_path / "f" / "skipped.txt")
    assert sorted(skipped) == ["spk-bad", "spk-empty"] and "no samples" in skipped["spk-empty"]
    feats = read_kaldi_map(data / "feats.scp")
    assert sorted(feats) == [f"spk-u{i}" for i in range(5)]
    assert list(read_kaldi_map(data / "utt2num_frames")) == list(feats)


def test_sample_rate_mismatch_and_bad_pipe(tmp_path):
    p = tmp_path / "x8k.wav"
    sf.write(p, chirp(1.0, rate=8000), 8000, subtype="PCM_16")
    opts = FbankOptions()
    with pytest.raises(FeatureError, match=r"utt8k.*8000 Hz.*--on-rate-mismatch resample"):
        load_utterance(str(p), "utt8k", opts)
    wav = load_utterance(str(p), "utt8k", opts, on_rate_mismatch="resample")
    assert wav.shape[0] == 16000
    with pytest.raises(FeatureError, match=r"uttp.*exited with status"):
        read_audio("false |", "uttp", allow_pipes=True)


def test_segments(tmp_path):
    data = make_data_dir(tmp_path)
    (data / "segments").write_text("seg-a spk-u3 0.0 0.5\nseg-b spk-u3 0.5 -1\n")
    compute_fbank.main(["--data", str(data), "--out", str(tmp_path / "f"), "--nj", "2", "--no-progress", "--allow-pipes"])
    frames = read_kaldi_map(data / "utt2num_frames")
    assert frames == {"seg-a": "48", "seg-b": "73"}  # 0.5 s and 0.75 s at 25/10 ms, snip_edges


def test_cmvn_stats_equal_numpy(tmp_path):
    data = make_data_dir(tmp_path)
    compute_fbank.main(["--data", str(data), "--out", str(tmp_path / "f"), "--no-progress", "--allow-pipes"])
    compute_cmvn.main(["--data", str(data)])
    stats = kaldiio.load_mat(str(data / "cmvn.ark"))
    assert stats.dtype == np.float64 and stats.shape == (2, 81)
    allf = np.concatenate([kaldiio.load_mat(v) for v in read_kaldi_map(data / "feats.scp").values()]).astype(np.float64)
    assert stats[0, 80] == allf.shape[0] and stats[1, 80] == 0
    np.testing.assert_allclose(stats[0, :80], allf.sum(0), rtol=1e-10)
    np.testing.assert_allclose(stats[1, :80], (allf ** 2).sum(0), rtol=1e-10)
    mean, std = load_global_cmvn(data / "cmvn.ark")
    assert mean.dtype == torch.float32 and mean.shape == (80,)
    np.testing.assert_allclose(mean.numpy(), allf.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(std.numpy(), allf.std(0), rtol=1e-4, atol=1e-5)
    from gossip_accel.bin.train_asr import load_cmvn, load_conf

    for overrides, per_utt, per_var in (([], False, False), (["data.utterance_cmn=true"], True, False),
                                        (["data.utterance_cmn=true", "data.utterance_cvn=true"], True, True)):
        norm = load_cmvn(load_conf([], [f"data.train={data}", *overrides]))   # a run's conf picks the norm
        assert (norm.per_utterance, norm.per_utterance_var) == (per_utt, per_var)
        torch.testing.assert_close((norm.mean, norm.std), (mean, std))
    from gossip_accel.sync.config import ConfigError

    with pytest.raises(ConfigError, match=r"data.utterance_cvn: .*needs data.utterance_cmn=true"):
        load_cmvn(load_conf([], [f"data.train={data}", "data.utterance_cvn=true"]))



def test_per_speaker_cmvn_stats_and_norm(tmp_path):
    """compute_cmvn --per-speaker: one Kaldi stats matrix per speaker of utt2spk; data.speaker_cmvn=true normalizes
    each utterance with its speaker's mean and variance (Kaldi's apply-cmvn --utt2spk)."""
    from gossip_accel.bin.train_asr import load_cmvn, load_conf
    from gossip_accel.data.cmvn import FeatureNorm, load_speaker_cmvn
    from gossip_accel.sync.config import ConfigError

    data = make_data_dir(tmp_path)
    compute_fbank.main(["--data", str(data), "--out", str(tmp_path / "f"), "--no-progress", "--allow-pipes"])
    speaker = {"spk-u0": "a", "spk-u1": "a", "spk-u2": "b", "spk-u3": "b", "spk-u4": "b"}
    (data / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s in speaker.items()))
    compute_cmvn.main(["--data", str(data)])
    with pytest.raises(FileNotFoundError, match=r"cmvn_spk.ark not found: .*compute_cmvn --data .* --per-speaker"):
        load_speaker_cmvn(data)
    compute_cmvn.main(["--data", str(data), "--per-speaker"])
    feats = {u: kaldiio.load_mat(v).astype(np.float64) for u, v in read_kaldi_map(data / "feats.scp").items()}
    arks = dict(kaldiio.load_ark(str(data / "cmvn_spk.ark")))
    assert sorted(arks) == ["a", "b"]
    for spk in ("a", "b"):
        allf = np.concatenate([m for u, m in feats.items() if speaker[u] == spk])
        np.testing.assert_allclose(arks[spk][0], [*allf.sum(0), allf.shape[0]], rtol=1e-10)
    np.testing.assert_allclose(sum(arks.values()), kaldiio.load_mat(str(data / "cmvn.ark")), rtol=1e-10)

    norm = load_cmvn(load_conf([], [f"data.train={data}", "data.utterance_cmn=true", "data.utterance_cvn=true",
                                    "data.speaker_cmvn=true"]))
    assert norm.per_speaker
    norm.add_speakers(data)
    assert sorted(norm.speakers) == sorted(speaker)
    out = {u: norm(torch.from_numpy(m).float(), u).double() for u, m in feats.items()}
    for spk in ("a", "b"):   # a speaker's frames together: mean 0, variance 1
        allx = torch.cat([x for u, x in out.items() if speaker[u] == spk])
        torch.testing.assert_close(allx.mean(0), torch.zeros(80, dtype=torch.float64), atol=1e-3, rtol=0)
        torch.testing.assert_close(allx.var(0, unbiased=False), torch.ones(80, dtype=torch.float64), atol=1e-3, rtol=0)
    assert out["spk-u0"].mean(0).abs().max() > 0.01   # not each utterance's own statistics
    with pytest.raises(KeyError, match="utterance nobody: no per-speaker CMVN stats"):
        norm(torch.zeros(3, 80), "nobody")
    norm.add_speakers(data)   # the same dir again: the same stats, no error
    with pytest.raises(ConfigError, match=r"data.speaker_cmvn: .*needs data.utterance_cmn=true"):
        load_cmvn(load_conf([], [f"data.train={data}", "data.speaker_cmvn=true"]))
    assert not FeatureNorm(norm.mean, norm.std, per_utterance=True).speakers   # off: add_speakers reads nothing
    with pytest.raises(SystemExit, match="several --data dirs need --per-speaker"):
        compute_cmvn.main(["--data", str(data), str(data)])
    (data / "utt2spk").write_text("spk-u0 a\n")
    with pytest.raises(SystemExit, match=r"utt2spk has no speaker for 4 utterance\(s\) of .*feats.scp"):
        compute_cmvn.main(["--data", str(data), "--per-speaker"])


def test_feature_norm_global_then_per_utterance_mean():
    from gossip_accel.data.asr import collate
    from gossip_accel.data.cmvn import FeatureNorm

    gen = torch.Generator().manual_seed(0)
    mean, std = torch.randn(4, generator=gen), torch.rand(4, generator=gen) + 0.5
    feats = torch.randn(30, 4, generator=gen) * 3 + 1
    glob = FeatureNorm(mean, std)
    torch.testing.assert_close(glob(feats), (feats - mean) / std)
    utt = FeatureNorm(mean, std, per_utterance=True)
    torch.testing.assert_close(utt(feats).mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(utt(feats).std(0), glob(feats).std(0))   # the variance stays global
    offset = torch.tensor([2.0, -1.0, 0.5, 3.0])   # a voice's or channel's constant spectral offset
    torch.testing.assert_close(utt(feats + offset), utt(feats))
    assert not torch.allclose(glob(feats + offset), glob(feats))


def test_feature_norm_per_utterance_variance():
    from gossip_accel.data.cmvn import FeatureNorm

    gen = torch.Generator().manual_seed(1)
    mean, std = torch.randn(4, generator=gen), torch.rand(4, generator=gen) + 0.5
    feats = torch.randn(50, 4, generator=gen) * 3 + 1
    mvn = FeatureNorm(mean, std, per_utterance=True, per_utterance_var=True)
    out = mvn(feats)
    torch.testing.assert_close(out.mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.pow(2).mean(0), torch.ones(4), atol=1e-4, rtol=0)
    scale = torch.tensor([2.0, 0.5, 1.5, 3.0])   # a scaling of each band goes too, the offset as before
    torch.testing.assert_close(mvn(feats * scale + 7), out, atol=1e-4, rtol=1e-4)
    flat = feats.clone()
    flat[:, 2] = 5.0                               # a band without variation: floored, not divided by zero
    assert torch.isfinite(mvn(flat)).all() and mvn(flat)[:, 2].abs().max() < 1e-4
    with pytest.raises(ValueError, match="needs the per-utterance mean"):
        FeatureNorm(mean, std, per_utterance_var=True)


def test_collate_normalizes_each_utterance_before_padding(tmp_path):
    from gossip_accel.data.asr import Utterance, collate
    from gossip_accel.data.cmvn import FeatureNorm

    rng = np.random.default_rng(0)
    mats = {"a": rng.normal(size=(7, 3)).astype(np.float32) + 5, "b": rng.normal(size=(4, 3)).astype(np.float32) - 2}
    kaldiio.save_ark(str(tmp_path / "f.ark"), mats, scp=str(tmp_path / "f.scp"))
    scp = read_kaldi_map(tmp_path / "f.scp")
    batch = collate([Utterance(u, scp[u], len(m), [1, 2]) for u, m in mats.items()],
                    FeatureNorm(torch.zeros(3), torch.ones(3), per_utterance=True))
    assert batch["lengths"].tolist() == [7, 4]
    torch.testing.assert_close(batch["feats"][0].mean(0), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(batch["feats"][1, :4].mean(0), torch.zeros(3), atol=1e-5, rtol=0)
    assert batch["feats"][1, 4:].abs().sum() == 0   # padding after normalization


@pytest.mark.parametrize("warp", [0.9, 1.1])
def test_vtlp_of_features_approximates_kaldi_vtln_fbank(warp):
    """VTLP on log-mel features moves each bin as Kaldi's VTLN moves its filter: close to the fbank computed with
    that warp (torchaudio's Kaldi fbank, ``vtln_warp``), far closer than the unwarped fbank is."""
    from gossip_accel.data.asr import vtlp

    wave = torch.tensor(chirp(1.0, f0=80.0, f1=7000.0), dtype=torch.float32).unsqueeze(0)
    plain = kaldi.fbank(wave, num_mel_bins=80, dither=0.0)
    warped = kaldi.fbank(wave, num_mel_bins=80, dither=0.0, vtln_warp=warp)
    ours = vtlp(plain, warp)
    assert ours.shape == plain.shape
    assert (ours - warped).abs().mean() < 0.25 * (plain - warped).abs().mean()   # 0.14-0.15 measured
    torch.testing.assert_close(vtlp(plain, 1.0), plain)


def test_vtlp_interpolates_between_the_bins_it_reads():
    """On features linear in the mel bin, VTLP's output is that line at the warped bin positions; no value leaves
    the input's range (edges are clamped, not extrapolated)."""
    from torchaudio.compliance.kaldi import inverse_mel_scale, mel_scale, vtln_warp_freq

    from gossip_accel.data.asr import vtlp

    d = 40
    feats = torch.arange(d, dtype=torch.float32).repeat(3, 1)
    lo, hi = mel_scale(torch.tensor(20.0)), mel_scale(torch.tensor(8000.0))
    step = (hi - lo) / (d + 1)
    centres = inverse_mel_scale(lo + step * torch.arange(1, d + 1, dtype=torch.float64))
    moved = vtln_warp_freq(100.0, 7500.0, 20.0, 8000.0, 1.1, centres)
    expected = ((mel_scale(moved) - lo) / step - 1).clamp(0, d - 1).float()
    torch.testing.assert_close(vtlp(feats, 1.1), expected.repeat(3, 1), rtol=0, atol=1e-4)
    out = vtlp(feats, 0.9)
    assert out.min() >= 0 and out.max() <= d - 1 and out[0, 20] > feats[0, 20]   # 0.9: bins read higher frequencies


TEXT = ["HELLO WORLD", "THE CAT SAT ON THE MAT", "IT'S A DOG'S LIFE", "HELLO THERE GENERAL KENOBI",
        "SPEECH RECOGNITION WITH CONNECTIONIST TEMPORAL CLASSIFICATION", "A MAN A PLAN A CANAL PANAMA"]


@pytest.mark.parametrize("unit_type", ["bpe", "char"])
def test_units_roundtrip_and_layout(tmp_path, unit_type):
    text = tmp_path / "text"
    text.write_text("".join(f"utt{i} {t}\n" for i, t in enumerate(TEXT * 3)) + "utt-empty\n")
    args = ["--text", str(text), "--unit-type", unit_type, "--vocab-size", "60"]
    train_units.main(args + ["--lang-dir", str(tmp_path / "l1")])
    train_units.main(args + ["--lang-dir", str(tmp_path / "l2")])
    assert (tmp_path / "l1" / "bpe.model").read_bytes() == (tmp_path / "l2" / "bpe.model").read_bytes()
    tok = Tokenizer(tmp_path / "l1")
    lines = (tmp_path / "l1" / "tokens.txt").read_text().splitlines()
    assert lines[:2] == ["<blk> 0", "<unk> 1"] and len(lines) == tok.vocab_size
    assert [line.split()[1] for line in lines] == [str(i) for i in range(tok.vocab_size)]
    if unit_type == "bpe":
        assert tok.vocab_size == 60
    else:
        chars = {c for t in TEXT for c in t if c != " "}
        assert tok.vocab_size == 3 + len(chars) and "▁ 2" in lines  # blank, unk, word boundary, chars
    for t in TEXT:
        ids = tok.encode(t)
        assert ids and 0 not in ids and tok.decode(ids) == t
        assert tok.decode([0] + ids + [0]) == t  # blanks dropped
    assert tok.unk_id in tok.encode("HELLO ZZZ")  # Z never seen
    assert tok.decode(tok.encode("HELLO ZZZ")).startswith("HELLO <unk>")


@pytest.mark.parametrize("kind,options", [
    ("dnn", {"context": 2, "hidden": 16, "layers": 2, "subsample": 3}),
    ("cldnn", {"conv_channels": 4, "lstm_cells": 16, "lstm_proj": 8, "lstm_layers": 1, "dnn_hidden": 16, "dnn_layers": 1}),
    ("blstm", {"hidden": 8, "layers": 2, "bottleneck": 6, "subsample": 3}),
    ("tdnn", {"hidden": 8, "layers": 3, "subsample": 3, "dilations": [1, 2]}),
])
def test_acoustic_models_shapes_and_lengths(kind, options):
    """Every model type: (B, T', V) log-probs, T' = ceil-ish(T / subsample), padding ignored."""
    from gossip_accel.models.asr import build_acoustic_model

    torch.manual_seed(0)
    model = build_acoustic_model(kind, 40, 11, options).eval()
    x, lengths = torch.randn(2, 31, 40), torch.tensor([31, 20])
    x[1, 20:] = 0.0  # padding, as collate makes it
    logp, out_lengths = model(x, lengths)
    assert logp.shape[0] == 2 and logp.shape[2] == 11 and int(out_lengths[0]) == logp.shape[1] == 11
    assert int(out_lengths[1]) == 7
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(2, logp.shape[1]))
    # the second utterance's output does not depend on how much padding follows it (the last
    # output frame may: its splice/convolution window reaches past the end)
    alone, _ = model(x[1:, :20], lengths[1:])
    torch.testing.assert_close(logp[1, :6], alone[0, :6], rtol=1e-4, atol=1e-4)
