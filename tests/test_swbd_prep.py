"""Switchboard data handling without flite: NIST SPHERE (mu-law, PCM, shorten-compressed as LDC
ships it), features from segments of two-channel recordings (reco2file_and_channel, Kaldi
pipes), the mini corpus's layout (built with a sine-tone synthesizer), the LDC97S62/ms98 and
eval2000 data preparation, transcript normalization and the scoring filter."""
from __future__ import annotations

import io
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from gossip_accel.data import kaldi as kd
from gossip_accel.data import sphere as S
from gossip_accel.data.features import FbankOptions, compute_fbank, compute_fbank_dir, load_utterance, read_audio
from recipe_local import load

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / "recipes" / "swbd" / "asr1" / "local"




sys.path.insert(0, str(LOCAL))
mini = load(LOCAL / "make_mini_swbd.py")
prep = load(LOCAL / "swbd1_data_prep.py")
evalprep = load(LOCAL / "eval2000_data_prep.py")
split = load(LOCAL / "split_train_dev.py")
wf = load(LOCAL / "wer_filter.py")


def speechlike(n: int, seed: int = 0, rate: int = 8000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    x = np.sin(2 * np.pi * 180 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 1.3 * t)) * 9000 + rng.standard_normal(n) * 400
    x[n // 3: n // 3 + rate // 4] = 0                           # a silent stretch: ZERO blocks, bit shifts
    return x.astype(np.int64)


# ------------------------------------------------------------------ SPHERE and shorten

@pytest.mark.parametrize("ftype", [S.TYPE_AU1, S.TYPE_AU2, S.TYPE_S16HL, S.TYPE_S16LH])
def test_shorten_round_trip(ftype):
    x = speechlike(9000)
    y = np.stack([x, np.roll(x, 77) // 3], axis=1)
    data = S.linear_to_ulaw(y) if ftype in (S.TYPE_AU1, S.TYPE_AU2) else y
    for kw in ({}, {"qlpc": [58, -28, 3]}, {"nmean": 0}, {"blocksize": 300}):
        enc = S.encode_shorten(data, ftype, **kw)
        assert enc.startswith(b"ajkg\x02")
        dec = S.decode_shorten(enc)
        assert dec.ftype == ftype and dec.channels == 2
        assert np.array_equal(dec.samples, np.asarray(data, dtype=np.int64)), kw
    assert len(S.encode_shorten(data, ftype)) < 0.8 * data.size * (1 if ftype in (S.TYPE_AU1, S.TYPE_AU2) else 2)


def test_shorten_ulaw_tables_are_shortens():
    """ulaw_outward as shorten's mkbshift prints it (rows checked against its bitshift.h)."""
    _, inward, outward = S.shorten_ulaw_tables()
    assert outward[0][:4] == [127, 0, 1, 2] and outward[0][126:131] == [125, 126, 255, 254, 253]
    assert outward[1][:12] == [112, 114, 116, 118, 120, 122, 124, 126, 127, 0, 1, 2]
    assert outward[5][:10] == [49, 51, 53, 55, 57, 59, 61, 63, 64, 66]
    assert outward[12][125:132] == [126, 127, 0, 255, 254, 253, 252]
    for s in range(13):
        assert sorted(outward[s]) == list(range(256))
        assert all(outward[s][inward[s][b] + 128] == b for b in range(256))


def test_shorten_errors():
    with pytest.raises(S.SphereError, match="ajkg"):
        S.decode_shorten(b"\0" * 64)
    enc = S.encode_shorten(S.linear_to_ulaw(speechlike(4000)), S.TYPE_AU2)
    with pytest.raises(S.SphereError, match="truncated"):
        S.decode_shorten(enc[: len(enc) // 2])


def test_sphere_write_read(tmp_path):
    y = np.stack([speechlike(8000, 1), speechlike(8000, 2) // 2], axis=1).astype(np.int16)
    plain, short, pcm = tmp_path / "p.sph", tmp_path / "s.sph", tmp_path / "pcm.sph"
    S.write_sphere(plain, y, 8000, "ulaw")
    S.write_sphere(short, y, 8000, "ulaw", shorten=True, extra={"conversation_id": "2001"})
    S.write_sphere(pcm, y, 8000, "pcm", shorten=True)
    h = S.read_header(short)
    assert (h.channels, h.rate, h.sample_count, h.coding) == (2, 8000, 8000, "ulaw,embedded-shorten-v2.00")
    assert h.fields["conversation_id"] == "2001" and h.size == 1024
    via_sf, rate = sf.read(plain, dtype="int16", always_2d=True)     # libsndfile reads plain mu-law SPHERE
    assert rate == 8000 and np.array_equal(S.read_sphere(plain)[0], via_sf)
    assert np.array_equal(S.read_sphere(short, use_sph2pipe=False)[0], via_sf)
    assert np.array_equal(S.read_sphere(pcm, use_sph2pipe=False)[0], y)
    assert short.stat().st_size < plain.stat().st_size
    # the features module reads both; libsndfile alone cannot read the shortened one
    with pytest.raises(Exception):
        sf.read(short)
    a, _ = read_audio(str(short))
    b, _ = read_audio(str(plain))
    assert np.array_equal(a, b) and a.shape == (8000, 2)


# ------------------------------------------------------------------ features of two-channel recordings

def swbd_like_dir(tmp_path: Path, style: str) -> tuple[Path, np.ndarray]:
    """A data dir over one two-channel shortened .sph: sides A and B, two segments each."""
    rate = 8000
    t = np.arange(rate * 3) / rate
    a = (np.sin(2 * np.pi * 300 * t) * 8000).astype(np.int16)
    b = (np.random.default_rng(3).standard_normal(len(t)) * 3000).astype(np.int16)
    y = np.stack([a, b], axis=1)
    sph = tmp_path / "sw02001.sph"
    S.write_sphere(sph, y, rate, "ulaw", shorten=True)
    d = tmp_path / f"data_{style}"
    d.mkdir()
    segs = {"sw02001-A_000010-000120": ("sw02001-A", 0.1, 1.2), "sw02001-A_000150-000290": ("sw02001-A", 1.5, 2.9),
            "sw02001-B_000000-000100": ("sw02001-B", 0.0, 1.0), "sw02001-B_000200-000300": ("sw02001-B", 2.0, 3.0)}
    kd.write_segments(d / "segments", segs)
    kd.write_text(d / "text", {u: "hello" for u in segs})
    kd.write_utt2spk(d / "utt2spk", {u: r for u, (r, _, _) in segs.items()})
    kd.write_spk2utt(d / "spk2utt", kd.utt2spk_to_spk2utt({u: r for u, (r, _, _) in segs.items()}))
    if style == "path":
        kd.write_wav_scp(d / "wav.scp", {"sw02001-A": str(sph), "sw02001-B": str(sph)})
    else:   # Kaldi's pipes, through a stand-in for sph2pipe (which the project cannot install)
        bindir = tmp_path / "bin"
        bindir.mkdir(exist_ok=True)
        fake = bindir / "sph2pipe"
        fake.write_text(f"""#!{sys.executable}
import sys, io, soundfile as sf
sys.path.insert(0, {str(ROOT)!r})
from gossip_accel.data.sphere import read_sphere
a = sys.argv[1:]
ch = int(a[a.index('-c') + 1]) - 1
x, r = read_sphere(a[-1], use_sph2pipe=False)
b = io.BytesIO(); sf.write(b, x[:, ch], r, format='WAV', subtype='PCM_16'); sys.stdout.buffer.write(b.getvalue())
""")
        fake.chmod(0o755)
        kd.write_wav_scp(d / "wav.scp", {f"sw02001-{s}": f"{fake} -f wav -p -c {c} {sph} |" for s, c in (("A", 1), ("B", 2))})
    kd.write_reco2file_and_channel(d / "reco2file_and_channel", {"sw02001-A": ("sw02001", "A"),
                                                                   "sw02001-B": ("sw02001", "B")})
    return d, y


@pytest.mark.parametrize("style", ["path", "sph2pipe"])
def test_fbank_of_segments_picks_each_sides_channel(tmp_path, style):
    d, y = swbd_like_dir(tmp_path, style)
    assert kd.validate_data_dir(d) == []
    opts = FbankOptions(num_mel_bins=40, sample_frequency=8000)
    res = compute_fbank_dir(d, tmp_path / f"fbank_{style}", opts, nj=2, progress=False, allow_pipes=style != "path")
    assert len(res.frames) == 4 and not res.skipped
    import kaldiio
    feats = {u: kaldiio.load_mat(v) for u, v in kd.read_feats_scp(d / "feats.scp").items()}
    lin = S.ULAW_TO_LINEAR[S.linear_to_ulaw(y)].astype(np.float32)
    for utt, (ch, s, e) in {"sw02001-A_000150-000290": (0, 1.5, 2.9), "sw02001-B_000000-000100": (1, 0.0, 1.0)}.items():
        want = compute_fbank(lin[int(s * 8000):int(e * 8000), ch], opts).numpy()
        assert np.allclose(feats[utt], want, atol=1e-4), utt


def test_multichannel_without_reco2file_and_channel_is_an_error(tmp_path):
    d, _ = swbd_like_dir(tmp_path, "path")
    (d / "reco2file_and_channel").unlink()
    from gossip_accel.data.features import FeatureError
    with pytest.raises(FeatureError, match="channels"):
        compute_fbank_dir(d, tmp_path / "f", FbankOptions(sample_frequency=8000), progress=False)
    wav = load_utterance(str(tmp_path / "sw02001.sph"), "u", FbankOptions(sample_frequency=8000), channel=1,
                         segment=(0.0, 0.5))
    assert wav.numel() == 4000


# ------------------------------------------------------------------ transcripts

@pytest.mark.parametrize("raw, want", [
    ("[silence]", ""), ("<b_aside> yeah <e_aside>", "yeah"), ("[laughter-yes] i do", "yes i do"),
    ("th[e]- the dog", "th- the dog"), ("[ex]cept", "-cept"), ("-[ex]cept", "-cept"), ("[bocket/bucket]", "bucket"),
    ("{yuppiedom}", "yuppiedom"), ("i_1 [noise] UH [vocalized-noise] [laughter]", "i [noise] uh [vocalized-noise] [laughter]"),
    ("[laughter-don't] know", "don't know"),
])
def test_map_words(raw, want):
    assert prep.map_words(raw) == want


@pytest.mark.parametrize("raw, want", [
    ("uh i [noise] think th- so um [laughter]", "i think so"), ("(%hesitation) (th-) the cat", "the cat"),
    ("ok alright mhm [laughter-yeah]", "okay all right uh-huh yeah"), ("<unk> -cept it", "it"),
])
def test_wer_filter(raw, want):
    assert wf.filter_words(raw) == want


# ------------------------------------------------------------------ the mini corpus and the data prep

def tone_synth(text: str, spk):
    """A stand-in for flite: a tone whose length follows the text (16 kHz, like flite's voices)."""
    n = int(16000 * (0.15 + 0.06 * len(text)))
    t = np.arange(n) / 16000
    return (0.3 * np.sin(2 * np.pi * (spk.f0 * 2) * t)).astype(np.float32), 16000


@pytest.fixture(scope="module")
def mini_corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("mini_swbd")
    cfg = mini.Config(train_convs=3, segs_per_side=4, eval_convs=1, eval_segs_per_side=3, check_with_flite=False,
                      p_hesitation=0.5, p_noise=0.5, p_laughter=0.5, p_vocalized=0.5, p_partial=0.5, p_laughword=0.5)
    stats = mini.build(out, cfg, synthesize=tone_synth, read_words=None, jobs=2)
    return out, stats


def test_mini_corpus_layout(mini_corpus):
    out, stats = mini_corpus
    sph = sorted((out / "LDC97S62" / "swb1_d1" / "data").glob("sw0*.sph"))
    assert len(sph) == 3 and stats["corpora"]["train"]["segments"] == 24
    h = S.read_header(sph[0])
    assert (h.channels, h.rate, h.coding) == (2, 8000, "ulaw,embedded-shorten-v2.00")
    trans = sorted((out / "LDC97S62" / "swb_ms98_transcriptions").glob("*/*/sw*[AB]-ms98-a-trans.text"))
    assert len(trans) == 6
    name = trans[0].name
    assert name[2:6] == trans[0].parent.name and trans[0].parent.parent.name == name[2:4]
    lines = [ln.split() for t in trans for ln in t.read_text().splitlines()]
    assert all(len(ln) >= 4 and ln[0].endswith(tuple(f"-ms98-a-{i:04d}" for i in range(1, 100))) for ln in lines)
    words = " ".join(" ".join(ln[3:]) for ln in lines)
    for token in ("[silence]", "[noise]", "[laughter]", "[vocalized-noise]", "[laughter-"):
        assert token in words, token
    assert any(w.endswith("]-") and "[" in w for w in words.split())           # partial words th[e]-
    for ln in (t.read_text().splitlines() for t in trans):                     # contiguous timeline per side
        spans = [(float(x.split()[1]), float(x.split()[2])) for x in ln]
        assert spans[0][0] == 0 and all(abs(a[1] - b[0]) < 1e-6 for a, b in zip(spans, spans[1:]))
    stm = (out / "LDC2002T43" / "reference" / "hub5e00.english.000405.stm").read_text()
    assert "sw_" in stm and "en_" in stm and "IGNORE_TIME_SEGMENT_IN_SCORING" in stm and "(%hesitation)" in stm
    assert (out / "LDC2002S09" / "hub5e_00" / "english" / "hub5e_00.pem").is_file()
    assert (out / "lm_text.txt").stat().st_size > 1000


def test_more_training_conversations_leave_the_corpus_and_train_dev_as_they_were(mini_corpus, tmp_path):
    """--more-train-convs adds conversations of other voices, named after the others (so train_dev, Kaldi's first
    utterances, keeps its conversations), re-reading no train_dev sentence; every file of the build without them
    is byte for byte what it was."""
    out, stats = mini_corpus
    more = tmp_path / "more"
    voices = (("kal",), ("espeak-en-gb-scotland-m1", "espeak-en-us-f2"))
    cfg = mini.Config(train_convs=3, segs_per_side=4, eval_convs=1, eval_segs_per_side=3, check_with_flite=False,
                      p_hesitation=0.5, p_noise=0.5, p_laughter=0.5, p_vocalized=0.5, p_partial=0.5, p_laughword=0.5,
                      more_train_convs=4, more_train_voices=voices, more_train_speakers=(2, 3), dev_segments=8)
    st = mini.build(more, cfg, synthesize=tone_synth, read_words=None, jobs=2)
    old = sorted(f.relative_to(out) for f in out.rglob("*") if f.is_file() and f.name != "lm_text.txt")
    assert old and all((more / f).read_bytes() == (out / f).read_bytes() for f in old)
    assert (more / "lm_text.txt").read_text() == (out / "lm_text.txt").read_text()
    data = more / "LDC97S62" / "swb1_d1" / "data"
    names = sorted(f.stem for f in data.glob("sw0*.sph"))
    added = [n for n in names if (n + ".sph") not in {f.name for f in old}]
    assert len(names) == 7 and added == names[3:]                          # after the three of the plain build
    assert st["corpora"]["train"]["segments"] == 7 * 2 * 4
    assert set(st["corpora"]["train"]["voices"]) >= {"espeak-en-gb-scotland-m1", "espeak-en-us-f2"}
    sides = {c: st["sides"][c] for c in added}
    assert len({s for c in sides.values() for s in c.values()}) <= 5 and set(st["sides"]) >= set(added)
    assert not {s for c in added for s in st["sides"][c].values()} & {s for c in names[:3] for s in st["sides"][c].values()}

    # they read the unused sentences first; without any, the training ones from the last backwards, never train_dev's
    texts = mini.select_texts(cfg)
    plain = [c for c in mini.plan_conversations(cfg, texts) if c.name in added]
    reread = [next(p.text for p in g.pieces if p.kind == "speech")
              for c in mini.plan_conversations(cfg, {**texts, "more": []}) if c.name in added for g in c.segments]
    train = [s.transcript.lower() for s in texts["train"]]
    assert reread == [train[len(train) - 1 - k % (len(train) - 8)] for k in range(len(reread))]
    assert not set(reread) & set(train[:8]) and len(reread) == 4 * 2 * 4
    fresh = [next(p.text for p in g.pieces if p.kind == "speech") for c in plain for g in c.segments]
    assert not set(fresh) & set(train)


@pytest.mark.parametrize("args, says", [
    (["--more-train-convs", "2"], "needs --more-train-voices"),
    (["--more-train-convs", "2", "--more-train-voices", "kal espeak-*-m1", "--more-train-speakers", "1"], "2 or more"),
    (["--more-train-convs", "2", "--more-train-voices", "kal; espeak-*-m1", "--more-train-speakers", "4"], "1 number(s) for 2"),
    (["--more-train-convs", "2", "--more-train-voices", "kal; kal", "--more-train-speakers", "2 2"], "more than one"),
    (["--more-train-convs", "2", "--more-train-voices", "awb", "--more-train-speakers", "4"], "CallHome"),
    (["--more-train-convs", "2", "--more-train-voices", "nosuch-*", "--more-train-speakers", "4"], "no voice matches"),
])
def test_more_training_conversations_bad_options(args, says, tmp_path, capsys):
    with pytest.raises(SystemExit):
        mini.main(["--out", str(tmp_path / "c"), *args])
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()[-1]) > 20
    assert not (tmp_path / "c").exists()


def test_swbd1_and_eval2000_data_prep(mini_corpus, tmp_path):
    out, _ = mini_corpus
    train = tmp_path / "train"
    st = prep.prepare(out / "LDC97S62", out / "LDC97S62" / "swb_ms98_transcriptions", train)
    assert st["utterances"] == 24 and st["recordings"] == 6
    assert kd.validate_data_dir(train, need=("wav.scp", "text", "utt2spk", "spk2utt", "segments")) == []
    r2fc = kd.read_reco2file_and_channel(train / "reco2file_and_channel")
    assert all(r.endswith(f"-{c}") and r.startswith(f) for r, (f, c) in r2fc.items())
    segs = kd.read_segments(train / "segments")
    utt, (reco, s, e) = next(iter(segs.items()))
    assert utt == f"{reco}_{int(100 * s + 0.5):06d}-{int(100 * e + 0.5):06d}"
    text = " ".join(kd.read_text(train / "text").values())
    assert "[silence]" not in text and "[laughter-" not in text and "[noise]" in text
    assert not any("[" in w and w.endswith("-") for w in text.split())       # th[e]- -> th-
    # Kaldi-style pipes instead of paths
    piped = tmp_path / "train_piped"
    prep.prepare(out / "LDC97S62", out / "LDC97S62" / "swb_ms98_transcriptions", piped, wav_style="sph2pipe")
    assert all(v.startswith("sph2pipe -f wav -p -c ") and v.endswith(" |") for v in kd.read_wav_scp(piped / "wav.scp").values())
    # dev = the first utterances, the rest for training
    assert split.main(["--src", str(train), "--dev", str(tmp_path / "dev"), "--train", str(tmp_path / "nodup"),
                       "--dev-utts", "5", "--max-dup", "1"]) == 0
    assert len(kd.read_text(tmp_path / "dev" / "text")) == 5
    assert kd.validate_data_dir(tmp_path / "nodup") == [] and kd.validate_data_dir(tmp_path / "dev") == []
    # eval2000 and its halves
    ev = tmp_path / "eval2000"
    st = evalprep.prepare(out / "LDC2002S09" / "hub5e_00", out / "LDC2002T43", ev)
    assert st["sizes"] == {"eval2000": 12, "eval2000_swbd": 6, "eval2000_callhome": 6}
    assert st["left_out"]["ignored in scoring (IGNORE_TIME_SEGMENT_IN_SCORING)"] == 4
    for name in ("eval2000", "eval2000_swbd", "eval2000_callhome"):
        assert kd.validate_data_dir(tmp_path / name) == [], name
        assert (tmp_path / name / "stm").is_file() and (tmp_path / name / "glm").is_file()
    assert all(u.startswith("sw_") for u in kd.read_text(tmp_path / "eval2000_swbd" / "text"))
    assert all(u.startswith("en_") for u in kd.read_text(tmp_path / "eval2000_callhome" / "text"))
    # features of the prepared train dir: shortened two-channel SPHERE, one channel per side, 8 kHz
    res = compute_fbank_dir(train, tmp_path / "fbank", FbankOptions(num_mel_bins=40, sample_frequency=8000), nj=2,
                            progress=False)
    assert len(res.frames) == 24 and not res.skipped


def test_data_sh_test_only_prepares_eval2000_alone(mini_corpus, tmp_path):
    """local/data.sh --test-only true: eval2000 and its halves from LDC2002S09/T43, no Switchboard-1."""
    out, _ = mini_corpus
    rec = tmp_path / "asr1"
    rec.mkdir()
    for name in ("local", "utils"):
        (rec / name).symlink_to(LOCAL.parent / name)

    def data_sh(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "local/data.sh", "--test-only", "true", *args], cwd=rec, capture_output=True,
                              text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))

    ok = data_sh("--eval2000-speech", str(out / "LDC2002S09" / "hub5e_00"), "--eval2000-transcripts", str(out / "LDC2002T43"))
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in (rec / "data").iterdir()) == ["eval2000", "eval2000_callhome", "eval2000_swbd"]
    for name in ("eval2000_swbd", "eval2000_callhome"):
        assert kd.validate_data_dir(rec / "data" / name) == [], name
    half = data_sh("--eval2000-speech", str(out / "LDC2002S09" / "hub5e_00"))
    assert half.returncode == 1 and "needs --eval2000-transcripts" in half.stderr


def test_score_hook(tmp_path):
    """local/score.sh rescores a decode dir with the filter and keeps the unfiltered scores."""
    import json
    from gossip_accel.asr.scoring import write_scoring_dir
    d = tmp_path / "decode"
    refs = {"u1": "uh i think [noise] th- so", "u2": "(%hesitation) the cat sat"}
    hyps = {"u1": "um i think so [laughter]", "u2": "the cat sad"}
    stats = write_scoring_dir(d, refs, hyps)
    (d / "summary.json").write_text(json.dumps({"method": "greedy", **stats.as_dict()}))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(2):                                   # idempotent
        r = subprocess.run(["bash", str(LOCAL / "score.sh"), str(tmp_path / "data"), str(d)], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 0, r.stderr
        s = json.loads((d / "summary.json").read_text())
        assert s["ref_words"] == 6 and s["errors"] == 1 and s["unfiltered"]["ref_words"] == 10
        assert (d / "wer").read_text().startswith("%WER 16.67 [ 1 / 6,")
