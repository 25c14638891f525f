"""Acoustic features of a Kaldi data dir: log-mel filterbanks and global CMVN statistics.

Audio comes from ``wav.scp`` (``<utt> <path>`` or ``<utt> <command> |``), cut by ``segments``
when the data dir has one; a multi-channel recording is reduced to the channel that
``reco2file_and_channel`` names for it (``A``/``1`` = first, ``B``/``2`` = second), unless
``--channel`` says otherwise; ``utt2speed`` (speed perturbation, :mod:`.speed_perturb`) changes an
utterance's speed before its features are computed, and ``utt2augment`` (:mod:`.augment`) adds noise and
reverberation after it. Samples are read with soundfile (WAV, FLAC, NIST SPHERE; no FFmpeg
needed; shorten-compressed SPHERE, as on LDC's discs, by :mod:`gossip_accel.data.sphere`) and
scaled to the 16-bit integer range, as Kaldi's ``compute-fbank-feats`` sees them, so
the features equal Kaldi's (``torchaudio.compliance.kaldi.fbank`` with the same options).
Features are written as Kaldi archives with kaldiio: one ``raw_fbank.<j>.ark/.scp`` per job.

CMVN statistics and the normalization a model sees are in :mod:`.cmvn` (imported without torch).
"""
from __future__ import annotations

import io
import multiprocessing
import os
import subprocess
import sys
import zlib
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from .kaldi.tables import DataDirError, is_command, read_table, refuse_commands, write_table
from .augment import Augmentation, apply_augmentation, read_augmentations
from .speed_perturb import read_speeds

INT16_SCALE = 32768.0  # soundfile gives [-1, 1); Kaldi reads 16-bit integers


class FeatureError(RuntimeError):
    """An utterance whose audio cannot be read or gives no frames (message names utt and path)."""


# Kaldi <key> <value...> tables are read by the data-dir module (errors name file and line).
read_kaldi_map = read_table

#: what to do about a wav.scp pipe (the fix named in the error)
PIPE_FIX = ("write the audio file's path instead, or pass --allow-pipes to compute_fbank "
            "(allow_pipes=True) if you trust this data dir: its commands are then run by bash, as Kaldi does")


# --------------------------------------------------------------------------- audio


def read_audio(spec: str, utt: str = "?", allow_pipes: bool = False) -> tuple[np.ndarray, int]:
    """Samples (num_samples, channels) float32 in [-1, 1) and the sample rate of a wav.scp value.

    ``spec`` is a file soundfile reads (WAV, FLAC, NIST SPHERE...; shorten-compressed SPHERE
    through :func:`gossip_accel.data.sphere.read_sphere`) or a shell command ending in ``|``
    that writes such a file (normally WAV) to stdout, as in Kaldi's ``wav.scp`` (e.g.
    ``sph2pipe -f wav -p -c 1 sw02001.sph |``). A command is only run with ``allow_pipes``
    (``compute_fbank --allow-pipes``), by ``bash -c`` as Kaldi runs it: such a ``wav.scp`` is a
    program, only opt in for data dirs you trust; without it a command is a
    :class:`FeatureError`. Only a value ending in ``|`` is a command; anything else is a path
    (spaces and quotes included). Errors are :class:`FeatureError` naming ``utt`` and ``spec``.
    """
    import soundfile as sf

    spec = spec.strip()
    try:
        if is_command(spec):
            if not allow_pipes:
                raise FeatureError(f"utterance {utt}: {spec!r} is a shell command; {PIPE_FIX}")
            cmd = spec[:-1].strip()
            proc = subprocess.run(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if proc.returncode != 0:
                err = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
                raise FeatureError(f"utterance {utt}: command {cmd!r} exited with status {proc.returncode}"
                                   + (f": {' / '.join(err)}" if err else ""))
            if not proc.stdout:
                raise FeatureError(f"utterance {utt}: command {cmd!r} wrote no audio to stdout")
            data, rate = sf.read(io.BytesIO(proc.stdout), dtype="float32", always_2d=True)
        elif not os.path.isfile(spec):
            what = "is a directory, not an audio file" if os.path.isdir(spec) else "audio file not found"
            raise FeatureError(f"utterance {utt}: {what}: {spec!r}")
        elif _is_shortened_sphere(spec):
            from .sphere import read_sphere

            samples, rate = read_sphere(spec)
            data = samples.astype(np.float32) / INT16_SCALE
        else:
            data, rate = sf.read(spec, dtype="float32", always_2d=True)
    except FeatureError:
        raise
    except Exception as e:  # soundfile raises LibsndfileError, RuntimeError, OSError...
        raise FeatureError(f"utterance {utt}: cannot read audio {spec!r}: {e}") from None
    return data, int(rate)


def _is_shortened_sphere(path: str) -> bool:
    """A NIST SPHERE file whose samples are shorten-compressed (libsndfile cannot read those)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError:
        return False
    return head.startswith(b"NIST_1A") and b"shorten" in head.split(b"end_head")[0]


def channel_index(name: str) -> int:
    """0-based channel of a ``reco2file_and_channel`` channel name: ``A``/``1`` -> 0, ``B``/``2`` -> 1, ..."""
    n = name.strip()
    if n.isdigit() and int(n) >= 1:
        return int(n) - 1
    if len(n) == 1 and n.isalpha():
        return ord(n.upper()) - ord("A")
    raise ValueError(f"channel {name!r}: expected a letter (A, B, ...) or a 1-based number (1, 2, ...)")


def utterance_channels(data_dir: str | Path) -> dict[str, int]:
    """utt -> 0-based channel from ``reco2file_and_channel`` (via ``segments`` when there is one);
    {} when the data dir has no ``reco2file_and_channel``."""
    data_dir = Path(data_dir)
    r2fc = data_dir / "reco2file_and_channel"
    if not r2fc.is_file():
        return {}
    reco_ch = {}
    for reco, value in read_kaldi_map(r2fc).items():
        parts = value.split()
        if len(parts) != 2:
            raise ValueError(f"{r2fc}: line of {reco!r} should be '<recording> <file> <channel>', got {value!r}")
        try:
            reco_ch[reco] = channel_index(parts[1])
        except ValueError as e:
            raise ValueError(f"{r2fc}: recording {reco}: {e}") from None
    seg_file = data_dir / "segments"
    if not seg_file.is_file():
        return reco_ch
    out = {}
    for utt, value in read_kaldi_map(seg_file).items():
        reco = value.split()[0] if value.split() else ""
        if reco in reco_ch:
            out[utt] = reco_ch[reco]
    return out


@dataclass
class FbankOptions:
    """Options of ``torchaudio.compliance.kaldi.fbank`` (Kaldi's names, Kaldi's defaults but dither).

    ``dither`` is 0 by default so that features are deterministic; with dither > 0 the noise is
    seeded per utterance (CRC32 of its id), so results still do not depend on ``--nj``.
    """

    num_mel_bins: int = 80
    frame_length: float = 25.0  # ms
    frame_shift: float = 10.0  # ms
    dither: float = 0.0
    sample_frequency: float = 16000.0
    low_freq: float = 20.0
    high_freq: float = 0.0  # <= 0: offset from the Nyquist frequency
    preemphasis_coefficient: float = 0.97
    window_type: str = "povey"
    snip_edges: bool = True
    remove_dc_offset: bool = True
    round_to_power_of_two: bool = True
    use_energy: bool = False
    energy_floor: float = 0.0
    use_log_fbank: bool = True
    use_power: bool = True

    def kwargs(self) -> dict:
        return asdict(self)


def compute_fbank(samples: np.ndarray | torch.Tensor, opts: FbankOptions, seed: int = 0) -> torch.Tensor:
    """(frames, num_mel_bins) float32 log-mel fbank of mono samples already in 16-bit scale."""
    import torchaudio.compliance.kaldi as kaldi

    wav = torch.as_tensor(samples, dtype=torch.float32).reshape(1, -1)
    if opts.dither > 0:
        torch.manual_seed(seed)
    return kaldi.fbank(wav, **opts.kwargs())


def load_utterance(spec: str, utt: str, opts: FbankOptions, channel: int = -1, on_rate_mismatch: str = "error",
                   segment: Optional[tuple[float, float]] = None,
                   cache: Optional[dict] = None, default_channel: Optional[int] = None,
                   allow_pipes: bool = False, speed: float = 1.0) -> torch.Tensor:
    """Mono samples in 16-bit scale at ``opts.sample_frequency``, ready for :func:`compute_fbank`.

    ``channel`` -1 requires mono audio (as Kaldi's ``--channel=-1``); 0, 1... picks one.
    ``default_channel`` (0, 1..., e.g. from ``reco2file_and_channel``) is used for multi-channel
    audio when ``channel`` is -1; a pipe that already selected the channel gives mono audio.
    ``on_rate_mismatch``: ``error`` or ``resample`` (torchaudio's sinc interpolation).
    ``segment`` = (start, end) seconds, end <= 0 meaning the end of the recording.
    ``cache`` (a dict) keeps the last recording read, for consecutive segments of one file.
    ``allow_pipes``: run a ``wav.scp`` command (see :func:`read_audio`).
    ``speed`` != 1: sox's ``speed`` (tempo and pitch x speed; :mod:`gossip_accel.data.speed_perturb`).
    """
    if cache is not None and cache.get("spec") == spec:
        data, rate = cache["audio"]
    else:
        data, rate = read_audio(spec, utt, allow_pipes)
        if cache is not None:
            cache.update(spec=spec, audio=(data, rate))
    if data.shape[1] > 1 and channel < 0 and default_channel is not None:
        channel = default_channel
    if data.shape[1] > 1 and channel < 0:
        raise FeatureError(f"utterance {utt}: {spec!r} has {data.shape[1]} channels; pass --channel N "
                           f"(0 = first) or select one in wav.scp")
    ch = max(channel, 0)
    if ch >= data.shape[1]:
        raise FeatureError(f"utterance {utt}: {spec!r} has {data.shape[1]} channel(s), --channel {channel} asked")
    x = data[:, ch]
    if segment is not None:
        start, end = segment
        a = int(round(start * rate))
        b = x.shape[0] if end <= 0 else min(int(round(end * rate)), x.shape[0])
        if a >= b:
            raise FeatureError(f"utterance {utt}: segment {start}-{end} s lies outside {spec!r} "
                               f"({x.shape[0] / rate:.2f} s)")
        x = x[a:b]
    wav = torch.from_numpy(np.ascontiguousarray(x)) * INT16_SCALE
    if speed != 1.0:   # read as if sampled at speed * rate, back to rate: duration / speed
        import torchaudio.functional as AF

        wav = AF.resample(wav, int(round(rate * speed)), rate)
    target = int(opts.sample_frequency)
    if rate != target:
        if on_rate_mismatch != "resample":
            raise FeatureError(f"utterance {utt}: {spec!r} is sampled at {rate} Hz, expected {target} Hz "
                               f"(pass --on-rate-mismatch resample, or --sample-rate {rate})")
        import torchaudio.functional as AF

        wav = AF.resample(wav, rate, target)
    if wav.numel() == 0:
        raise FeatureError(f"utterance {utt}: {spec!r} has no samples")
    return wav


# --------------------------------------------------------------------------- jobs


@dataclass
class Job:
    """One feature-extraction job: a contiguous slice of the utterance list."""

    index: int  # 1-based, as Kaldi's JOB
    entries: list  # [(utt, wav.scp value, segment or None)]
    out_dir: str
    opts: FbankOptions
    channel: int = -1
    on_rate_mismatch: str = "error"
    on_error: str = "fail"
    progress: bool = True
    channels: Optional[dict] = None  # utt -> 0-based channel (reco2file_and_channel), for multi-channel audio
    allow_pipes: bool = False  # run wav.scp commands ("... |")
    suffix: str = ""  # the job writes raw_fbank.<j>.{ark,scp}<suffix>; merge_jobs renames them
    speeds: Optional[dict] = None  # utt -> speed factor (utt2speed: speed perturbation)
    augment: Optional[dict] = None  # utt -> Augmentation (utt2augment: noise and reverberation)
    sources: Optional[dict] = None  # babble utt -> (wav.scp value, segment): the audio augment names


@dataclass
class JobResult:
    index: int
    frames: dict  # utt -> number of frames
    skipped: list  # [(utt, reason)]


def utterance_entries(data_dir: str | Path) -> list[tuple[str, str, Optional[tuple[float, float]]]]:
    """(utt, wav.scp value, segment) for every utterance of a data dir, sorted by utterance id.

    With a ``segments`` file (``<utt> <recording> <start> <end>``) utterances are its keys and
    the audio is cut from the recording; otherwise the utterances are the keys of ``wav.scp``.
    """
    data_dir = Path(data_dir)
    wav = read_kaldi_map(data_dir / "wav.scp")
    seg_file = data_dir / "segments"
    if not seg_file.is_file():
        return [(u, wav[u], None) for u in sorted(wav)]
    out = []
    for utt, value in read_kaldi_map(seg_file).items():
        parts = value.split()
        if len(parts) != 3:
            raise ValueError(f"{seg_file}: line of {utt!r} should be '<utt> <recording> <start> <end>', got {value!r}")
        reco, start, end = parts[0], float(parts[1]), float(parts[2])
        if reco not in wav:
            raise ValueError(f"{seg_file}: utterance {utt!r} refers to recording {reco!r}, "
                             f"absent from {data_dir}/wav.scp")
        out.append((utt, wav[reco], (start, end)))
    return sorted(out)


def split_contiguous(items: Sequence, n: int) -> list[list]:
    """``n`` contiguous, non-empty parts whose sizes differ by at most one (Kaldi's split_scp.pl)."""
    n = max(1, min(n, len(items)))
    q, r = divmod(len(items), n)
    parts, start = [], 0
    for j in range(n):
        size = q + (1 if j < r else 0)
        parts.append(list(items[start:start + size]))
        start += size
    return parts


def run_job(job: Job) -> JobResult:
    """Compute the job's features into ``<out>/raw_fbank.<j>.ark`` + ``.scp`` (kaldiio WriteHelper).

    A failing utterance raises :class:`FeatureError` (``on_error="fail"``) or is left out and
    returned in ``skipped`` (``on_error="skip"``); an utterance shorter than one frame counts as failing.
    """
    import kaldiio
    from tqdm import tqdm

    torch.set_num_threads(1)  # jobs run side by side, one core each
    out = Path(job.out_dir)
    ark, scp = out / f"raw_fbank.{job.index}.ark{job.suffix}", out / f"raw_fbank.{job.index}.scp{job.suffix}"
    frames: dict[str, int] = {}
    skipped: list[tuple[str, str]] = []
    cache: dict = {}
    sources = _SourceCache()
    bar = tqdm(job.entries, desc=f"fbank job {job.index}", unit="utt", position=job.index - 1,
               leave=True, mininterval=2.0, file=sys.stderr, disable=not job.progress)
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}") as writer:
        for utt, spec, segment in bar:
            try:
                wav = _job_audio(job, utt, spec, segment, cache)
                if job.augment and utt in job.augment:
                    wav = _augmented(job, utt, wav, job.augment[utt], sources)
                feats = compute_fbank(wav, job.opts, seed=zlib.crc32(utt.encode()))
                if feats.shape[0] == 0:
                    raise FeatureError(f"utterance {utt}: {spec!r} gives 0 frames ({wav.numel()} samples, "
                                       f"shorter than one {job.opts.frame_length} ms frame)")
            except FeatureError as e:
                if job.on_error != "skip":
                    raise
                skipped.append((utt, str(e).removeprefix(f"utterance {utt}: ")))  # the caller reports them
                continue
            writer(utt, feats.numpy())
            frames[utt] = int(feats.shape[0])
    bar.close()
    return JobResult(job.index, frames, skipped)


def _job_audio(job: Job, utt: str, spec: str, segment, cache: Optional[dict] = None) -> torch.Tensor:
    return load_utterance(spec, utt, job.opts, job.channel, job.on_rate_mismatch, segment, cache,
                          (job.channels or {}).get(utt), job.allow_pipes, (job.speeds or {}).get(utt, 1.0))


class _SourceCache:
    """Decoded babble sources of one job, least recently used dropped beyond ``max_bytes``.

    Each augmented copy names 3-7 other utterances and a source is named by several copies,
    so decoding each once per job (within the budget) saves repeated reads and resampling.
    """

    def __init__(self, max_bytes: int = 256 << 20):
        self.max_bytes, self.bytes = max_bytes, 0
        self.items: "OrderedDict[str, torch.Tensor]" = OrderedDict()

    def get(self, key: str, load) -> torch.Tensor:
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = load()
        self.items[key] = value
        self.bytes += value.numel() * value.element_size()
        while self.bytes > self.max_bytes and len(self.items) > 1:
            _, dropped = self.items.popitem(last=False)
            self.bytes -= dropped.numel() * dropped.element_size()
        return value


def _augmented(job: Job, utt: str, wav: torch.Tensor, aug: Augmentation,
               sources: Optional[_SourceCache] = None) -> torch.Tensor:
    """``wav`` with the noise and reverberation of ``utt2augment`` (babble read from ``job.sources``)."""
    sources = sources if sources is not None else _SourceCache()

    def load_source(src: str) -> torch.Tensor:
        try:
            return sources.get(src, lambda: _job_audio(job, src, *job.sources[src]))
        except FeatureError as e:
            raise FeatureError(f"utterance {utt}: its babble source {e}") from None

    return apply_augmentation(wav, int(job.opts.sample_frequency), aug, load_source)


def compute_fbank_dir(data_dir: str | Path, out_dir: str | Path | None = None, opts: FbankOptions | None = None,
                      nj: int = 1, channel: int = -1, on_rate_mismatch: str = "error", on_error: str = "fail",
                      progress: bool = True, allow_pipes: bool = False) -> JobResult:
    """Features of every utterance of ``data_dir`` in ``nj`` parallel jobs; merge into the data dir.

    Writes ``<out>/raw_fbank.<j>.{ark,scp}`` (j = 1..nj), then ``<data>/feats.scp`` (sorted,
    absolute ark paths) and ``<data>/utt2num_frames``, and ``<out>/skipped.txt``
    (``<utt> <reason>`` per skipped utterance; empty if none). Returns the merged result
    (index 0). Raises :class:`FeatureError` for the first failing utterance unless
    ``on_error == "skip"``. The jobs write temporary files that replace the outputs only when
    every job succeeded, so a failed run leaves the outputs of an earlier run (archives,
    ``feats.scp``, ``utt2num_frames``) byte-identical, or none if there were none.
    ``wav.scp`` commands (``... |``) are refused, naming the line, unless ``allow_pipes``.
    """
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    if on_rate_mismatch not in ("error", "resample"):
        raise ValueError(f"on_rate_mismatch must be 'error' or 'resample', got {on_rate_mismatch!r}")
    data_dir = Path(data_dir)
    out = Path(out_dir) if out_dir is not None else data_dir / "data"
    out = out.resolve()
    opts = opts or FbankOptions()
    wav_scp = data_dir / "wav.scp"
    if not wav_scp.is_file():
        raise FeatureError(f"{wav_scp} not found: {data_dir} is not a Kaldi data dir with audio "
                           f"(check it with utils/validate_data_dir.sh {data_dir})")
    if not allow_pipes:
        refuse_commands(wav_scp, PIPE_FIX)
    entries = utterance_entries(data_dir)
    if not entries:
        raise ValueError(f"{wav_scp} lists no utterances")
    if "," in str(out):
        raise ValueError(f"--out {out}: a path with ',' cannot be written in a Kaldi wspecifier "
                         f"(ark,scp:<ark>,<scp>); choose a directory without ','")
    chans = utterance_channels(data_dir)
    speeds = read_speeds(data_dir)
    augment = read_augmentations(data_dir)
    audio = {u: (spec, segment) for u, spec, segment in entries}
    for utt, aug in augment.items():
        lost = [s for s in aug.sources if s not in audio]
        if lost:
            raise FeatureError(f"{data_dir / 'utt2augment'}: {utt}: babble source {lost[0]} is not an utterance "
                               f"of {data_dir}")
    out.mkdir(parents=True, exist_ok=True)
    parts = split_contiguous(entries, nj)
    suffix = f".tmp{os.getpid()}"

    def only(table: dict, utts) -> Optional[dict]:
        return {u: table[u] for u in utts if u in table} or None

    jobs = []
    for j, part in enumerate(parts):
        utts = [u for u, _, _ in part]
        job_augment = only(augment, utts)
        babble = sorted({s for a in (job_augment or {}).values() for s in a.sources})
        jobs.append(Job(j + 1, part, str(out), opts, channel, on_rate_mismatch, on_error, progress,
                        only(chans, utts + babble), allow_pipes, suffix, only(speeds, utts + babble),
                        job_augment, only(audio, babble)))
    try:
        if len(jobs) == 1:
            results = [run_job(jobs[0])]
        else:
            # fork where there is one: the workers inherit torch instead of importing it again
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            with multiprocessing.get_context(method).Pool(len(jobs)) as pool:
                results = pool.map(run_job, jobs, chunksize=1)
        return merge_jobs(data_dir, out, results, suffix)
    except FeatureError as e:   # name the file the utterance comes from
        raise FeatureError(f"{wav_scp}: {e}") from None
    finally:
        for job in jobs:   # what a failed run left behind (merge_jobs renamed them on success)
            for kind in ("ark", "scp"):
                (out / f"raw_fbank.{job.index}.{kind}{suffix}").unlink(missing_ok=True)


def merge_jobs(data_dir: Path, out: Path, results: Sequence[JobResult], suffix: str = "") -> JobResult:
    """Sorted ``<data>/feats.scp`` and ``utt2num_frames`` from the job scps; ``<out>/skipped.txt``.

    With ``suffix``, the jobs wrote ``raw_fbank.<j>.{ark,scp}<suffix>``: they are renamed to
    their final names first (the scp values then name the final archives)."""
    scp_lines: dict[str, str] = {}
    for r in results:
        job_scp = read_kaldi_map(out / f"raw_fbank.{r.index}.scp{suffix}")
        if suffix:
            ark = str(out / f"raw_fbank.{r.index}.ark")
            tmp_ark = ark + suffix
            job_scp = {u: ark + v[len(tmp_ark):] for u, v in job_scp.items() if v.startswith(tmp_ark + ":")}
        scp_lines.update(job_scp)
    frames = {u: n for r in results for u, n in r.frames.items()}
    skipped = [s for r in results for s in r.skipped]
    if set(scp_lines) != set(frames):
        raise RuntimeError(f"{out}: job scp files and frame counts disagree ({len(scp_lines)} vs {len(frames)} "
                           f"utterances); rerun the feature stage")
    for r in results:
        if suffix:
            os.replace(out / f"raw_fbank.{r.index}.ark{suffix}", out / f"raw_fbank.{r.index}.ark")
            write_table(out / f"raw_fbank.{r.index}.scp", {u: v for u, v in scp_lines.items() if u in r.frames})
            (out / f"raw_fbank.{r.index}.scp{suffix}").unlink()
    keys = sorted(scp_lines)
    write_table(data_dir / "feats.scp", {u: scp_lines[u] for u in keys})
    write_table(data_dir / "utt2num_frames", {u: str(frames[u]) for u in keys})
    write_table(out / "skipped.txt", [(u, " ".join(reason.split())) for u, reason in skipped])
    return JobResult(0, {u: frames[u] for u in keys}, skipped)


# --------------------------------------------------------------------------- CMVN


def fbank_options_from(args) -> FbankOptions:
    """FbankOptions from argparse attributes of the same names (missing ones keep defaults)."""
    names = {f.name for f in fields(FbankOptions)}
    return FbankOptions(**{k: v for k, v in vars(args).items() if k in names})
