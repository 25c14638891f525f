"""Shorten-compressed SPHERE through FFmpeg: bit-identical int16 samples to the Python decoder for
every sample type FFmpeg's ``shorten`` decoder has (U8, 16-bit PCM), the bit splice that gives
FFmpeg the WAV header it insists on, and the fallbacks: mu-law shorten (Switchboard), a missing
ffmpeg and a stream FFmpeg fails on all go to the Python decoder (or raise when FFmpeg is forced).
ffmpeg is a requirement of the tests (utils/install_system_deps.sh installs it)."""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from gossip_accel.data import ffmpeg_audio
from gossip_accel.data import sphere as S


def speechlike(n: int, seed: int = 0, rate: int = 8000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    x = np.sin(2 * np.pi * 180 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 1.3 * t)) * 9000 + rng.standard_normal(n) * 400
    x[n // 3: n // 3 + rate // 4] = 0                           # silence: ZERO blocks and bit shifts
    return x.astype(np.int64)


def two_sides(n: int = 9000) -> np.ndarray:
    x = speechlike(n)
    return np.stack([x, np.roll(x, 77) // 3], axis=1)


def as_type(y: np.ndarray, ftype: int) -> np.ndarray:
    return y // 256 + 128 if ftype == S.TYPE_U8 else y


def test_ffmpeg_is_installed():
    assert ffmpeg_audio.ffmpeg_program(), "ffmpeg is missing: run utils/install_system_deps.sh (Debian ffmpeg)"


@pytest.mark.parametrize("ftype", S.FFMPEG_SHORTEN_TYPES)
@pytest.mark.parametrize("kw", [{}, {"qlpc": [58, -28, 3]}, {"nmean": 0}, {"blocksize": 300}],
                         ids=["diff", "qlpc", "nmean0", "block300"])
@pytest.mark.parametrize("channels", [1, 2])
def test_ffmpeg_gives_the_python_decoders_samples(ftype, kw, channels):
    data = as_type(two_sides(9001)[:, :channels], ftype)         # 9001: a last, shorter block
    enc = S.encode_shorten(data, ftype, **kw)
    python = S.shorten_to_int16(S.decode_shorten(enc), "pcm")
    ffmpeg = S.decode_shorten_ffmpeg(enc, 8000)
    assert ffmpeg.dtype == np.int16 and ffmpeg.shape == (9001, channels)
    assert np.array_equal(ffmpeg, python)
    if ftype != S.TYPE_U8:
        assert np.array_equal(ffmpeg, data)


def test_the_splice_changes_nothing_but_the_verbatim_chunk():
    """The spliced stream decodes (Python) to the same samples, and is the WAV chunk's bits longer."""
    enc = S.encode_shorten(two_sides(), S.TYPE_S16LH, verbatim=b"")
    spliced = S.shorten_for_ffmpeg(enc, 16000)
    assert spliced.startswith(b"ajkg\x02")
    assert np.array_equal(S.decode_shorten(spliced).samples, S.decode_shorten(enc).samples)
    head, tail = S.read_shorten_header(enc), S.read_shorten_header(spliced)
    assert (head.ftype, head.channels, head.blocksize, head.end_bit) == (tail.ftype, tail.channels,
                                                                         tail.blocksize, tail.end_bit)
    # VERBATIM (5 bits) + its length 44 (7 bits) + 44 bytes of 9 bits = 408 bits = 51 bytes, less the
    # encoder's padding to 32 bits (the splice pads to 8)
    assert len(spliced) - len(enc) in range(51 - 3, 51 + 1)
    w = S._wav_header(2, 16000, 16)
    assert len(w) == S.WAV_HEADER_SIZE and sf.info(_wav_file(w)).samplerate == 16000


def _wav_file(header: bytes):
    """An in-memory WAV file made of ``header`` with its sizes filled in and two frames of data."""
    data = b"\0" * 8
    riff = bytearray(header)
    riff[4:8] = (36 + len(data)).to_bytes(4, "little")
    riff[40:44] = len(data).to_bytes(4, "little")
    return io.BytesIO(bytes(riff) + data)


def test_read_sphere_takes_ffmpeg_for_pcm_shorten(tmp_path, monkeypatch):
    y = two_sides().astype(np.int16)
    path = tmp_path / "pcm.sph"
    S.write_sphere(path, y, 8000, "pcm", shorten=True)
    monkeypatch.setattr(S, "decode_shorten", lambda *a, **k: pytest.fail("the Python decoder was used"))
    for use in (None, True):
        samples, rate = S.read_sphere(path, use_sph2pipe=False, use_ffmpeg=use)
        assert rate == 8000 and np.array_equal(samples, y)
    monkeypatch.undo()
    assert np.array_equal(S.read_sphere(path, use_sph2pipe=False, use_ffmpeg=False)[0], y)


def test_mulaw_shorten_stays_with_python(tmp_path, monkeypatch):
    """Switchboard's ulaw,embedded-shorten: FFmpeg's decoder has no mu-law, so Python decodes it."""
    y = two_sides().astype(np.int16)
    short, plain = tmp_path / "sw.sph", tmp_path / "plain.sph"
    S.write_sphere(short, y, 8000, "ulaw", shorten=True)
    S.write_sphere(plain, y, 8000, "ulaw")
    with pytest.raises(S.SphereError, match=r"sw\.sph: FFmpeg's shorten decoder reads PCM only"):
        S.read_sphere(short, use_sph2pipe=False, use_ffmpeg=True)
    with pytest.raises(S.SphereError, match=r"does not read sample type 8 .*mu-law"):
        S.shorten_for_ffmpeg(S.encode_shorten(S.linear_to_ulaw(y), S.TYPE_AU2), 8000)
    monkeypatch.setattr(S, "decode_shorten_ffmpeg", lambda *a, **k: pytest.fail("FFmpeg was tried on mu-law"))
    assert np.array_equal(S.read_sphere(short, use_sph2pipe=False)[0], sf.read(plain, dtype="int16")[0])


def test_without_ffmpeg_python_decodes(tmp_path, monkeypatch):
    y = two_sides().astype(np.int16)
    path = tmp_path / "pcm.sph"
    S.write_sphere(path, y, 8000, "pcm", shorten=True)
    monkeypatch.setenv("PATH", str(tmp_path))                     # no ffmpeg (nor sph2pipe) on PATH
    assert ffmpeg_audio.ffmpeg_program() is None
    assert np.array_equal(S.read_sphere(path)[0], y)
    with pytest.raises(S.SphereError, match=r"pcm\.sph: ffmpeg is not on PATH"):
        S.read_sphere(path, use_ffmpeg=True)


def test_a_stream_ffmpeg_fails_on_falls_back_or_raises(tmp_path):
    y = two_sides().astype(np.int16)
    path = tmp_path / "cut.sph"
    S.write_sphere(path, y, 8000, "pcm", shorten=True)
    raw = path.read_bytes()
    path.write_bytes(raw[: S.HEADER_SIZE + (len(raw) - S.HEADER_SIZE) // 2])      # truncated
    with pytest.raises(S.SphereError, match=r"cut\.sph: (ffmpeg could not decode|FFmpeg decoded \d+ samples)"):
        S.read_sphere(path, use_sph2pipe=False, use_ffmpeg=True)
    with pytest.raises(S.SphereError, match="truncated"):                  # the fallback's own verdict
        S.read_sphere(path, use_sph2pipe=False)
    with pytest.raises(ffmpeg_audio.FFmpegError, match=r"junk\.shn: ffmpeg could not decode it as shn"):
        ffmpeg_audio.decode_to_int16(b"ajkg\x02" + b"\xff" * 64, "shn", 2, "junk.shn")
