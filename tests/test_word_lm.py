"""Word-level decoding: KenLM n-gram + lexicon spelled in the model's units + flashlight's CTC lexicon decoder."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gossip_accel.asr.word_lm import LexiconTrie, WordDecoder, build_word_lm, oov_rate, read_word_list
from gossip_accel.data.units import BLANK, UNK
from gossip_accel.data.units import train_units

LM_TEXT = ["THE CAT SAT", "THE CAT SAT ON THE MAT", "THE DOG SAT", "A CAT SAT", "THEY SET THE TABLE",
           "THE CAT RAN", "THE CAT SAT ON THE TABLE"]


@pytest.fixture(scope="module")
def lang(tmp_path_factory):
    """Character units of a small text without the letters M and Y (so MAT and THEY cannot be spelled)."""
    d = tmp_path_factory.mktemp("units")
    (d / "text").write_text("u1 THE CAT SAT\nu2 THE DOG SET THE TABLE\nu3 A CAT RAN ON\n")
    return train_units(d / "text", d / "lang", unit_type="char")


@pytest.fixture(scope="module")
def word_lm(lang, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "word_lm3"
    info = build_word_lm(LM_TEXT, lang, out, order=3, source="LM_TEXT")
    return out, info


def emissions(tok, frames: list[dict[str, float]]) -> torch.Tensor:
    """(1, T, V) log-probs: each listed frame, then a blank frame (so repeats are separate)."""
    ids = {t: i for i, t in enumerate(tok.tokens)}
    rows = []
    for probs in frames:
        for p in (probs, {"<blk>": 1.0}):
            r = torch.full((len(ids),), 1e-4)
            for t, v in p.items():
                r[ids[t]] = v
            rows.append((r / r.sum()).log())
    return torch.stack(rows)[None]


def test_lexicon_spells_words_in_units_and_leaves_out_the_unspellable(lang, word_lm):
    out, info = word_lm
    lines = (out / "lexicon.txt").read_text(encoding="utf-8").splitlines()
    assert "THE \u2581 T H E" in lines and "TABLE \u2581 T A B L E" in lines
    assert lang.spellings(["MAT", "CAT"]) == {"CAT": [["\u2581", "C", "A", "T"]]}
    assert info["left_out_words"] == 2 and set(info["left_out_examples"]) == {"MAT", "THEY"}
    assert info["lexicon_words"] == len(lines) == 9
    assert json.loads((out / "info.json").read_text()) == info
    arpa = (out / "lm.arpa").read_text()
    assert "\\3-grams:" in arpa and "THE CAT SAT" in arpa and (out / "lm.bin").stat().st_size > 0
    assert oov_rate(["THE MAT SAT", "A CAT"], out / "lexicon.txt") == pytest.approx(1 / 5)


def test_decoder_outputs_lexicon_words_and_the_lm_decides_between_them(lang, word_lm):
    out, _ = word_lm
    tok = lang
    # "COT" is no word: the lexicon makes it CAT although O is likelier than A
    lp = emissions(tok, [{c: 0.9} for c in "\u2581THE\u2581C"] + [{"O": 0.6, "A": 0.3}, {"T": 0.9}])
    assert WordDecoder(out, tok, beam=20, lm_weight=0.5)(lp, torch.tensor([lp.shape[1]])) == ["THE CAT"]
    # SET is a little likelier acoustically than SAT; the LM (THE CAT SAT, never THE CAT SET) turns it
    frames = [{c: 0.9} for c in "\u2581THE\u2581CAT\u2581S"] + [{"E": 0.5, "A": 0.4}, {"T": 0.9}]
    lp = emissions(tok, frames)
    length = torch.tensor([lp.shape[1]])
    assert WordDecoder(out, tok, beam=20, lm_weight=0.0)(lp, length) == ["THE CAT SET"]
    assert WordDecoder(out, tok, beam=20, lm_weight=1.0)(lp, length) == ["THE CAT SAT"]
    # a batch with padding: the second utterance's frames past its length are ignored
    short = emissions(tok, [{c: 0.9} for c in "\u2581A\u2581CAT"])
    batch = torch.full((2, lp.shape[1], lp.shape[2]), -9.0)
    batch[0], batch[1, :short.shape[1]] = lp[0], short[0]
    got = WordDecoder(out, tok, beam=20, lm_weight=1.0)(batch, torch.tensor([lp.shape[1], short.shape[1]]))
    assert got == ["THE CAT SAT", "A CAT"]


def test_decoders_sharing_one_trie_decode_as_torchaudios_ctc_decoder(lang, word_lm):
    """The tuning grid's decoders share one lexicon trie; each decodes what torchaudio's ctc_decoder (which builds
    its own trie from the same files) decodes with the same weights."""
    from torchaudio.models.decoder import ctc_decoder
    out, _ = word_lm
    sat = emissions(lang, [{c: 0.9} for c in "\u2581THE\u2581CAT\u2581S"] + [{"E": 0.5, "A": 0.4}, {"T": 0.9}])
    cot = emissions(lang, [{c: 0.6, "\u2581": 0.3} for c in "\u2581A\u2581C"] + [{"O": 0.6, "A": 0.3}, {"T": 0.9}])
    batch = torch.full((2, sat.shape[1], sat.shape[2]), -9.0)
    batch[0], batch[1, :cot.shape[1]] = sat[0], cot[0]
    lengths = torch.tensor([sat.shape[1], cot.shape[1]], dtype=torch.int32)
    trie = LexiconTrie(out, lang)
    got = {}
    for lm_weight in (0.0, 0.5, 1.0, 3.0):
        for word_score in (-2.0, 0.0, 1.0):
            ours = WordDecoder(out, lang, beam=20, lm_weight=lm_weight, word_score=word_score, lexicon=trie)
            theirs = ctc_decoder(lexicon=str(out / "lexicon.txt"), tokens=lang.tokens, lm=str(out / "lm.bin"), nbest=1,
                                 beam_size=20, beam_threshold=25.0, lm_weight=lm_weight, word_score=word_score,
                                 sil_score=0.0, blank_token=BLANK, sil_token=UNK, unk_word=UNK)
            expected = [" ".join(r[0].words) for r in theirs(batch, lengths)]
            got[lm_weight, word_score] = ours(batch, lengths)
            assert got[lm_weight, word_score] == expected, (lm_weight, word_score)
    assert got[0.0, 0.0] == ["THE CAT SET", "A CAT"] and got[1.0, 0.0][0] == "THE CAT SAT"   # the weights matter
    with pytest.raises(ValueError, match="lexicon trie of"):
        WordDecoder(out.parent, lang, lexicon=trie)


def test_repeated_decodes_give_each_wer_and_the_utterances_that_differ(lang, word_lm):
    from bench.word_beam import repeat_decodes
    out, _ = word_lm
    sat = emissions(lang, [{c: 0.9} for c in "\u2581THE\u2581CAT\u2581S"] + [{"E": 0.5, "A": 0.4}, {"T": 0.9}])
    cat = emissions(lang, [{c: 0.9} for c in "\u2581A\u2581CAT"])
    batches = [(["u1"], sat, torch.tensor([sat.shape[1]])), (["u2"], cat, torch.tensor([cat.shape[1]]))]
    refs = {"u1": "THE CAT SAT", "u2": "A CAT"}
    same = repeat_decodes(lambda: WordDecoder(out, lang, beam=20, lm_weight=1.0), batches, refs, 3)
    assert same["wers"] == [0.0, 0.0, 0.0] and same["differing_utterances"] == [] and same["utterances"] == 2
    # decoders that differ (no LM, then the LM): SET, then SAT for u1; u2 the same
    weights = iter([0.0, 1.0])
    varied = repeat_decodes(lambda: WordDecoder(out, lang, beam=20, lm_weight=next(weights)), batches, refs, 2)
    assert varied["wers"] == [20.0, 0.0] and varied["differing_utterances"] == ["u1"]


def test_max_words_keeps_the_most_frequent_and_the_lm_maps_the_rest_to_unk(lang, tmp_path):
    info = build_word_lm(LM_TEXT, lang, tmp_path / "lm", order=2, max_words=3, binary=False)
    assert [line.split()[0] for line in (tmp_path / "lm" / "lexicon.txt").read_text().splitlines()] == ["THE", "CAT", "SAT"]
    assert info["lm"] == "lm.arpa" and not (tmp_path / "lm" / "lm.bin").exists()
    unigrams = (tmp_path / "lm" / "lm.arpa").read_text().split("\\1-grams:")[1].split("\\2-grams:")[0]
    assert {line.split("\t")[1] for line in unigrams.strip().splitlines()} == {"<unk>", "<s>", "</s>", "THE", "CAT", "SAT"}


def test_cli_bad_input_is_one_line_naming_the_file(lang, tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "gossip_accel.bin.make_word_lm", "--lang-dir", str(lang.path.parent),
                               "--out", str(tmp_path / "lm"), *args], capture_output=True, text=True)
    missing = cli("--text", str(tmp_path / "nope"))
    assert missing.returncode != 0 and missing.stderr.strip() == f"make_word_lm: {tmp_path / 'nope'} not found"
    (tmp_path / "empty.txt").write_text("\n\n")
    empty = cli("--plain-text", str(tmp_path / "empty.txt"))
    assert empty.returncode != 0 and "no words" in empty.stderr and "Traceback" not in empty.stderr
    (tmp_path / "lm.txt").write_text("\n".join(LM_TEXT) + "\n")
    (tmp_path / "dev").write_text("d1 THE CAT SAT ON THE MAT\n")
    ok = cli("--plain-text", str(tmp_path / "lm.txt"), "--dev-text", str(tmp_path / "dev"), "--order", "2")
    assert ok.returncode == 0, ok.stderr
    assert "16.67% of" in ok.stdout and json.loads((tmp_path / "lm" / "info.json").read_text())["dev_oov_rate"] == 0.16667


def test_decoder_names_a_missing_or_mismatched_word_lm(lang, word_lm, tmp_path):
    with pytest.raises(FileNotFoundError, match="lexicon.txt not found"):
        WordDecoder(tmp_path, lang)
    out, _ = word_lm
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "lexicon.txt").write_text("THE \u2581 T H E\nZOO \u2581 Z O O\n")   # Z is no unit of the model
    (bad / "lm.arpa").write_text((out / "lm.arpa").read_text())
    with pytest.raises(ValueError, match="does not load with the units"):
        WordDecoder(bad, lang)


def unigram_log10(arpa: Path, word: str) -> float:
    unigrams = arpa.read_text().split("\\1-grams:")[1].split("\\2-grams:")[0]
    return next(float(line.split("\t")[0]) for line in unigrams.strip().splitlines() if line.split("\t")[1] == word)


def test_word_list_widens_the_lexicon_and_its_words_share_the_unseen_mass(lang, word_lm, tmp_path):
    (tmp_path / "words").write_text("# a dictionary\nZoe\ncot\nCot\nrat's\ncaf\u00e9\nmat\nthe\nx-ray\n\n")
    words = read_word_list(tmp_path / "words")
    assert words == ["COT", "RAT'S", "MAT", "THE", "ZOE"]   # upper-cased, once, letters and apostrophes only;
    #                                                         the words written in lower case before the names
    out = tmp_path / "lm"
    info = build_word_lm(LM_TEXT, lang, out, order=3, word_list=words, word_list_source="words", binary=False)
    lexicon = [line.split()[0] for line in (out / "lexicon.txt").read_text().splitlines()]
    assert "COT" in lexicon and "MAT" not in lexicon and lexicon.count("THE") == 1   # M is no unit; THE is the LM's
    assert "RAT'S" not in lexicon                             # the apostrophe is no unit of these character units
    assert info["word_list_added"] == 1 and info["lexicon_words"] == 9 + 1 and info["word_list"] == "words"
    # lmplz shares the unseen unigram mass among the padded vocabulary: <unk> scores below an LM-only run's
    plain = unigram_log10(word_lm[0] / "lm.arpa", "<unk>")
    assert unigram_log10(out / "lm.arpa", "<unk>") < plain
    # a list word comes out where the acoustics spell it; without the list the lexicon forces an LM word
    frames = [{c: 0.9} for c in "\u2581THE\u2581C"] + [{"O": 0.9, "A": 0.05}, {"T": 0.9}]
    lp = emissions(lang, frames)
    n = torch.tensor([lp.shape[1]])
    assert WordDecoder(word_lm[0], lang, beam=20, lm_weight=0.5)(lp, n) == ["THE CAT"]
    assert WordDecoder(out, lang, beam=20, lm_weight=0.5)(lp, n) == ["THE COT"]


def test_word_list_bad_input_is_one_line_naming_the_file(lang, tmp_path):
    (tmp_path / "lm.txt").write_text("\n".join(LM_TEXT) + "\n")

    def cli(words):
        return subprocess.run([sys.executable, "-m", "gossip_accel.bin.make_word_lm", "--lang-dir", str(lang.path.parent),
                               "--out", str(tmp_path / "lm"), "--plain-text", str(tmp_path / "lm.txt"), "--order", "2",
                               "--word-list", str(words)], capture_output=True, text=True)
    missing = cli(tmp_path / "nope")
    assert missing.returncode != 0 and missing.stderr.strip().startswith(f"make_word_lm: {tmp_path / 'nope'} not found")
    (tmp_path / "digits").write_text("123\n4-5\n")
    bad = cli(tmp_path / "digits")
    assert bad.returncode != 0 and f"{tmp_path / 'digits'}: no words" in bad.stderr and "Traceback" not in bad.stderr
    (tmp_path / "words").write_text("cot\n")
    ok = cli(tmp_path / "words")
    assert ok.returncode == 0, ok.stderr
    assert f"1 of them from {tmp_path / 'words'}" in ok.stdout


def test_tuning_record_is_one_file_per_model_lexicon_and_dev_set(tmp_path):
    """Tuning the LM weight on another dev set (or with a widened lexicon) keeps the earlier tuning's record."""
    from gossip_accel.bin.decode_asr import tuning_record

    plain, widened = tmp_path / "word_lm3", tmp_path / "word_lm3_dict"
    plain.mkdir()
    widened.mkdir()
    (widened / "info.json").write_text(json.dumps({"word_list": "/usr/share/dict/american-english-huge"}))
    model = tmp_path / "avg_best5.pt"
    names = {tuning_record(tmp_path, model, lm, Path("data") / dev).name
             for lm in (plain, widened) for dev in ("dev_clean", "dev_other")}
    assert names == {"word_tuning_avg_best5_on_dev_clean.json", "word_tuning_avg_best5_on_dev_other.json",
                     "word_tuning_avg_best5_american-english-huge_on_dev_clean.json",
                     "word_tuning_avg_best5_american-english-huge_on_dev_other.json"}
