"""Phone units: a lang dir from a pronunciation lexicon (+ flite's G2P for the words it lacks), the
tokenizer's ids, the word LM's lexicon of every pronunciation, and lexicon decoding of phone posteriors."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from gossip_accel.asr.word_lm import WordDecoder, build_word_lm
from gossip_accel.bin import train_units
from gossip_accel.data.g2p import flite_g2p, g2p
from gossip_accel.data.units import LexiconTokenizer, Tokenizer, load_units, read_lexicon

LEXICON = """THE dh ax
THE dh iy
CAT k ae t
SAT s ae t
SET s eh t
ON aa n
MAT m ae t
A ax
A ey
"""
needs_flite = pytest.mark.skipif(shutil.which("t2p") is None, reason="flite's t2p (utils/install_system_deps.sh flite)")


@pytest.fixture()
def lexicon(tmp_path):
    path = tmp_path / "lexicon.txt"
    path.write_text(LEXICON)
    return path


def make_lang(tmp_path, lexicon, name="lang", text="u1 THE CAT SAT\nu2 A CAT SAT ON THE MAT\n", *extra):
    (tmp_path / "text").write_text(text)
    train_units.main(["--text", str(tmp_path / "text"), "--lang-dir", str(tmp_path / name), "--unit-type", "phone",
                      "--lexicon", str(lexicon), *extra])
    return load_units(tmp_path / name)


def test_phone_lang_layout_ids_and_first_pronunciation(tmp_path, lexicon):
    tok = make_lang(tmp_path, lexicon)
    assert isinstance(tok, LexiconTokenizer)
    lines = (tmp_path / "lang" / "tokens.txt").read_text().splitlines()
    phones = sorted({p for line in LEXICON.splitlines() for p in line.split()[1:]})
    assert lines == [f"{t} {i}" for i, t in enumerate(["<blk>", "<unk>"] + phones)] and tok.vocab_size == len(lines)
    assert read_lexicon(tmp_path / "lang" / "lexicon.txt") == read_lexicon(lexicon)
    ids = tok.encode("THE CAT SAT")
    assert tok.decode(ids) == "dh ax k ae t s ae t" and tok.decode([0] + ids + [0]) == tok.decode(ids)
    assert tok.encode("A ZOO") == tok.encode("A") + [tok.unk_id] and tok.decode(tok.encode("A")) == "ax"
    assert tok.spellings(["THE", "ZOO", "CAT"]) == {"THE": [["dh", "ax"], ["dh", "iy"]], "CAT": [["k", "ae", "t"]]}
    again = make_lang(tmp_path, lexicon, "lang2")
    for f in ("tokens.txt", "lexicon.txt", "units.json"):
        assert (tmp_path / "lang" / f).read_bytes() == (tmp_path / "lang2" / f).read_bytes()


def test_load_units_opens_either_kind_of_lang_dir(tmp_path, lexicon):
    make_lang(tmp_path, lexicon)
    train_units.main(["--text", str(tmp_path / "text"), "--lang-dir", str(tmp_path / "char"), "--unit-type", "char"])
    assert isinstance(load_units(tmp_path / "char"), Tokenizer)
    assert isinstance(load_units(tmp_path / "char" / "bpe.model"), Tokenizer)
    assert isinstance(load_units(tmp_path / "lang"), LexiconTokenizer)
    with pytest.raises(FileNotFoundError, match="bpe.model not found"):
        load_units(tmp_path / "nothing")


def test_word_lm_lexicon_holds_every_pronunciation_and_decodes_phones_to_words(tmp_path, lexicon):
    tok = make_lang(tmp_path, lexicon)
    info = build_word_lm(["THE CAT SAT", "THE CAT SAT ON THE MAT", "A CAT SAT"], tok, tmp_path / "wlm", order=2,
                         word_list=["SET", "ZOO"])
    lines = (tmp_path / "wlm" / "lexicon.txt").read_text().splitlines()
    assert "THE dh ax" in lines and "THE dh iy" in lines and "SET s eh t" in lines
    assert info["lexicon_words"] == 7 and info["left_out_examples"] == ["ZOO"]
    ids = {t: i for i, t in enumerate(tok.tokens)}

    def frames(phones):   # each phone's frame, then a blank frame
        rows = []
        for p in phones:
            for q in (p, "<blk>"):
                r = torch.full((len(ids),), 1e-4)
                r[ids[q]] = 1.0
                rows.append((r / r.sum()).log())
        return torch.stack(rows)[None]

    lp = frames("dh iy k ae t s ae t".split())   # the second pronunciation of THE
    assert WordDecoder(tmp_path / "wlm", tok, beam=20, lm_weight=0.5)(lp, torch.tensor([lp.shape[1]])) == ["THE CAT SAT"]
    # the decoder's trie holds 6 words per spelling: the 7th homophone of CAT (the list's last) is left out
    homophones = [f"KAT{'T' * i}" for i in range(6)]
    (tmp_path / "lexicon7.txt").write_text(LEXICON + "".join(f"{w} k ae t\n" for w in homophones))
    tok7 = make_lang(tmp_path, tmp_path / "lexicon7.txt", "lang7")
    info = build_word_lm(["THE CAT SAT"], tok7, tmp_path / "wlm7", order=2, word_list=homophones)
    kat = [line.split()[0] for line in (tmp_path / "wlm7" / "lexicon.txt").read_text().splitlines() if "k ae t" in line]
    assert kat == ["CAT"] + homophones[:5] and info["left_out_examples"] == homophones[5:]


def test_bad_lexicons_and_options_name_the_file_or_option(tmp_path, lexicon):
    bad = tmp_path / "bad.txt"
    bad.write_text("THE dh ax\nCAT\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: 'CAT' has no pronunciation"):
        read_lexicon(bad)
    bad.write_text("THE dh <blk>\n")
    with pytest.raises(ValueError, match=r"bad.txt:1: <blk> and <unk> are reserved"):
        read_lexicon(bad)
    (tmp_path / "text").write_text("u1 THE CAT\n")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "gossip_accel.bin.train_units", "--text", str(tmp_path / "text"),
                               "--lang-dir", str(tmp_path / "l"), *args], capture_output=True, text=True)
    for args, message in [(["--unit-type", "phone"], "phone units need a lexicon (--lexicon) or a g2p"),
                          (["--unit-type", "phone", "--lexicon", str(tmp_path / "nope")], f"{tmp_path / 'nope'} not found"),
                          (["--unit-type", "char", "--lexicon", str(lexicon)], "are for --unit-type phone, not char")]:
        r = cli(*args)
        assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    (tmp_path / "other.txt").write_text("DOG d ao g\n")
    r = cli("--unit-type", "phone", "--lexicon", str(tmp_path / "other.txt"))
    assert r.returncode != 0 and "no word of" in r.stderr and "has a pronunciation" in r.stderr


@needs_flite
def test_flite_g2p_batches_equal_one_word_calls_and_fill_the_lexicon(tmp_path, lexicon):
    words = [f"{a}{b}{c}ton" for a in "bdgklmnprst" for b in "aeiou" for c in "lmnr"][:250]   # > one batch of 200
    batched = flite_g2p(words, jobs=3)
    assert list(flite_g2p(words, jobs=1).items()) == list(batched.items())   # parallel batches: same result, same order
    one_by_one = {}
    for w in words[:: 25]:
        one_by_one.update(flite_g2p([w]))
    assert all(batched[w] == p for w, p in one_by_one.items()) and len(batched) == len(set(words))
    # a homograph is read as alone whatever word precedes it in the batch (flite's part-of-speech context)
    homographs = ["read", "record", "use", "reading", "combine", "wind", "tear", "object"]
    alone = {w: flite_g2p([w])[w] for w in homographs}
    for before in ("will", "to", "they"):
        after = flite_g2p([w for h in homographs for w in (before, h)])
        assert {w: after[w] for w in homographs} == alone, before
    assert alone["record"] == [["r", "eh", "k", "er", "d"]] and alone["use"] == [["y", "uw", "s"]]
    got = flite_g2p(["DRUMHELLER", "a", "of"])
    assert got == {"DRUMHELLER": [["d", "r", "ah", "m", "hh", "eh", "l", "er"]], "a": [["ax"], ["ey"]], "of": [["ah", "v"]]}
    # Switchboard's tokens: Kaldi's non-speech phones; fragments as spoken noise; a word said laughing as the word
    assert g2p("flite", ["[noise]", "[laughter]", "[vocalized-noise]", "th-", "[laughter-yeah]", "yeah"]) == {
        "[noise]": [["nsn"]], "[laughter]": [["lau"]], "[vocalized-noise]": [["spn"]], "th-": [["spn"]],
        "[laughter-yeah]": [["y", "ae"]], "yeah": [["y", "ae"]]}
    # training words the lexicon lacks are pronounced by flite; decoding-time words too
    tok = make_lang(tmp_path, lexicon, "lang", "u1 THE CAT SAT\nu2 THE DRUMHELLER CAT\n", "--g2p", "flite")
    assert "DRUMHELLER d r ah m hh eh l er" in (tmp_path / "lang" / "lexicon.txt").read_text()
    assert tok.meta["train_words_by_g2p"] == 1 and tok.meta["train_words_without_pronunciation"] == 0
    assert tok.decode(tok.encode("THE MAD CAT")) == "dh ax m ae d k ae t"
