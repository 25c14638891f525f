"""Data preparation of the wikitext103/lm1 and gutenberg/lm1 recipes (their local/ scripts).

The scripts are imported from their paths and their ``main(argv)`` called in-process (one torch
import for all). Fixtures are made in tmp_path by the tests: a fake WikiText-103 directory, small
original-books trees and tars, a fake janeaustenr R package. Two tests run on the shipped mini
corpora (local/data/wiki_mini and recipes/gutenberg/lm1/local/data/original-books-mini.tar.gz).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import struct
import sys
import tarfile
import textwrap
import zlib
from collections import Counter
from pathlib import Path

import pytest
from recipe_local import load

ROOT = Path(__file__).resolve().parent.parent
WIKI_LOCAL = ROOT / "recipes" / "wikitext103" / "lm1" / "local"
GUT_LOCAL = ROOT / "recipes" / "gutenberg" / "lm1" / "local"
MINI_TAR = GUT_LOCAL / "data" / "original-books-mini.tar.gz"
WIKI_MINI = ROOT / "local" / "data" / "wiki_mini"




pw = load(WIKI_LOCAL / "prepare_wikitext.py")
mm = load(WIKI_LOCAL / "make_mini.py")
pg = load(GUT_LOCAL / "prepare_gutenberg.py")
mb = load(GUT_LOCAL / "make_mini_books.py")


def fails(main, argv, *needles):
    """main(argv) must stop with an error message containing every needle."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    msg = str(e.value.code)
    for n in needles:
        assert str(n) in msg, msg
    return msg


def snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def vocab_lines(path: Path) -> list[tuple[str, int]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        w, c = line.split(" ")
        out.append((w, int(c)))
    return out


def stream_counts(path: Path) -> Counter:
    """Token counts as the trainer reads the file: tokens + <eos> per non-empty line."""
    c = Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        toks = line.split()
        if toks:
            c.update(toks + ["<eos>"])
    return c


# ======================================================================================
# WikiText-103
# ======================================================================================

TRAIN = """ 
 = Alpha = 
 
 The cat sat on the mat . The cat ran . 
 A dog saw the cat and the <unk> . 
 
 = = Beta = = 
 
 The dog sat . Rare word here . 
"""
VALID = " \n = Gamma = \n \n The cat saw a <unk> dog . \n"
TEST = " \n The mat sat on the cat . Unseen words here . \n"


def wikidir(d: Path, train=TRAIN, valid=VALID, test=TEST) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        (d / f"wiki.{name}.tokens").write_bytes(data)
    return d


def test_wikitext_outputs_vocab_stats_and_rerun(tmp_path, capsys):
    src, out = wikidir(tmp_path / "src"), tmp_path / "out"
    assert pw.main(["--src", str(src), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "no <unk>" not in err and "wiki.test.tokens: 2 tokens are not in the training vocabulary" in err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens", "vocab.txt", "stats.json"])
    for s in ("train", "valid", "test"):  # byte-for-byte copies
        assert (out / f"wiki.{s}.tokens").read_bytes() == (src / f"wiki.{s}.tokens").read_bytes()
    vocab = vocab_lines(out / "vocab.txt")
    counts = [c for _, c in vocab]
    assert counts == sorted(counts, reverse=True)
    assert dict(vocab) == stream_counts(src / "wiki.train.tokens")  # all training tokens, min count 1
    assert dict(vocab)["<eos>"] == 5 and dict(vocab)["<unk>"] == 1 and dict(vocab)["Rare"] == 1
    stats = json.loads((out / "stats.json").read_text())
    tr, te = stats["splits"]["train"], stats["splits"]["test"]
    assert stats["vocab_size"] == len(vocab)
    assert (tr["lines"], tr["blank_lines"], tr["paragraph_lines"]) == (9, 4, 5)
    assert tr["tokens"] == sum(len(line.split()) for line in TRAIN.splitlines())
    assert tr["tokens_with_eos"] == tr["tokens"] + 5
    assert tr["unk"] == 1 and tr["unk_rate"] == round(1 / tr["tokens_with_eos"], 6)
    # "Unseen" and "words" are not in the training vocabulary: read as <unk>
    assert te["oov"] == 2 and te["unk"] == 2
    # rerun: identical bytes, no temporary file left
    before = snapshot(out)
    assert pw.main(["--src", str(src), "--out", str(out)]) == 0
    assert snapshot(out) == before


def test_wikitext_warns_when_train_has_no_unk(tmp_path, capsys):
    src = wikidir(tmp_path / "src", train=TRAIN.replace("<unk>", "bird"))
    assert pw.main(["--src", str(src), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "no <unk>" in err and "wiki.train.tokens" in err


def test_wikitext_unk_threshold_maps_rare_words_everywhere(tmp_path):
    src, out = wikidir(tmp_path / "src", train=TRAIN.replace("<unk>", "bird")), tmp_path / "out"
    assert pw.main(["--src", str(src), "--out", str(out), "--unk-threshold", "2"]) == 0
    train_counts = Counter((src / "wiki.train.tokens").read_text().split())
    for s in ("train", "valid", "test"):
        raw = (src / f"wiki.{s}.tokens").read_text()
        new = (out / f"wiki.{s}.tokens").read_text()
        assert len(new.splitlines()) == len(raw.splitlines())
        for a, b in zip(raw.splitlines(), new.splitlines()):  # same spacing, rare words -> <unk>
            assert len(a.split(" ")) == len(b.split(" "))
            for wa, wb in zip(a.split(" "), b.split(" ")):
                assert wb == (wa if train_counts[wa] >= 2 or wa in ("", "<unk>") else "<unk>")
    vocab = dict(vocab_lines(out / "vocab.txt"))
    assert "Rare" not in vocab and "bird" not in vocab and vocab["cat"] == 3
    assert set(vocab) == {w for w, c in train_counts.items() if c >= 2} | {"<unk>", "<eos>"}
    stats = json.loads((out / "stats.json").read_text())
    assert stats["splits"]["test"]["oov"] == 0
    assert stats["splits"]["test"]["mapped_to_unk"] == sum(train_counts[w] < 2 for w in TEST.split()) == 5
    assert stats["splits"]["train"]["mapped_to_unk"] == sum(c for c in train_counts.values() if c < 2)
    assert stats["splits"]["train"]["unk"] == vocab["<unk>"] == stats["splits"]["train"]["mapped_to_unk"]


@pytest.mark.parametrize("case", ["missing", "empty", "blank", "bad_utf8", "no_src", "nested", "raw"])
def test_wikitext_bad_input(tmp_path, case):
    out = tmp_path / "out"
    if case == "missing":
        src = wikidir(tmp_path / "src")
        (src / "wiki.test.tokens").unlink()
        needles = ["wiki.test.tokens", "missing split file", "wiki.valid.tokens"]
    elif case == "empty":
        src = wikidir(tmp_path / "src", valid="")
        needles = ["wiki.valid.tokens", "empty file"]
    elif case == "blank":
        src = wikidir(tmp_path / "src", valid=" \n \n")
        needles = ["wiki.valid.tokens", "no tokens"]
    elif case == "bad_utf8":
        src = wikidir(tmp_path / "src", test=b" \n fine line \n caf\xe9 au lait \n")
        needles = ["wiki.test.tokens:3:", "0xe9", "UTF-8"]
    elif case == "no_src":
        src = tmp_path / "nowhere"
        needles = ["nowhere", "no such directory", "wiki.train.tokens"]
    elif case == "nested":
        src = tmp_path / "top"
        wikidir(src / "wikitext-103")
        needles = ["missing split file", "pass that as --src"]
    else:
        src = tmp_path / "src"
        src.mkdir()
        (src / "wiki.train.raw").write_text("x\n")
        needles = ["wiki.train.tokens", "WikiText-103-raw"]
    fails(pw.main, ["--src", src, "--out", out], *needles)
    assert not out.exists() or not any(out.iterdir())  # nothing written


def test_wiki_mini_make_mini_then_prepare(tmp_path):
    """The embedded wiki_mini -> make_mini.py (rare words -> <unk>) -> prepare_wikitext.py."""
    mini, out = tmp_path / "mini", tmp_path / "prep"
    assert mm.main(["--src", str(WIKI_MINI), "--out", str(mini)]) == 0
    assert mm.main(["--src", str(WIKI_MINI), "--out", str(mini)]) == 0  # idempotent
    raw_train = Counter((WIKI_MINI / "wiki.train.tokens").read_text(encoding="utf-8").split())
    for s in ("train", "valid", "test"):
        raw = (WIKI_MINI / f"wiki.{s}.tokens").read_text(encoding="utf-8")
        new = (mini / f"wiki.{s}.tokens").read_text(encoding="utf-8")
        assert len(new.split()) == len(raw.split()) and new.count("\n") == raw.count("\n")
        assert {w for w in new.split() if w != "<unk>"} <= {w for w, c in raw_train.items() if c >= 3}
        assert "<unk>" in new
    assert pw.main(["--src", str(mini), "--out", str(out)]) == 0
    stats = json.loads((out / "stats.json").read_text())
    for s in ("train", "valid", "test"):
        assert stats["splits"][s]["oov"] == 0 and 0 < stats["splits"][s]["unk_rate"] < 0.2
    vocab = dict(vocab_lines(out / "vocab.txt"))
    assert min(c for w, c in vocab.items() if w != "<unk>") >= 3
    assert stats["vocab_size"] == len(vocab) == sum(c >= 3 for c in raw_train.values()) + 2
    # prepare_wikitext's own --unk-threshold 3 on the raw corpus gives the same three files
    direct = tmp_path / "direct"
    assert pw.main(["--src", str(WIKI_MINI), "--out", str(direct), "--unk-threshold", "3"]) == 0
    for s in ("train", "valid", "test"):
        assert (direct / f"wiki.{s}.tokens").read_bytes() == (mini / f"wiki.{s}.tokens").read_bytes()


def test_make_mini_bad_input(tmp_path):
    src = wikidir(tmp_path / "src", train=b" ok \n \xff\n")
    fails(mm.main, ["--src", src, "--out", tmp_path / "o"], "wiki.train.tokens:2:", "0xff")
    (src / "wiki.train.tokens").unlink()
    fails(mm.main, ["--src", src, "--out", tmp_path / "o"], "wiki.train.tokens", "missing")


# ======================================================================================
# Gutenberg
# ======================================================================================

WORDS = ("the a of and to in was she he it that her his had with for as but at not be on by you "
         "is which Mr Mrs Miss said could would very much more than so all been have were").split()


def prose(rng_seed: int, n_paras: int, marker: str) -> list[str]:
    """Deterministic paragraphs over a shared word pool, each with the book's marker word."""
    out = []
    h = rng_seed
    for p in range(n_paras):
        words = [marker]
        for _ in range(12 + p % 7):
            h = (h * 1103515245 + 12345) % 2 ** 31
            words.append(WORDS[h % len(WORDS)])
        words.insert(3, f"Only{rng_seed}x{p}")  # a word seen once: <unk> at min count > 1
        out.append(" ".join(words) + ".")
    return out


JOIN_RAW = "It was a _truly_ well-\nknown fact--said he--that\nMr. Smith's 1,000 cats\nwere grey."
JOIN_TOKENS = "It was a truly well @-@ known fact — said he — that Mr . Smith 's 1 @,@ 000 cats were grey ."


def gbook(title: str, paras: list[str], style: str = "modern", crlf: bool = True) -> str:
    body = []
    for p in paras:
        body += (p.split("\n") if "\n" in p else textwrap.wrap(p, 40, break_on_hyphens=False)) + [""]
    if style == "modern":
        head = [f"The Project Gutenberg EBook of {title}", "", "Headerword licence terms here.", "",
                f"*** START OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***", "", ""]
        foot = ["", f"End of the Project Gutenberg EBook of {title}", "",
                f"*** END OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***", "", "Footerword license text."]
    elif style == "old":
        head = [f"**The Project Gutenberg Etext of {title}**", "Headerword small print.",
                "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*", ""]
        foot = [f"End of The Project Gutenberg Etext of {title}", "Footerword."]
    else:
        head, foot = [], []
    return ("\r\n" if crlf else "\n").join(head + body + foot) + "\n"


def expected_lines(paras: list[str]) -> list[str]:
    return [" ".join(pg.tokenize(pg.clean(pg.join_paragraphs(p.split("\n"))[0]))) for p in paras]


def books_fixture() -> tuple[dict[str, bytes], dict[str, list[str]]]:
    """original-books members -> bytes; book id -> its paragraphs (as in the text)."""
    paras = {
        "100": [JOIN_RAW] + prose(1, 11, "Bookhundred") + ["Caf\u00e9 \u201cna\u00efve\u201d r\u00e9sum\u00e9 said she."],
        "200": prose(2, 9, "Booktwohundred") + ["Caf\u00e9 au lait for Miss Bingley."],
        "300": prose(3, 10, "Bookthreehundred"),
        "400": prose(4, 8, "Bookfourhundred"),
    }
    files = {
        "LibriSpeech/books/utf-8/100/100.txt.utf-8": gbook("Hundred", paras["100"]).encode("utf-8"),
        "LibriSpeech/books/ascii/200/200.txt": gbook("Two Hundred", paras["200"], "old").encode("latin-1"),
        # in both folders: the utf-8 copy (a .txt there) must win over the different ascii copy
        "LibriSpeech/books/utf-8/300/300.txt": gbook("Three Hundred", paras["300"], crlf=False).encode("utf-8"),
        "LibriSpeech/books/ascii/300/300.txt": gbook("Three Hundred", prose(9, 3, "Wrongcopy")).encode("ascii"),
        "LibriSpeech/books/utf-8/400/400.txt.utf-8": gbook("Four Hundred", paras["400"], None).encode("utf-8"),
        "LibriSpeech/books/README.txt": b"not a book\n",
    }
    return files, paras


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def write_tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in sorted(files.items()):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


def read_tsv(path: Path) -> dict[str, dict[str, str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    cols = lines[0].split("\t")
    assert cols[:4] == ["book_id", "split", "tokens", "header_stripped"]
    return {r.split("\t")[0]: dict(zip(cols, r.split("\t"))) for r in lines[1:]}


def prep(src, out, *extra) -> dict:
    assert pg.main(["--src", str(src), "--out", str(out), *map(str, extra)]) == 0
    return json.loads((out / "stats.json").read_text(encoding="utf-8"))


def test_gutenberg_tree_and_tar(tmp_path, capsys):
    files, paras = books_fixture()
    tree = write_tree(tmp_path / "extracted", files)
    tar = write_tar(tmp_path / "original-books.tar.gz", files)
    stats = prep(tar, tmp_path / "a", "--min-count", 1)
    err = capsys.readouterr().err
    assert "ignored 1 file(s)" in err and "README.txt" in err
    out = tmp_path / "a"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["train.tokens", "valid.tokens", "test.tokens", "vocab.txt", "books.tsv", "stats.json"])
    # the directory (any of its three levels) gives the same data
    for src in (tree, tree / "LibriSpeech", tree / "LibriSpeech" / "books"):
        prep(src, tmp_path / "b", "--min-count", 1)
        for f in ("train.tokens", "valid.tokens", "test.tokens", "vocab.txt"):
            assert (tmp_path / "b" / f).read_bytes() == (out / f).read_bytes()
    rows = read_tsv(out / "books.tsv")
    assert set(rows) == {"100", "200", "300", "400"}
    assert rows["300"]["source"].endswith("utf-8/300/300.txt") and rows["200"]["source"].endswith("ascii/200/200.txt")
    assert rows["200"]["encoding"] == "cp1252" and rows["100"]["encoding"] == "utf-8"
    assert [rows[b]["header_stripped"] for b in ("100", "200", "300", "400")] == ["yes", "yes", "yes", "no"]
    assert [rows[b]["footer_stripped"] for b in ("100", "200", "300", "400")] == ["yes", "yes", "yes", "no"]
    for b, ps in paras.items():  # header/footer gone, every paragraph kept: token counts are exact
        assert int(rows[b]["tokens"]) == sum(len(x.split()) for x in expected_lines(ps)), b
        assert int(rows[b]["paragraphs"]) == len(ps)
    assert stats["books"]["ascii_copies_superseded_by_utf8"] == 1 and stats["ignored_files"]["count"] == 1
    assert stats["books"]["without_start_marker"] == 1 and stats["books"]["without_end_marker"] == 1
    text = "".join((out / f).read_text(encoding="utf-8") for f in ("train.tokens", "valid.tokens", "test.tokens"))
    for junk in ("Headerword", "Footerword", "Gutenberg", "Wrongcopy", "SMALL", "_", "--"):
        assert junk not in text
    # paragraphs joined (hard wrap, hyphen break, italics, dashes) and tokenized WikiText-style
    all_lines = text.splitlines()
    vocab = dict(vocab_lines(out / "vocab.txt"))
    assert " ".join(w if w in vocab else "<unk>" for w in JOIN_TOKENS.split()) in all_lines
    assert len(all_lines) == sum(len(p) for p in paras.values())


def test_gutenberg_paragraph_joining_and_markers():
    assert pg.join_paragraphs(["", "  One two", "three-", "four.  ", "", "", "Five", "six--", "seven"]) == [
        "One two three-four.", "Five six-- seven"]
    assert " ".join(pg.tokenize(pg.clean(pg.join_paragraphs(JOIN_RAW.split("\n"))[0]))) == JOIN_TOKENS
    head = ["Title", "*** START OF THE PROJECT GUTENBERG EBOOK X ***", "text", "End of Project Gutenberg's X",
            "*** END OF THE PROJECT GUTENBERG EBOOK X ***", "license"]
    assert pg.find_body(head) == (2, 3, True, True)
    old = ["*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*", "a",
           "***START OF THE PROJECT GUTENBERG EBOOK X***", "b", "***END OF THE PROJECT GUTENBERG EBOOK X***"]
    assert pg.find_body(old) == (3, 4, True, True)
    assert pg.find_body(["no", "markers"]) == (0, 2, False, False)
    assert pg.find_body(["text", "End of the Project Gutenberg EBook of X", "lic"]) == (0, 1, False, True)


def test_gutenberg_tokenizer_matches_make_wiki_text():
    mwt = load(ROOT / "local" / "make_wiki_text.py")
    for s in ["The U.S. army's 1,250.5 km high-speed trains (e.g. TGV) don't stop.",
              "Café «naïve» — O'Neil said: “Well-known!”", JOIN_TOKENS]:
        assert pg.tokenize(s) == mwt.tokenize(s)


def gut_many(n_books: int) -> tuple[dict[str, bytes], dict[str, list[str]]]:
    paras = {str(1000 + i): prose(i, 6 + i % 5, f"Marker{i}") for i in range(n_books)}
    files = {f"LibriSpeech/books/utf-8/{b}/{b}.txt.utf-8": gbook(f"Book {b}", p).encode() for b, p in paras.items()}
    return files, paras


def test_gutenberg_split_by_book_deterministic_and_min_count(tmp_path):
    files, paras = gut_many(12)
    tar = write_tar(tmp_path / "books.tar.gz", files)
    stats = prep(tar, tmp_path / "a", "--test-fraction", 0.2, "--min-count", 3)
    out = tmp_path / "a"
    rows = read_tsv(out / "books.tsv")
    # test = the first books in SHA-1("<seed>\t<id>") order until >= 20% of the tokens
    order = sorted(paras, key=lambda b: hashlib.sha1(f"0\t{b}".encode()).hexdigest())
    total = sum(int(r["tokens"]) for r in rows.values())
    k, acc = 0, 0
    while acc < 0.2 * total:
        acc += int(rows[order[k]]["tokens"])
        k += 1
    assert {b for b, r in rows.items() if r["split"] == "test"} == set(order[:k])
    assert stats["split_mode"] == "books" and stats["splits"]["test"]["books"] == k
    # every paragraph in exactly the split of its book (valid: carved from train books only)
    vocab = dict(vocab_lines(out / "vocab.txt"))
    got = {s: Counter((out / f"{s}.tokens").read_text().splitlines()) for s in ("train", "valid", "test")}
    want = {"test": Counter(), "trainvalid": Counter()}
    for b, ps in paras.items():
        mapped = [" ".join(w if w in vocab else "<unk>" for w in line.split()) for line in expected_lines(ps)]
        want["test" if rows[b]["split"] == "test" else "trainvalid"].update(mapped)
    assert got["test"] == want["test"] and got["train"] + got["valid"] == want["trainvalid"]
    assert sum(got["valid"].values()) == sum(int(r["valid_paragraphs"]) for r in rows.values()) >= 1
    # vocabulary: train.tokens words with count >= 3, counts exactly as in train.tokens
    assert vocab == stream_counts(out / "train.tokens") and vocab["<unk>"] > 0
    assert all(c >= 3 for w, c in vocab.items() if w != "<unk>")
    for i in range(12):  # each marker: in >= 5 paragraphs of its book only
        assert (f"Marker{i}" in vocab) == (rows[str(1000 + i)]["split"] == "train")
    for s in ("valid", "test"):
        assert set((out / f"{s}.tokens").read_text().split()) <= set(vocab)
    assert stats["splits"]["train"]["unk"] == vocab["<unk>"]
    # deterministic: same bytes on rerun and with --jobs 2; another seed, another split
    before = snapshot(out)
    prep(tar, out, "--test-fraction", 0.2, "--min-count", 3, "--jobs", 2)
    assert snapshot(out) == before
    prep(tar, tmp_path / "s1", "--test-fraction", 0.2, "--min-count", 3, "--seed", 1)
    rows1 = read_tsv(tmp_path / "s1" / "books.tsv")
    assert {b for b, r in rows1.items() if r["split"] == "test"} != set(order[:k])


def test_gutenberg_single_book_splits_paragraphs(tmp_path, capsys):
    files, paras = gut_many(1)
    stats = prep(write_tree(tmp_path / "t", files), tmp_path / "o", "--min-count", 1)
    assert "only one book" in capsys.readouterr().err and stats["split_mode"].startswith("paragraphs")
    n = {s: v["paragraphs"] for s, v in stats["splits"].items()}
    assert n["test"] >= 1 and n["valid"] >= 1 and n["train"] >= 1 and sum(n.values()) == len(paras["1000"])
    assert read_tsv(tmp_path / "o" / "books.tsv")["1000"]["split"] == "train+test"


def test_gutenberg_valid_fraction_zero(tmp_path):
    files, _ = gut_many(3)
    tar = write_tar(tmp_path / "b.tar.gz", files)
    prep(tar, tmp_path / "o", "--min-count", 1)
    assert (tmp_path / "o" / "valid.tokens").exists()
    stats = prep(tar, tmp_path / "o", "--min-count", 1, "--valid-fraction", 0)
    assert not (tmp_path / "o" / "valid.tokens").exists() and "valid" not in stats["splits"]


def test_gutenberg_bad_input(tmp_path):
    out = tmp_path / "out"
    files, _ = books_fixture()
    # a tar without the layout
    bad = write_tar(tmp_path / "wrong.tar.gz", {"books/100.txt": b"x\n", "other/a.txt": b"y\n"})
    fails(pg.main, ["--src", bad, "--out", out], "wrong.tar.gz", "no book found",
          "LibriSpeech/books/utf-8/<book_id>/<book_id>.txt.utf-8", "books/100.txt")
    # non-UTF-8 bytes in a utf-8 book: file (member) and line
    broken = dict(files)
    broken["LibriSpeech/books/utf-8/100/100.txt.utf-8"] = b"line one\nline two\nbad \xe9 byte\n"
    fails(pg.main, ["--src", write_tar(tmp_path / "enc.tar.gz", broken), "--out", out],
          "enc.tar.gz: member LibriSpeech/books/utf-8/100/100.txt.utf-8", "line 3", "0xe9", "--on-bad-book skip")
    fails(pg.main, ["--src", write_tree(tmp_path / "enc_dir", broken), "--out", out],
          str(tmp_path / "enc_dir" / "LibriSpeech/books/utf-8/100/100.txt.utf-8"), "line 3")
    # --on-bad-book skip: left out, listed in books.tsv
    prep(write_tar(tmp_path / "enc2.tar.gz", broken), tmp_path / "skip", "--on-bad-book", "skip", "--min-count", 1)
    assert read_tsv(tmp_path / "skip" / "books.tsv")["100"]["split"] == "skipped"
    # an empty book
    empty = dict(files)
    empty["LibriSpeech/books/utf-8/400/400.txt.utf-8"] = b"\r\n  \r\n"
    fails(pg.main, ["--src", write_tar(tmp_path / "empty_book.tar.gz", empty), "--out", out],
          "400.txt.utf-8", "no text")
    # empty, non-tar and missing inputs; a directory without books/
    (tmp_path / "zero.tar.gz").write_bytes(b"")
    fails(pg.main, ["--src", tmp_path / "zero.tar.gz", "--out", out], "zero.tar.gz", "empty file")
    (tmp_path / "notes.txt").write_text("hello\n")
    fails(pg.main, ["--src", tmp_path / "notes.txt", "--out", out], "notes.txt", "not a readable tar archive")
    fails(pg.main, ["--src", tmp_path / "absent.tar.gz", "--out", out], "absent.tar.gz", "no such file")
    (tmp_path / "emptydir").mkdir()
    fails(pg.main, ["--src", tmp_path / "emptydir", "--out", out], "emptydir", "books/utf-8")
    assert not out.exists() or not any(out.iterdir())  # no work dir or temporary file left


def test_help_of_every_script(capsys):
    for mod in (pw, mm, pg, mb):
        with pytest.raises(SystemExit) as e:
            mod.main(["--help"])
        assert e.value.code == 0 and "usage:" in capsys.readouterr().out


# ---- make_mini_books.py offline: a fake janeaustenr package (R lazy-load database) ----------

def r_int(i: int) -> bytes:
    return struct.pack(">i", i)


def r_chars(s: str) -> bytes:
    b = s.encode("utf-8")
    return r_int(9 | ((64 if s.isascii() else 8) << 12)) + r_int(len(b)) + b


def r_strs(v: list[str], names: list[str] | None = None) -> bytes:
    return r_int(16 | ((1 << 9) if names else 0)) + r_int(len(v)) + b"".join(map(r_chars, v)) + \
        (r_names(names) if names else b"")


def r_names(names: list[str]) -> bytes:  # attribute pairlist: names = <character>
    return r_int(2 | (1 << 10)) + r_int(1) + r_chars("names") + r_strs(names) + r_int(254)


def r_list(items: list[bytes], names: list[str]) -> bytes:
    return r_int(19 | (1 << 9)) + r_int(len(items)) + b"".join(items) + r_names(names)


def serialize(body: bytes) -> bytes:
    return b"X\n" + r_int(2) + r_int(0x040201) + r_int(0x020300) + body


def fake_janeaustenr(d: Path) -> dict[str, list[str]]:
    novels = {}
    for i, name in enumerate(mb.NOVELS):
        lines = [name.upper(), "", "by Jane Austen", ""]
        for p in prose(i, 4, f"Novel{i}"):
            lines += textwrap.wrap(p, 50) + [""]
        if name == "mansfieldpark":
            lines += ["It cost \u00a35 and more.", ""]
        novels[name] = lines
    rdb, offsets = b"", []
    for name in mb.NOVELS:
        data = serialize(r_strs(novels[name]))
        blob = struct.pack(">I", len(data)) + zlib.compress(data)
        offsets.append(r_int(13) + r_int(2) + r_int(len(rdb)) + r_int(len(blob)))
        rdb += blob
    index = r_list([r_list(offsets, list(mb.NOVELS)), r_list([], []), r_int(10) + r_int(1) + r_int(1)],
                   ["variables", "references", "compressed"])
    (d / "janeaustenr" / "data").mkdir(parents=True)
    (d / "janeaustenr" / "data" / "Rdata.rdx").write_bytes(gzip.compress(serialize(index)))
    (d / "janeaustenr" / "data" / "Rdata.rdb").write_bytes(rdb)
    (d / "janeaustenr" / "DESCRIPTION").write_text("Package: janeaustenr\nVersion: 9.9.9\n")
    return novels


def test_make_mini_books_offline_then_prepare(tmp_path, capsys):
    novels = fake_janeaustenr(tmp_path / "pkg")
    out = tmp_path / "data" / "mini.tar.gz"
    assert mb.main(["--pkg-dir", str(tmp_path / "pkg"), "--out", str(out)]) == 0
    first = out.read_bytes()
    assert mb.main(["--pkg-dir", str(tmp_path / "pkg"), "--out", str(out)]) == 0
    assert out.read_bytes() == first  # reproducible archive
    with tarfile.open(out) as tf:
        names = sorted(m.name for m in tf.getmembers() if m.isfile())
        ascii_book = tf.extractfile("LibriSpeech/books/ascii/141/141.txt").read()
    ids = {"sensesensibility": "161", "prideprejudice": "1342", "mansfieldpark": "141", "emma": "158",
           "northangerabbey": "121", "persuasion": "105"}
    assert set(names) == {*(f"LibriSpeech/books/utf-8/{i}/{i}.txt.utf-8" for i in ids.values() if i != "141"),
                          "LibriSpeech/books/ascii/141/141.txt"}
    assert b"\xa35" in ascii_book and b"\r\n" in ascii_book  # Latin-1 and CRLF
    readme = (out.parent / "README.md").read_text()
    assert "janeaustenr 9.9.9" in readme and "public domain" in readme and "make_mini_books.py" in readme
    stats = prep(out, tmp_path / "prep", "--min-count", 1)
    assert stats["books"]["used"] == 6 and stats["books"]["without_start_marker"] == 0
    assert stats["books"]["without_end_marker"] == 0 and stats["books"]["from_ascii_folder"] == 1
    rows = read_tsv(tmp_path / "prep" / "books.tsv")
    for name, i in ids.items():  # the whole text, nothing of the added header/footer
        paras = [p for p in "\n".join(novels[name]).split("\n\n") if p.strip()]
        assert int(rows[i]["tokens"]) == sum(len(x.split()) for x in expected_lines(paras)), name
    # an archive over --max-bytes drops the largest novels and says so
    small = tmp_path / "small" / "mini.tar.gz"
    assert mb.main(["--pkg-dir", str(tmp_path / "pkg"), "--out", str(small), "--max-bytes", "1500"]) == 0
    assert "leaving out" in capsys.readouterr().err and "Left out" in (small.parent / "README.md").read_text()
    fails(mb.main, ["--pkg-dir", tmp_path / "nothing", "--out", small], "Rdata.rdx")


# ---- the shipped mini Gutenberg corpus ---------------------------------------------------

def test_shipped_mini_books_pass_prepare_gutenberg(tmp_path):
    assert MINI_TAR.is_file() and MINI_TAR.stat().st_size < 2_000_000
    stats = prep(MINI_TAR, tmp_path / "o")  # defaults: paper's min count 7, 5% test
    b = stats["books"]
    assert (b["used"], b["from_utf8_folder"], b["from_ascii_folder"], b["skipped"]) == (6, 5, 1, 0)
    assert b["without_start_marker"] == 0 and b["without_end_marker"] == 0 and stats["ignored_files"]["count"] == 0
    sp = stats["splits"]
    assert sp["test"]["books"] == 1 and sp["train"]["books"] == 5
    assert stats["tokens_total"] == sum(v["tokens"] for v in sp.values()) > 800_000
    assert all(0 < v["unk_rate"] < 0.1 for v in sp.values())
    vocab = dict(vocab_lines(tmp_path / "o" / "vocab.txt"))
    assert len(vocab) == stats["vocab_size"] > 3000 and min(c for w, c in vocab.items() if w != "<unk>") >= 7
    rows = read_tsv(tmp_path / "o" / "books.tsv")
    assert sorted(rows, key=int) == ["105", "121", "141", "158", "161", "1342"]
    assert all(r["header_stripped"] == r["footer_stripped"] == "yes" for r in rows.values())
