"""Per-rank training checkpoints, written atomically.

Between syncs every worker holds a different replica (and, for gossip/local BMUF, different
slots), so each rank saves its own file: ``<dir>/epoch<E>/rank<r>.pt``. A checkpoint is
complete when ``<dir>/epoch<E>/done`` exists (written by rank 0 after a barrier), so a run
killed while saving is never resumed from a partial epoch.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

import torch


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file, fsync, then rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def epoch_dir(root: Path, epoch: int) -> Path:
    return root / f"epoch{epoch}"


def latest_complete(root: Path) -> Optional[int]:
    """The highest epoch whose checkpoint is complete, or None."""
    if not root.is_dir():
        return None
    epochs = [int(m.group(1)) for p in root.iterdir() if (m := re.fullmatch(r"epoch(\d+)", p.name))
              and (p / "done").is_file()]
    return max(epochs) if epochs else None


def rng_state() -> dict:
    return {"torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])


def load_rank(root: Path, epoch: int, rank: int, world_size: int) -> dict:
    """Rank ``rank``'s state of ``epoch``; refuses a checkpoint written by another world size."""
    path = epoch_dir(root, epoch) / f"rank{rank}.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the checkpoint of epoch {epoch} was written by a run with "
            f"different ranks; resume with the same number of workers or start a new --exp-dir"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("world_size") != world_size:
        raise ValueError(
            f"{path} was written by {state.get('world_size')} workers, this run has {world_size}; "
            "resume with the same number of workers"
        )
    return state
