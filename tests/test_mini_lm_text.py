"""recipes/librispeech/asr1/local/make_lm_text.py: the mini corpus's LM text (wiki.train's sentences without the
articles of evaluation sentences) and WordNet's words and glosses added to it (``--wordnet``)."""
from __future__ import annotations

from pathlib import Path

import pytest

from recipe_local import load

LOCAL = Path(__file__).resolve().parent.parent / "recipes" / "librispeech" / "asr1" / "local"
lt = load(LOCAL / "make_lm_text.py")

HEADER = "  1 This software and database is being provided to you, the LICENSEE, by Princeton University\n"
NOUNS = (HEADER +
         "08531840 15 n 02 Edmonton 0 provincial_capital 0 001 @ 08524735 n 0000 | the provincial capital of "
         "Alberta (in the central part of the province)\n"
         "08532280 15 n 01 Calgary 0 001 @ 08524735 n 0000 | a city in south central Alberta; \"the Calgary "
         "Stampede is held in July\"; in 1988 it hosted the games\n")
ADJS = (HEADER + "00001740 00 a 02 able 0 able-bodied(p) 0 001 ! 00002098 a 0101 | (usually followed by `to') "
        "having the necessary means; \"she was able to program her computer\"\n")


def wordnet(tmp_path: Path, noun: str = NOUNS) -> Path:
    d = tmp_path / "wordnet"
    d.mkdir(exist_ok=True)
    (d / "data.noun").write_text(noun, encoding="latin-1")
    (d / "data.adj").write_text(ADJS, encoding="latin-1")
    for name in ("data.verb", "data.adv"):
        (d / name).write_text(HEADER, encoding="latin-1")
    return d


def corpus(tmp_path: Path, held_out: str, subsets=lt.EVAL_SUBSETS, name: str = "corpus") -> Path:
    """A LibriSpeech-layout root whose evaluation subsets hold one transcript each (the first: held_out)."""
    root = tmp_path / name
    for k, subset in enumerate(subsets):
        d = root / subset / "10" / "20"
        d.mkdir(parents=True)
        text = held_out if k == 0 else f"ANOTHER SENTENCE NUMBER {'ONE TWO THREE'.split()[k - 1]}"
        (d / "10-20.trans.txt").write_text(f"10-20-{k:04d} {text}\n", encoding="utf-8")
    return root


def test_lm_normalize():
    assert lt.lm_normalize("a self-contained (living or nonliving) entity;") == "A SELF CONTAINED LIVING OR NONLIVING ENTITY"
    assert lt.lm_normalize("provincial_capital") == "PROVINCIAL CAPITAL"
    assert lt.lm_normalize('"she\'s able to program it"') == "SHE'S ABLE TO PROGRAM IT"
    assert lt.lm_normalize("in 1988 it hosted the games") is None          # digits: left out, not half kept
    assert lt.lm_normalize("usually followed by `to'") == "USUALLY FOLLOWED BY TO"
    assert lt.lm_normalize("x = y + 2") is None and lt.lm_normalize(" ; ") is None


def test_wordnet_lines_hold_synset_words_definitions_and_examples(tmp_path):
    lines = lt.wordnet_lines(wordnet(tmp_path))
    assert lines == ["EDMONTON", "PROVINCIAL CAPITAL", "THE PROVINCIAL CAPITAL OF ALBERTA IN THE CENTRAL PART OF THE PROVINCE",
                     "CALGARY", "A CITY IN SOUTH CENTRAL ALBERTA", "THE CALGARY STAMPEDE IS HELD IN JULY",
                     "ABLE", "ABLE BODIED", "USUALLY FOLLOWED BY TO HAVING THE NECESSARY MEANS",
                     "SHE WAS ABLE TO PROGRAM HER COMPUTER"]


def test_wordnet_errors_name_the_file(tmp_path):
    d = wordnet(tmp_path)
    (d / "data.adv").unlink()
    with pytest.raises(lt.BuildError, match=r"data\.adv: missing \(--wordnet wants WordNet 3\.0's dict folder"):
        lt.wordnet_lines(d)
    d = wordnet(tmp_path, HEADER + "not a wordnet line\n")
    with pytest.raises(lt.BuildError, match=r"data\.noun:2: not a WordNet data line"):
        lt.wordnet_lines(d)
    d = wordnet(tmp_path, HEADER + "08531840 15 n zz Edmonton 0 000 | a city\n")     # a word count that is not hex
    with pytest.raises(lt.BuildError, match=r"data\.noun:2: not a WordNet data line"):
        lt.wordnet_lines(d)


def test_main_adds_wordnet_after_the_wiki_text_and_never_an_evaluation_sentence(tmp_path, capsys):
    text = tmp_path / "wiki"
    text.mkdir()
    (text / "wiki.train.tokens").write_text(
        " = Kept = \n The river flows through the old town . \n"
        " = Dropped = \n A city in south central Alberta . \n", encoding="utf-8")
    root = corpus(tmp_path, "A CITY IN SOUTH CENTRAL ALBERTA")
    out = tmp_path / "lm.txt"
    assert lt.main(["--corpus", str(root), "--text", str(text), "--out", str(out)]) == 0
    assert out.read_text().splitlines() == ["THE RIVER FLOWS THROUGH THE OLD TOWN"]
    assert lt.main(["--corpus", str(root), "--text", str(text), "--out", str(out), "--wordnet",
                    str(wordnet(tmp_path))]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "THE RIVER FLOWS THROUGH THE OLD TOWN" and "CALGARY" in lines
    assert "A CITY IN SOUTH CENTRAL ALBERTA" not in lines and len(lines) == 1 + 9
    assert "+ 9 lines, 41 words of WordNet" in capsys.readouterr().out
    assert lt.main(["--corpus", str(root), "--text", str(text), "--out", str(out), "--wordnet", str(tmp_path)]) == 1
    assert "data.noun: missing" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 10                      # a failed run leaves the last text
    # dev-other's sentences are held out too; a corpus built without dev-other has none to hold out
    (text / "wiki.train.tokens").write_text(" = Kept = \n The river flows through the old town . \n"
                                            " = Dev other = \n Another sentence number three . \n", encoding="utf-8")
    assert lt.main(["--corpus", str(root), "--text", str(text), "--out", str(out)]) == 0
    assert out.read_text().splitlines() == ["THE RIVER FLOWS THROUGH THE OLD TOWN"]
    older = corpus(tmp_path, "A CITY IN SOUTH CENTRAL ALBERTA", lt.EVAL_SUBSETS[:3], "older")
    assert lt.main(["--corpus", str(older), "--text", str(text), "--out", str(out)]) == 0
    assert out.read_text().splitlines() == ["THE RIVER FLOWS THROUGH THE OLD TOWN", "ANOTHER SENTENCE NUMBER THREE"]


def test_base_text_extended_in_lower_case_without_held_out_sentences(tmp_path, capsys):
    base = tmp_path / "lm_text.txt"
    base.write_text("the clocks are compared\nright owning fort knox\nthe  dev set's sentence\n", encoding="utf-8")
    held = tmp_path / "text"
    held.write_text("sw_1-A_000001-000200 a city in south central alberta\n", encoding="utf-8")
    dev = tmp_path / "dev_text"    # a tuning set's sentence in the base is dropped (case and spaces aside)
    dev.write_text("sw_2-B_000001-000200 THE DEV SET'S SENTENCE\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    assert lt.main(["--base", str(base), "--held-out", str(held), str(dev), "--lower-case",
                    "--wordnet", str(wordnet(tmp_path)), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[:2] == ["the clocks are compared", "right owning fort knox"] and "calgary" in lines
    assert "a city in south central alberta" not in lines and len(lines) == 2 + 9 and lines == [s.lower() for s in lines]
    assert f"(base {base}, 1 of its lines left out: --held-out sentences)" in capsys.readouterr().out
    assert lt.main(["--base", str(tmp_path / "none.txt"), "--out", str(out)]) == 1
    assert "none.txt: missing (expected --base's LM text" in capsys.readouterr().err
    (tmp_path / "latin1.txt").write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    assert lt.main(["--base", str(tmp_path / "latin1.txt"), "--out", str(out)]) == 1
    assert f"{tmp_path / 'latin1.txt'}:2: invalid UTF-8" in capsys.readouterr().err
    assert lines == out.read_text().splitlines()                                        # the output untouched
    assert lt.main(["--base", str(base), "--held-out", str(tmp_path / "no_text"), "--out", str(out)]) == 1
    assert "no_text: missing (expected --held-out's Kaldi text files" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lt.main(["--base", str(base), "--corpus", str(tmp_path), "--out", str(out)])     # one source only
