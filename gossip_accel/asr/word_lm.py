"""Word-level CTC decoding: a lexicon of unit spellings, a KenLM word n-gram, and torchaudio's
CTC lexicon decoder (flashlight-text's beam search, the decoder of wav2letter and torchaudio's
ASR tutorials).

A word LM directory (made by gossip_accel.bin.make_word_lm) holds

* ``lm.arpa`` (and ``lm.bin``, its KenLM binary, when ``build_binary`` is there): a word n-gram
  estimated by KenLM's ``lmplz`` (modified Kneser-Ney; Heafield et al. 2013);
* ``lexicon.txt``: ``<word> <unit> <unit> ...`` per line, every word of the LM text spelled in the
  ASR model's units exactly as sentencepiece writes it (``THE`` -> ``▁ T H E`` for characters,
  ``▁THE`` for BPE), so no pronunciation dictionary is needed; with phone units, a line per
  pronunciation of the lang dir's lexicon (or its G2P's: ``THE dh ax``, ``THE dh iy``); words with a
  unit the model lacks, or a 7th homophone (:func:`write_lexicon`), are left out (counted in ``info.json``);
* ``info.json``: order, sizes, sources, the words left out.

A word list (``--word-list``: a dictionary, one word per line, e.g. Debian's ``wamerican-huge``, as
Kaldi's LibriSpeech lexicon adds CMUdict's words to the LM's) widens the lexicon beyond the LM text.
Those words are not in the n-gram's counts; lmplz is told the full vocabulary size
(``--vocab_pad``), so the probability mass its interpolated unigrams keep for unseen words is
shared among them and each list word scores P(<unk> | h) = that mass / (number of unseen words)
(backed off from the context h), which is what the decoder gives a lexicon word the LM lacks.

The beam search keeps only unit sequences that spell lexicon words and ranks a hypothesis of
words W = w_1..w_n by

    score(W) = log P_ctc(spelling(W) | x) + lm_weight * log P_ngram(W) + word_score * n

(natural logs; KenLM's log10 scores are converted by the decoder). So the output is always a
sequence of known words: the n-gram and the lexicon fix the spelling errors a character model
makes, at the price of never producing a word outside the lexicon.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional, Sequence

import torch

from ..data.units import BLANK, UNK, Units

KENLM_HINT = "run utils/install_kenlm.sh (builds KenLM's lmplz and build_binary into tools/kenlm/bin)"


def kenlm_tool(name: str) -> Path:
    """Path of KenLM's ``lmplz`` or ``build_binary``: $KENLM_BIN, then PATH, then the project's tools/kenlm/bin."""
    candidates = []
    if os.environ.get("KENLM_BIN"):
        candidates.append(Path(os.environ["KENLM_BIN"]) / name)
    found = shutil.which(name)
    if found:
        candidates.append(Path(found))
    candidates.append(Path(__file__).resolve().parents[2] / "tools" / "kenlm" / "bin" / name)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(f"KenLM's {name} not found (KENLM_BIN, PATH, tools/kenlm/bin): {KENLM_HINT}")


TRIE_MAX_HOMOPHONES = 6   # flashlight's lexicon trie keeps at most 6 words per spelling (its kTrieMaxLabel)


def write_lexicon(words: Iterable[str], tok: Units, path: Path) -> list[str]:
    """Write ``<word> <units...>`` lines for the spellable ``words`` (a line per pronunciation with phone
    units); return the words left out: those the units cannot spell, and with phone units those whose
    every pronunciation is shared by :data:`TRIE_MAX_HOMOPHONES` earlier words (the decoder's trie
    would drop them with a warning per word; ``words`` come most frequent first, so the rare go)."""
    words = list(words)
    spelled = tok.spellings(words)
    lines, taken, per_spelling = [], set(), Counter()
    for w in words:
        for units in spelled.get(w, []):
            key = tuple(units)
            if per_spelling[key] < TRIE_MAX_HOMOPHONES:
                per_spelling[key] += 1
                taken.add(w)
                lines.append(f"{w} {' '.join(units)}\n")
    left_out = [w for w in words if w not in taken]
    if not lines:
        raise ValueError(f"{path}: none of the {len(left_out)} words can be spelled with the units of {tok.path}")
    path.write_text("".join(lines), encoding="utf-8")
    return left_out


def _run(cmd: Sequence[str], stdin, stdout, what: str) -> None:
    """Run a KenLM tool; its failure is a ValueError naming ``what`` with the tool's last message."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.run(list(map(str, cmd)), stdin=stdin, stdout=stdout, stderr=err)
        if proc.returncode != 0:
            err.seek(0)
            lines = [x for x in err.read().decode("utf-8", "replace").splitlines() if x.strip()]
            raise ValueError(f"{Path(cmd[0]).name} failed on {what} (exit {proc.returncode}): "
                             f"{lines[-1].strip() if lines else 'no message'}")


def read_word_list(path: Path) -> list[str]:
    """The words of a dictionary file (one per line; ``#`` lines skipped), upper-cased as LibriSpeech's
    text is, each once: the words written in lower case first (common words), then the capitalized
    (names), each in file order (which of two homophones a full trie keeps: :func:`write_lexicon`); a
    word with anything but letters and apostrophes is left out."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (a word list: one word per line)")
    common: dict[str, None] = {}
    names: dict[str, None] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        w = line.strip()
        if w and not w.startswith("#") and w.replace("'", "").isalpha() and w.isascii():
            (common if w.islower() else names).setdefault(w.upper(), None)
    if not common and not names:
        raise ValueError(f"{path}: no words (one word of letters and apostrophes per line)")
    return list(common) + [w for w in names if w not in common]


def build_word_lm(sentences: Sequence[str], tok: Units, out: Path, order: int = 3,
                  max_words: int = 0, memory: str = "20%", source: str = "", binary: bool = True,
                  word_list: Sequence[str] = (), word_list_source: str = "") -> dict:
    """Estimate an ``order``-gram on ``sentences`` with lmplz and write the word LM dir ``out``.

    ``max_words`` > 0 keeps the most frequent words only (the LM's others become ``<unk>``, as
    LibriSpeech's 200k-word vocabulary); 0 keeps every word. ``word_list``: more lexicon words, each
    scored as an unseen word (module docstring). Returns (and writes) ``info.json``.
    """
    if order < 1:
        raise ValueError(f"--order {order}: an n-gram order is at least 1")
    counts = Counter(w for s in sentences for w in s.split())
    if not counts:
        raise ValueError(f"{source or 'the LM text'}: no words to estimate a word LM on")
    vocab = [w for w, _ in counts.most_common(max_words or None) if w not in ("<s>", "</s>", UNK)]
    in_lm = set(vocab)
    extra = [w for w in word_list if w not in in_lm and w not in ("<s>", "</s>", UNK)]
    out.mkdir(parents=True, exist_ok=True)
    left_out = write_lexicon(vocab + extra, tok, out / "lexicon.txt")
    lmplz = kenlm_tool("lmplz")
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text"
        text.write_text("".join(" ".join(s.split()) + "\n" for s in sentences if s.strip()), encoding="utf-8")
        cmd = [lmplz, "-o", order, "-S", memory, "-T", tmp, "--discount_fallback"]
        if max_words:
            (Path(tmp) / "vocab").write_text("\n".join(vocab) + "\n", encoding="utf-8")
            cmd += ["--limit_vocab_file", Path(tmp) / "vocab"]
        if extra:  # <unk>'s unigram = the unseen mass / the unseen words of the lexicon (+ <s>, </s>, <unk>)
            cmd += ["--interpolate_unigrams", "1", "--vocab_pad", len(vocab) + len(extra) + 3]
        with open(text, "rb") as fin, open(out / "lm.arpa.tmp", "wb") as fout:
            _run(cmd, fin, fout, source or "the LM text")
    os.replace(out / "lm.arpa.tmp", out / "lm.arpa")
    (out / "lm.bin").unlink(missing_ok=True)
    if binary:
        _run([kenlm_tool("build_binary"), out / "lm.arpa", out / "lm.bin"], subprocess.DEVNULL,
             subprocess.DEVNULL, str(out / "lm.arpa"))
    info = {"order": order, "source": source, "sentences": len(sentences), "running_words": sum(counts.values()),
            "distinct_words": len(counts), "lexicon_words": len(vocab) + len(extra) - len(left_out),
            "left_out_words": len(left_out), "left_out_examples": left_out[:20], "max_words": max_words,
            "word_list": word_list_source, "word_list_added": len(extra) - len(set(left_out) - in_lm),
            "units": str(tok.path), "lm": "lm.bin" if binary else "lm.arpa"}
    (out / "info.json").write_text(json.dumps(info, indent=2))
    return info


def oov_rate(sentences: Iterable[str], lexicon: Path) -> float:
    """Fraction of running words of ``sentences`` that are not in ``lexicon`` (the words it can never output)."""
    known = {line.split(maxsplit=1)[0] for line in lexicon.read_text(encoding="utf-8").splitlines() if line.strip()}
    words = [w for s in sentences for w in s.split()]
    return sum(w not in known for w in words) / max(1, len(words))


class LexiconTrie:
    """What a word decoder needs whatever its weights, built once per word LM dir: the unit and word
    dictionaries, the KenLM, and the lexicon trie of the units' spellings, each word labelled with its
    unigram log-probability and the trie smeared by the max (flashlight-text's public API, as torchaudio's
    ``ctc_decoder`` builds it). The trie of a 357k-word lexicon takes 20-55 s, with the machine's load; every
    :class:`WordDecoder` of one tuning grid shares it."""

    def __init__(self, lm_dir: Path, tok: Units):
        from flashlight.lib.text.decoder import SmearingMode, Trie
        from flashlight.lib.text.decoder.kenlm import KenLM
        from flashlight.lib.text.dictionary import Dictionary, create_word_dict, load_words

        self.lm_dir = lm_dir = Path(lm_dir)
        lexicon = lm_dir / "lexicon.txt"
        lm = lm_dir / "lm.bin" if (lm_dir / "lm.bin").is_file() else lm_dir / "lm.arpa"
        for f in (lexicon, lm):
            if not f.is_file():
                raise FileNotFoundError(f"{f} not found: make the word LM with gossip_accel.bin.make_word_lm")
        self.tok = tok
        try:
            self.units = Dictionary(tok.tokens)
            spellings = load_words(str(lexicon))
            self.words = create_word_dict(spellings)
            self.lm = KenLM(str(lm), self.words)
            # The spellings hold the word boundary (``▁``) as the model emits it, so no unit may be the
            # decoder's optional silence between words: ``▁`` as silence loses one-letter words (``▁ A``
            # is read as silence + a word without its start). <unk> takes that role: the model
            # emits it for nothing of the training text, and a frame of it costs nothing between words.
            self.blank, self.silence = self.units.get_index(BLANK), self.units.get_index(UNK)
            self.unk_word = self.words.get_index(UNK)
            self.trie = Trie(self.units.index_size(), self.silence)
            start = self.lm.start(False)
            for word, word_spellings in spellings.items():
                index = self.words.get_index(word)
                _, unigram = self.lm.score(start, index)
                for spelling in word_spellings:
                    self.trie.insert([self.units.get_index(u) for u in spelling], index, unigram)
            self.trie.smear(SmearingMode.MAX)
        except Exception as e:  # noqa: BLE001 - flashlight raises RuntimeError/ValueError/IndexError
            raise ValueError(f"{lm_dir}: the word LM does not load with the units of {tok.path} "
                             f"({' '.join(str(e).split())[:200]}); make it again with these units") from None


class WordDecoder:
    """CTC lexicon beam search with a word n-gram over a batch of log-probabilities (B, T, V): flashlight's
    ``LexiconDecoder`` (the decoder of wav2letter and torchaudio's ``ctc_decoder``) on a :class:`LexiconTrie`,
    built here from ``lm_dir`` or shared (``lexicon``: decoders of other weights on the same word LM)."""

    def __init__(self, lm_dir: Path, tok: Units, beam: int = 50, lm_weight: float = 1.0,
                 word_score: float = 0.0, beam_threshold: float = 25.0, beam_size_token: Optional[int] = None,
                 lexicon: Optional[LexiconTrie] = None):
        from flashlight.lib.text.decoder import CriterionType, LexiconDecoder, LexiconDecoderOptions

        if lexicon is not None and (lexicon.lm_dir != Path(lm_dir) or lexicon.tok.tokens != tok.tokens):
            raise ValueError(f"the lexicon trie of {lexicon.lm_dir} ({lexicon.tok.path}) given for the word LM "
                             f"{lm_dir} ({tok.path})")
        self.lexicon = lexicon or LexiconTrie(lm_dir, tok)
        self.tok, self.lm_weight, self.word_score = tok, lm_weight, word_score
        options = LexiconDecoderOptions(beam_size=beam,
                                        beam_size_token=beam_size_token or self.lexicon.units.index_size(),
                                        beam_threshold=beam_threshold, lm_weight=lm_weight, word_score=word_score,
                                        unk_score=float("-inf"), sil_score=0.0, log_add=False,
                                        criterion_type=CriterionType.CTC)
        lx = self.lexicon
        self.decoder = LexiconDecoder(options, lx.trie, lx.lm, lx.silence, lx.blank, lx.unk_word, [], False)

    def __call__(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        emissions = log_probs.detach().to("cpu", torch.float32).contiguous()
        b, _, v = emissions.shape
        words = []
        for i in range(b):   # flashlight reads utterance i's frames from its address in the batch
            results = self.decoder.decode(emissions.data_ptr() + 4 * i * emissions.stride(0), int(lengths[i]), v)
            best = results[0].words if results else []
            words.append(" ".join(w for w in (self.lexicon.words.get_entry(x) for x in best if x >= 0) if w))
        return words
