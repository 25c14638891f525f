"""WikiText-103-style word tokenization (standard library only).

Punctuation is split from words, clitics are split (``John's`` -> ``John 's``), and hyphens
inside words and separators inside numbers are protected as ``@-@``, ``@,@`` and ``@.@``, as in
wikitext-103. Shared by the embedded Wikipedia text builder and the Gutenberg preparation, so
both LM corpora are tokenized the same way.
"""
from __future__ import annotations

import re
import unicodedata

_TOKEN = re.compile(
    r"@[-,.]@"                       # protected intra-word / intra-number separators
    r"|(?:[^\W\d_]\.){2,}"           # U.S. , e.g.
    r"|(?<=[^\W\d_])'[^\W\d_]+"      # clitics: John's -> John 's ; don't -> don 't
    r"|[^\W_](?:[^\W_]|[\u0300-\u036f])*"  # words / numbers (with combining accents)
    r"|\S",                          # any other single character
)


def wikitext_tokenize(s: str) -> list[str]:
    """Tokens of ``s`` in the wikitext-103 convention."""
    s = unicodedata.normalize("NFC", s)
    s = re.sub(r"(?<=\d),(?=\d)", " @,@ ", s)
    s = re.sub(r"(?<=\d)\.(?=\d)", " @.@ ", s)
    s = re.sub(r"(?<=[^\W_])-(?=[^\W_])", " @-@ ", s)
    return _TOKEN.findall(s)
