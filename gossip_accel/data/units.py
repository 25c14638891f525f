"""Output units of CTC models: sentencepiece BPE, characters, or phones of a pronunciation lexicon,
with the CTC blank at id 0.

:func:`train_units` trains a sentencepiece model on the transcripts of a Kaldi ``text`` file
(utterance ids stripped) and writes ``<lang_dir>/bpe.model`` and ``<lang_dir>/tokens.txt``.
The model itself carries the CTC layout, so its ids are the CTC ids, with no offset:

* id 0 ``<blk>``: the CTC blank (a sentencepiece control symbol, never produced by encode,
  decoded as nothing);
* id 1 ``<unk>``: anything not covered by the units (decoded as the word ``<unk>``);
* ids 2.. the units; ``▁`` (U+2581) marks the start of a word. In ``char`` mode ``▁`` is a
  unit of its own (the word boundary) and every other unit is one character.

No bos/eos/pad symbols. ``tokens.txt`` lines are ``<symbol> <id>`` (k2/icefall's format).
Text is used as is (sentencepiece's ``identity`` normalization, whitespace runs collapsed),
so LibriSpeech's upper-case transcripts decode to upper case. Training is single-threaded and
reads every sentence, hence deterministic: the same text gives the same bpe.model bytes.

``phone`` units (Kaldi's and icefall's ``lang_phone``): the phones of a lexicon (``WORD PH1 PH2 ...``
per line, as LibriSpeech's ``librispeech-lexicon.txt``; a word may have several lines, its first is
its training target), with words it lacks given a pronunciation by a G2P (:mod:`.g2p`, ``flite`` for
the mini corpus). The lang dir holds ``lexicon.txt`` (the lexicon and the G2P's training words),
``tokens.txt`` and ``units.json``; :class:`LexiconTokenizer` reads it. A transcript's ids are its words'
pronunciations one after the other (no word-boundary unit: the decoding lexicon finds the words);
a word with none is ``<unk>``. Such a model decodes to words only through a lexicon (beam_word).
:func:`load_units` opens either kind of lang dir.

Vocabulary size (``bpe`` only; it counts ``<blk>`` and ``<unk>``): 500 by default, the size
icefall and ESPnet use for LibriSpeech 960 h; take 300 or fewer for a small corpus (the mini
LibriSpeech train-clean-5, 1.5k sentences) or sentencepiece refuses ("Vocabulary size too high").
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Iterable, Sequence, Union

BLANK, UNK = "<blk>", "<unk>"
BLANK_ID, UNK_ID = 0, 1
DEFAULT_BPE_VOCAB = 500
UNIT_TYPES = ("bpe", "char", "phone")


def read_transcripts(text_path: str | Path) -> list[str]:
    """Transcripts of a Kaldi ``text`` file (first field = utterance id, dropped), non-empty ones only."""
    from .kaldi.tables import read_table as read_kaldi_map

    return [t for t in read_kaldi_map(text_path).values() if t.strip()]


def train_units(text_path: str | Path, lang_dir: str | Path, unit_type: str = "bpe",
                vocab_size: int = DEFAULT_BPE_VOCAB, character_coverage: float = 1.0,
                lexicon: str | Path | None = None, g2p_method: str | None = None):
    """Train the unit model on a Kaldi ``text`` file; write ``bpe.model`` + ``tokens.txt``; return its Tokenizer.

    ``unit_type`` ``bpe`` (``vocab_size`` units including ``<blk>`` and ``<unk>``) or ``char``
    (every character of the training text, ``vocab_size`` ignored); ``phone``: the phones of
    ``lexicon`` and of ``g2p_method``'s pronunciations of the words it lacks
    (:func:`make_phone_lang`, returns a :class:`LexiconTokenizer`).
    """
    import sentencepiece as spm

    if unit_type not in UNIT_TYPES:
        raise ValueError(f"unit type must be one of {UNIT_TYPES}, got {unit_type!r}")
    sentences = read_transcripts(text_path)
    if not sentences:
        raise ValueError(f"{text_path}: no non-empty transcripts to train units on")
    if unit_type == "phone":
        return make_phone_lang(sentences, lang_dir, lexicon, g2p_method, source=str(text_path))
    lang_dir = Path(lang_dir)
    lang_dir.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    char = unit_type == "char"
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, model_type=unit_type,
            vocab_size=vocab_size if not char else 3,  # char: use_all_vocab decides
            use_all_vocab=char, hard_vocab_limit=not char,
            unk_id=UNK_ID, bos_id=-1, eos_id=-1, pad_id=-1, control_symbols=[BLANK], unk_surface=UNK,
            character_coverage=character_coverage, normalization_rule_name="identity",
            num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
            max_sentence_length=1 << 16, minloglevel=2)
    except RuntimeError as e:
        hint = " (lower --vocab-size: the corpus is too small for that many units)" if "ocab" in str(e) else ""
        raise ValueError(f"sentencepiece training on {text_path} failed: {e}{hint}") from None
    _replace_bytes(lang_dir / "bpe.model", model.getvalue())
    tok = Tokenizer(lang_dir / "bpe.model")
    tok.write_tokens(lang_dir / "tokens.txt")
    return tok


def _replace_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` atomically (temporary file + rename): readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def load_units(lang: str | Path) -> "Units":
    """The tokenizer of a lang dir (or of a ``bpe.model`` path): :class:`Tokenizer` or :class:`LexiconTokenizer`."""
    path = Path(lang)
    if path.is_dir() and (path / PHONE_META).is_file() and not (path / "bpe.model").is_file():
        return LexiconTokenizer(path)
    return Tokenizer(path)


class Tokenizer:
    """Text <-> CTC ids with a trained ``bpe.model`` (blank 0, ``<unk>`` 1; see the module doc)."""

    blank_id = BLANK_ID
    unk_id = UNK_ID

    def __init__(self, model: str | Path):
        import sentencepiece as spm

        path = Path(model)
        if path.is_dir() or (not path.exists() and path.suffix != ".model"):   # a lang dir
            path = path / "bpe.model"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run gossip_accel.bin.train_units first")
        self.path = path
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as e:
            raise ValueError(f"{path}: not a sentencepiece model ({str(e).strip() or type(e).__name__}); "
                             f"train it with gossip_accel.bin.train_units") from None
        if not (self.sp.id_to_piece(BLANK_ID) == BLANK and self.sp.is_control(BLANK_ID)
                and self.sp.unk_id() == UNK_ID):
            raise ValueError(f"{path}: not a CTC unit model (expected {BLANK} at id 0 and {UNK} at id 1); "
                             f"train it with gossip_accel.bin.train_units")

    @property
    def vocab_size(self) -> int:
        """Number of CTC outputs, blank included (the model's output dimension)."""
        return self.sp.get_piece_size()

    @property
    def tokens(self) -> list[str]:
        return [self.sp.id_to_piece(i) for i in range(self.vocab_size)]

    def id_to_token(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def encode(self, text: str) -> list[int]:
        """CTC ids of a transcript (never 0)."""
        return list(self.sp.encode(text))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of CTC ids; blanks (0) are dropped, ``<unk>`` becomes the word ``<unk>``."""
        ids = [int(i) for i in ids if int(i) != BLANK_ID]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids {bad[:5]} outside the vocabulary of {self.path} (size {self.vocab_size})")
        return self.sp.decode(ids)

    def decode_batch(self, batch: Sequence[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def spellings(self, words: Iterable[str]) -> dict[str, list[list[str]]]:
        """Each word's unit spelling as the model writes it at a word start (``THE`` -> ``[['▁', 'T', 'H',
        'E']]``); a word with a unit the model lacks (``<unk>``) is left out."""
        out = {}
        for w in words:
            ids = self.encode(w)
            if ids and self.unk_id not in ids:
                out[w] = [[self.id_to_token(i) for i in ids]]
        return out

    def write_tokens(self, path: str | Path) -> None:
        """``<symbol> <id>`` per line, ids 0..vocab_size-1."""
        _replace_bytes(Path(path), "".join(f"{t} {i}\n" for i, t in enumerate(self.tokens)).encode("utf-8"))


PHONE_META = "units.json"


def read_lexicon(path: str | Path) -> dict[str, list[list[str]]]:
    """A pronunciation lexicon: ``WORD PH1 PH2 ...`` per line (spaces or tabs; Kaldi's ``lexicon.txt``,
    LibriSpeech's ``librispeech-lexicon.txt``); a word's lines are its pronunciations in file order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (a lexicon: WORD PH1 PH2 ... per line)")
    lex: dict[str, list[list[str]]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2:
            raise ValueError(f"{path}:{n}: '{line.strip()}' has no pronunciation (WORD PH1 PH2 ... per line)")
        if {BLANK, UNK} & set(fields[1:]):
            raise ValueError(f"{path}:{n}: {BLANK} and {UNK} are reserved, not phones")
        prons = lex.setdefault(fields[0], [])
        if fields[1:] not in prons:
            prons.append(fields[1:])
    if not lex:
        raise ValueError(f"{path}: no pronunciations (WORD PH1 PH2 ... per line)")
    return lex


def _write_lexicon(lex: dict[str, list[list[str]]], path: Path) -> None:
    _replace_bytes(path, "".join(f"{w} {' '.join(p)}\n" for w, prons in lex.items() for p in prons).encode("utf-8"))


def make_phone_lang(sentences: Sequence[str], lang_dir: str | Path, lexicon: str | Path | None = None,
                    g2p_method: str | None = None, source: str = "the transcripts") -> "LexiconTokenizer":
    """Write a phone lang dir: ``lexicon.txt`` (``lexicon``'s entries and ``g2p_method``'s for the training
    words it lacks), ``tokens.txt`` (``<blk>``, ``<unk>``, then the phones sorted) and ``units.json``."""
    from .g2p import g2p

    if lexicon is None and g2p_method is None:
        raise ValueError("phone units need a lexicon (--lexicon) or a g2p (--g2p flite), or both")
    lex = read_lexicon(lexicon) if lexicon else {}
    words = list(dict.fromkeys(w for s in sentences for w in s.split()))
    missing = [w for w in words if w not in lex]
    if missing and g2p_method:
        lex.update(g2p(g2p_method, missing))
    unspoken = [w for w in words if w not in lex]
    if len(unspoken) == len(words):
        raise ValueError(f"{lexicon or g2p_method}: no word of {source} has a pronunciation")
    lang_dir = Path(lang_dir)
    lang_dir.mkdir(parents=True, exist_ok=True)
    _write_lexicon(lex, lang_dir / "lexicon.txt")
    phones = sorted({p for prons in lex.values() for pron in prons for p in pron})
    _replace_bytes(lang_dir / "tokens.txt",
                   "".join(f"{t} {i}\n" for i, t in enumerate([BLANK, UNK] + phones)).encode("utf-8"))
    meta = {"type": "phone", "lexicon": str(lexicon) if lexicon else None, "g2p": g2p_method,
            "lexicon_words": len(lex), "phones": len(phones), "train_words": len(words),
            "train_words_by_g2p": len(missing) - len(unspoken) if g2p_method else 0,
            "train_words_without_pronunciation": len(unspoken), "examples_without": unspoken[:20]}
    _replace_bytes(lang_dir / PHONE_META, json.dumps(meta, indent=2).encode("utf-8"))
    return LexiconTokenizer(lang_dir)


class LexiconTokenizer:
    """Text <-> CTC ids of phone units through a lexicon (a phone lang dir of :func:`make_phone_lang`).

    Same interface as :class:`Tokenizer`. ``encode`` spells each word by its first pronunciation
    (the lang dir's G2P, if any, gives one to a word the lexicon lacks; cached); ``decode`` gives
    the phones, space-separated (not words: a lexicon decoder makes words).
    """

    blank_id = BLANK_ID
    unk_id = UNK_ID

    def __init__(self, lang_dir: str | Path):
        lang_dir = Path(lang_dir)
        meta = lang_dir / PHONE_META
        if not meta.is_file():
            raise FileNotFoundError(f"{meta} not found: run gossip_accel.bin.train_units --unit-type phone first")
        try:
            self.meta = json.loads(meta.read_text())
            tokens = [line.split()[0] for line in (lang_dir / "tokens.txt").read_text(encoding="utf-8").splitlines()
                      if line.strip()]
        except (ValueError, IndexError, OSError) as e:
            raise ValueError(f"{lang_dir}: not a phone lang dir ({e}); make it with gossip_accel.bin.train_units "
                             f"--unit-type phone") from None
        if tokens[:2] != [BLANK, UNK]:
            raise ValueError(f"{lang_dir}/tokens.txt: expected {BLANK} at id 0 and {UNK} at id 1")
        self.path = lang_dir
        self.g2p_method = self.meta.get("g2p")
        self.lexicon = read_lexicon(lang_dir / "lexicon.txt")
        self._tokens = tokens
        self._ids = {t: i for i, t in enumerate(tokens)}

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> list[str]:
        return list(self._tokens)

    def id_to_token(self, i: int) -> str:
        return self._tokens[int(i)]

    def spellings(self, words: Iterable[str]) -> dict[str, list[list[str]]]:
        """Every pronunciation of each word that the phones spell (the lexicon's, else the G2P's, then
        cached in the lexicon); a word with none is left out."""
        words = list(dict.fromkeys(words))
        missing = [w for w in words if w not in self.lexicon]
        if missing and self.g2p_method:
            from .g2p import g2p

            found = g2p(self.g2p_method, missing)
            self.lexicon.update((w, found.get(w, [])) for w in missing)
        out = {}
        for w in words:
            prons = [p for p in self.lexicon.get(w, []) if all(x in self._ids for x in p)]
            if prons:
                out[w] = prons
        return out

    def encode(self, text: str) -> list[int]:
        """CTC ids of a transcript: each word's first pronunciation, ``<unk>`` for a word with none."""
        words = text.split()
        prons = self.spellings(words)
        ids: list[int] = []
        for w in words:
            ids += [self._ids[p] for p in prons[w][0]] if w in prons else [UNK_ID]
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """The phones of CTC ids, space-separated; blanks dropped."""
        ids = [int(i) for i in ids if int(i) != BLANK_ID]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids {bad[:5]} outside the phones of {self.path} ({self.vocab_size})")
        return " ".join(self._tokens[i] for i in ids)

    def decode_batch(self, batch: Sequence[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def write_tokens(self, path: str | Path) -> None:
        _replace_bytes(Path(path), "".join(f"{t} {i}\n" for i, t in enumerate(self._tokens)).encode("utf-8"))


Units = Union[Tokenizer, LexiconTokenizer]   # what load_units returns
