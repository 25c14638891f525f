"""NIST SPHERE audio (``.sph``): read and write, including LDC's shorten-compressed files, numpy only.

LDC distributes Switchboard-1 (LDC97S62), Hub5'00 (LDC2002S09), WSJ, TIMIT... as SPHERE files:
a text header (``NIST_1A``, its size, then ``name -type value`` lines up to ``end_head``)
followed by the samples. The sample data is PCM (``pcm``, 16-bit, byte order ``01`` or ``10``),
mu-law (``ulaw`` / ``mu-law``), a-law, or any of these compressed with Tony Robinson's
*shorten* (``ulaw,embedded-shorten-v2.00`` on the Switchboard discs). libsndfile (soundfile)
and sox read the uncompressed codings but not shorten; LDC's ``sph2pipe`` reads all of them
but is packaged neither by Debian nor by PyPI. This module reads every one of them without a
binary: :func:`read_sphere` decodes shorten itself (a pure-Python decoder, about 0.35 CPU-s per
minute of two-channel 8 kHz audio, ``bench/sphere_decode.py``). When ``sph2pipe`` is on PATH it
is used instead; else PCM shorten goes through FFmpeg's ``shorten`` decoder when ``ffmpeg`` is
on PATH (about 14 times less CPU), given the WAV header it insists on by
:func:`shorten_for_ffmpeg`. FFmpeg has no mu-law shorten, so Switchboard's files stay with the
Python decoder (or sph2pipe).

:func:`write_sphere` writes 8 kHz two-channel mu-law files like the LDC's (optionally
shorten-compressed, as on the real discs), which the recipes' mini corpora use.

Shorten (format version 1 and 2): the stream starts with ``ajkg`` and a version byte, then
Rice-coded header values (file type, channels, block size, max LPC order, number of means,
skipped bytes) and one command per block and channel: ``DIFF0``-``DIFF3`` (fixed polynomial
predictors), ``QLPC`` (quantized LPC), ``ZERO``, ``BITSHIFT``, ``BLOCKSIZE``, ``VERBATIM``,
``QUIT``. mu-law samples are coded as a linear-order index (types ``AU1``/``AU2``), mapped back
to mu-law bytes by a table that depends on the block's bit shift; the tables are computed
here the way shorten's ``mkbshift`` builds them (from the G.711 mu-law encoder).
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from .ffmpeg_audio import FFmpegError, decode_to_int16, ffmpeg_program

MAGIC = b"NIST_1A"
HEADER_SIZE = 1024


class SphereError(ValueError):
    """A file that is not SPHERE, or a coding this module does not read."""


# --------------------------------------------------------------------------------------
# mu-law / a-law (G.711), as libsndfile and sph2pipe convert them
# --------------------------------------------------------------------------------------

def _ulaw_to_linear_table() -> np.ndarray:
    out = np.empty(256, dtype=np.int16)
    for b in range(256):
        u = ~b & 0xFF
        sign, exponent, mantissa = u & 0x80, (u >> 4) & 0x07, u & 0x0F
        t = (((mantissa << 3) + 0x84) << exponent) - 0x84
        out[b] = -t if sign else t
    return out


def _alaw_to_linear_table() -> np.ndarray:
    out = np.empty(256, dtype=np.int16)
    for b in range(256):
        a = b ^ 0x55
        t = (a & 0x0F) << 4
        seg = (a & 0x70) >> 4
        if seg == 0:
            t += 8
        elif seg == 1:
            t += 0x108
        else:
            t = (t + 0x108) << (seg - 1)
        out[b] = t if (a & 0x80) else -t
    return out


ULAW_TO_LINEAR = _ulaw_to_linear_table()
ALAW_TO_LINEAR = _alaw_to_linear_table()


def linear_to_ulaw(x: np.ndarray) -> np.ndarray:
    """16-bit linear samples (int) -> mu-law bytes (uint8), G.711 with the usual bias 0x84 and clip."""
    x = np.asarray(x, dtype=np.int64)
    sign = np.where(x < 0, 0x80, 0)
    mag = np.minimum(np.abs(x), 32635) + 0x84
    exponent = np.floor(np.log2(mag)).astype(np.int64) - 7          # mag >= 0x84 > 128
    exponent = np.clip(exponent, 0, 7)
    mantissa = (mag >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)


def _shorten_ulaw_tables() -> tuple[list[int], list[list[int]], list[list[int]]]:
    """(ulaw_maxshift, ulaw_inward, ulaw_outward) built as shorten's mkbshift does.

    ``maxshift[b]``: the largest shift s such that mu-law byte b is the code of a multiple of
    2**(s+3); ``inward[s][b]``: b's index in a linear order that keeps the codes compatible
    with shift s first; ``outward[s][v + 128]``: the inverse."""
    codes = linear_to_ulaw(np.arange(-(1 << 15), 1 << 15))
    tab = [0] * 256
    for shift in range(13):
        for b in codes[::1 << (shift + 3)]:
            tab[int(b)] = shift
    inward, outward = [], []
    for shift in range(13):
        fwd = [0] * 256
        n = 0
        for pass_ok in (True, False):
            for i in range(255, 127, -1):
                if (tab[i] >= shift) == pass_ok:
                    fwd[i] = n
                    n += 1
        n = -1
        for i in range(126, -1, -1):
            if tab[i] >= shift:
                fwd[i] = n
                n -= 1
        fwd[127] = n
        n -= 1
        for i in range(126, -1, -1):
            if tab[i] < shift:
                fwd[i] = n
                n -= 1
        rev = [0] * 256
        for i in range(256):
            rev[fwd[i] + 128] = i
        inward.append(fwd)
        outward.append(rev)
    return tab, inward, outward


_ULAW_TABLES: Optional[tuple] = None


def shorten_ulaw_tables():
    global _ULAW_TABLES
    if _ULAW_TABLES is None:
        _ULAW_TABLES = _shorten_ulaw_tables()
    return _ULAW_TABLES


# --------------------------------------------------------------------------------------
# The header
# --------------------------------------------------------------------------------------

@dataclass
class SphereHeader:
    fields: dict = field(default_factory=dict)
    size: int = HEADER_SIZE

    @property
    def channels(self) -> int:
        return int(self.fields.get("channel_count", 1))

    @property
    def rate(self) -> int:
        return int(self.fields.get("sample_rate", 16000))

    @property
    def sample_count(self) -> Optional[int]:
        v = self.fields.get("sample_count")
        return int(v) if v is not None else None

    @property
    def n_bytes(self) -> int:
        return int(self.fields.get("sample_n_bytes", 2))

    @property
    def coding(self) -> str:
        return str(self.fields.get("sample_coding", "pcm")).lower()

    @property
    def byte_format(self) -> str:
        return str(self.fields.get("sample_byte_format", "01"))

    @property
    def shorten(self) -> bool:
        return "shorten" in self.coding

    @property
    def base_coding(self) -> str:
        """``pcm``, ``ulaw`` or ``alaw`` (the coding before compression)."""
        c = self.coding.split(",")[0]
        return {"mu-law": "ulaw", "u-law": "ulaw", "a-law": "alaw"}.get(c, c)


def parse_header(data: bytes, name: str = "?") -> SphereHeader:
    """The header of a SPHERE file's first bytes (at least the header size, normally 1024)."""
    if not data.startswith(MAGIC):
        raise SphereError(f"{name}: not a NIST SPHERE file (no NIST_1A at the start)")
    lines = data[:HEADER_SIZE * 64].split(b"\n")
    try:
        size = int(lines[1].strip())
    except (IndexError, ValueError):
        raise SphereError(f"{name}: bad SPHERE header (no header size on line 2)") from None
    fields: dict = {}
    for raw in data[:size].split(b"\n")[2:]:
        line = raw.decode("latin-1").strip()
        if not line or line.startswith(";"):
            continue
        if line == "end_head":
            break
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        key, typ, val = parts
        if typ == "-i":
            fields[key] = int(val)
        elif typ == "-r":
            fields[key] = float(val)
        elif typ.startswith("-s") and typ[2:].isdigit():
            fields[key] = val[:int(typ[2:])]          # -sN: a string of exactly N characters
        else:
            fields[key] = val
    else:
        raise SphereError(f"{name}: SPHERE header without end_head")
    return SphereHeader(fields, size)


def read_header(path: str | os.PathLike) -> SphereHeader:
    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE)
        if head.startswith(MAGIC):
            size = int(head.split(b"\n")[1].strip() or HEADER_SIZE)
            if size > len(head):
                head += f.read(size - len(head))
    return parse_header(head, str(path))


# --------------------------------------------------------------------------------------
# Shorten decoder
# --------------------------------------------------------------------------------------

FN_DIFF0, FN_DIFF1, FN_DIFF2, FN_DIFF3, FN_QUIT, FN_BLOCKSIZE, FN_BITSHIFT, FN_QLPC, FN_ZERO, FN_VERBATIM = range(10)
TYPE_AU1, TYPE_S8, TYPE_U8, TYPE_S16HL, TYPE_U16HL, TYPE_S16LH, TYPE_U16LH, TYPE_ULAW, TYPE_AU2 = range(9)
FNSIZE, ENERGYSIZE, BITSHIFTSIZE, LPCQSIZE, LPCQUANT, XBYTESIZE, ULONGSIZE = 2, 3, 2, 2, 5, 7, 2
NWRAP = 3
VERBATIM_CKSIZE_SIZE, VERBATIM_BYTE_SIZE = 5, 8


class _Bits:
    """MSB-first bit reader with shorten's Rice codes."""

    __slots__ = ("data", "pos", "buf", "nbits")

    def __init__(self, data: bytes, pos: int = 0):
        self.data = data + b"\0" * 8
        self.pos = pos
        self.buf = 0
        self.nbits = 0

    def _fill(self) -> None:
        if self.pos >= len(self.data) - 8:
            raise SphereError("shorten stream ends before its QUIT command (truncated file?)")
        self.buf = (self.buf << 64) | int.from_bytes(self.data[self.pos:self.pos + 8], "big")
        self.pos += 8
        self.nbits += 64

    def uvar(self, nbin: int) -> int:
        """Unary high part (zeros ended by a one), then ``nbin`` low bits."""
        zeros = 0
        while True:
            if self.nbits == 0:
                self._fill()
            mask = (1 << self.nbits) - 1
            rest = self.buf & mask
            if rest == 0:
                zeros += self.nbits
                self.nbits = 0
                self.buf = 0
                continue
            lead = self.nbits - rest.bit_length()
            zeros += lead
            self.nbits -= lead + 1
            self.buf = rest & ((1 << self.nbits) - 1)
            break
        if nbin:
            while self.nbits < nbin:
                self._fill()
            self.nbits -= nbin
            low = self.buf >> self.nbits
            self.buf &= (1 << self.nbits) - 1
            return (zeros << nbin) | low
        return zeros

    def var(self, nbin: int) -> int:
        u = self.uvar(nbin + 1)
        return ~(u >> 1) if u & 1 else u >> 1

    def ulong(self) -> int:
        return self.uvar(self.uvar(ULONGSIZE))

    def many_var(self, n: int, nbin: int) -> list[int]:
        """n signed Rice values (the inner loop of every block, kept in one frame for speed)."""
        out = [0] * n
        data, pos, buf, nbits = self.data, self.pos, self.buf, self.nbits
        nb1 = nbin + 1
        end = len(data) - 8
        for i in range(n):
            zeros = 0
            while True:
                if nbits == 0:
                    if pos >= end:
                        raise SphereError("shorten stream ends before its QUIT command (truncated file?)")
                    buf = int.from_bytes(data[pos:pos + 8], "big")
                    pos += 8
                    nbits = 64
                if buf == 0:
                    zeros += nbits
                    nbits = 0
                    continue
                lead = nbits - buf.bit_length()
                zeros += lead
                nbits -= lead + 1
                buf &= (1 << nbits) - 1
                break
            while nbits < nb1:
                if pos >= end:
                    raise SphereError("shorten stream ends before its QUIT command (truncated file?)")
                buf = (buf << 64) | int.from_bytes(data[pos:pos + 8], "big")
                pos += 8
                nbits += 64
            nbits -= nb1
            u = (zeros << nb1) | (buf >> nbits)
            buf &= (1 << nbits) - 1
            out[i] = ~(u >> 1) if u & 1 else u >> 1
        self.pos, self.buf, self.nbits = pos, buf, nbits
        return out


def _cdiv(a: int, b: int) -> int:
    """C's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _rshift_round(x: int, n: int) -> int:
    return x if n == 0 else (x >> (n - 1)) >> 1


@dataclass
class ShortenStream:
    ftype: int
    channels: int
    samples: np.ndarray        # (n, channels): int64 linear values, or mu-law bytes for AU types
    skipped: bytes = b""


@dataclass
class ShortenHeader:
    """The values a shorten stream starts with, and the bit where its first command begins."""
    start: int                 # byte offset of ``ajkg`` in the data
    version: int
    ftype: int
    channels: int
    blocksize: int
    maxnlpc: int
    nmean: int
    skipped: bytes
    end_bit: int               # bit offset (from the start of the data) just after the header


def _read_shorten_header(data: bytes, name: str) -> tuple[ShortenHeader, _Bits]:
    """The header of a shorten stream, and a bit reader standing at its first command."""
    start = data.find(b"ajkg")
    if start < 0 or start > 16 or len(data) < start + 5:
        raise SphereError(f"{name}: no shorten stream (magic 'ajkg' not found)")
    version = data[start + 4]
    if version not in (1, 2):
        raise SphereError(f"{name}: shorten format version {version} is not supported (1 and 2 are)")
    bits = _Bits(data, start + 5)
    ftype, nchan, blocksize, maxnlpc, nmean, nskip = (bits.ulong() for _ in range(6))
    if ftype > TYPE_AU2:
        raise SphereError(f"{name}: shorten sample type {ftype} is not supported")
    if not (1 <= nchan <= 64) or not (0 < blocksize <= 1 << 20) or maxnlpc > 1024 or nmean > 1024:
        raise SphereError(f"{name}: implausible shorten header (channels {nchan}, block size {blocksize})")
    skipped = bytes(bits.uvar(XBYTESIZE) & 0xFF for _ in range(nskip))
    end_bit = bits.pos * 8 - bits.nbits
    return ShortenHeader(start, version, ftype, nchan, blocksize, maxnlpc, nmean, skipped, end_bit), bits


def read_shorten_header(data: bytes, name: str = "?") -> ShortenHeader:
    """The header of a shorten stream (``ajkg``, version, Rice-coded type, channels, ...)."""
    return _read_shorten_header(data, name)[0]


def decode_shorten(data: bytes, name: str = "?") -> ShortenStream:
    """Decode a shorten stream (``ajkg`` + version 1 or 2) into its samples, per channel.

    For the mu-law types (``AU1``, ``AU2``, ``ULAW``) ``samples`` holds mu-law bytes; for the
    PCM types the sample values (signed, or unsigned for ``U8``/``U16``)."""
    head, bits = _read_shorten_header(data, name)
    version, ftype, nchan, blocksize = head.version, head.ftype, head.channels, head.blocksize
    maxnlpc, nmean, skipped = head.maxnlpc, head.nmean, head.skipped
    nwrap = max(NWRAP, maxnlpc)
    mean0 = {TYPE_U8: 0x80, TYPE_U16HL: 0x8000, TYPE_U16LH: 0x8000}.get(ftype, 0)
    offset = [[mean0] * max(1, nmean) for _ in range(nchan)]
    hist = [[0] * nwrap for _ in range(nchan)]            # the last nwrap values of each channel
    blocks: list[list[list[int]]] = [[] for _ in range(nchan)]
    lpcqoffset = (1 << LPCQUANT) if version > 1 else 0
    bitshift = 0
    chan = 0
    au = ftype in (TYPE_AU1, TYPE_AU2)
    outward = shorten_ulaw_tables()[2] if au else None
    while True:
        cmd = bits.uvar(FNSIZE)
        if cmd == FN_QUIT:
            break
        if cmd in (FN_ZERO, FN_DIFF0, FN_DIFF1, FN_DIFF2, FN_DIFF3, FN_QLPC):
            resn = bits.uvar(ENERGYSIZE) if cmd != FN_ZERO else 0
            if nmean == 0:
                coffset = offset[chan][0]
            elif version < 2:
                coffset = _cdiv(sum(offset[chan]), nmean)
            else:
                coffset = _rshift_round(_cdiv(sum(offset[chan]) + nmean // 2, nmean), bitshift)
            h = hist[chan]
            if cmd == FN_ZERO:
                cur = [0] * blocksize
            elif cmd == FN_QLPC:
                nlpc = bits.uvar(LPCQSIZE)
                qlpc = [bits.var(LPCQUANT) for _ in range(nlpc)]
                res = bits.many_var(blocksize, resn)
                buf = [v - coffset for v in h[len(h) - nlpc:]] if nlpc else []
                for i in range(blocksize):
                    s = lpcqoffset
                    for j in range(nlpc):
                        s += qlpc[j] * buf[-j - 1]
                    buf.append(res[i] + (s >> LPCQUANT))
                cur = [v + coffset for v in buf[nlpc:]]
            else:
                res = bits.many_var(blocksize, resn)
                if cmd == FN_DIFF0:
                    cur = [r + coffset for r in res]
                else:
                    a, b, c = h[-1], h[-2], h[-3]         # x[i-1], x[i-2], x[i-3]
                    cur = [0] * blocksize
                    if cmd == FN_DIFF1:
                        for i, r in enumerate(res):
                            a = r + a
                            cur[i] = a
                    elif cmd == FN_DIFF2:
                        for i, r in enumerate(res):
                            a, b = r + 2 * a - b, a
                            cur[i] = a
                    else:
                        for i, r in enumerate(res):
                            a, b, c = r + 3 * (a - b) + c, a, b
                            cur[i] = a
            if nmean > 0:
                s = (0 if version < 2 else blocksize // 2) + sum(cur)
                offset[chan] = offset[chan][1:] + [_cdiv(s, blocksize) << (bitshift if version >= 2 else 0)]
            hist[chan] = (h + cur)[-nwrap:]
            if au:
                table = outward[bitshift]
                if ftype == TYPE_AU1:
                    cur = [table[v + 128] for v in cur]
                else:
                    cur = [table[v + 128] if v >= 0 else (0x7F if v == -1 else table[v + 129]) for v in cur]
            elif bitshift:
                cur = [v << bitshift for v in cur]
            blocks[chan].append(cur)
            chan = (chan + 1) % nchan
        elif cmd == FN_BLOCKSIZE:
            blocksize = bits.ulong()
            if not 0 < blocksize <= 1 << 20:
                raise SphereError(f"{name}: implausible shorten block size {blocksize}")
        elif cmd == FN_BITSHIFT:
            bitshift = bits.uvar(BITSHIFTSIZE)
        elif cmd == FN_VERBATIM:
            for _ in range(bits.uvar(VERBATIM_CKSIZE_SIZE)):
                bits.uvar(VERBATIM_BYTE_SIZE)
        else:
            raise SphereError(f"{name}: corrupt shorten stream (unknown command {cmd})")
    n = min(sum(len(b) for b in blocks[c]) for c in range(nchan))
    out = np.empty((n, nchan), dtype=np.int64)
    for c in range(nchan):
        out[:, c] = np.fromiter((v for b in blocks[c] for v in b), dtype=np.int64, count=sum(map(len, blocks[c])))[:n]
    if ftype == TYPE_ULAW:                      # linear values (13-bit) re-coded as mu-law
        out = linear_to_ulaw(out << 3).astype(np.int64)
    return ShortenStream(ftype, nchan, out, skipped)


# --------------------------------------------------------------------------------------
# Shorten encoder (for test data and the mini corpora: the real discs are shortened)
# --------------------------------------------------------------------------------------

class _BitWriter:
    def __init__(self):
        self.acc = 0
        self.n = 0
        self.out = bytearray()

    def put(self, value: int, nbits: int) -> None:
        self.acc = (self.acc << nbits) | (value & ((1 << nbits) - 1))
        self.n += nbits
        if self.n >= 64:
            extra = self.n % 8
            self.out += (self.acc >> extra).to_bytes((self.n - extra) // 8, "big")
            self.acc &= (1 << extra) - 1
            self.n = extra

    def uvar(self, value: int, nbin: int) -> None:
        hi = value >> nbin
        while hi >= 64:                        # long unary runs, in pieces
            self.put(0, 64)
            hi -= 64
        self.put(1, hi + 1)
        if nbin:
            self.put(value, nbin)

    def var(self, value: int, nbin: int) -> None:
        self.uvar((value << 1) if value >= 0 else ((~value) << 1) | 1, nbin + 1)

    def ulong(self, value: int) -> None:
        nbit = value.bit_length()
        self.uvar(nbit, ULONGSIZE)
        self.uvar(value, nbit)

    def bits(self) -> tuple[int, int]:
        """(value, number of bits) of everything written so far, unpadded."""
        return int.from_bytes(self.out, "big") << self.n | self.acc, len(self.out) * 8 + self.n

    def finish(self) -> bytes:
        pad = (-self.n) % 32                    # readers fetch whole 32-bit words
        self.put(0, pad)
        if self.n:
            self.out += self.acc.to_bytes(self.n // 8, "big")
        return bytes(self.out)


def _rice_param(res: list[int]) -> int:
    m = sum(abs(r) for r in res) / max(1, len(res))
    k = 0
    while (1 << (k + 1)) <= m:
        k += 1
    return min(k, 30)


def encode_shorten(samples: np.ndarray, ftype: int = TYPE_AU2, blocksize: int = 256, nmean: int = 4,
                   qlpc: Optional[list[int]] = None, verbatim: bytes = b"") -> bytes:
    """A shorten (version 2) stream of ``samples`` (n, channels): mu-law bytes for ``AU1``/``AU2``,
    sample values otherwise. Each block uses the cheapest of DIFF0-DIFF3 (and QLPC with the fixed
    coefficients ``qlpc``, if given), ZERO for silent blocks, and the largest bit shift the block
    allows. ``verbatim``: bytes stored first in a VERBATIM chunk (``.shn`` music files keep the
    WAV header there; SPHERE-embedded streams have none). Meant for test data and mini corpora;
    :func:`decode_shorten` and sph2pipe read it."""
    x = np.asarray(samples, dtype=np.int64)
    if x.ndim == 1:
        x = x[:, None]
    n, nchan = x.shape
    maxnlpc = len(qlpc) if qlpc else 0
    nwrap = max(NWRAP, maxnlpc)
    w = _BitWriter()
    au = ftype in (TYPE_AU1, TYPE_AU2)
    if au:
        maxshift, inward, _ = shorten_ulaw_tables()
    for v in (ftype, nchan, blocksize, maxnlpc, nmean, 0):
        w.ulong(v)
    if verbatim:
        w.uvar(FN_VERBATIM, FNSIZE)
        w.uvar(len(verbatim), VERBATIM_CKSIZE_SIZE)
        for b in verbatim:
            w.uvar(b, VERBATIM_BYTE_SIZE)
    mean0 = {TYPE_U8: 0x80, TYPE_U16HL: 0x8000, TYPE_U16LH: 0x8000}.get(ftype, 0)
    offset = [[mean0] * max(1, nmean) for _ in range(nchan)]
    hist = [[0] * nwrap for _ in range(nchan)]
    bitshift = 0
    cur_bs = blocksize
    for start in range(0, n, blocksize):
        bs = min(blocksize, n - start)
        if bs != cur_bs:
            w.uvar(FN_BLOCKSIZE, FNSIZE)
            w.ulong(bs)
            cur_bs = bs
        block = x[start:start + bs]
        # one bit shift for all channels of the block (as shorten does per block and channel: its value persists)
        shifts = []
        for c in range(nchan):
            col = [int(v) for v in block[:, c]]
            if au:
                s = min(maxshift[v] for v in col)
                if ftype == TYPE_AU2 and s > 0 and any(v == 0x7F for v in col):
                    s = 0
            else:
                acc = 0
                for v in col:
                    acc |= v
                s = (acc & -acc).bit_length() - 1 if acc else 0
                s = min(s, 3)
            shifts.append(s)
        for c in range(nchan):
            col = [int(v) for v in block[:, c]]
            s = shifts[c]
            if s != bitshift:
                w.uvar(FN_BITSHIFT, FNSIZE)
                w.uvar(s, BITSHIFTSIZE)
                bitshift = s
            if au:
                fw = inward[bitshift]
                if ftype == TYPE_AU1:
                    cur = [fw[v] for v in col]
                else:
                    cur = [fw[v] if v > 0x7F else (-1 if v == 0x7F else fw[v] - 1) for v in col]
            else:
                cur = [v >> bitshift for v in col]
            if nmean == 0:
                coffset = offset[c][0]
            else:
                coffset = _rshift_round(_cdiv(sum(offset[c]) + nmean // 2, nmean), bitshift)
            h = hist[c]
            seq = h + cur
            cands = {}
            if all(v == 0 for v in cur):
                cands[FN_ZERO] = None
            else:
                cands[FN_DIFF0] = [v - coffset for v in cur]
                cands[FN_DIFF1] = [seq[nwrap + i] - seq[nwrap + i - 1] for i in range(bs)]
                cands[FN_DIFF2] = [seq[nwrap + i] - 2 * seq[nwrap + i - 1] + seq[nwrap + i - 2] for i in range(bs)]
                cands[FN_DIFF3] = [seq[nwrap + i] - 3 * (seq[nwrap + i - 1] - seq[nwrap + i - 2]) - seq[nwrap + i - 3]
                                   for i in range(bs)]
                if qlpc:
                    p = len(qlpc)
                    buf = [v - coffset for v in seq]
                    res = []
                    for i in range(bs):
                        s_ = 1 << LPCQUANT
                        for j in range(p):
                            s_ += qlpc[j] * buf[nwrap + i - j - 1]
                        res.append(buf[nwrap + i] - (s_ >> LPCQUANT))
                    cands[FN_QLPC] = res
            cmd = min(cands, key=lambda k: -1 if cands[k] is None else sum(abs(r) for r in cands[k]))
            w.uvar(cmd, FNSIZE)
            if cmd != FN_ZERO:
                res = cands[cmd]
                k = _rice_param(res)
                w.uvar(k, ENERGYSIZE)
                if cmd == FN_QLPC:
                    w.uvar(len(qlpc), LPCQSIZE)
                    for q in qlpc:
                        w.var(q, LPCQUANT)
                for r in res:
                    w.var(r, k)
            if nmean > 0:
                tot = bs // 2 + sum(cur)
                offset[c] = offset[c][1:] + [_cdiv(tot, bs) << bitshift]
            hist[c] = seq[-nwrap:]
    w.uvar(FN_QUIT, FNSIZE)
    return b"ajkg\x02" + w.finish()


# --------------------------------------------------------------------------------------
# Shorten through FFmpeg
# --------------------------------------------------------------------------------------

#: the sample types FFmpeg's ``shorten`` decoder implements (libavcodec/shorten.c; checked with
#: Debian's FFmpeg 5.1): 8-bit unsigned and 16-bit PCM. It has no mu-law (``AU1``/``AU2``/``ULAW``:
#: "unknown audio type"), so Switchboard's ``ulaw,embedded-shorten-v2.00`` stays with
#: :func:`decode_shorten`.
FFMPEG_SHORTEN_TYPES = (TYPE_U8, TYPE_S16HL, TYPE_S16LH)
WAV_HEADER_SIZE = 44


def _wav_header(channels: int, rate: int, bits_per_sample: int) -> bytes:
    """A canonical 44-byte PCM WAV header (sizes 0: FFmpeg's shorten decoder reads only its fmt chunk)."""
    block = channels * bits_per_sample // 8
    return (b"RIFF" + (0).to_bytes(4, "little") + b"WAVE" + b"fmt " + (16).to_bytes(4, "little")
            + b"".join(v.to_bytes(k, "little") for v, k in ((1, 2), (channels, 2), (rate, 4), (rate * block, 4),
                                                             (block, 2), (bits_per_sample, 2)))
            + b"data" + (0).to_bytes(4, "little"))


def shorten_for_ffmpeg(data: bytes, rate: int, name: str = "?") -> bytes:
    """The shorten stream ``data`` as FFmpeg's decoder takes it: a VERBATIM chunk holding a WAV
    header inserted just after the stream header, everything else bit for bit the same.

    FFmpeg refuses a stream whose first command is not a VERBATIM chunk with a RIFF/WAVE (or
    FORM/AIFF) header in it ("missing verbatim section"), which ``.shn`` music files have and
    SPHERE-embedded streams do not (the SPHERE header holds the rate). Commands are bit-aligned,
    not byte-aligned, so the rest of the stream moves by the chunk's bit length."""
    head = read_shorten_header(data, name)
    if head.ftype not in FFMPEG_SHORTEN_TYPES:
        raise SphereError(f"{name}: FFmpeg's shorten decoder does not read sample type {head.ftype} "
                          f"(only U8 and 16-bit PCM; mu-law shorten needs the Python decoder or sph2pipe)")
    wav = _wav_header(head.channels, rate, 8 if head.ftype == TYPE_U8 else 16)
    w = _BitWriter()
    w.uvar(FN_VERBATIM, FNSIZE)
    w.uvar(len(wav), VERBATIM_CKSIZE_SIZE)
    for b in wav:
        w.uvar(b, VERBATIM_BYTE_SIZE)
    chunk, chunk_bits = w.bits()
    stream = data[head.start:]
    whole = int.from_bytes(stream, "big")
    tail_bits = len(stream) * 8 - (head.end_bit - 8 * head.start)
    spliced = (((whole >> tail_bits) << chunk_bits | chunk) << tail_bits) | (whole & ((1 << tail_bits) - 1))
    nbits = len(stream) * 8 + chunk_bits
    pad = -nbits % 8
    return (spliced << pad).to_bytes((nbits + pad) // 8, "big")


def decode_shorten_ffmpeg(data: bytes, rate: int, name: str = "?") -> np.ndarray:
    """int16 samples (n, channels) of a 16-bit or U8 PCM shorten stream, decoded by FFmpeg
    (``ffmpeg -f shn`` through pipes); the same samples as :func:`decode_shorten` then
    :func:`shorten_to_int16` with coding ``pcm``, for about 1/14 of the CPU time on 5-minute
    files (``bench/sphere_decode.py``; ffmpeg's start-up dominates shorter ones). Raises
    :class:`SphereError` when ffmpeg is missing, the type is not FFmpeg's, or decoding fails."""
    fixed = shorten_for_ffmpeg(data, rate, name)
    try:
        return decode_to_int16(fixed, "shn", read_shorten_header(data, name).channels, name)
    except FFmpegError as e:
        raise SphereError(str(e)) from None


# --------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------

def _to_int16(stream_or_bytes: np.ndarray, coding: str) -> np.ndarray:
    if coding == "ulaw":
        return ULAW_TO_LINEAR[np.asarray(stream_or_bytes, dtype=np.int64) & 0xFF]
    if coding == "alaw":
        return ALAW_TO_LINEAR[np.asarray(stream_or_bytes, dtype=np.int64) & 0xFF]
    return np.asarray(stream_or_bytes, dtype=np.int16)


def shorten_to_int16(stream: ShortenStream, coding: str) -> np.ndarray:
    """int16 samples of a decoded shorten stream whose SPHERE coding (before shorten) is ``coding``."""
    if stream.ftype in (TYPE_AU1, TYPE_AU2, TYPE_ULAW):
        return ULAW_TO_LINEAR[stream.samples & 0xFF] if coding != "alaw" else ALAW_TO_LINEAR[stream.samples & 0xFF]
    if stream.ftype in (TYPE_U8, TYPE_S8):
        v = stream.samples - (0x80 if stream.ftype == TYPE_U8 else 0)
        return (_to_int16(v & 0xFF, coding) if coding != "pcm" else (v << 8)).astype(np.int16)
    v = stream.samples - (0x8000 if stream.ftype in (TYPE_U16HL, TYPE_U16LH) else 0)
    return np.clip(v, -32768, 32767).astype(np.int16)


def _ffmpeg_fits(hdr: SphereHeader, body: bytes, name: str) -> bool:
    return hdr.base_coding == "pcm" and read_shorten_header(body, name).ftype in FFMPEG_SHORTEN_TYPES


def _read_shortened_ffmpeg(path: Path, hdr: SphereHeader, body: bytes) -> np.ndarray:
    if hdr.base_coding != "pcm":
        raise SphereError(f"{path}: FFmpeg's shorten decoder reads PCM only, this file is {hdr.coding!r}")
    samples = decode_shorten_ffmpeg(body, hdr.rate, str(path))
    if samples.shape[1] != hdr.channels:
        raise SphereError(f"{path}: header says {hdr.channels} channel(s), the shorten stream {samples.shape[1]}")
    if hdr.sample_count is not None and len(samples) < hdr.sample_count:
        raise SphereError(f"{path}: FFmpeg decoded {len(samples)} samples, the header says {hdr.sample_count} "
                          f"(truncated file?)")
    return samples


def _read_shortened(path: Path, hdr: SphereHeader, use_sph2pipe: Optional[bool],
                    use_ffmpeg: Optional[bool]) -> np.ndarray:
    """int16 samples of a shorten-compressed SPHERE file: sph2pipe, FFmpeg or the Python decoder."""
    if use_sph2pipe is not False and shutil.which("sph2pipe"):
        import soundfile as sf

        r = subprocess.run(["sph2pipe", "-f", "wav", "-p", str(path)], capture_output=True)
        if r.returncode == 0 and r.stdout:
            return sf.read(io.BytesIO(r.stdout), dtype="int16", always_2d=True)[0]
    body = path.read_bytes()[hdr.size:]
    if use_ffmpeg or (use_ffmpeg is None and _ffmpeg_fits(hdr, body, str(path)) and ffmpeg_program()):
        try:
            return _read_shortened_ffmpeg(path, hdr, body)
        except SphereError:
            if use_ffmpeg:
                raise
    stream = decode_shorten(body, str(path))
    if stream.channels != hdr.channels:
        raise SphereError(f"{path}: header says {hdr.channels} channel(s), the shorten stream {stream.channels}")
    return shorten_to_int16(stream, hdr.base_coding)


def read_sphere(path: str | os.PathLike, use_sph2pipe: Optional[bool] = None,
                use_ffmpeg: Optional[bool] = None) -> tuple[np.ndarray, int]:
    """(int16 samples (n, channels), rate) of a SPHERE file: PCM, mu-law, a-law, shortened or not.

    Shorten-compressed files go through ``sph2pipe`` when it is on PATH (``use_sph2pipe`` None =
    when available, False = never); else 16-bit (and U8) PCM shorten through FFmpeg when
    ``ffmpeg`` is on PATH (``use_ffmpeg`` None = when available and the type is one FFmpeg
    decodes, falling back to Python if it fails; True = FFmpeg or an error; False = never);
    else, and always for mu-law shorten (Switchboard), through :func:`decode_shorten`."""
    path = Path(path)
    hdr = read_header(path)
    coding = hdr.base_coding
    if coding not in ("pcm", "ulaw", "alaw"):
        raise SphereError(f"{path}: sample_coding {hdr.coding!r} is not supported (pcm, ulaw, alaw, "
                          f"optionally embedded-shorten)")
    if hdr.shorten:
        samples = _read_shortened(path, hdr, use_sph2pipe, use_ffmpeg)
    else:
        raw = np.fromfile(path, dtype=np.uint8, offset=hdr.size)
        if coding == "pcm":
            if hdr.n_bytes != 2:
                raise SphereError(f"{path}: {hdr.n_bytes}-byte PCM is not supported (2-byte is)")
            dt = ">i2" if hdr.byte_format == "10" else "<i2"
            samples = raw[: len(raw) // 2 * 2].view(dt).astype(np.int16)
        else:
            samples = _to_int16(raw, coding)
        samples = samples[: len(samples) // hdr.channels * hdr.channels].reshape(-1, hdr.channels)
    if hdr.sample_count is not None:
        samples = samples[: hdr.sample_count]
    return np.ascontiguousarray(samples.reshape(-1, hdr.channels)), hdr.rate


def write_sphere(path: str | os.PathLike, samples: np.ndarray, rate: int, coding: str = "ulaw",
                 shorten: bool = False, extra: Optional[dict] = None) -> None:
    """Write int16 (or float in [-1, 1]) samples (n,) or (n, channels) as a SPHERE file.

    ``coding`` ``ulaw`` (8-bit mu-law, as Switchboard) or ``pcm`` (16-bit little-endian);
    ``shorten`` compresses the samples as LDC's discs do (``ulaw,embedded-shorten-v2.00``).
    ``extra``: more header fields (``database_id``, ``conversation_id``...). Written atomically."""
    x = np.asarray(samples)
    if x.ndim == 1:
        x = x[:, None]
    if x.dtype.kind == "f":
        x = np.clip(np.round(x * 32768.0), -32768, 32767)
    x = x.astype(np.int64)
    n, nchan = x.shape
    if coding == "ulaw":
        body = linear_to_ulaw(x)
        n_bytes, fmt = 1, "1"
        if shorten:
            data = encode_shorten(body, TYPE_AU2)
            code = "ulaw,embedded-shorten-v2.00"
        else:
            data = body.tobytes()
            code = "ulaw"
    elif coding == "pcm":
        n_bytes, fmt = 2, "01"
        if shorten:
            data = encode_shorten(x, TYPE_S16LH)
            code = "pcm,embedded-shorten-v2.00"
        else:
            data = x.astype("<i2").tobytes()
            code = "pcm"
    else:
        raise ValueError(f"coding must be ulaw or pcm, got {coding!r}")
    fields = [("database_id", "-s", "gossip_accel"), *((k, "-s", str(v)) for k, v in (extra or {}).items()),
              ("channel_count", "-i", nchan), ("sample_count", "-i", n), ("sample_rate", "-i", int(rate)),
              ("sample_n_bytes", "-i", n_bytes), ("sample_byte_format", "-s", fmt),
              ("sample_coding", "-s", code), ("sample_checksum", "-i", 0)]
    lines = ["NIST_1A", f"{HEADER_SIZE:7d}"]
    for k, t, v in fields:
        lines.append(f"{k} -i {v}" if t == "-i" else f"{k} -s{len(str(v))} {v}")
    lines.append("end_head")
    head = ("\n".join(lines) + "\n").encode("ascii")
    if len(head) > HEADER_SIZE:
        raise ValueError("SPHERE header fields too long for 1024 bytes")
    head += b" " * (HEADER_SIZE - len(head))
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(head + data)
    os.replace(tmp, path)
