"""Checkpoint averaging at the end of training: the mean of a run's epoch models, the last N
or the N best by CV loss (ESPnet's ``valid.acc.ave``, icefall's ``--avg``, WeNet's
``average_model.py``):  theta_avg = (1/N) sum_{e in S} theta_e.

Each theta_e is the GLOBAL average of the replicas at the end of epoch e, (1/n) sum_k theta_e^k
(the model whose CV loss results.json records as the epoch's ``cv_loss``), never one replica
between syncs. Where it comes from, in this order:

* ``<exp>/epoch_models/epoch<E>.pt``: written by rank 0 after each epoch's validation when
  ``train.save_epoch_models`` is on (the ASR trainer's default): the replicas' average the loop
  already all-reduces to validate it, so it costs no communication and one model file per epoch;
* else the epoch-end checkpoint ``<exp>/checkpoints/epoch<E>/rank*.pt``, averaged over ranks
  (:func:`gossip_accel.train.checkpoint.average_model`) when every rank's file is there (a
  directory not shared between nodes holds only its node's); only the newest
  ``train.keep_checkpoints`` are kept, so this serves runs trained before epoch models existed.

Floating-point tensors are averaged in float64 and cast back; integer buffers (counters such as
BatchNorm's ``num_batches_tracked``) are the newest selected epoch's
(:func:`gossip_accel.train.checkpoint.mean_state`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Optional

import torch

from . import checkpoint as ckpt

EPOCH_MODELS = "epoch_models"
MODES = ("last", "best")


def epoch_model_path(exp: Path, epoch: int) -> Path:
    return Path(exp) / EPOCH_MODELS / f"epoch{epoch}.pt"


def checkpoint_name(avg: int, mode: str) -> str:
    """The averaged model's name (file stem, decode-dir suffix, table cell): ``avg_best5``; 0: ``final``."""
    if avg < 0 or mode not in MODES:
        raise ValueError(f"--avg {avg} --avg-mode {mode}: use --avg N >= 0 (0: the final model) and a mode of {MODES}")
    return "final" if avg == 0 else f"avg_{mode}{avg}"


def available_epochs(exp: Path) -> dict[int, tuple[str, Callable[[], dict]]]:
    """Epoch -> (where its globally averaged model is, a loader of it), for every epoch of ``exp``
    that has an epoch model or a complete epoch-end checkpoint."""
    exp = Path(exp)
    out: dict[int, tuple[str, Callable[[], dict]]] = {}
    for entry in ckpt.list_complete(exp / "checkpoints"):
        ranks = len(list(entry.path.glob("rank*.pt")))
        if entry.epoch_end and ranks and ranks == (entry.world_size or ranks):  # every rank's replica is here
            out[entry.epoch] = (f"{entry.path}/rank*.pt (mean over ranks)",
                                lambda e=entry: ckpt.average_model(exp / "checkpoints", e))
    for f in (exp / EPOCH_MODELS).glob("epoch*.pt"):
        m = ckpt.NAME.fullmatch(f.stem)
        if m and m.group(2) is None:
            out[int(m.group(1))] = (str(f), lambda p=f: _load(p))
    return dict(sorted(out.items()))


def _load(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same: unusable
        raise ckpt.CheckpointError(f"{path}: cannot be loaded with weights_only=True ({e})") from None


def _epoch_loss(h: dict) -> float:
    """An epoch's CV loss: the ASR trainer's ``cv_loss`` (``cv_loss_replicas`` for a run that did not log it),
    or the LM trainer's ln ``valid_ppl`` (the validation cross-entropy per token)."""
    for key in ("cv_loss", "cv_loss_replicas"):
        if key in h:
            return float(h[key])
    return math.log(float(h["valid_ppl"]))


def cv_losses(exp: Path) -> dict[int, float]:
    """Epoch -> CV loss of the averaged model (:func:`_epoch_loss`) from ``<exp>/results.json``'s history."""
    f = Path(exp) / "results.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: the training of {exp} did not finish (--avg-mode best reads "
                                "the CV loss of every epoch from it)")
    try:
        history = json.loads(f.read_text()).get("history", [])
        return {int(h["epoch"]): _epoch_loss(h) for h in history}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{f}: no per-epoch CV loss in its history ({type(e).__name__}: {e})") from None


def select_epochs(epochs: list[int], n: int, mode: str, losses: Optional[dict[int, float]] = None) -> list[int]:
    """The ``n`` epochs to average (ascending): the last ``n`` of ``epochs``, or the ``n`` with the
    lowest ``losses`` (a tie goes to the later epoch). Fewer when fewer exist."""
    checkpoint_name(n, mode)
    if n == 0:
        raise ValueError("--avg 0 selects no epochs: it means the final model (final.pt)")
    if mode == "last":
        return sorted(epochs)[-n:]
    scored = [e for e in epochs if e in (losses or {})]
    return sorted(sorted(scored, key=lambda e: (losses[e], -e))[:n])


def average_run(exp: Path, n: int, mode: str, out: Optional[Path] = None) -> tuple[Path, dict]:
    """Average ``exp``'s epoch models (:func:`select_epochs`) into ``out`` (default
    ``<exp>/<checkpoint_name>.pt``), next to ``<out stem>.json`` saying which epochs, their CV
    loss and files. Returns (out, that record)."""
    exp = Path(exp)
    have = available_epochs(exp)
    if not have:
        raise FileNotFoundError(f"{exp}: no epoch models ({exp / EPOCH_MODELS}/epoch<E>.pt) and no epoch-end "
                                f"checkpoints ({exp}/checkpoints/epoch<E>): train with train.save_epoch_models=true, "
                                "or decode the final model (--avg 0)")
    losses = cv_losses(exp) if mode == "best" or (exp / "results.json").is_file() else {}
    chosen = select_epochs(list(have), n, mode, losses)
    if not chosen:
        raise ValueError(f"{exp}: none of the epochs with a model ({sorted(have)}) has a CV loss in results.json")
    names = [have[e][0] for e in chosen]
    state = ckpt.mean_state([have[e][1]() for e in chosen], integers_from=-1, names=names)
    out = Path(out) if out is not None else exp / f"{checkpoint_name(n, mode)}.pt"
    ckpt.atomic_save(state, out)
    record = {"name": out.stem, "mode": mode, "avg": n, "epochs": chosen,
              "cv_loss": {str(e): losses[e] for e in chosen if e in losses}, "files": names,
              "epochs_with_a_model": sorted(have)}
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    return out, record
