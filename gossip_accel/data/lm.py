"""Language-model token streams in the wikitext layout (one paragraph per line, <eos> per line).

The vocabulary is sorted by descending training frequency (ids 0.. are the most frequent
words), which is what an adaptive softmax needs: its head is the first ``cutoffs[0]`` ids.
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Iterator, Sequence

import torch

UNK, EOS = "<unk>", "<eos>"


class LMDataError(ValueError):
    """An LM text or vocabulary file that cannot be used; the message names the file and line."""


class Vocabulary:
    """Word <-> id, with counts; ``<unk>`` and ``<eos>`` always present."""

    def __init__(self, words: Sequence[str], counts: Sequence[int]):
        self.words = list(words)
        self.counts = list(counts)
        self.index = {w: i for i, w in enumerate(self.words)}
        for special in (UNK, EOS):
            if special not in self.index:
                raise ValueError(f"vocabulary lacks {special}")

    def __len__(self) -> int:
        return len(self.words)

    @classmethod
    def build(cls, lines: Iterator[list[str]], min_count: int = 1, max_size: int | None = None) -> "Vocabulary":
        """Words seen at least ``min_count`` times (the rest map to <unk>), most frequent first."""
        counts: Counter[str] = Counter()
        for toks in lines:
            counts.update(toks)
        counts[EOS] += 0
        kept = [(w, c) for w, c in counts.items() if c >= min_count or w in (UNK, EOS)]
        kept.sort(key=lambda wc: (-wc[1], wc[0]))
        if max_size is not None:
            kept = kept[:max_size]
        dropped = sum(counts.values()) - sum(c for _, c in kept)
        words = [w for w, _ in kept]
        freq = [c for _, c in kept]
        if UNK in words:
            freq[words.index(UNK)] += dropped
        else:
            words.append(UNK)
            freq.append(dropped)
        if EOS not in words:
            words.append(EOS)
            freq.append(0)
        return cls(words, freq)

    def save(self, path: str | Path) -> None:
        """``<word> <count>`` lines, written atomically (temporary file + rename)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            for w, c in zip(self.words, self.counts):
                f.write(f"{w} {c}\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> "Vocabulary":
        words, counts = [], []
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"vocabulary {path} not found: run gossip_accel.bin.prepare_lm first")
        for lineno, line in _utf8_lines(path):
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                raise LMDataError(f"{path}:{lineno}: expected '<word> <count>', got {line.rstrip()!r}")
            words.append(parts[0])
            counts.append(int(parts[1]))
        return cls(words, counts)

    def encode(self, lines: Iterator[list[str]]) -> torch.Tensor:
        unk = self.index[UNK]
        return torch.tensor([self.index.get(w, unk) for toks in lines for w in toks], dtype=torch.long)


def read_lines(path: str | Path) -> Iterator[list[str]]:
    """Tokens of each non-empty line of a wikitext-style file, followed by <eos>."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LM text file not found: {path}")
    for _, line in _utf8_lines(path):
        toks = line.split()
        if toks:
            yield toks + [EOS]


def _utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file; a line that is not UTF-8 is an :class:`LMDataError`
    naming the file, the line and the byte."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                yield n, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise LMDataError(f"{path}:{n}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                                  f"convert the file, e.g. iconv -f latin1 -t utf-8") from None


def check_text(path: str | Path) -> int:
    """Number of tokens of an LM text file; :class:`LMDataError` (naming the file and line) if a
    line is not UTF-8 or the file holds no token at all."""
    n = sum(len(toks) - 1 for toks in read_lines(path))
    if n == 0:
        raise empty_text_error(path)
    return n


def empty_text_error(path: str | Path) -> LMDataError:
    return LMDataError(f"{path}: no tokens (empty or blank lines only); give one sentence or paragraph per line")


def shard(ids: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Worker ``rank``'s contiguous 1/n of the stream (D^k of Algorithm 1); equal lengths."""
    per = ids.numel() // world_size
    return ids[rank * per:(rank + 1) * per]


def batchify(ids: torch.Tensor, streams: int) -> torch.Tensor:
    """(streams, L) matrix of parallel token streams (the tail that does not fit is dropped)."""
    length = ids.numel() // streams
    if length < 2:
        raise ValueError(f"{ids.numel()} tokens are too few for {streams} streams")
    return ids[:streams * length].view(streams, length)


#: how the training text is dealt out to the workers (``data.shard_layout``; see ``worker_streams``)
SHARD_LAYOUTS = ("contiguous", "interleaved")


def worker_streams(ids: torch.Tensor, rank: int, world_size: int, streams: int,
                   layout: str = "contiguous") -> torch.Tensor:
    """Worker ``rank``'s (streams, L) matrix of parallel token streams, its D^k of Algorithm 1.

    ``contiguous``: its contiguous 1/n of the text cut into ``streams`` streams, so a worker reads one
    part of the corpus (on a corpus of a few books, one or two books). ``interleaved``: the text cut
    into n x ``streams`` streams and worker k given streams k, k + n, k + 2n, ...: every worker reads
    every part of the corpus, as torch's DistributedSampler deals samples out. Both give every worker
    streams of the same length L = len // (n x streams); DDP's step (the union of the workers'
    windows) sees the same text either way, up to the tail tokens a contiguous shard drops."""
    if layout == "contiguous":
        return batchify(shard(ids, rank, world_size), streams)
    if layout == "interleaved":
        return batchify(ids, world_size * streams)[rank::world_size]
    raise ValueError(f"shard layout {layout!r}: expected one of {', '.join(SHARD_LAYOUTS)}")


def rest_of_stream(ids: torch.Tensor, world_size: int, streams: int, columns: int,
                   layout: str = "contiguous") -> torch.Tensor:
    """The tokens of ``ids`` that ``world_size`` workers have not fed as inputs yet, once each has run
    over the first ``columns`` columns of its (streams, L) matrix (``worker_streams`` ->
    ``bptt_windows``: ``columns`` = batches x bptt): old rank 0's stream 0 from that column on, its
    stream 1, ..., then rank 1's, in that order. Dealing the result out to m workers continues the
    epoch on m workers (elastic resume) with no token fed twice; what is lost is the tails
    ``shard``/``batchify`` drop (fewer than m + m x streams tokens)."""
    rows = [worker_streams(ids, k, world_size, streams, layout)[:, columns:] for k in range(world_size)]
    return torch.cat([r.reshape(-1) for r in rows])


def bptt_windows(data: torch.Tensor, bptt: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input, target) windows of truncated back-propagation through time."""
    for i in range(0, data.shape[1] - 1, bptt):
        n = min(bptt, data.shape[1] - 1 - i)
        yield data[:, i:i + n], data[:, i + 1:i + 1 + n]


def num_windows(data: torch.Tensor, bptt: int) -> int:
    return len(range(0, data.shape[1] - 1, bptt))
