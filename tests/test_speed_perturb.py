"""Speed perturbation: Kaldi's 3-way data dir (sp0.9-/sp1.1- copies) and the on-the-fly speed change."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from gossip_accel.data.features import FbankOptions, compute_fbank_dir
from gossip_accel.data.kaldi.tables import read_table
from gossip_accel.data.speed_perturb import parse_factors, perturb_data_dir_speed, read_speeds


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "train"
    d.mkdir()
    t = np.arange(16000) / 16000
    for utt in ("a-1-0001", "b-2-0001"):
        sf.write(tmp_path / f"{utt}.wav", (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
    (d / "wav.scp").write_text("".join(f"{u} {tmp_path / u}.wav\n" for u in ("a-1-0001", "b-2-0001")))
    (d / "text").write_text("a-1-0001 HELLO WORLD\nb-2-0001 GOSSIP\n")
    (d / "utt2spk").write_text("a-1-0001 a\nb-2-0001 b\n")
    (d / "spk2gender").write_text("a f\nb m\n")
    (d / "utt2dur").write_text("a-1-0001 1\nb-2-0001 1\n")
    return d


def test_three_way_copies_have_prefixed_ids_and_speeds(data_dir, tmp_path):
    dst = tmp_path / "train_sp"
    stats = perturb_data_dir_speed(data_dir, dst)
    assert stats == {"utterances": 6, "speakers": 6}
    text = read_table(dst / "text")
    assert sorted(text) == ["a-1-0001", "b-2-0001", "sp0.9-a-1-0001", "sp0.9-b-2-0001", "sp1.1-a-1-0001",
                            "sp1.1-b-2-0001"]
    assert text["sp1.1-a-1-0001"] == "HELLO WORLD"
    assert read_table(dst / "utt2spk")["sp0.9-b-2-0001"] == "sp0.9-b"
    assert read_table(dst / "spk2utt")["sp0.9-a"] == "sp0.9-a-1-0001"
    assert read_table(dst / "spk2gender")["sp1.1-b"] == "m"
    assert read_table(dst / "wav.scp")["sp0.9-a-1-0001"] == read_table(data_dir / "wav.scp")["a-1-0001"]
    assert float(read_table(dst / "utt2dur")["sp0.9-a-1-0001"]) == pytest.approx(1 / 0.9, abs=1e-3)
    assert read_speeds(dst) == {u: (0.9 if u.startswith("sp0.9") else 1.1 if u.startswith("sp1.1") else 1.0)
                                for u in text}
    with pytest.raises(ValueError, match="already speed-perturbed"):
        perturb_data_dir_speed(dst, tmp_path / "again")


def test_features_of_a_slower_copy_are_longer_and_lower(data_dir, tmp_path):
    """sox's speed f: duration / f and every frequency x f (a 440 Hz tone moves to 396 Hz at 0.9)."""
    dst = tmp_path / "train_sp"
    perturb_data_dir_speed(data_dir, dst)
    compute_fbank_dir(dst, tmp_path / "fbank", FbankOptions(num_mel_bins=40), nj=1, progress=False)
    frames = {u: int(n) for u, n in read_table(dst / "utt2num_frames").items()}
    assert frames["a-1-0001"] == 98                     # 1 s at 10 ms shift, 25 ms window
    assert frames["sp0.9-a-1-0001"] == pytest.approx(98 / 0.9, abs=2)
    assert frames["sp1.1-a-1-0001"] == pytest.approx(98 / 1.1, abs=2)
    import kaldiio

    feats = {u: kaldiio.load_mat(v) for u, v in read_table(dst / "feats.scp").items()}
    peak = {u: int(np.argmax(f.mean(axis=0))) for u, f in feats.items()}
    assert peak["sp0.9-a-1-0001"] <= peak["a-1-0001"] <= peak["sp1.1-a-1-0001"]
    assert peak["sp0.9-a-1-0001"] < peak["sp1.1-a-1-0001"]


def test_bad_factors_are_refused():
    assert parse_factors("0.9,1.0 1.1") == (0.9, 1.0, 1.1)
    for bad in ("", "fast", "0.9 0.9", "3"):
        with pytest.raises(ValueError, match="speed factors"):
            parse_factors(bad)
