#!/usr/bin/env python3
"""Rebuild local/data/original-books-mini.tar.gz: Jane Austen's six novels in the original-books layout.

    apt-get update && python local/make_mini_books.py --download /tmp/janeaustenr
    python local/make_mini_books.py --deb /path/to/r-cran-janeaustenr_1.0.0-1_all.deb
    python local/make_mini_books.py --pkg-dir /usr/lib/R/site-library/janeaustenr

Source: the texts of Jane Austen's six completed novels (public domain) as shipped in the R
package janeaustenr (Debian package ``r-cran-janeaustenr``), which took them from Project
Gutenberg. The package keeps them as lazy-loaded R data (``data/Rdata.rdx`` / ``Rdata.rdb``:
zlib-compressed R serializations of one character vector per novel, one element per line of
the Gutenberg text, header and footer already removed). This script reads them without R:
it has a minimal reader of R's XDR serialization format (character vectors, lists,
attributes), cross-checked against the ``rdata`` package from PyPI (identical lines). The
``.deb`` is read without dpkg (an ``ar`` archive holding ``data.tar.xz``). Stdlib only.

Output (``--out``, default ``local/data/original-books-mini.tar.gz`` next to this script), in
the layout of openslr's ``original-books.tar.gz``, with the real Project Gutenberg ebook numbers
as book ids:

    LibriSpeech/books/utf-8/<id>/<id>.txt.utf-8     five novels, UTF-8
    LibriSpeech/books/ascii/<id>/<id>.txt           Mansfield Park (141), Latin-1 (one '£')

Each book gets a short Project Gutenberg-style header and footer around the text: the modern
``*** START OF THE PROJECT GUTENBERG EBOOK <TITLE> ***`` / ``*** END OF ...`` markers for the
UTF-8 books, the older ``*END*THE SMALL PRINT! ...`` / ``End of the Project Gutenberg Etext of``
markers for the ASCII one; the text keeps Gutenberg's hard wrapping (lines of at most ~76
characters, paragraphs separated by blank lines) and CRLF line ends, as the Gutenberg files have.
So prepare_gutenberg.py's header stripping, paragraph joining and both folders are exercised.

The archive is reproducible (sorted members, fixed mtimes and owners, gzip header without
name or time): rerunning on the same package gives identical bytes. If it would exceed
``--max-bytes`` (default 2,000,000), the largest novels are left out, one at a time, and the
README says so. Also writes ``README.md`` beside the archive (source, license, sizes, rebuild
command; with ``--prep-stats``, the counts of a prepare_gutenberg.py run on it).
"""
from __future__ import annotations

import argparse
import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shlex
import struct
import subprocess
import sys
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

PROG = "make_mini_books.py"
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "data" / "original-books-mini.tar.gz"
PACKAGE = "r-cran-janeaustenr"

# R object name -> (Project Gutenberg ebook number, title, folder)
NOVELS = {
    "sensesensibility": ("161", "Sense and Sensibility", "utf-8"),
    "prideprejudice": ("1342", "Pride and Prejudice", "utf-8"),
    "mansfieldpark": ("141", "Mansfield Park", "ascii"),
    "emma": ("158", "Emma", "utf-8"),
    "northangerabbey": ("121", "Northanger Abbey", "utf-8"),
    "persuasion": ("105", "Persuasion", "utf-8"),
}


class BuildError(Exception):
    pass


# --------------------------------------------------------------------------------------
# Minimal reader of R serialization (format 2/3, XDR): enough for character vectors and lists
# --------------------------------------------------------------------------------------

@dataclass
class RVec:
    type: int           # 16 STRSXP, 19 VECSXP, 13 INTSXP, 10 LGLSXP, 14 REALSXP
    values: list
    attrs: dict

    def names(self) -> list[str]:
        n = self.attrs.get("names")
        return n.values if isinstance(n, RVec) else []


class RReader:
    SPECIAL = {242: "emptyenv", 241: "baseenv", 253: "globalenv", 252: "unbound", 251: "missing", 250: "basenamespace"}

    def __init__(self, data: bytes, what: str):
        self.b, self.p, self.refs, self.what = data, 0, [], what

    def int(self) -> int:
        if self.p + 4 > len(self.b):
            raise BuildError(f"{self.what}: truncated R serialization")
        v = struct.unpack_from(">i", self.b, self.p)[0]
        self.p += 4
        return v

    def read(self):
        if self.b[:2] != b"X\n":
            raise BuildError(f"{self.what}: not an XDR R serialization (starts {self.b[:2]!r}, expected b'X\\n')")
        self.p = 2
        version = self.int()
        self.int(), self.int()
        if version == 3:
            n = self.int()
            self.p += n
        elif version != 2:
            raise BuildError(f"{self.what}: R serialization version {version} (expected 2 or 3)")
        return self.item()

    def pairlist_to_dict(self, pl) -> dict:
        out = {}
        while pl is not None:
            tag, car, pl = pl
            out[tag if isinstance(tag, str) else str(tag)] = car
        return out

    def item(self):
        flags = self.int()
        t, levels = flags & 0xFF, flags >> 12
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t == 254:                      # NILVALUE_SXP
            return None
        if t == 255:                      # REFSXP
            k = flags >> 8 or self.int()
            return self.refs[k - 1]
        if t in self.SPECIAL:
            return self.SPECIAL[t]
        if t == 1:                        # SYMSXP
            name = self.item()
            self.refs.append(name)
            return name
        if t == 2:                        # LISTSXP (pairlist): (tag, car, cdr)
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car = self.item()
            return (tag, car, self.item())
        if t == 9:                        # CHARSXP
            n = self.int()
            if n == -1:
                return None               # NA_character_
            raw = self.b[self.p:self.p + n]
            self.p += n
            return raw.decode("latin-1" if levels & 4 else "utf-8")
        if t in (16, 19, 20):
            n = self.int()
            values = [self.item() for _ in range(n)]
        elif t in (10, 13):
            n = self.int()
            values = list(struct.unpack_from(f">{n}i", self.b, self.p))
            self.p += 4 * n
        elif t == 14:
            n = self.int()
            values = list(struct.unpack_from(f">{n}d", self.b, self.p))
            self.p += 8 * n
        else:
            raise BuildError(f"{self.what}: R object of SEXP type {t} is not supported by this minimal reader")
        attrs = self.pairlist_to_dict(self.item()) if has_attr else {}
        return RVec(t, values, attrs)


def lazyload_db(rdx: bytes, rdb: bytes, what: str) -> dict[str, object]:
    """All objects of an R lazy-load database (.rdx index + .rdb blobs)."""
    try:
        index = RReader(zlib.decompress(rdx[4:]) if rdx[:2] != b"\x1f\x8b" else gzip.decompress(rdx),
                        what + ".rdx").read()
    except (zlib.error, OSError, EOFError) as e:
        raise BuildError(f"{what}.rdx: cannot decompress ({e})") from None
    if not isinstance(index, RVec) or "variables" not in index.names():
        raise BuildError(f"{what}.rdx: not a lazy-load index (no 'variables' entry)")
    variables = index.values[index.names().index("variables")]
    compressed = 1
    if "compressed" in index.names():
        compressed = index.values[index.names().index("compressed")].values[0]
    objs = {}
    for name, ref in zip(variables.names(), variables.values):
        off, length = ref.values
        blob = rdb[off:off + length]
        n = struct.unpack(">I", blob[:4])[0]
        body = blob[4:]
        try:
            if compressed in (2, 3):  # a type byte, then the data: Z xz, 2 bzip2, 1 zlib, 0 none
                data = {b"Z": lzma.decompress, b"2": bz2.decompress, b"1": zlib.decompress,
                        b"0": lambda x: x}[body[:1]](body[1:])
            else:                     # compress = TRUE: zlib
                data = zlib.decompress(body)
        except (KeyError, zlib.error, lzma.LZMAError, OSError, ValueError) as e:
            raise BuildError(f"{what}.rdb: object {name}: cannot decompress ({e!r})") from None
        if len(data) != n:
            raise BuildError(f"{what}.rdb: object {name}: {len(data)} bytes decompressed, {n} expected")
        objs[name] = RReader(data, f"{what}.rdb:{name}").read()
    return objs


# --------------------------------------------------------------------------------------
# Getting the package
# --------------------------------------------------------------------------------------

def ar_members(data: bytes, what: str) -> dict[str, bytes]:
    if data[:8] != b"!<arch>\n":
        raise BuildError(f"{what}: not a .deb (ar) archive")
    pos, out = 8, {}
    while pos + 60 <= len(data):
        hdr = data[pos:pos + 60]
        name = hdr[:16].decode("ascii").strip().rstrip("/")
        size = int(hdr[48:58].decode("ascii").strip())
        out[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
    return out


def tar_from_member(name: str, body: bytes, deb: Path) -> tarfile.TarFile:
    if name.endswith(".zst"):  # no zstd in the stdlib: let dpkg-deb decompress
        field = "--ctrl-tarfile" if name.startswith("control") else "--fsys-tarfile"
        body = subprocess.run(["dpkg-deb", field, str(deb)], check=True, capture_output=True).stdout
        return tarfile.open(fileobj=io.BytesIO(body), mode="r:")
    return tarfile.open(fileobj=io.BytesIO(body), mode="r:*")


def read_deb(deb: Path) -> tuple[dict[str, bytes], str]:
    """{'Rdata.rdx', 'Rdata.rdb', 'DESCRIPTION'} bytes from the package, and its Debian version."""
    members = ar_members(deb.read_bytes(), str(deb))
    data_name = next((n for n in members if n.startswith("data.tar")), None)
    ctrl_name = next((n for n in members if n.startswith("control.tar")), None)
    if data_name is None or ctrl_name is None:
        raise BuildError(f"{deb}: no data.tar.* / control.tar.* member (expected a Debian package)")
    files = {}
    with tar_from_member(data_name, members[data_name], deb) as tf:
        for m in tf.getmembers():
            for want in ("janeaustenr/data/Rdata.rdx", "janeaustenr/data/Rdata.rdb", "janeaustenr/DESCRIPTION"):
                if m.isfile() and m.name.endswith(want):
                    files[want.rsplit("/", 1)[1]] = tf.extractfile(m).read()
    with tar_from_member(ctrl_name, members[ctrl_name], deb) as tf:
        control = next((tf.extractfile(m).read().decode() for m in tf.getmembers()
                        if m.name.lstrip("./") == "control"), "")
    m = re.search(r"^Version:\s*(\S+)", control, re.M)
    missing = {"Rdata.rdx", "Rdata.rdb", "DESCRIPTION"} - set(files)
    if missing:
        raise BuildError(f"{deb}: lacks janeaustenr/{', janeaustenr/'.join(sorted(missing))} "
                         f"(expected the {PACKAGE} package)")
    return files, m.group(1) if m else "unknown"


def read_pkg_dir(d: Path) -> tuple[dict[str, bytes], str]:
    hits = sorted(d.rglob("janeaustenr/data/Rdata.rdx")) or sorted(d.glob("data/Rdata.rdx"))
    if not hits:
        raise BuildError(f"{d}: no janeaustenr/data/Rdata.rdx below it (expected an installed R package "
                         f"or an unpacked {PACKAGE} .deb)")
    pkg = hits[0].parent.parent
    files = {n: (pkg / "data" / n).read_bytes() for n in ("Rdata.rdx", "Rdata.rdb")}
    files["DESCRIPTION"] = (pkg / "DESCRIPTION").read_bytes()
    return files, "unknown (read from a directory)"


def apt_download(dest: Path, version: str | None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    spec = f"{PACKAGE}={version}" if version else PACKAGE
    cmd = ["apt-get", "download", spec]
    print("+", "cd", shlex.quote(str(dest)), "&&", " ".join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, cwd=dest)
    if r.returncode != 0:
        raise BuildError(f"'{' '.join(cmd)}' failed (exit {r.returncode}); run 'apt-get update' first")
    debs = sorted(dest.glob(f"{PACKAGE}_*.deb"), key=lambda p: p.stat().st_mtime)
    if not debs:
        raise BuildError(f"{dest}: no {PACKAGE}_*.deb after apt-get download")
    return debs[-1]


# --------------------------------------------------------------------------------------
# Books
# --------------------------------------------------------------------------------------

NOTE = ("[This file was made by recipes/gutenberg/lm1/local/make_mini_books.py from the text of the\n"
        "novel in the R package janeaustenr {version}, which took it from Project Gutenberg. Only\n"
        "the layout of this header and footer imitates Project Gutenberg's files.]")


def book_text(title: str, lines: list[str], folder: str, version: str) -> str:
    note = NOTE.format(version=version)
    if folder == "utf-8":
        head = [f"The Project Gutenberg eBook of {title}, by Jane Austen", "", *note.split("\n"), "",
                f"Title: {title}", "", "Author: Jane Austen", "", "Language: English", "",
                "Character set encoding: UTF-8", "", "",
                f"*** START OF THE PROJECT GUTENBERG EBOOK {title.upper()} ***", "", ""]
        foot = ["", "", "", f"*** END OF THE PROJECT GUTENBERG EBOOK {title.upper()} ***", "",
                "[The Project Gutenberg License would follow here.]", ""]
    else:
        head = [f"The Project Gutenberg Etext of {title}, by Jane Austen", "", *note.split("\n"), "",
                "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*", "", ""]
        foot = ["", "", f"End of the Project Gutenberg Etext of {title}, by Jane Austen", ""]
    return "\r\n".join(head + lines + foot) + "\r\n"


def write_tar(out: Path, files: list[tuple[str, bytes]]) -> None:
    """Reproducible tar.gz: directories and files sorted, mtime 0, root-owned, no gzip name/time."""
    dirs = sorted({"/".join(name.split("/")[:i]) for name, _ in files for i in range(1, name.count("/") + 1)})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9,
                                                   mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            for d in dirs:
                ti = tarfile.TarInfo(d + "/")
                ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
                tf.addfile(ti)
            for name, data in sorted(files):
                ti = tarfile.TarInfo(name)
                ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
                tf.addfile(ti, io.BytesIO(data))
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 epilog="Details: see the module docstring (head of this file).")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--download", type=Path, metavar="DIR",
                     help=f"run 'apt-get download {PACKAGE}' in DIR first (needs 'apt-get update')")
    src.add_argument("--deb", type=Path, help=f"a downloaded {PACKAGE}_*.deb")
    src.add_argument("--pkg-dir", type=Path, help="an installed janeaustenr R package or an unpacked .deb")
    ap.add_argument("--version", default=None, help="with --download: the Debian version to fetch (e.g. 1.0.0-1)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"archive to write (default {DEFAULT_OUT})")
    ap.add_argument("--max-bytes", type=int, default=2_000_000,
                    help="leave out the largest novels until the archive is at most this big (default 2000000)")
    ap.add_argument("--prep-stats", type=Path, default=None,
                    help="stats.json of a prepare_gutenberg.py run on the archive, to quote in README.md")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except BuildError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None


def run(args) -> int:
    if args.download:
        deb = apt_download(args.download, args.version)
    else:
        deb = args.deb
    if deb is not None:
        if not deb.is_file():
            raise BuildError(f"{deb}: no such file (expected a {PACKAGE}_*.deb)")
        files, deb_version = read_deb(deb)
    else:
        files, deb_version = read_pkg_dir(args.pkg_dir)
    desc = files["DESCRIPTION"].decode("utf-8", "replace")
    m = re.search(r"^Version:\s*(\S+)", desc, re.M)
    r_version = m.group(1) if m else "unknown"
    objs = lazyload_db(files["Rdata.rdx"], files["Rdata.rdb"], "janeaustenr/data/Rdata")
    missing = sorted(set(NOVELS) - set(objs))
    if missing:
        raise BuildError(f"janeaustenr/data/Rdata: lacks {', '.join(missing)} (has {', '.join(sorted(objs))})")

    books = []  # (name, id, title, folder, archive path, bytes, lines, words)
    for name, (book_id, title, folder) in NOVELS.items():
        v = objs[name]
        if not isinstance(v, RVec) or v.type != 16:
            raise BuildError(f"janeaustenr/data/Rdata.rdb:{name}: not a character vector")
        lines = ["" if x is None else x for x in v.values]
        text = book_text(title, lines, folder, r_version)
        if folder == "utf-8":
            path, data = f"LibriSpeech/books/utf-8/{book_id}/{book_id}.txt.utf-8", text.encode("utf-8")
        else:
            path, data = f"LibriSpeech/books/ascii/{book_id}/{book_id}.txt", text.encode("latin-1")
        books.append(dict(name=name, id=book_id, title=title, folder=folder, path=path, data=data,
                          lines=len(lines), words=sum(len(x.split()) for x in lines)))

    left_out = []
    while True:
        write_tar(args.out, [(b["path"], b["data"]) for b in books])
        size = args.out.stat().st_size
        if size <= args.max_bytes or len(books) == 1:
            break
        big = max(books, key=lambda b: (len(b["data"]), b["id"]))
        books.remove(big)
        left_out.append(big["title"])
        print(f"{PROG}: {size} bytes > --max-bytes {args.max_bytes}: leaving out {big['title']}", file=sys.stderr)
    sha = hashlib.sha256(args.out.read_bytes()).hexdigest()
    write_readme(args, books, left_out, size, sha, deb, deb_version, r_version)
    for b in books:
        print(f"{PROG}: {b['path']}: {b['title']}, {b['lines']} lines, {b['words']} words, {len(b['data'])} bytes")
    print(f"{PROG}: wrote {args.out} ({size} bytes, sha256 {sha[:16]}...) and README.md")
    return 0


def rel(p: Path) -> str:
    root = HERE.parents[3]
    try:
        return p.resolve().relative_to(root).as_posix()
    except ValueError:
        return str(p)


def write_readme(args, books, left_out, size, sha, deb, deb_version, r_version) -> None:
    rows = "\n".join(f"| {b['id']} | {b['title']} | `{b['path']}` | {b['folder']} | {b['lines']} | {b['words']} | "
                     f"{len(b['data'])} |" for b in sorted(books, key=lambda b: int(b["id"])))
    pin = f" --version {deb_version}" if deb_version[0].isdigit() else ""
    out_opt = "" if args.out.resolve() == DEFAULT_OUT else f" --out {rel(args.out)}"
    prep = ""
    if args.prep_stats:
        st = json.loads(args.prep_stats.read_text(encoding="utf-8"))
        o = st["options"]
        splits = [(s, st["splits"][s]) for s in ("train", "valid", "test") if s in st["splits"]]
        srows = "\n".join(f"| {s} | {v['books']} | {v['paragraphs']} | {v['tokens']} | {v['token_fraction']:.1%} | "
                          f"{v['tokens_with_eos']} | {v['unk']} | {v['unk_rate']:.2%} |" for s, v in splits)
        share = st["splits"]["test"]["token_fraction"]
        small = (f" With so few books, test (at least one whole book) holds {share:.1%} of the tokens, not "
                 f"{o['test_fraction']:.0%}." if share > 2 * o["test_fraction"] else "")
        prep = f"""
## Prepared

`python recipes/gutenberg/lm1/local/prepare_gutenberg.py --src {rel(args.out)} --out DIR`
(test fraction {o['test_fraction']}, valid fraction {o['valid_fraction']}, min count {o['min_count']},
seed {o['seed']}): split by {st['split_mode'].split(' ')[0]}, vocabulary {st['vocab_size']} words
(incl. `<unk>`, `<eos>`); header and footer markers found in
{st['books']['used'] - st['books']['without_start_marker']} / {st['books']['used']} books.
`<unk>` rate = `<unk>` / tokens incl. one `<eos>` per line; valid.tokens is carved out of the
training books' paragraphs.{small}

| split | books | paragraphs (lines) | tokens | share of tokens | tokens incl. `<eos>` | `<unk>` | `<unk>` rate |
|---|---|---|---|---|---|---|---|
{srows}
"""
    dropped = (f"\n**Left out to stay under {args.max_bytes} bytes:** {', '.join(left_out)}.\n" if left_out else "")
    readme = f"""# original-books-mini.tar.gz: a mini Gutenberg corpus in the original-books layout

A small, offline stand-in for openslr resource 12's `original-books.tar.gz` (the paper's
Gutenberg corpus): {len(books)} real Project Gutenberg books, Jane Austen's completed novels, in
exactly that archive's layout, for quick runs and tests of `prepare_gutenberg.py`.

## Source

* Debian package **{PACKAGE} {deb_version}** (`{deb.name if deb else 'a local directory'}`), i.e. the R package
  **janeaustenr {r_version}** by Julia Silge (CRAN), file `janeaustenr/data/Rdata.rdb`: one
  character vector per novel, one element per line of the Project Gutenberg text (header and
  footer already removed by janeaustenr).
* Read without R by `make_mini_books.py`'s minimal R-serialization reader (checked to give the
  same lines as the `rdata` package from PyPI).

## License

The novels are in the **public domain** (Jane Austen, 1775-1817; the texts are Project
Gutenberg's transcriptions of the novels, first published 1811-1818). The janeaustenr package itself is
MIT-licensed (Copyright 2016-2017 Julia Silge); no code of it is included here. The short
header and footer around each text were written by `make_mini_books.py` and only imitate
Project Gutenberg's layout; no Project Gutenberg trademark license text is included.

## Layout and contents

Book ids are the real Project Gutenberg ebook numbers. Five books are UTF-8 in `books/utf-8`
with modern `*** START OF THE PROJECT GUTENBERG EBOOK <TITLE> ***` / `*** END OF ...` markers;
Mansfield Park is in `books/ascii` as a Latin-1 file (one `£`) with the older
`*END*THE SMALL PRINT! ...` header marker and an `End of the Project Gutenberg Etext of ...`
footer. Lines keep Gutenberg's hard wrapping (at most ~76 characters; paragraphs separated by
blank lines) and CRLF line ends.

| id | title | member | folder | text lines | words (whitespace) | bytes (with header/footer) |
|---|---|---|---|---|---|---|
{rows}

Archive: {size} bytes, sha256 `{sha}` (reproducible: sorted members, mtime 0, root owner,
gzip header without name or time).
{dropped}{prep}
## Rebuild

From the repository root (Debian/Ubuntu with apt; stdlib Python >= 3.10, no R needed):

```
apt-get update
python3 recipes/gutenberg/lm1/local/make_mini_books.py --download /tmp/janeaustenr{pin}{out_opt}
```

or with a downloaded package: `python3 recipes/gutenberg/lm1/local/make_mini_books.py --deb
/path/to/{deb.name if deb else PACKAGE + '_VERSION_all.deb'}{out_opt}`. To quote the prepared counts above, add
`--prep-stats DIR/stats.json` after running `prepare_gutenberg.py --src {rel(args.out)} --out DIR`.
"""
    path = args.out.with_name("README.md")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(readme, encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
