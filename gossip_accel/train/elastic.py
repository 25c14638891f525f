"""Elastic resume: a checkpoint written by n workers continues on m != n workers (a node died and is
gone, torchrun's ``--nnodes MIN:MAX`` restarted with fewer, or a rerun with another ``--num-workers``).

Every new rank reads all n files of the checkpoint (the directory must be shared by the nodes) and
starts from the same merged state (docs/RELIABILITY.md, "Elastic resume"):

* model: the mean of the n replicas, theta = (1/n) sum_k theta^k (Algorithm 1, line 20 of 000);
  integer buffers from old rank 0;
* inner optimizer state: the element-wise mean over the n ranks (Adagrad's sums of squared
  gradients, Adam's moments: statistics of the gradients of replicas that are now one model;
  a reset would restart Adagrad at its largest steps), except NG-SGD's preconditioner
  (``natural_gradient``: eigenbases, whose mean is none), taken from old rank 0;
* learning-rate schedule, epoch, step counter, history: carried (the same on every old rank);
* synchronizer: :func:`gossip_accel.sync.elastic.merge_states` (slots carried when identical on
  every old rank, as under BMUF, else averaged; eta of eq. 6, p and q re-derived for m);
* RNG states: new rank r < n continues old rank r's; a rank beyond the old world keeps its own seeding;
* data position (the loop's): an epoch-end checkpoint starts the next epoch sharded over m workers;
  a mid-epoch one is a *segment* (n workers ran ``next_batch`` batches each) and the trainer's
  :meth:`gossip_accel.train.loop.Task.rest_of_epoch` shards what the segments left of the epoch over
  the m workers, so no batch of the epoch is repeated or skipped (up to the tails a re-split drops).
  The running training loss of that epoch restarts at the resume (the per-rank LSTM states are
  not carried).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ..sync.elastic import mean_counters, mean_tree, merge_states, slots_identical
from . import checkpoint as ckpt

#: optimizer state keys whose mean means nothing (NG-SGD's preconditioner eigenbases): old rank 0's
OPTIMIZER_KEEP_FIRST = ("natural_gradient",)
#: a mid-epoch data position: (workers, batches each had run) per segment of the epoch, oldest first
Segment = tuple[int, int]


def merge_run_states(states: Sequence[dict], rank: int, world: int) -> dict:
    """The per-rank states of :meth:`DistributedRun._write` of n old ranks merged into the state new
    rank ``rank`` of ``world`` loads (the rule of the module docstring). ``state["elastic"]`` says
    what happened: ``{"from_world": n, "algorithm": the old sync.algorithm, "slots_identical": bool}``."""
    n = len(states)
    steps = {s["step"] for s in states}
    if len(steps) != 1:
        raise ckpt.CheckpointError(f"the old ranks' files are at different steps {sorted(steps)}: not one checkpoint")
    first = states[0]
    extra = {k: v for k, v in first["extra"].items() if k != "epoch_state"}  # rank 0's; its LSTM state is its own
    return {
        "world_size": world, "epoch": first["epoch"], "step": first["step"],
        "model": mean_tree([s["model"] for s in states]),
        "optimizer": mean_tree([s["optimizer"] for s in states], keep_first=OPTIMIZER_KEEP_FIRST),
        "scheduler": first["scheduler"],
        "sync": merge_states([s["sync"] for s in states]) if first["sync"] else {},
        "ddp_counter": mean_counters([{"ddp": s["ddp_counter"]} for s in states])["ddp"],
        "rng": states[rank]["rng"] if rank < n else None,
        "extra": extra,
        "elastic": {"from_world": n, "algorithm": first["sync"].get("algorithm"),
                    "slots_identical": bool(first["sync"]) and slots_identical([s["sync"] for s in states])},
    }


def loader(world: int, log: Callable[[str], None] = print) -> Callable[[ckpt.Entry, int], tuple[Optional[dict], Optional[str]]]:
    """For :func:`gossip_accel.train.checkpoint.select`: (entry, rank) -> (the merged state, None),
    or (None, what failed) when an old rank's file does not verify (named in the log)."""
    def load(entry: ckpt.Entry, rank: int) -> tuple[Optional[dict], Optional[str]]:
        states = []
        for r in range(int(entry.world_size)):
            path = entry.path / f"rank{r}.pt"
            state, problem = ckpt.verify_and_load(path)
            if state is None:
                log(f"[checkpoint] elastic resume reads every old rank's file: {path}: {problem}")
                return None, problem
            states.append(state)
        try:
            return merge_run_states(states, rank, world), None
        except ValueError as e:  # mean_tree: files of different shapes
            return None, f"the old ranks' files do not merge: {e}"
    return load


def segments_after(saved: Sequence, old_world: int, next_batch: int) -> list[Segment]:
    """The segments of the resumed epoch once a mid-epoch checkpoint of ``old_world`` workers, at
    ``next_batch``, is left for another world: the saved ones and that one."""
    return [*(tuple(s) for s in saved), (old_world, next_batch)]


def steps_done(segments: Sequence[Segment]) -> int:
    """Steps per worker the segments ran (``train.max_steps_per_epoch`` counts them)."""
    return sum(d for _, d in segments)


def batches_done(segments: Sequence[Segment]) -> int:
    """Batches of the epoch the segments consumed, over all their workers."""
    return sum(w * d for w, d in segments)


def resume_line(from_world: int, world: int, where: str, slots: str, eta: str, data: str) -> str:
    """The one log line of an elastic resume."""
    return (f"[train] resuming a {from_world}-worker checkpoint on {world} workers ({where}): replicas averaged "
            f"(Algorithm 1, line 20), {slots}, optimizer state averaged, lr schedule and step counter carried, {data}"
            f"{eta}")


def eta_note(sync_cfg, uses_bmuf: bool, from_world: int, world: int) -> str:
    """'; eta re-derived for 3 workers: 0.667 (0.750 for 4)' under the eq. 6 rule, else ''."""
    if not uses_bmuf or sync_cfg.block_momentum is not None or sync_cfg.outer_optimizer is not None:
        return ""
    return (f"; eta (eq. 6) re-derived for {world} workers: {sync_cfg.resolved_block_momentum(world):.3f} "
            f"({sync_cfg.resolved_block_momentum(from_world):.3f} for {from_world})")
