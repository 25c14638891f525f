#!/usr/bin/env python3
"""Build the Gutenberg LM data dir from LibriSpeech's original-books (openslr resource 12).

    python local/prepare_gutenberg.py --src /corpora/original-books.tar.gz --out data/lm
    python local/prepare_gutenberg.py --src /corpora/original-books --out data/lm --jobs 8

``--src`` is ``original-books.tar.gz`` (read member by member, never extracted) or the directory
it was extracted to (or its ``LibriSpeech`` or ``LibriSpeech/books`` folder). Layout:

    LibriSpeech/books/utf-8/<book_id>/<book_id>.txt.utf-8   (UTF-8; a few are <book_id>.txt)
    LibriSpeech/books/ascii/<book_id>/<book_id>.txt         (ASCII or Latin-1 / cp1252)

A book in both folders is read from ``utf-8``. Other files are ignored and counted in the
report (stats.json, stderr); an input without any such book is an error.

Each book:

1. Decoding: ``utf-8`` files must be UTF-8 (otherwise an error naming the file and line);
   ``ascii`` files are read as UTF-8 (ASCII is UTF-8) or else cp1252 or else Latin-1; the
   encoding used is listed in books.tsv.
2. Project Gutenberg header and footer are cut: the text starts after the last start marker
   (``*** START OF THE/THIS PROJECT GUTENBERG EBOOK ...``, the older
   ``*END*THE SMALL PRINT! ...`` and ``*** START OF THE COPYRIGHTED PROJECT GUTENBERG ...``)
   that precedes the first end marker (``*** END OF THE/THIS PROJECT GUTENBERG ...``,
   ``End of the Project Gutenberg EBook/Etext of ...``, ``End of Project Gutenberg's ...``,
   ``*** END OF THE COPYRIGHTED ...``), and stops before that end marker. Without a marker the
   text is kept whole on that side; books.tsv says which books had which marker.
3. Hard-wrapped lines are joined into paragraphs (blank-line separated; a line ending in a
   hyphen after a letter is joined without a space: ``well-`` + ``known`` -> ``well-known``).
4. Each paragraph is tokenized like WikiText (local/make_wiki_text.py, case kept): punctuation
   split from words, intra-word hyphens ``@-@``, ``,``/``.`` inside numbers ``@,@``/``@.@``.
   Gutenberg's ``_italics_`` underscores are removed and ``--`` dashes become ``—``.
   A paragraph with no token left (e.g. a ``______`` rule) is dropped and counted.

Split, by book and deterministically: books are ordered by SHA-1 of ``"<seed>\\t<book_id>"`` and
taken into test in that order until test holds ``--test-fraction`` of all tokens (at least one
book, at least one book left for train); the rest is train (the paper: 95% / 5%). With a single
book its paragraphs are split instead (by a hash of the paragraph index) and the report says so.
The paper has no validation set; the trainer needs one for per-epoch perplexity, so
``valid.tokens`` is carved out of *train*: every training paragraph whose hash
(``"<seed>\\tvalid\\t<book_id>\\t<paragraph index>"``) falls below ``--valid-fraction`` (at least one
paragraph) moves from train to valid. Valid therefore shares books with train (it measures fit,
not generalization to new books; test does that).

Vocabulary: the words of train.tokens (after the valid carve) seen at least ``--min-count``
times (paper: 7), most frequent first; every other word becomes ``<unk>`` in all splits.

Outputs in ``--out`` (each through a temporary file and a rename; reruns give identical bytes):
``train.tokens``, ``valid.tokens``, ``test.tokens`` (one paragraph per line, tokens separated
by single spaces, books in split order), ``vocab.txt`` (``<word> <count>``, most frequent first,
counts as in train.tokens plus ``<eos>`` = its lines; gossip_accel.data.lm.Vocabulary),
``books.tsv`` (book_id, split, tokens, header_stripped, footer_stripped, paragraphs,
valid_paragraphs, encoding, header_lines, footer_lines, source) and ``stats.json`` (counts per
split: books, paragraphs, tokens, tokens with ``<eos>``, ``<unk>`` tokens and
rate = ``<unk>`` / tokens with ``<eos>``; vocabulary size; books per encoding, without markers,
skipped; ignored files).

The tokenized books are kept in a temporary folder inside ``--out`` between the passes (about
the size of the outputs; removed at the end). On the full corpus use ``--jobs N`` (one process
per core): the outputs do not depend on it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

try:
    from gossip_accel.data.lm import EOS, UNK, Vocabulary
    from gossip_accel.data.tokenize import wikitext_tokenize
except ImportError:  # run from a checkout without path.sh: the repository root is 4 levels up
    sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
    from gossip_accel.data.lm import EOS, UNK, Vocabulary
    from gossip_accel.data.tokenize import wikitext_tokenize

PROG = "prepare_gutenberg.py"
SPLITS = ("train", "valid", "test")
LAYOUT = ("LibriSpeech/books/utf-8/<book_id>/<book_id>.txt.utf-8 (or .txt) and/or "
          "LibriSpeech/books/ascii/<book_id>/<book_id>.txt")
MEMBER_RE = re.compile(r"(?:^|/)books/(utf-8|ascii)/([^/]+)/([^/]+)$")
TSV_COLUMNS = ("book_id", "split", "tokens", "header_stripped", "footer_stripped", "paragraphs",
               "valid_paragraphs", "encoding", "header_lines", "footer_lines", "source")


class DataError(Exception):
    """Bad input: the message names the file and says what was expected."""


def warn(msg: str) -> None:
    print(f"{PROG}: warning: {msg}", file=sys.stderr)


# --------------------------------------------------------------------------------------
# Text processing (pure functions, run in worker processes with --jobs)
# --------------------------------------------------------------------------------------

START_MARKERS = re.compile(
    r"^\s*\*+\s*START\s+OF\s+(?:THE\s+|THIS\s+)?PROJECT\s+GUTENBERG"
    r"|^\s*\*+\s*START\s+OF\s+THE\s+COPYRIGHTED\s+PROJECT\s+GUTENBERG"
    r"|^\s*\*+\s*END\s*\*?\s*THE\s+SMALL\s+PRINT", re.I)
END_MARKERS = re.compile(
    r"^\s*\*+\s*END\s+OF\s+(?:THE\s+|THIS\s+)?PROJECT\s+GUTENBERG"
    r"|^\s*\*+\s*END\s+OF\s+THE\s+COPYRIGHTED\s+PROJECT\s+GUTENBERG"
    r"|^\s*End\s+of\s+(?:the\s+|this\s+)?Project\s+Gutenberg", re.I)


def find_body(lines: list[str]) -> tuple[int, int, bool, bool]:
    """(first, end) line indices of the text between Gutenberg's header and footer markers."""
    starts = [i for i, line in enumerate(lines) if START_MARKERS.match(line)]
    ends = [i for i, line in enumerate(lines) if END_MARKERS.match(line)]
    first = starts[0] if starts else -1
    end = next((i for i in ends if i > first), None)
    if starts:
        first = max(i for i in starts if end is None or i < end)
    return first + 1, len(lines) if end is None else end, bool(starts), end is not None


def join_paragraphs(lines: list[str]) -> list[str]:
    """Blank-line separated blocks of hard-wrapped lines -> one string per paragraph."""
    paras: list[str] = []
    cur = ""
    for line in lines:
        s = line.strip()
        if not s:
            if cur:
                paras.append(cur)
            cur = ""
        elif not cur:
            cur = s
        elif cur[-1] == "-" and cur[-2:-1].isalpha() and s[0].isalpha():
            cur += s
        else:
            cur += " " + s
    if cur:
        paras.append(cur)
    return paras


# The repository's WikiText-style tokenization (gossip_accel/data/tokenize.py), as local/make_wiki_text.py.
tokenize = wikitext_tokenize


def clean(paragraph: str) -> str:
    """Gutenberg plain-text conventions: _italics_ underscores dropped, -- dashes -> —."""
    return re.sub(r"-{2,}", " — ", paragraph.replace("_", ""))


def unit_hash(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts."""
    h = hashlib.sha1("\t".join(map(str, parts)).encode("utf-8")).hexdigest()
    return int(h[:15], 16) / 16 ** 15


def decode(data: bytes, kind: str) -> tuple[str | None, str, str]:
    """(text or None, encoding, error message)."""
    try:
        text = data.decode("utf-8")
        enc = "ascii" if text.isascii() else "utf-8"
    except UnicodeDecodeError as e:
        if kind == "utf-8":
            line = data.count(b"\n", 0, e.start) + 1
            col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
            return None, "", (f"line {line}: invalid UTF-8 byte 0x{data[e.start]:02x} at byte {col} "
                              "of the line (expected UTF-8 text in a books/utf-8 file)")
        try:
            text, enc = data.decode("cp1252"), "cp1252"
        except UnicodeDecodeError:
            text, enc = data.decode("latin-1"), "latin-1"
    return text.lstrip("\ufeff"), enc, ""


@dataclass
class Book:
    book_id: str
    kind: str                   # folder: utf-8 | ascii
    source: str                 # member name / path
    encoding: str = ""
    error: str = ""
    header_stripped: bool = False
    footer_stripped: bool = False
    header_lines: int = 0
    footer_lines: int = 0
    lines: int = 0
    paragraphs: int = 0
    empty_paragraphs: int = 0
    tokens: int = 0
    valid_idx: list[int] = field(default_factory=list)
    best_valid: tuple[float, int] = (2.0, -1)   # smallest valid hash and its paragraph index
    split: str = ""
    work: str = ""


def process_book(job: tuple[Book, bytes, int, float]) -> tuple[Book, list[str]]:
    """Decode, strip, join, tokenize one book: (Book with counts, tokenized paragraph lines)."""
    book, data, seed, valid_fraction = job
    text, book.encoding, book.error = decode(data, book.kind)
    if text is None:
        return book, []
    lines = text.splitlines()
    first, end, book.header_stripped, book.footer_stripped = find_body(lines)
    book.lines, book.header_lines, book.footer_lines = len(lines), first, len(lines) - end
    out = []
    for para in join_paragraphs(lines[first:end]):
        toks = tokenize(clean(para))
        if not toks:
            book.empty_paragraphs += 1
            continue
        i = len(out)
        h = unit_hash(seed, "valid", book.book_id, i)
        if h < valid_fraction:
            book.valid_idx.append(i)
        book.best_valid = min(book.best_valid, (h, i))
        out.append(" ".join(toks))
        book.tokens += len(toks)
    book.paragraphs = len(out)
    if not out:
        book.error = (f"no text: {len(lines)} lines, {book.header_lines} header and {book.footer_lines} "
                      "footer lines stripped, no token left (expected a book)")
    return book, out


# --------------------------------------------------------------------------------------
# Input: tar archive or directory
# --------------------------------------------------------------------------------------

@dataclass
class Inventory:
    books: list[tuple[Book, Callable[[], bytes]]]
    ignored: list[str]
    superseded_ascii: int
    archive: str = ""           # the tar file, "" for a directory (then sources are paths)

    def where(self, name: str) -> str:
        return f"{self.archive}: member {name}" if self.archive else name


def classify(names: list[str], keys: list[str]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """book_id -> {kind: name}; names that do not fit the layout (matched on ``keys``)."""
    found: dict[str, dict[str, str]] = {}
    ignored = []
    for name, key in zip(names, keys):
        m = MEMBER_RE.search(key)
        if not m:
            ignored.append(name)
            continue
        kind, book_id, fname = m.groups()
        wanted = (f"{book_id}.txt.utf-8", f"{book_id}.txt") if kind == "utf-8" else (f"{book_id}.txt",)
        if fname not in wanted:
            ignored.append(name)
            continue
        prev = found.setdefault(book_id, {}).get(kind)
        if prev is not None:  # utf-8 folder with both .txt.utf-8 and .txt: keep .txt.utf-8
            keep, drop = (prev, name) if prev.endswith(".utf-8") else (name, prev)
            found[book_id][kind] = keep
            ignored.append(drop)
        else:
            found[book_id][kind] = name
    return found, ignored


def inventory_from_names(names: list[str], reader: Callable[[str], bytes], where: str,
                         keys: list[str] | None = None) -> Inventory:
    found, ignored = classify(names, keys or names)
    if not found:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "") if names else "nothing"
        raise DataError(f"{where}: no book found (expected {LAYOUT}); it holds {len(names)} file(s): {shown}")
    books = []
    superseded = 0
    for book_id in sorted(found):
        kinds = found[book_id]
        kind = "utf-8" if "utf-8" in kinds else "ascii"
        superseded += kind == "utf-8" and "ascii" in kinds
        name = kinds[kind]
        books.append((Book(book_id, kind, name), lambda name=name: reader(name)))
    return Inventory(books, ignored, superseded)


def open_inventory(src: Path, stack) -> Inventory:
    if not src.exists():
        raise DataError(f"{src}: no such file or directory (expected original-books.tar.gz or the "
                        "directory it was extracted to)")
    if src.is_dir():
        root = src
        for cand in (src / "LibriSpeech" / "books", src / "books", src):
            if (cand / "utf-8").is_dir() or (cand / "ascii").is_dir():
                root = cand
                break
        else:
            raise DataError(f"{src}: no books/utf-8 or books/ascii folder (expected {LAYOUT} under it)")
        paths = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            paths += [Path(dirpath) / f for f in sorted(filenames)]
        return inventory_from_names([str(p) for p in paths], lambda n: Path(n).read_bytes(), str(root),
                                    keys=["books/" + p.relative_to(root).as_posix() for p in paths])
    if src.stat().st_size == 0:
        raise DataError(f"{src}: empty file (expected original-books.tar.gz)")
    try:
        tf = stack(tarfile.open(src, "r:*"))
        members = [m for m in tf.getmembers() if m.isfile()]
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise DataError(f"{src}: not a readable tar archive ({e}); expected original-books.tar.gz "
                        "or the directory it was extracted to") from None
    by_name = {m.name: m for m in members}

    def read(name: str) -> bytes:
        try:
            f = tf.extractfile(by_name[name])
            assert f is not None
            return f.read()
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
            raise DataError(f"{src}: member {name}: corrupt or truncated archive ({e})") from None

    inv = inventory_from_names([m.name for m in members], read, str(src))
    inv.archive = str(src)
    # read members in archive order (a gzip stream only seeks forward cheaply)
    order = {m.name: i for i, m in enumerate(members)}
    inv.books.sort(key=lambda bl: order[bl[0].source])
    return inv


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------

def tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def processed(inv: Inventory, args) -> Iterator[tuple[Book, list[str]]]:
    jobs = ((book, read(), args.seed, args.valid_fraction) for book, read in inv.books)
    if args.jobs <= 1:
        yield from map(process_book, jobs)
        return
    import multiprocessing as mp
    with mp.get_context("spawn" if sys.platform == "darwin" else "fork").Pool(args.jobs) as pool:
        batch = []
        for job in jobs:  # bounded batches: never more than 8 * jobs books in memory
            batch.append(job)
            if len(batch) >= 8 * args.jobs:
                yield from pool.map(process_book, batch)
                batch = []
        yield from pool.map(process_book, batch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        epilog="Layout, processing, split and outputs: see the module docstring (head of this file).")
    ap.add_argument("--src", type=Path, required=True,
                    help="original-books.tar.gz or the directory it was extracted to")
    ap.add_argument("--out", type=Path, required=True, help="output directory (created if needed)")
    ap.add_argument("--test-fraction", type=float, default=0.05,
                    help="share of tokens (whole books) for test (default 0.05, as the paper)")
    ap.add_argument("--valid-fraction", type=float, default=0.05,
                    help="share of training paragraphs moved to valid.tokens (default 0.05; 0 = none)")
    ap.add_argument("--min-count", type=int, default=7,
                    help="training words seen fewer times become <unk> (default 7, as the paper)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the book order and the valid carve")
    ap.add_argument("--on-bad-book", choices=("error", "skip"), default="error",
                    help="a book that is not UTF-8 in books/utf-8 or has no text: stop (default) "
                         "or leave it out (listed in books.tsv as skipped)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes for tokenization (default 1)")
    args = ap.parse_args(argv)
    if not 0 < args.test_fraction < 1:
        ap.error(f"--test-fraction must be in (0, 1), got {args.test_fraction}")
    if not 0 <= args.valid_fraction < 1:
        ap.error(f"--valid-fraction must be in [0, 1), got {args.valid_fraction}")
    if args.min_count < 1:
        ap.error(f"--min-count must be >= 1, got {args.min_count}")
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    try:
        return run(args)
    except DataError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None


def run(args) -> int:
    src, out = args.src, args.out
    opened: list = []
    out.mkdir(parents=True, exist_ok=True)
    work = out / f".prepare_gutenberg.work{os.getpid()}"
    tmps: list[Path] = []
    try:
        inv = open_inventory(src, lambda x: opened.append(x) or x)
        where = str(src)
        if inv.ignored:
            shown = ", ".join(inv.ignored[:5]) + (", ..." if len(inv.ignored) > 5 else "")
            warn(f"{where}: ignored {len(inv.ignored)} file(s) outside the layout {LAYOUT}: {shown}")
        work.mkdir()
        books: list[Book] = []
        for n, (book, paras) in enumerate(processed(inv, args)):
            if book.error:
                if args.on_bad_book == "error":
                    raise DataError(f"{inv.where(book.source)}: {book.error}; "
                                    "pass --on-bad-book skip to leave such books out")
                warn(f"{inv.where(book.source)}: skipped: {book.error}")
                book.split = "skipped"
            else:
                book.work = str(work / f"{n}.txt")
                with open(book.work, "w", encoding="utf-8") as f:
                    f.write("\n".join(paras) + "\n")
            books.append(book)
        ok = [b for b in books if not b.error]
        if not ok:
            raise DataError(f"{where}: all {len(books)} book(s) were skipped, nothing to split")
        stats = split_and_write(ok, books, inv, args, out, tmps)
    finally:
        for f in opened:
            f.close()
        shutil.rmtree(work, ignore_errors=True)
        for p in tmps:
            if p.exists():
                p.unlink()
    for s in SPLITS:
        if s in stats["splits"]:
            st = stats["splits"][s]
            print(f"{PROG}: {s:5s}: {st['books']} books, {st['paragraphs']} paragraphs, {st['tokens']} tokens "
                  f"({st['token_fraction']:.1%}), {st['tokens_with_eos']} with <eos>, <unk> rate {st['unk_rate']:.2%}")
    bk = stats["books"]
    print(f"{PROG}: {bk['used']} books ({bk['skipped']} skipped; {bk['without_start_marker']} without a start "
          f"marker, {bk['without_end_marker']} without an end marker); vocab.txt: {stats['vocab_size']} words "
          f"(min count {args.min_count}); wrote {out}")
    return 0


def read_work(book: Book) -> list[str]:
    with open(book.work, encoding="utf-8") as f:
        return f.read().splitlines()


def split_and_write(ok: list[Book], books: list[Book], inv: Inventory, args, out: Path, tmps: list[Path]) -> dict:
    seed = args.seed
    total = sum(b.tokens for b in ok)
    # ---- split
    test_idx: dict[str, set[int]] = {}
    if len(ok) == 1:
        book = ok[0]
        paras = read_work(book)
        if len(paras) < (3 if args.valid_fraction > 0 else 2):
            raise DataError(f"{book.source}: only one book, with {len(paras)} paragraph(s): too few to split "
                            "into train, valid and test")
        hs = sorted((unit_hash(seed, "test", book.book_id, i), i) for i in range(len(paras)))
        test = {i for h, i in hs if h < args.test_fraction} or {hs[0][1]}
        if len(test) == len(paras):
            test.discard(hs[-1][1])
        test_idx[book.book_id] = test
        book.valid_idx = [i for i in book.valid_idx if i not in test]
        book.best_valid = min((unit_hash(seed, "valid", book.book_id, i), i)
                              for i in range(len(paras)) if i not in test)
        book.split = "train+test"
        split_mode = "paragraphs (only one book: its paragraphs are split by hash instead of books)"
        warn(f"only one book ({book.book_id}): splitting its paragraphs instead of books")
        train_books, test_books = [book], [book]
    else:
        order = sorted(ok, key=lambda b: (unit_hash(seed, b.book_id), b.book_id))
        test_books, test_tokens = [], 0
        for b in order[:-1]:
            if test_books and test_tokens >= args.test_fraction * total:
                break
            test_books.append(b)
            test_tokens += b.tokens
        train_books = order[len(test_books):]
        for b in test_books:
            b.split, b.valid_idx = "test", []
        for b in train_books:
            b.split = "train"
        split_mode = "books"
    if args.valid_fraction > 0 and not any(b.valid_idx for b in train_books):
        b = min(train_books, key=lambda b: b.best_valid)
        b.valid_idx = [b.best_valid[1]]

    # ---- vocabulary from train (after the valid carve)
    def lines_of(split: str) -> Iterator[list[str]]:
        for b in (test_books if split == "test" else train_books):
            valid = set(b.valid_idx)
            tst = test_idx.get(b.book_id, set())
            for i, line in enumerate(read_work(b)):
                if split == "test":
                    keep = b.split == "test" or i in tst
                elif i in tst:
                    keep = False
                else:
                    keep = (i in valid) == (split == "valid")
                if keep:
                    yield line.split()

    vocab = Vocabulary.build((toks + [EOS] for toks in lines_of("train")), min_count=args.min_count)
    known = vocab.index

    # ---- outputs
    splits = {}
    finals = {s: out / f"{s}.tokens" for s in SPLITS if s != "valid" or args.valid_fraction > 0}
    for s, final in finals.items():
        tmp = tmp_path(final)
        tmps.append(tmp)
        n_par = n_tok = n_unk = 0
        with open(tmp, "w", encoding="utf-8") as f:
            for toks in lines_of(s):
                mapped = [w if w in known else UNK for w in toks]
                n_unk += sum(1 for w in mapped if w == UNK)
                n_par += 1
                n_tok += len(toks)
                f.write(" ".join(mapped) + "\n")
        n_books = len({b.book_id for b in (test_books if s == "test" else train_books)
                       if s != "valid" or b.valid_idx})
        splits[s] = {"file": final.name, "books": n_books, "paragraphs": n_par, "tokens": n_tok,
                     "tokens_with_eos": n_tok + n_par, "unk": n_unk,
                     "unk_rate": round(n_unk / max(n_tok + n_par, 1), 6),
                     "token_fraction": round(n_tok / max(total, 1), 6)}
    if splits["train"]["paragraphs"] == 0:
        raise DataError(f"{args.src}: no training paragraph left after the test split and the valid carve "
                        f"({len(ok)} book(s), {total} tokens): too little text")
    vocab_tmp = tmp_path(out / "vocab.txt")
    tmps.append(vocab_tmp)
    vocab.save(vocab_tmp)
    assert vocab.counts[vocab.index[EOS]] == splits["train"]["paragraphs"]

    tsv_tmp = tmp_path(out / "books.tsv")
    tmps.append(tsv_tmp)
    with open(tsv_tmp, "w", encoding="utf-8") as f:
        f.write("\t".join(TSV_COLUMNS) + "\n")
        for b in sorted(books, key=lambda b: (not b.book_id.isdigit(), int(b.book_id) if b.book_id.isdigit() else 0,
                                              b.book_id)):
            row = (b.book_id, b.split, b.tokens, "yes" if b.header_stripped else "no",
                   "yes" if b.footer_stripped else "no", b.paragraphs, len(b.valid_idx) if b.split != "skipped" else 0,
                   b.encoding or "-", b.header_lines, b.footer_lines, b.source)
            f.write("\t".join(map(str, row)) + "\n")

    enc = Counter(b.encoding for b in ok)
    skipped = [b for b in books if b.error]
    stats = {
        "corpus": "gutenberg (LibriSpeech original-books, openslr 12)",
        "src": str(args.src),
        "options": {"test_fraction": args.test_fraction, "valid_fraction": args.valid_fraction,
                    "min_count": args.min_count, "seed": args.seed, "on_bad_book": args.on_bad_book},
        "split_mode": split_mode,
        "valid_note": "valid.tokens = training paragraphs moved out of train (hash < valid_fraction)",
        "unk_rate_note": "<unk> tokens / tokens incl. one <eos> per line",
        "books": {
            "found": len(books), "used": len(ok), "skipped": len(skipped),
            "skipped_ids": [b.book_id for b in skipped],
            "from_utf8_folder": sum(b.kind == "utf-8" for b in ok),
            "from_ascii_folder": sum(b.kind == "ascii" for b in ok),
            "ascii_copies_superseded_by_utf8": inv.superseded_ascii,
            "encodings": dict(sorted(enc.items())),
            "without_start_marker": sum(not b.header_stripped for b in ok),
            "without_end_marker": sum(not b.footer_stripped for b in ok),
        },
        "lines": {"total": sum(b.lines for b in ok), "header_stripped": sum(b.header_lines for b in ok),
                  "footer_stripped": sum(b.footer_lines for b in ok)},
        "paragraphs_without_tokens_dropped": sum(b.empty_paragraphs for b in ok),
        "ignored_files": {"count": len(inv.ignored), "examples": inv.ignored[:20]},
        "tokens_total": total,
        "vocab_size": len(vocab),
        "splits": splits,
    }
    stats_tmp = tmp_path(out / "stats.json")
    tmps.append(stats_tmp)
    with open(stats_tmp, "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")

    for s, final in finals.items():
        os.replace(tmp_path(final), final)
    os.replace(vocab_tmp, out / "vocab.txt")
    os.replace(tsv_tmp, out / "books.tsv")
    if args.valid_fraction == 0 and (out / "valid.tokens").exists():
        (out / "valid.tokens").unlink()
        warn(f"--valid-fraction 0: removed the stale {out / 'valid.tokens'}")
    os.replace(stats_tmp, out / "stats.json")
    for b in ok:
        if b.header_lines + b.footer_lines > b.lines / 2:
            warn(f"{b.source}: {b.header_lines} header + {b.footer_lines} footer lines stripped of {b.lines}: "
                 "check its Project Gutenberg markers")
    return stats


if __name__ == "__main__":
    sys.exit(main())
