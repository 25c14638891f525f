"""Per-rank training checkpoints: atomic, checksummed, pruned, agreed on by every rank.

Between syncs every worker holds a different replica (and, for gossip/local BMUF, different
slots), so each rank saves its own file into one directory per checkpoint:

    <root>/epoch<E>/rank<r>.pt            after epoch E (the epoch-end checkpoint)
    <root>/epoch<E>_step<S>/rank<r>.pt    inside epoch E, after step S (train.checkpoint_every_steps)

Each ``rank<r>.pt`` is written to a temporary file, fsynced and renamed (:func:`atomic_save`),
next to ``rank<r>.pt.sha256`` (its SHA-256 and size). A checkpoint is complete once rank 0
wrote ``done`` (JSON: step, epoch, world size) after a barrier, so a run killed while saving
never resumes from a partial one. On resume (:func:`select`) every rank verifies its own file
of the newest complete checkpoint (size, SHA-256, ``torch.load(weights_only=True)``); the
ranks agree with one all-reduce, and when any rank's file fails, the failure is reported
(file and check) and the checkpoint is renamed ``<name>.corrupt`` and the previous one tried.
A checkpoint of another number of workers is refused, or merged for this world by the loader
``select`` is given (elastic resume, :mod:`gossip_accel.train.elastic`).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ..sync.config import ConfigError
from ..sync.elastic import mean_tree

NAME = re.compile(r"epoch(\d+)(?:_step(\d+))?")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used by this run (another model, another world size)."""


@dataclass(frozen=True)
class Entry:
    """One complete checkpoint directory."""

    path: Path
    epoch: int
    step: int
    world_size: Optional[int]
    epoch_end: bool

    @property
    def key(self) -> tuple[int, int, int]:
        """Newest first sorting: by step, an epoch end after a mid-epoch one at the same step."""
        return (self.step, self.epoch, int(self.epoch_end))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_synced(path: Path, write: Callable[[Any], None]) -> None:
    """``write(f)`` into ``path.tmp<pid>``, flush, fsync, rename over ``path``, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: Path, checksum: bool = False) -> None:
    """torch.save to a temporary file, fsync, then rename over ``path``; with ``checksum``, also
    ``<path>.sha256`` ("<hex sha256> <bytes>"), written the same way after the file."""
    _write_synced(path, lambda f: torch.save(obj, f))
    if checksum:
        line = f"{file_sha256(path)} {path.stat().st_size}\n"
        _write_synced(path.with_name(path.name + ".sha256"), lambda f: f.write(line.encode()))


def checkpoint_dir(root: Path, epoch: int, step: int, epoch_end: bool) -> Path:
    return root / (f"epoch{epoch}" if epoch_end else f"epoch{epoch}_step{step}")


def mark_done(ckpt: Path, epoch: int, step: int, world_size: int, epoch_end: bool) -> None:
    """Rank 0, after every rank wrote its file: the checkpoint counts from now on."""
    info = {"epoch": epoch, "step": step, "world_size": world_size, "epoch_end": epoch_end}
    _write_synced(ckpt / "done", lambda f: f.write((json.dumps(info) + "\n").encode()))


def _read_done(path: Path) -> Optional[Entry]:
    m = NAME.fullmatch(path.name)
    done = path / "done"
    if not m or not done.is_file():
        return None
    text = done.read_text().strip()
    try:
        info = json.loads(text)
    except json.JSONDecodeError:
        info = None
    if not isinstance(info, dict):  # the first format: the step alone
        info = {"step": int(text) if text.isdigit() else -1}
    return Entry(path, int(m.group(1)), int(info.get("step", -1)), info.get("world_size"), m.group(2) is None)


def list_complete(root: Path) -> list[Entry]:
    """Complete checkpoints under ``root``, newest first."""
    if not root.is_dir():
        return []
    entries = [e for p in root.iterdir() if p.is_dir() and (e := _read_done(p)) is not None]
    return sorted(entries, key=lambda e: e.key, reverse=True)


def latest_complete(root: Path) -> Optional[int]:
    """The highest epoch whose epoch-end checkpoint is complete, or None."""
    ends = [e.epoch for e in list_complete(root) if e.epoch_end]
    return max(ends) if ends else None


def _name_key(path: Path) -> tuple[int, float]:
    """(epoch, step in the name; an epoch end sorts after every mid-epoch step of its epoch)."""
    m = NAME.fullmatch(path.name)
    return int(m.group(1)), float(m.group(2)) if m.group(2) else float("inf")


def prune(root: Path, keep: int) -> list[Path]:
    """Remove all but the ``keep`` newest complete checkpoints, and the incomplete ones older than
    the newest complete one (left by a run killed while saving). Rank 0 calls this after a newer
    one is complete. An incomplete checkpoint newer than that is left alone: under gossip a faster
    rank may already be writing the next one, since its syncs wait only for its neighbours."""
    complete = list_complete(root)
    keep_paths = {e.path for e in complete[:max(keep, 1)]}
    complete_paths = {e.path for e in complete}
    newest = _name_key(complete[0].path) if complete else None
    removed = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if not (p.is_dir() and NAME.fullmatch(p.name)) or p in keep_paths:
            continue
        if p not in complete_paths and (newest is None or _name_key(p) > newest):
            continue  # being written (or a newer one a killed attempt left; rewritten when reached)
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


# -- random number generators ----------------------------------------------------------------
def rng_state() -> dict:
    """torch (CPU and CUDA), numpy and python ``random`` states, in types ``weights_only`` loads."""
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached": float(cached)},
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        n = state["numpy"]
        np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- loading ----------------------------------------------------------------------------------
def verify_and_load(path: Path, legacy: bool = False) -> tuple[Optional[dict], Optional[str]]:
    """(state, None) when ``path`` matches its ``.sha256`` and loads with ``weights_only=True``;
    (None, what failed) otherwise. ``legacy``: a checkpoint of the first format (no checksum
    files) is only loaded."""
    side = path.with_name(path.name + ".sha256")
    if not path.is_file():
        return None, "file missing"
    if legacy and not side.is_file():
        return _load(path)
    if not side.is_file():
        return None, f"checksum file {side.name} missing"
    try:
        digest, size = side.read_text().split()
        size_n = int(size)
    except ValueError:
        return None, f"checksum file {side.name} unreadable"
    actual = path.stat().st_size
    if actual != size_n:
        return None, f"size check failed: {actual} bytes, {size_n} written (truncated?)"
    got = file_sha256(path)
    if got != digest:
        return None, f"sha256 check failed: {got[:16]}... != {digest[:16]}... written (corrupted)"
    return _load(path)


def _load(path: Path) -> tuple[Optional[dict], Optional[str]]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True), None
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same: unusable
        return None, f"torch.load(weights_only=True) failed: {e}"


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def select(root: Path, world_size: int, log: Callable[[str], None] = print,
           other_world: Optional[Callable[[Entry, int], tuple[Optional[dict], Optional[str]]]] = None,
           ) -> Optional[tuple[Entry, dict]]:
    """The newest complete checkpoint whose file verifies on EVERY rank, and this rank's state.

    Collective when torch.distributed is initialized: rank 0's list of candidates is broadcast
    and each candidate costs one all-gather of every rank's verdict on its own file, so all
    ranks load the same checkpoint. A failed candidate is reported (rank, file, which check)
    and renamed ``<name>.corrupt`` by rank 0 (unless files are only missing: a directory not
    shared between nodes is left alone). A checkpoint written by another number of workers
    raises :class:`CheckpointError`, unless ``other_world`` loads it: ``other_world(entry, rank)``
    -> (state, None) or (None, what failed), e.g. :func:`gossip_accel.train.elastic.loader`
    (elastic resume: every old rank's file read and merged).
    """
    rank, world = _world()
    candidates: list = [[(str(e.path), e.epoch, e.step, e.world_size, e.epoch_end) for e in list_complete(root)]]
    if world > 1:
        dist.broadcast_object_list(candidates, src=0)
    for path_s, epoch, step, written_by, epoch_end in candidates[0]:
        entry = Entry(Path(path_s), epoch, step, written_by, epoch_end)
        elastic = other_world is not None and written_by is not None and written_by != world_size
        if written_by is not None and written_by != world_size and not elastic:
            raise CheckpointError(
                f"{entry.path} was written by {written_by} workers, this run has {world_size}: resume with "
                f"--num-workers {written_by}, or start a new --exp-dir (or train.resume=false); "
                f"train.elastic=true resumes it on {world_size} (the replicas averaged); "
                f"gossip_accel.train.checkpoint.average_model gives the mean of its replicas, a model any run can start from")
        if elastic:
            state, problem = other_world(entry, rank)
        else:
            state, problem = verify_and_load(entry.path / f"rank{rank}.pt", legacy=written_by is None)
        if state is not None and state.get("world_size", world_size) != world_size:
            state, problem = None, f"written by {state.get('world_size')} workers, this run has {world_size}"
        problems: list = [problem]
        if world > 1:
            problems = [None] * world
            dist.all_gather_object(problems, problem)
        if all(p is None for p in problems):
            return entry, state
        for r, p in enumerate(problems):
            if p is not None:
                log(f"[checkpoint] {entry.path / f'rank{r}.pt'}: {p}; not using checkpoint {entry.path.name}")
        if world > 1:
            dist.barrier()  # every rank has read the candidate before rank 0 moves it
        if rank == 0 and any(p not in (None, "file missing") for p in problems):
            # (a file only missing may be a directory that is not shared between nodes: left alone)
            bad = entry.path.with_name(entry.path.name + ".corrupt")
            shutil.rmtree(bad, ignore_errors=True)
            entry.path.rename(bad)
            log(f"[checkpoint] moved it to {bad}; trying the previous checkpoint")
    return None


def check_fits(path: Path, model: torch.nn.Module, saved: dict) -> None:
    """Refuse a model state of another architecture with the file and the fix in the message."""
    have = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in saved.items()}
    missing, unexpected = sorted(have.keys() - got.keys()), sorted(got.keys() - have.keys())
    shapes = [f"{k}: {got[k]} in the file, {have[k]} here"
              for k in sorted(have.keys() & got.keys()) if got[k] != have[k]]
    if missing or unexpected or shapes:
        parts = (([f"missing {missing[:4]}"] if missing else []) + ([f"unexpected {unexpected[:4]}"] if unexpected else [])
                 + shapes[:4])
        raise CheckpointError(
            f"{path} holds another model ({'; '.join(parts)}): it was written with another model config "
            f"(see config.yaml next to checkpoints/); use a new --exp-dir, or train.resume=false to start over")


def load_sync_state(path: Path, sync: Any, state: dict) -> None:
    """``sync.load_state_dict(state)`` of checkpoint file ``path``: a state of another sync setup (algorithm,
    wire, hierarchy, world) is refused in one line naming the file and the key that differs."""
    try:
        sync.load_state_dict(state)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


def mean_state(states: list[dict], integers_from: int = 0, names: Optional[list[str]] = None) -> dict:
    """(1/n) sum_k state_k of model states with the same keys and shapes: floating-point tensors
    summed in float64 and cast back to their dtype; integer and bool tensors (counters such as
    BatchNorm's ``num_batches_tracked``, not weights) are taken from ``states[integers_from]``.
    ``names`` (one per state, e.g. its file) go into the error on a state of another model. The mean
    is :func:`gossip_accel.sync.elastic.mean_tree`'s; the result shares no tensor with the inputs."""
    if not states:
        raise ValueError("no model states to average")
    names = names or [f"state {i}" for i in range(len(states))]
    ref = states[0]
    for state, name in zip(states[1:], names[1:]):
        if state.keys() != ref.keys():
            diff = sorted(state.keys() ^ ref.keys())
            raise CheckpointError(f"{name} holds another model than {names[0]} (keys differ: {diff[:4]})")
        shapes = [k for k in ref if tuple(state[k].shape) != tuple(ref[k].shape)]
        if shapes:
            raise CheckpointError(f"{name} holds another model than {names[0]} (shape of {shapes[0]}: "
                                  f"{tuple(state[shapes[0]].shape)} vs {tuple(ref[shapes[0]].shape)})")
    mean = mean_tree(states, counters_from=integers_from)
    # a new state: the leaves mean_tree passed through (integer buffers, identical weights) are copied
    return {k: v.clone() if any(v is s[k] for s in states) else v for k, v in mean.items()}


def average_model(root: Path, entry: Entry) -> dict:
    """The mean over ranks of the model states of checkpoint ``entry`` (the model every worker of
    a new run, of any size, can start from; e.g. ``torch.save(average_model(...), 'init.pt')``)."""
    ranks = sorted(entry.path.glob("rank*.pt"), key=lambda p: int(re.sub(r"\D", "", p.stem)))
    states = []
    for p in ranks:
        state, problem = verify_and_load(p)
        if state is None:
            raise CheckpointError(f"{p}: {problem}")
        states.append(state["model"])
    if not states:
        raise CheckpointError(f"{entry.path}: no rank*.pt files")
    return mean_state(states, names=[str(p) for p in ranks])
