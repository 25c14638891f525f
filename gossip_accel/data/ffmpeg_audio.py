"""Audio decoded by the ``ffmpeg`` program, bytes in and int16 samples out through pipes.

No shell and no temporary files: the encoded bytes go to ffmpeg's stdin and raw little-endian
16-bit samples come back on its stdout. torchcodec (torchaudio's I/O) links the same FFmpeg
libraries but cannot be used for raw streams without timestamps, such as shorten's: its
decoder drops frames that carry no pts ("No audio frames were decoded").
"""
from __future__ import annotations

import shutil
import subprocess
from typing import Optional

import numpy as np


class FFmpegError(RuntimeError):
    """ffmpeg is missing, refused the input, or reported an error while decoding it."""


def ffmpeg_program() -> Optional[str]:
    """The path of the ``ffmpeg`` program on PATH, or None."""
    return shutil.which("ffmpeg")


def decode_to_int16(data: bytes, input_format: str, channels: int, name: str = "?") -> np.ndarray:
    """int16 samples (n, channels) of ``data`` decoded by ffmpeg's demuxer ``input_format``.

    Any message at ffmpeg's ``error`` level counts as a failure (ffmpeg exits 0 after some
    decoding errors), as does output that is not whole frames of ``channels`` samples."""
    program = ffmpeg_program()
    if program is None:
        raise FFmpegError(f"{name}: ffmpeg is not on PATH (Debian: apt-get install ffmpeg)")
    cmd = [program, "-hide_banner", "-nostdin", "-loglevel", "error", "-f", input_format, "-i", "pipe:0",
           "-map", "0:a:0", "-c:a", "pcm_s16le", "-f", "s16le", "pipe:1"]
    r = subprocess.run(cmd, input=data, capture_output=True, check=False)
    message = r.stderr.decode("utf-8", "replace").strip()
    if r.returncode != 0 or message:
        last = message.splitlines()[-1] if message else f"exit status {r.returncode}"
        raise FFmpegError(f"{name}: ffmpeg could not decode it as {input_format}: {last}")
    if len(r.stdout) % (2 * channels):
        raise FFmpegError(f"{name}: ffmpeg returned {len(r.stdout)} bytes, not whole {channels}-channel frames")
    return np.frombuffer(r.stdout, dtype="<i2").reshape(-1, channels).astype(np.int16)
