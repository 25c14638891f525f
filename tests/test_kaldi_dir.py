"""gossip_accel.data.kaldi: tables, validate_data_dir, fix_data_dir, and their entry points
(python -m gossip_accel.bin.{validate,fix}_data_dir, utils/{validate,fix}_data_dir.sh)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gossip_accel.bin import fix_data_dir as fix_bin
from gossip_accel.bin import validate_data_dir as validate_bin
from gossip_accel.data import kaldi as kd

ROOT = Path(__file__).resolve().parent.parent


def write(d: Path, name: str, text: str | bytes) -> Path:
    p = d / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def make_dir(tmp_path: Path, n: int = 4, spaces: bool = False) -> Path:
    """A valid data dir: speakers spkA/spkB, n utterances, real (empty) audio files."""
    d = tmp_path / "data"
    d.mkdir(parents=True)
    audio = tmp_path / ("my audio" if spaces else "audio")
    audio.mkdir()
    wav, text, u2s = {}, {}, {}
    for i in range(n):
        spk = "spkA" if i < n // 2 else "spkB"
        u = f"{spk}-{i:03d}"
        f = audio / f"{u}.flac"
        f.write_bytes(b"x")
        wav[u], text[u], u2s[u] = str(f), f"WORD {i}", spk
    kd.write_wav_scp(d / "wav.scp", wav)
    kd.write_text(d / "text", text)
    kd.write_utt2spk(d / "utt2spk", u2s)
    kd.write_spk2utt(d / "spk2utt", kd.utt2spk_to_spk2utt(u2s))
    return d


# ---------------------------------------------------------------- tables

def test_roundtrip_all_tables(tmp_path):
    d = tmp_path
    kd.write_wav_scp(d / "wav.scp", {"b": "/x/y z.flac", "a": "flac -d -c a.flac |"})
    assert (d / "wav.scp").read_text() == "a flac -d -c a.flac |\nb /x/y z.flac\n"
    assert kd.read_wav_scp(d / "wav.scp") == {"a": "flac -d -c a.flac |", "b": "/x/y z.flac"}
    kd.write_text(d / "text", {"u1": "HELLO  WORLD"})
    assert kd.read_text(d / "text") == {"u1": "HELLO  WORLD"}
    kd.write_spk2utt(d / "spk2utt", {"s": ["u2", "u1"]})
    assert (d / "spk2utt").read_text() == "s u1 u2\n"
    assert kd.read_spk2utt(d / "spk2utt") == {"s": ["u1", "u2"]}
    kd.write_segments(d / "segments", {"u1": ("r1", 0.0, 1.25)})
    assert (d / "segments").read_text() == "u1 r1 0 1.25\n"
    assert kd.read_segments(d / "segments") == {"u1": ("r1", 0.0, 1.25)}
    kd.write_reco2file_and_channel(d / "reco2file_and_channel", {"r1": ("sw02001", "A")})
    assert kd.read_reco2file_and_channel(d / "reco2file_and_channel") == {"r1": ("sw02001", "A")}
    kd.write_feats_scp(d / "feats.scp", {"u1": "/f/raw.ark:17"})
    assert kd.read_feats_scp(d / "feats.scp") == {"u1": "/f/raw.ark:17"}
    kd.write_utt2num_frames(d / "utt2num_frames", {"u1": 125})
    assert kd.read_utt2num_frames(d / "utt2num_frames") == {"u1": 125}
    kd.write_utt2dur(d / "utt2dur", {"u1": 1.25, "u2": 3.0})
    assert kd.read_utt2dur(d / "utt2dur") == {"u1": 1.25, "u2": 3.0}
    kd.write_utt2spk(d / "utt2spk", {"u1": "s"})
    assert kd.read_utt2spk(d / "utt2spk") == {"u1": "s"}


def test_write_sorts_in_c_order_and_rejects_bad_keys(tmp_path):
    kd.write_table(tmp_path / "t", {"b": "1", "B": "2", "a-1": "3", "a": "4", "é": "5"})
    keys = [ln.split()[0] for ln in (tmp_path / "t").read_text(encoding="utf-8").splitlines()]
    assert keys == sorted(keys, key=lambda k: k.encode("utf-8")) == ["B", "a", "a-1", "b", "é"]
    with pytest.raises(ValueError, match="invalid key"):
        kd.write_table(tmp_path / "t", {"a b": "x"})
    with pytest.raises(ValueError, match="line break"):
        kd.write_table(tmp_path / "t", {"a": "x\ny"})


def test_read_table_errors_name_file_and_line(tmp_path):
    p = write(tmp_path, "text", "a X\nb Y\na Z\n")
    with pytest.raises(kd.DataDirError, match=r"text:3: duplicate key a \(first on line 1\)"):
        kd.read_table(p)
    p = write(tmp_path, "text2", b"a X\nb caf\xe9\n")
    with pytest.raises(kd.DataDirError, match=r"text2:2: not UTF-8"):
        kd.read_table(p)


# ---------------------------------------------------------------- validate

def test_valid_dir_with_spaces_in_paths(tmp_path):
    d = make_dir(tmp_path, spaces=True)
    assert " " in (d / "wav.scp").read_text()
    assert kd.validate_data_dir(d) == []


def test_validate_reports_missing_required_file(tmp_path):
    d = make_dir(tmp_path)
    (d / "spk2utt").unlink()
    probs = kd.validate_data_dir(d)
    assert any("spk2utt: missing (required)" in p for p in probs), probs
    assert kd.validate_data_dir(d, need=("wav.scp", "text", "utt2spk")) == []


def test_validate_unsorted_and_duplicated_keys(tmp_path):
    d = make_dir(tmp_path)
    lines = (d / "text").read_text().splitlines()
    write(d, "text", "\n".join([lines[1], lines[0], *lines[2:], lines[3]]) + "\n")
    probs = kd.validate_data_dir(d)
    assert any(p.endswith("text:2: not sorted: spkA-000 after spkA-001 (sort with LC_ALL=C sort -k1,1 or fix_data_dir)")
               for p in probs), probs
    assert any("text:5: duplicate key spkB-003 (first on line 4)" in p for p in probs), probs


def test_validate_empty_transcript_non_utf8_and_missing_audio(tmp_path):
    d = make_dir(tmp_path)
    write(d, "text", "spkA-000 WORD\nspkA-001\nspkB-002 X\nspkB-003 Y\n")
    probs = kd.validate_data_dir(d)
    assert any("text:2: empty transcript for spkA-001" in p for p in probs), probs
    write(d, "text", b"spkA-000 WORD\nspkA-001 \xff\n")
    probs = kd.validate_data_dir(d)
    assert any("text:2: not UTF-8" in p for p in probs), probs
    d2 = make_dir(tmp_path / "b")
    wav = kd.read_wav_scp(d2 / "wav.scp")
    Path(wav["spkB-002"]).unlink()
    probs = kd.validate_data_dir(d2)
    assert probs == [f"{d2 / 'wav.scp'}:3: spkB-002: file not found: {wav['spkB-002']}"]
    assert kd.validate_data_dir(d2, check_audio=False) == []


def test_validate_pipes_and_ark_offsets_count_as_present(tmp_path):
    d = make_dir(tmp_path)
    kd.write_wav_scp(d / "wav.scp", {u: "sph2pipe -f wav /nowhere/x.sph |" for u in kd.read_utt2spk(d / "utt2spk")})
    ark = tmp_path / "feats.ark"
    ark.write_bytes(b"")
    kd.write_feats_scp(d / "feats.scp", {u: f"{ark}:{i * 10}" for i, u in enumerate(kd.read_utt2spk(d / "utt2spk"))})
    assert kd.validate_data_dir(d, need=("wav.scp", "feats.scp", "utt2spk", "spk2utt")) == []


def test_validate_inconsistent_utterance_sets_and_spk2utt(tmp_path):
    d = make_dir(tmp_path)
    text = (d / "text").read_text()
    write(d, "text", text.replace("spkB-003 WORD 3\n", "") + "spkC-009 EXTRA\n")
    write(d, "spk2utt", "spkA spkA-000 spkA-001 spkB-002\nspkB spkB-003\n")
    probs = kd.validate_data_dir(d)
    assert any(p.endswith("text:4: utterance spkC-009 is not in utt2spk") for p in probs), probs
    assert any(p.endswith("utt2spk:4: utterance spkB-003 has no entry in text") for p in probs), probs
    assert any("spk2utt:1: utterance spkB-002 is under spkA, but utt2spk says spkB" in p for p in probs), probs


def test_validate_speaker_prefix_rule(tmp_path):
    d = make_dir(tmp_path)
    u2s = {"a-1": "z", "b-1": "y"}
    kd.write_utt2spk(d / "utt2spk", u2s)
    kd.write_spk2utt(d / "spk2utt", kd.utt2spk_to_spk2utt(u2s))
    probs = kd.validate_data_dir(d, need=("utt2spk", "spk2utt"), check_audio=False)
    assert any("make each speaker id a prefix of its utterance ids" in p for p in probs), probs


def test_validate_segments_and_numbers(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    rec = tmp_path / "r.wav"
    rec.write_bytes(b"")
    kd.write_wav_scp(d / "wav.scp", {"rec1": str(rec)})
    write(d, "segments", "s-1 rec1 0.0 1.5\ns-2 rec2 0 1\ns-3 rec1 2 1\n")
    kd.write_utt2spk(d / "utt2spk", {"s-1": "s", "s-2": "s", "s-3": "s"})
    kd.write_spk2utt(d / "spk2utt", {"s": ["s-1", "s-2", "s-3"]})
    write(d, "text", "s-1 A\ns-2 B\ns-3 C\n")
    write(d, "utt2dur", "s-1 1.5\ns-2 x\ns-3 1\n")
    probs = kd.validate_data_dir(d)
    assert any("segments:2: s-2: recording rec2 not in wav.scp" in p for p in probs), probs
    assert any("segments:3: s-3: expected" in p for p in probs), probs
    assert any("utt2dur:2: s-2: expected a positive number" in p for p in probs), probs
    assert not any("wav.scp" in p and "not in utt2spk" in p for p in probs), probs  # wav.scp is per recording here


# ---------------------------------------------------------------- fix

def test_fix_drops_and_reports_every_utterance(tmp_path, capsys):
    d = make_dir(tmp_path, n=6)
    wav = kd.read_wav_scp(d / "wav.scp")
    Path(wav["spkB-004"]).unlink()                                  # missing audio
    text = (d / "text").read_text()
    text = text.replace("spkA-001 WORD 1", "spkA-001")              # empty transcript
    text = text.replace("spkB-005 WORD 5\n", "")                    # no transcript
    text += "spkZ-099 ONLY IN TEXT\n"                               # text only (and unsorted)
    write(d, "text", text)
    write(d, "utt2spk", (d / "utt2spk").read_text() + "spkA-000 spkA\n")   # duplicate
    originals = {f: (d / f).read_bytes() for f in ("wav.scp", "text", "utt2spk", "spk2utt")}
    rep = kd.fix_data_dir(d)
    err = capsys.readouterr().err
    assert rep.kept == 3 and rep.before == 7
    assert dict(rep.dropped) == {
        "spkA-001": "empty transcript",
        "spkB-004": f"audio file not found: {wav['spkB-004']}",
        "spkB-005": "not in text",
        "spkZ-099": "not in utt2spk, wav.scp",
    }
    for u, r in rep.dropped:
        assert f"dropped {u}: {r}" in err
    assert "utt2spk:7: duplicate key spkA-000: kept line 1" in err
    assert "kept 3 of 7 utterances" in err
    dropped = (d / ".backup" / "dropped.txt").read_text().splitlines()
    assert dropped == [f"{u} {r}" for u, r in rep.dropped]
    for f, b in originals.items():
        assert (d / ".backup" / f).read_bytes() == b
    assert kd.read_utt2spk(d / "utt2spk") == {"spkA-000": "spkA", "spkA-002": "spkA", "spkB-003": "spkB"}
    assert kd.read_spk2utt(d / "spk2utt") == {"spkA": ["spkA-000", "spkA-002"], "spkB": ["spkB-003"]}
    assert kd.validate_data_dir(d) == []


def test_fix_segments_keeps_used_recordings(tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    for r in ("r1", "r2"):
        (tmp_path / f"{r}.wav").write_bytes(b"")
    kd.write_wav_scp(d / "wav.scp", {"r1": str(tmp_path / "r1.wav"), "r2": str(tmp_path / "r2.wav")})
    kd.write_reco2file_and_channel(d / "reco2file_and_channel", {"r1": ("f1", "A"), "r2": ("f2", "B")})
    kd.write_segments(d / "segments", {"s-1": ("r1", 0, 1), "s-2": ("r2", 0, 1)})
    kd.write_utt2spk(d / "utt2spk", {"s-1": "s", "s-2": "s"})
    write(d, "text", "s-1 A\ns-2\n")
    kd.fix_data_dir(d)
    assert "dropped s-2: empty transcript" in capsys.readouterr().err
    assert kd.read_wav_scp(d / "wav.scp") == {"r1": str(tmp_path / "r1.wav")}
    assert kd.read_reco2file_and_channel(d / "reco2file_and_channel") == {"r1": ("f1", "A")}
    assert kd.validate_data_dir(d) == []


def test_fix_refuses_non_utf8_without_touching_anything(tmp_path):
    d = make_dir(tmp_path)
    write(d, "text", b"spkA-000 \xff\n")
    before = (d / "utt2spk").read_bytes()
    with pytest.raises(kd.DataDirError, match="text:1: not UTF-8"):
        kd.fix_data_dir(d)
    assert (d / "utt2spk").read_bytes() == before and not (d / ".backup").exists()


# ---------------------------------------------------------------- entry points

def test_bin_modules(tmp_path, capsys):
    d = make_dir(tmp_path)
    assert validate_bin.main([str(d)]) == 0
    assert "OK (4 utterances, 2 speakers)" in capsys.readouterr().out
    write(d, "text", (d / "text").read_text().replace("WORD 2", ""))
    assert validate_bin.main([str(d)]) == 1
    assert "text:3: empty transcript for spkB-002" in capsys.readouterr().err
    assert fix_bin.main([str(d)]) == 0
    assert "dropped spkB-002: empty transcript" in capsys.readouterr().err
    assert validate_bin.main([str(d), "--need", "wav.scp,text"]) == 0
    with pytest.raises(SystemExit, match="unknown file"):
        validate_bin.main([str(d), "--need", "wav.scp nonsense"])


def test_shell_wrappers(tmp_path):
    """With a PATH whose python lacks gossip_accel, the wrappers source path.sh (the project's venv)."""
    d = make_dir(tmp_path, spaces=True)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text("#!/bin/sh\nexec /usr/bin/env -u PYTHONPATH python3 -I \"$@\"\n")
    (fake / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{fake}:/usr/bin:/bin"
    run = lambda *a: subprocess.run(["bash", *a], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    r = run(str(ROOT / "utils" / "validate_data_dir.sh"))
    assert r.returncode == 1 and "Usage: utils/validate_data_dir.sh" in r.stderr
    r = run(str(ROOT / "utils" / "validate_data_dir.sh"), "--check-audio", "false", str(d))
    assert r.returncode == 0 and "OK (4 utterances" in r.stdout, r.stderr
    Path(kd.read_wav_scp(d / "wav.scp")["spkA-000"]).unlink()
    r = run(str(ROOT / "utils" / "fix_data_dir.sh"), str(d))
    assert r.returncode == 0 and "dropped spkA-000: audio file not found" in r.stderr, r.stderr
    assert "spkA-000" not in (d / "text").read_text()
