"""Output units of CTC models: sentencepiece BPE or characters, with the CTC blank at id 0.

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

Vocabulary size (``bpe`` only; it counts ``<blk>`` and ``<unk>``): 500 by default, the size
icefall and ESPnet use for LibriSpeech 960 h; take 300 or fewer for a small corpus (the mini
LibriSpeech train-clean-5, 1.5k sentences) or sentencepiece refuses ("Vocabulary size too high").
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Iterable, Sequence

BLANK, UNK = "<blk>", "<unk>"
BLANK_ID, UNK_ID = 0, 1
DEFAULT_BPE_VOCAB = 500
UNIT_TYPES = ("bpe", "char")


def read_transcripts(text_path: str | Path) -> list[str]:
    """Transcripts of a Kaldi ``text`` file (first field = utterance id, dropped), non-empty ones only."""
    from .kaldi.tables import read_table as read_kaldi_map

    return [t for t in read_kaldi_map(text_path).values() if t.strip()]


def train_units(text_path: str | Path, lang_dir: str | Path, unit_type: str = "bpe",
                vocab_size: int = DEFAULT_BPE_VOCAB, character_coverage: float = 1.0) -> "Tokenizer":
    """Train the unit model on a Kaldi ``text`` file; write ``bpe.model`` + ``tokens.txt``; return its Tokenizer.

    ``unit_type`` ``bpe`` (``vocab_size`` units including ``<blk>`` and ``<unk>``) or ``char``
    (every character of the training text, ``vocab_size`` ignored).
    """
    import sentencepiece as spm

    if unit_type not in UNIT_TYPES:
        raise ValueError(f"unit type must be one of {UNIT_TYPES}, got {unit_type!r}")
    sentences = read_transcripts(text_path)
    if not sentences:
        raise ValueError(f"{text_path}: no non-empty transcripts to train units on")
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

    def write_tokens(self, path: str | Path) -> None:
        """``<symbol> <id>`` per line, ids 0..vocab_size-1."""
        _replace_bytes(Path(path), "".join(f"{t} {i}\n" for i, t in enumerate(self.tokens)).encode("utf-8"))
