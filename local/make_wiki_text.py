#!/usr/bin/env python3
"""Build a small WikiText-103-style corpus from the Wikipedia sample shipped in gensim.

The gensim wheel on PyPI contains ~100 real English Wikipedia articles (a 2016 dump,
CC BY-SA 3.0) as test data:

    gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2

This script extracts that MediaWiki XML dump, strips the wiki markup, tokenizes the prose
the way WikiText-103 is tokenized, splits the articles deterministically into
train/valid/test and writes

    OUT/wiki.train.tokens  OUT/wiki.valid.tokens  OUT/wiki.test.tokens  OUT/README.md

Output format (as in WikiText-103): every line starts with a space; article titles are
` = Title = `, section headings ` = = Section = = ` (one `=` per heading level), one
paragraph per line, blank lines (` `) around headings. Tokens are separated by single
spaces; punctuation is split off, intra-word hyphens become `@-@`, and `,`/`.` inside
numbers become `@,@`/`@.@`. No vocabulary cut-off is applied (no <unk>).

Usage (stdlib only, Python >= 3.10):

    python local/make_wiki_text.py --download /tmp/gensim_dl --gensim-version 4.4.0 \\
        --out local/data/wiki_mini
    python local/make_wiki_text.py --gensim-wheel /path/to/gensim-*.whl --out DIR
"""

from __future__ import annotations

import argparse
import bz2
import hashlib
import html
import io
import re
import shlex
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gossip_accel.data.tokenize import wikitext_tokenize  # noqa: E402  (standard library only)

DUMP_NAME = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
DUMP_MEMBER = "gensim/test/test_data/" + DUMP_NAME

# Sections that are (almost) only lists, citations or links: dropped with their content.
SKIP_SECTIONS = {
    "references", "external links", "see also", "further reading", "notes", "bibliography",
    "sources", "footnotes", "citations", "works cited", "notes and references",
    "references and notes", "general references", "gallery", "related links", "links",
    "cited sources", "primary sources", "secondary sources", "selected bibliography",
    "filmography", "discography", "selected works", "works", "publications",
}
# Tags dropped together with their content.
DROP_TAGS = (
    "ref", "math", "gallery", "timeline", "imagemap", "score", "source", "syntaxhighlight",
    "pre", "references", "chem", "ce", "hiero", "graph", "mapframe", "templatedata", "table",
)
# Link namespaces that are not prose.
DROP_LINK_NS = {"file", "image", "category", "media", "wikipedia", "wp", "template", "help",
                "portal", "special", "user", "talk", "module", "draft", "book"}
# Keep the displayed text of these interwiki prefixes; other short prefixes (de:, fr:, ...)
# without a label are interlanguage links and are dropped.
KEEP_LINK_NS = {"wikt", "wiktionary", "w", "s", "wikisource", "b", "wikibooks", "q",
                "wikiquote", "n", "wikinews", "v", "wikiversity", "commons", "species", "meta"}

MIN_PARAGRAPH_TOKENS = 5
MIN_ARTICLE_TOKENS = 100


# --------------------------------------------------------------------------------------
# Getting the dump
# --------------------------------------------------------------------------------------

def pip_download(dest: Path, version: str | None) -> Path:
    """Run `pip download --no-deps gensim[==version] -d dest` and return the wheel path."""
    dest.mkdir(parents=True, exist_ok=True)
    spec = f"gensim=={version}" if version else "gensim"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           spec, "-d", str(dest)]
    print("+", " ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    cands = sorted(dest.glob("gensim-*.whl"))
    if version:
        cands = [c for c in cands if c.name.startswith(f"gensim-{version}-")]
    if not cands:
        sys.exit(f"error: no gensim wheel found in {dest} after pip download")
    return max(cands, key=lambda p: p.stat().st_mtime)


def read_dump(archive: Path) -> bytes:
    """Return the bz2-compressed dump stored in a gensim wheel (zip) or sdist (tar.gz)."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            names = [n for n in z.namelist() if n.endswith("/" + DUMP_NAME)]
            if not names:
                sys.exit(f"error: {archive} has no member ending in {DUMP_NAME}")
            return z.read(names[0])
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as t:
            for m in t.getmembers():
                if m.name.endswith("/" + DUMP_NAME):
                    f = t.extractfile(m)
                    assert f is not None
                    return f.read()
        sys.exit(f"error: {archive} has no member ending in {DUMP_NAME}")
    sys.exit(f"error: {archive} is neither a wheel (zip) nor a tar archive")


def gensim_version(archive: Path) -> str:
    m = re.match(r"gensim-([0-9][^-]*?)(?:-|\.tar\.gz$|\.zip$)", archive.name)
    return m.group(1) if m else "unknown"


def iter_pages(xml_bytes: bytes):
    """Yield (title, namespace, is_redirect, wikitext) for each <page>."""
    for _, elem in ET.iterparse(io.BytesIO(xml_bytes), events=("end",)):
        if elem.tag.rsplit("}", 1)[-1] != "page":
            continue
        title = ns = text = None
        redirect = False
        for child in elem.iter():
            tag = child.tag.rsplit("}", 1)[-1]
            if tag == "title":
                title = child.text or ""
            elif tag == "ns":
                ns = int(child.text or 0)
            elif tag == "redirect":
                redirect = True
            elif tag == "text":
                text = child.text or ""
        yield title or "", ns if ns is not None else 0, redirect, text or ""
        elem.clear()


# --------------------------------------------------------------------------------------
# Markup stripping
# --------------------------------------------------------------------------------------

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_DROP_TAG_BLOCK = re.compile(
    r"<\s*(%s)\b[^>]*?(?<!/)>.*?<\s*/\s*\1\s*>" % "|".join(DROP_TAGS), re.S | re.I)
_DROP_TAG_SELF = re.compile(r"<\s*(%s)\b[^>]*/\s*>" % "|".join(DROP_TAGS), re.I)
_INNER_TEMPLATE = re.compile(r"\{\{(?:(?!\{\{|\}\}).)*\}\}", re.S)
_INNER_LINK = re.compile(r"\[\[((?:(?!\[\[|\]\]).)*)\]\]", re.S)
_EXT_LINK = re.compile(r"\[(?:https?:|ftp:|//|mailto:|news:|irc:)[^\s\]]*(?:\s+([^\]]*))?\]", re.I)
_BARE_URL = re.compile(r"\b(?:https?|ftp)://\S+", re.I)
_BR = re.compile(r"<\s*br\s*/?\s*>", re.I)
_TAG = re.compile(r"</?\s*[A-Za-z][A-Za-z0-9]*\b[^<>]*>")
_MAGIC = re.compile(r"__[A-Z]+__")
_HEADING = re.compile(r"^(={1,6})\s*(.*?)\s*\1\s*$")
_EMPTY_PARENS = re.compile(r"[(\[]\s*(?:[,;:.]\s*)*[)\]]")
_LEFTOVER = re.compile(r"\{\{|\}\}|\[\[|\]\]|\{\||\|\}|\||<|>|&[A-Za-z]+;|&#\d+;|https?:|\bthumb\b|px\b")


def _template_text(body: str) -> str:
    """Text for a handful of inline templates whose output is prose; '' for the rest."""
    parts = [p.strip() for p in body.split("|")]
    name = parts[0].replace("_", " ").strip().lower()
    pos = [p for p in parts[1:] if "=" not in p]
    if name in ("convert", "cvt") and len(pos) >= 2:
        # {{convert|5|km|mi}} -> "5 km"; {{convert|5|to|10|km}} -> "5 to 10 km"
        unit = lambda u: {"C": "°C", "F": "°F", "K": "K"}.get(u, u)  # noqa: E731
        if len(pos) >= 4 and pos[1] in ("to", "-", "–", "and", "or", "by", "x", "×"):
            return f"{pos[0]} {pos[1]} {pos[2]} {unit(pos[3])}"
        return f"{pos[0]} {unit(pos[1])}"
    if name in ("nowrap", "nobr", "small", "big", "smaller", "larger", "sic", "lang-en",
                "center", "nobold", "noitalic", "transl", "abbr", "nowrap begin", "em",
                "strong", "var", "mvar", "math", "ill", "interlanguage link", "sortname"):
        if name in ("sortname",) and len(pos) >= 2:
            return f"{pos[0]} {pos[1]}"
        return pos[0] if pos else ""
    if name == "lang" or name == "transl":
        return pos[-1] if len(pos) >= 2 else ""
    if name.startswith("lang-") and pos:
        return pos[0]
    if name in ("'", "' \"", "apostrophe"):
        return "'"
    if name in ("ndash", "snd", "spaced ndash", "–"):
        return " – "
    if name in ("mdash", "spaced mdash", "—"):
        return " — "
    if name in ("=",):
        return "="
    if name in ("frac",) and pos:
        return "/".join(pos[-2:]) if len(pos) >= 2 else pos[0]
    if name in ("circa", "c."):
        return "c. " + (pos[0] if pos else "")
    if name in ("us$", "usd"):
        return "US$" + (pos[0] if pos else "")
    if name in ("as of",) and pos:
        months = ["January", "February", "March", "April", "May", "June", "July", "August",
                  "September", "October", "November", "December"]
        if len(pos) >= 2 and pos[1].isdigit() and 1 <= int(pos[1]) <= 12:
            return f"As of {months[int(pos[1]) - 1]} {pos[0]}"
        return f"As of {pos[0]}"
    return ""


def _remove_tables(text: str) -> str:
    """Remove {| ... |} tables (nested) that start and end at the beginning of a line."""
    out, depth = [], 0
    for line in text.split("\n"):
        s = line.lstrip()
        if s.startswith("{|"):
            depth += 1
            continue
        if depth:
            if s.startswith("|}"):
                depth -= 1
            continue
        out.append(line)
    return "\n".join(out)


def _link_text(inner: str) -> str:
    target, _, label = inner.partition("|")
    target = target.strip()
    if target.startswith(":"):  # [[:Category:X|label]] is a plain link
        target = target[1:]
        ns = target.split(":", 1)[0].strip().lower() if ":" in target else ""
        if ns in DROP_LINK_NS:
            return label.strip()
    elif ":" in target:
        ns = target.split(":", 1)[0].strip().lower()
        if ns in DROP_LINK_NS:
            return ""
        if ns not in KEEP_LINK_NS and re.fullmatch(r"[a-z]{2,3}(?:-[a-z]+)*|simple", ns) and not label:
            return ""  # interlanguage link
    if "|" in inner:
        label = label.strip()
        if label:
            return label.split("|")[-1]
        # pipe trick: [[Paris, Texas|]] -> Paris ; [[Foo (bar)|]] -> Foo
        t = target.split(":", 1)[-1]
        return re.sub(r"\s*\(.*\)$", "", t).split(",")[0]
    return target.split("#", 1)[0] if not target.startswith("#") else target[1:]


def _fixpoint(pattern: re.Pattern, repl, text: str, limit: int = 50) -> str:
    for _ in range(limit):
        new = pattern.sub(repl, text)
        if new == text:
            break
        text = new
    return text


def strip_markup(text: str) -> str:
    """Wikitext -> plain text with headings kept as `== X ==` lines."""
    text = text.replace("\r", "")
    text = _COMMENT.sub("", text)
    text = _DROP_TAG_SELF.sub("", text)
    text = _DROP_TAG_BLOCK.sub("", text)
    # Templates and tables may nest in each other: alternate until stable.
    for _ in range(20):
        before = text
        text = _fixpoint(_INNER_TEMPLATE, lambda m: _template_text(m.group(0)[2:-2]), text)
        text = _remove_tables(text)
        if text == before:
            break
    text = _fixpoint(_INNER_LINK, lambda m: _link_text(m.group(1)), text)
    text = _EXT_LINK.sub(lambda m: m.group(1) or "", text)
    text = _BARE_URL.sub("", text)
    text = _BR.sub(" ", text)
    text = _DROP_TAG_BLOCK.sub("", text)  # tags that came out of templates
    text = _TAG.sub("", text)
    text = _MAGIC.sub("", text)
    return text


def clean_inline(s: str) -> str:
    s = re.sub(r"'{2,}", "", s)  # bold / italic
    s = html.unescape(s)
    s = re.sub(r"[\u00a0\u2002-\u200a\u202f\u205f\u3000\t]", " ", s)
    s = re.sub(r"[\u200b-\u200d\u2060\ufeff\u00ad]", "", s)
    s = _fixpoint(_EMPTY_PARENS, "", s)
    s = re.sub(r"\(\s*[,;:]\s*", "(", s)
    s = re.sub(r"\s*[,;:]\s*\)", ")", s)
    s = re.sub(r"\s+", " ", s).strip()
    return s


# --------------------------------------------------------------------------------------
# Tokenization (WikiText-103 / Moses style)
# --------------------------------------------------------------------------------------

tokenize = wikitext_tokenize


# --------------------------------------------------------------------------------------
# Article -> WikiText lines
# --------------------------------------------------------------------------------------

@dataclass
class Article:
    title: str
    lines: list[str] = field(default_factory=list)
    n_tokens: int = 0
    n_dropped_paragraphs: int = 0


def article_to_lines(title: str, wikitext: str) -> Article:
    art = Article(title)
    plain = strip_markup(wikitext)
    # blocks: ("h", level, tokens) or ("p", tokens)
    blocks: list[tuple] = []
    para: list[str] = []
    skip_level = 0  # >0 while inside a skipped section of that level

    def flush():
        nonlocal para
        if para and not skip_level:
            text = clean_inline(" ".join(para))
            if text:
                toks = tokenize(text)
                words = sum(1 for t in toks if re.match(r"[^\W_]", t))
                if _LEFTOVER.search(text) or words < MIN_PARAGRAPH_TOKENS or text.startswith(("!", "=")):
                    art.n_dropped_paragraphs += 1
                else:
                    blocks.append(("p", toks))
        para = []

    for raw in plain.split("\n"):
        line = raw.rstrip()
        m = _HEADING.match(line.strip())
        if m and len(m.group(1)) >= 2:
            flush()
            level = len(m.group(1))
            name = clean_inline(m.group(2))
            if skip_level and level > skip_level:
                continue
            skip_level = 0
            if name.lower().strip(" :") in SKIP_SECTIONS or not name:
                skip_level = level
                continue
            blocks.append(("h", level, tokenize(name)))
            continue
        if not line.strip() or line.strip() == "----":
            flush()
            continue
        if line[0] in "*#;:|!" or line.startswith(" ") or line.startswith("{") or line.startswith("}"):
            flush()  # lists, definition lists, indents, table debris, preformatted text
            continue
        para.append(line.strip())
    flush()

    # Drop headings whose section (incl. subsections) has no paragraph.
    keep = [True] * len(blocks)
    has_text_below: dict[int, bool] = {}
    for i in range(len(blocks) - 1, -1, -1):
        b = blocks[i]
        if b[0] == "p":
            for lv in range(1, 7):
                has_text_below[lv] = True
        else:
            lv = b[1]
            keep[i] = has_text_below.get(lv, False)
            # a heading closes the sections of its level and deeper for what precedes it
            for deeper in range(lv, 7):
                has_text_below[deeper] = False
            if keep[i]:
                for shallower in range(1, lv):
                    has_text_below[shallower] = True
    blocks = [b for b, k in zip(blocks, keep) if k]

    art.lines = [" ", f" = {' '.join(tokenize(clean_inline(title)))} = ", " "]
    for b in blocks:
        if b[0] == "h":
            eq = " ".join(["="] * b[1])
            art.lines += [" ", f" {eq} {' '.join(b[2])} {eq} ", " "]
        else:
            art.lines.append(" " + " ".join(b[1]) + " ")
            art.n_tokens += len(b[1])
    return art


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------

def title_hash(title: str) -> str:
    return hashlib.sha1(title.encode("utf-8")).hexdigest()


def split_articles(arts: list[Article], frac: float, min_eval: int):
    """Order articles by SHA-1 of the title; the first n go to valid, the next n to test."""
    order = sorted(arts, key=lambda a: title_hash(a.title))
    n_eval = max(min_eval, round(frac * len(order)))
    if 2 * n_eval >= len(order):
        sys.exit(f"error: only {len(order)} usable articles, cannot make valid/test of {n_eval}")
    return order[2 * n_eval:], order[:n_eval], order[n_eval:2 * n_eval]


def n_bytes(arts: list[Article]) -> int:
    return sum(len(line.encode("utf-8")) + 1 for a in arts for line in a.lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gensim-wheel", type=Path, help="a downloaded gensim wheel (or sdist)")
    src.add_argument("--download", type=Path, metavar="DIR",
                     help="run `pip download --no-deps gensim -d DIR` first and use that wheel")
    ap.add_argument("--gensim-version", default=None,
                    help="with --download: pin this gensim version (e.g. 4.4.0)")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--eval-fraction", type=float, default=0.05,
                    help="fraction of articles for each of valid and test (default 0.05)")
    ap.add_argument("--min-eval-articles", type=int, default=3)
    ap.add_argument("--max-bytes", type=int, default=4_000_000,
                    help="cap on the total size of the three files; whole training articles "
                         "are dropped (last in hash order first) to fit (default 4000000)")
    args = ap.parse_args(argv)

    wheel = pip_download(args.download, args.gensim_version) if args.download else args.gensim_wheel
    if not wheel.is_file():
        sys.exit(f"error: {wheel} does not exist")
    version = gensim_version(wheel)
    dump_bz2 = read_dump(wheel)
    dump_sha = hashlib.sha256(dump_bz2).hexdigest()
    xml_bytes = bz2.decompress(dump_bz2)

    arts: list[Article] = []
    n_pages = n_redirect = n_other_ns = n_small = 0
    for title, ns, redirect, text in iter_pages(xml_bytes):
        n_pages += 1
        if redirect or text.lstrip().lower().startswith("#redirect"):
            n_redirect += 1
            continue
        if ns != 0:
            n_other_ns += 1
            continue
        art = article_to_lines(title, text)
        if title.endswith("(disambiguation)") or art.n_tokens < MIN_ARTICLE_TOKENS:
            n_small += 1
            continue
        arts.append(art)

    train, valid, test = split_articles(arts, args.eval_fraction, args.min_eval_articles)
    dropped_for_size: list[str] = []
    while n_bytes(train + valid + test) > args.max_bytes and len(train) > 1:
        dropped_for_size.append(train.pop().title)

    args.out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, part in (("train", train), ("valid", valid), ("test", test)):
        lines = [line for a in part for line in a.lines]
        # WikiText-103 counts tokens as whitespace-split tokens of every line plus <eos>.
        counts[name] = dict(articles=len(part), lines=len(lines),
                            tokens=sum(len(line.split()) for line in lines),
                            tokens_eos=sum(len(line.split()) + 1 for line in lines),
                            bytes=sum(len(line.encode("utf-8")) + 1 for line in lines))
        (args.out / f"wiki.{name}.tokens").write_text("\n".join(lines) + "\n", encoding="utf-8")

    try:
        out_rel = args.out.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        out_rel = args.out
    regen = ("python local/make_wiki_text.py --download /tmp/gensim_dl "
             f"--gensim-version {version} --out {out_rel}")
    if args.max_bytes != 4_000_000:
        regen += f" --max-bytes {args.max_bytes}"
    if args.eval_fraction != 0.05:
        regen += f" --eval-fraction {args.eval_fraction}"
    if args.min_eval_articles != 3:
        regen += f" --min-eval-articles {args.min_eval_articles}"
    table = "\n".join(
        f"| {k} | {v['articles']} | {v['lines']} | {v['tokens']} | {v['tokens_eos']} | {v['bytes']} |"
        for k, v in counts.items())
    vocab = len({t for p in (train, valid, test) for a in p for line in a.lines for t in line.split()})
    readme = f"""# wiki_mini: a small WikiText-103-style corpus

Plain-text English Wikipedia articles for quick-start language-model runs.

## Source

* Python package **gensim {version}** from PyPI (`{wheel.name}`), member
  `{DUMP_MEMBER}`
  (sha256 of the .bz2: `{dump_sha}`).
* It is a shortened MediaWiki XML export of the English Wikipedia (2016): {n_pages} pages, of
  which {n_redirect} redirects and {n_other_ns} non-article pages were skipped, and
  {n_small} disambiguation or near-empty pages were left out; {len(arts)} articles remain.

## License

Text of Wikipedia articles by **Wikipedia contributors**, licensed under the
**Creative Commons Attribution-ShareAlike 3.0 Unported License (CC BY-SA 3.0)**,
https://creativecommons.org/licenses/by-sa/3.0/ . The article histories (the list of
authors) are at https://en.wikipedia.org/wiki/TITLE?action=history . These files are a
modified (markup-stripped, tokenized) version of that text and are distributed under the
same license.

## Format

Like WikiText-103 (`wiki.{{train,valid,test}}.tokens`): each line starts with a space;
` = Title = ` starts an article, ` = = Section = = ` / ` = = = Subsection = = = ` are
headings, one paragraph per line, ` ` lines are blank. Punctuation is split into its own
tokens, intra-word hyphens are written ` @-@ `, and commas / points inside numbers
` @,@ ` / ` @.@ `. Raw tokens are kept: no lower-casing and no `<unk>` replacement (build
the vocabulary from `wiki.train.tokens`; {vocab} distinct tokens in all three files).
Wiki markup (templates, tables, references, files/images, categories, lists, the
References / External links / See also sections) is removed.

Articles are ordered by the SHA-1 of their title; the first {len(valid)} form valid, the
next {len(test)} test, the rest train{(" (" + str(len(dropped_for_size)) + " training articles dropped to stay under " + str(args.max_bytes) + " bytes)") if dropped_for_size else ""}.

| split | articles | lines | tokens | tokens incl. one `<eos>` per line | bytes |
|---|---|---|---|---|---|
{table}

Validation articles: {", ".join(a.title for a in valid)}.
Test articles: {", ".join(a.title for a in test)}.

## Regenerate

From the repository root (needs network access for `pip download`; stdlib only otherwise):

```
{regen}
```

or, with an already downloaded wheel,
`python local/make_wiki_text.py --gensim-wheel /path/to/{wheel.name} --out {out_rel}`.
"""
    (args.out / "README.md").write_text(readme, encoding="utf-8")

    print(f"gensim {version}: {n_pages} pages, {n_redirect} redirects, {n_other_ns} other ns, "
          f"{n_small} small/disambiguation, {len(arts)} articles", file=sys.stderr)
    if dropped_for_size:
        print(f"dropped {len(dropped_for_size)} training articles for --max-bytes", file=sys.stderr)
    for k, v in counts.items():
        print(f"{k:5s}: {v['articles']:3d} articles {v['tokens']:8d} tokens {v['bytes']:9d} bytes")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
