"""Word error rate as Kaldi reports it (``compute-wer``) with per-utterance alignments.

Counts come from ``kaldialign.edit_distance`` (a port of Kaldi's LevenshteinEditDistance, so
the totals equal ``compute-wer``'s), alignments from ``kaldialign.align`` with ``***`` for the
empty word (as ``align-text`` in Kaldi's ``steps/score_kaldi.sh``). Files of a scoring dir:

* ``wer``: ``%WER 50.00 [ 2 / 4, 1 ins, 0 del, 1 sub ]`` (`` [PARTIAL]`` appended when some
  references had no hypothesis), ``%SER 100.00 [ 1 / 1 ]``, ``Scored 1 sentences, 0 not present in hyp.``;
* ``cer``: the same ``%CER`` line over characters, the space between words counted as one
  character (ESPnet's ``<space>``), so a run that gets the letters but not the word boundaries
  shows it;
* ``per_utt``: ``utils/scoring/wer_per_utt_details.pl``'s format, four lines per utterance
  (``<utt> ref``, ``hyp``, ``op`` with C/S/I/D, columns centred to a common width, and
  ``<utt> #csid <C> <S> <I> <D>``);
* ``hyp.txt`` / ``ref.txt``: the scored hypotheses and references (``<utt> <words>``, sorted).

Modes (``compute-wer --mode``): ``all`` (default here: a missing hypothesis counts as empty,
all deletions), ``present`` (score only utterances with a hypothesis), ``strict`` (error).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

EPS = "***"
MODES = ("all", "present", "strict")


@dataclass
class EditCounts:
    """Insertions, deletions and substitutions of an alignment; errors is their sum."""

    ins: int = 0
    dels: int = 0
    subs: int = 0

    @property
    def errors(self) -> int:
        return self.ins + self.dels + self.subs

    def rate(self, ref_len: int) -> float:
        """errors / ref_len in percent; inf when the references are empty (Kaldi prints inf too)."""
        return 100.0 * self.errors / ref_len if ref_len else (0.0 if not self.errors else float("inf"))

    def add_edits(self, ref: list, hyp: list) -> None:
        import kaldialign

        d = kaldialign.edit_distance(ref, hyp)
        self.ins, self.dels, self.subs = self.ins + d["ins"], self.dels + d["del"], self.subs + d["sub"]


@dataclass
class CharStats(EditCounts):
    """Character-level totals (``%CER``) over ``ref_chars`` reference characters."""

    ref_chars: int = 0

    @property
    def cer(self) -> float:
        return self.rate(self.ref_chars)

    def add(self, ref: str, hyp: str) -> None:
        self.add_edits(list(ref), list(hyp))
        self.ref_chars += len(ref)

    def kaldi_line(self) -> str:
        return f"%CER {self.cer:.2f} [ {self.errors} / {self.ref_chars}, {self.ins} ins, {self.dels} del, {self.subs} sub ]"


@dataclass
class WerStats(EditCounts):
    """Corpus totals over ``ref_words`` reference words (and the same at character level, ``chars``)."""

    ref_words: int = 0
    chars: CharStats = field(default_factory=CharStats)
    sent_errors: int = 0
    sentences: int = 0
    absent: int = 0  # references without a hypothesis
    extra: list = field(default_factory=list)  # hypotheses without a reference (ignored)

    @property
    def wer(self) -> float:
        return self.rate(self.ref_words)

    @property
    def ser(self) -> float:
        return 100.0 * self.sent_errors / self.sentences if self.sentences else 0.0

    def as_dict(self) -> dict:
        return {"wer": self.wer, "ser": self.ser, "errors": self.errors, "ins": self.ins, "del": self.dels,
                "sub": self.subs, "ref_words": self.ref_words, "sentences": self.sentences,
                "sent_errors": self.sent_errors, "absent": self.absent, "cer": self.chars.cer,
                "char_errors": self.chars.errors, "ref_chars": self.chars.ref_chars}

    def kaldi_lines(self) -> list[str]:
        """The three lines ``compute-wer`` prints."""
        return [f"%WER {self.wer:.2f} [ {self.errors} / {self.ref_words}, {self.ins} ins, {self.dels} del, "
                f"{self.subs} sub ]" + (" [PARTIAL]" if self.absent else ""),
                f"%SER {self.ser:.2f} [ {self.sent_errors} / {self.sentences} ]",
                f"Scored {self.sentences} sentences, {self.absent} not present in hyp."]


@dataclass
class UttAlignment:
    utt: str
    pairs: list  # [(ref word or EPS, hyp word or EPS)]

    def ops(self) -> list[str]:
        return ["D" if h == EPS else "I" if r == EPS else "S" if r != h else "C" for r, h in self.pairs]

    def csid(self) -> tuple[int, int, int, int]:
        ops = self.ops()
        return ops.count("C"), ops.count("S"), ops.count("I"), ops.count("D")

    def kaldi_lines(self) -> list[str]:
        """Four lines in ``wer_per_utt_details.pl``'s format."""
        ops = self.ops()
        cols = [(r, h, o) for (r, h), o in zip(self.pairs, ops)]
        ref, hyp, op = [], [], []
        for r, h, o in cols:
            width = max(len(r), len(h), len(o))
            ref.append(_centre(r, width))
            hyp.append(_centre(h, width))
            op.append(_centre(o, width))
        c, s, i, d = self.csid()
        return [f"{self.utt} ref  " + "  ".join(ref), f"{self.utt} hyp  " + "  ".join(hyp),
                f"{self.utt} op   " + "  ".join(op), f"{self.utt} #csid {c} {s} {i} {d}"]


def _centre(word: str, width: int) -> str:
    """wer_per_utt_details.pl's cjustify: the odd space goes to the left."""
    right = (width - len(word)) // 2
    return " " * (width - len(word) - right) + word + " " * right


def align_words(ref: list[str], hyp: list[str], utt: str = "?") -> UttAlignment:
    """Levenshtein alignment of two word lists, ``***`` standing for the missing word."""
    import kaldialign

    if EPS in ref or EPS in hyp:
        raise ValueError(f"utterance {utt}: the word {EPS!r} is reserved for alignments; remove it from ref/hyp")
    return UttAlignment(utt, [tuple(p) for p in kaldialign.align(ref, hyp, EPS)])


def compute_wer(refs: Mapping[str, str], hyps: Mapping[str, str], mode: str = "all"
                ) -> tuple[WerStats, list[UttAlignment]]:
    """Corpus WER of ``hyps`` against ``refs`` (utt -> transcript), and one alignment per scored utterance.

    Utterances are scored in sorted order. Hypotheses with no reference are listed in
    ``stats.extra`` and not scored (as in Kaldi).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    stats = WerStats(extra=sorted(set(hyps) - set(refs)))
    details = []
    for utt in sorted(refs):
        ref = refs[utt].split()
        if utt not in hyps:
            if mode == "strict":
                raise KeyError(f"no hypothesis for utterance {utt} (mode strict; use --mode all or present)")
            stats.absent += 1
            if mode == "present":
                continue
        hyp = hyps.get(utt, "").split()
        stats.add_edits(ref, hyp)
        stats.ref_words += len(ref)
        stats.chars.add(" ".join(ref), " ".join(hyp))
        stats.sentences += 1
        stats.sent_errors += ref != hyp
        details.append(align_words(ref, hyp, utt))
    return stats, details


def write_scoring_dir(out_dir: str | Path, refs: Mapping[str, str], hyps: Mapping[str, str],
                      mode: str = "all") -> WerStats:
    """Score and write ``wer``, ``cer``, ``per_utt``, ``hyp.txt`` and ``ref.txt`` under ``out_dir``."""
    stats, details = compute_wer(refs, hyps, mode)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "wer").write_text("\n".join(stats.kaldi_lines()) + "\n", encoding="utf-8")
    (out / "cer").write_text(stats.chars.kaldi_line() + (" [PARTIAL]" if stats.absent else "") + "\n", encoding="utf-8")
    (out / "per_utt").write_text("".join(line + "\n" for d in details for line in d.kaldi_lines()), encoding="utf-8")
    scored = [d.utt for d in details]
    (out / "hyp.txt").write_text("".join(_line(u, hyps.get(u, "")) for u in scored), encoding="utf-8")
    (out / "ref.txt").write_text("".join(_line(u, refs[u]) for u in scored), encoding="utf-8")
    return stats


def _line(utt: str, text: str) -> str:
    words = " ".join(text.split())
    return f"{utt} {words}\n" if words else f"{utt}\n"
