"""The epoch loop every trainer shares: a trainer says what differs (a :class:`Task`: its data,
model, loss and validation), :func:`main` and :func:`train` do the rest.

Per epoch: the ranks agree on the number of steps (the minimum of their batch counts, one
all-reduce under ``faults.guard``), so that no sync round waits for a rank that ran out of
data; a run resumed inside the epoch skips the batches it has done and restores the task's
running state; a mid-epoch checkpoint every ``train.checkpoint_every_steps`` steps stores the
exact data position (after an elastic resume on another number of workers, the task's
``rest_of_epoch`` shards what is left of the epoch); TensorBoard gets the running loss, the
learning rate and the sync metrics every ``train.log_every`` steps; tqdm shows progress on rank 0. At the epoch end the
task validates its replica (the mean over workers is recorded as ``<valid_key>_replicas``)
and the average of the replicas (``<valid_key>``: the model the run returns if it stopped
here, see :meth:`DistributedRun.averaged_model`; with DDP or one worker the replicas are equal
and it is the same number), saves that average with ``train.save_epoch_models`` (for checkpoint
averaging, gossip_accel.train.average_checkpoints), writes one log line and the epoch-end
checkpoint. At the end:
the final average (Algorithm 1, line 20), its validation (``final_<valid_key>``),
``final.pt`` and ``results.json``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch
from omegaconf import OmegaConf

from .. import shutdown
from ..sync.config import load_sync_config
from .checkpoint import CheckpointError
from .collectives import agree_on_steps, all_mean
from .config import RunConf, check_epoch_caps, entry_args, run_options, warmup_in_steps
from .describe import settings_line
from .elastic import Segment, batches_done, steps_done
from .process_group import start_accelerator
from .run import DistributedRun

#: a per-worker number: a float (the loop averages it over workers) or a (sum, count) pair
#: (the loop divides the sum over workers by the count over workers)
Measure = Union[float, tuple[float, float]]


class Task:
    """What a trainer supplies to the shared loop; everything else is the loop's.

    A subclass builds its data, its seeded model (``self.model``), ``self.optimizer`` (and
    ``self.scheduler``, stepped or checkpointed with the run, or None) in ``__init__(conf, rank,
    world)`` and says how to name its numbers (the class attributes below).
    """

    tag = "train"                 # log prefix: [train_lm]
    loss_label = "loss"           # the epoch line's "train <loss_label>"
    loss_scalar = "train/loss"    # TensorBoard tag of the running training loss
    valid_key = "valid"           # history and results.json: <key>, <key>_replicas, final_<key>
    valid_label = "valid"         # the epoch line's name of the validation number
    valid_scalar = "valid/value"  # TensorBoard: <scalar>, <scalar>_replicas, <scalar>_final
    valid_format = ".4f"
    #: every worker validates on the whole validation set (not a shard of it): a model that is the
    #: same on every worker (the replicas' average, the final model) gives the same number on all
    #: of them, so that number is taken as it is instead of averaged over workers
    validates_whole_set = False
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    stopped = False               # set by end_epoch to stop before the next epoch (it is checkpointed
                                  # by the task's state_dict where the task can stop early)

    def describe(self) -> str:
        """The task's part of the start line (data, model)."""
        return ""

    def batches(self, epoch: int) -> Sequence:
        """This rank's batches of ``epoch`` in training order (the loop takes the agreed number)."""
        raise NotImplementedError

    def rest_of_epoch(self, epoch: int, segments: Sequence[tuple[int, int]]) -> Sequence:
        """This rank's batches of what is left of ``epoch`` after ``segments`` (oldest first: n
        workers ran d batches each of their lists, the first list being :meth:`batches` on n
        workers, each later one the previous rest split over its workers): elastic resume of a
        mid-epoch checkpoint on another number of workers (:mod:`gossip_accel.train.elastic`).
        A trainer that cannot re-shard its data refuses here."""
        raise CheckpointError(
            f"{type(self).__name__} cannot re-shard the data of epoch {epoch} after {list(segments)} (workers, batches "
            "each): resume from an epoch-end checkpoint, or on the old number of workers, or give the task rest_of_epoch")

    def begin_epoch(self, epoch: int, saved: dict) -> None:
        """Reset the running state for ``epoch``, or restore it from ``saved`` (the
        :meth:`epoch_state` of a mid-epoch checkpoint; empty at a fresh epoch start)."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """Forward ``batch`` through ``model`` (the prepared replica); the tensor to backpropagate.
        Adds the batch to the running statistics."""
        raise NotImplementedError

    def running_loss(self) -> float:
        """The epoch's training loss so far (tqdm, TensorBoard)."""
        raise NotImplementedError

    def epoch_state(self) -> dict:
        """The running state a mid-epoch checkpoint stores (see :meth:`begin_epoch`)."""
        raise NotImplementedError

    def train_measure(self) -> Measure:
        """This worker's training loss of the epoch."""
        raise NotImplementedError

    def validate(self, model: torch.nn.Module) -> Measure:
        """This worker's validation number of ``model`` (its replica, or the replicas' average)."""
        raise NotImplementedError

    def end_epoch(self, epoch: int, row: dict) -> None:
        """After the epoch's validation (``row``: its history row): e.g. the learning-rate schedule."""

    def state_dict(self) -> dict:
        """The task's own checkpointed state (merged into the checkpoint's ``extra``)."""
        return {}

    def load_state_dict(self, extra: dict) -> None:
        """Restore :meth:`state_dict` from a checkpoint's ``extra`` (empty when starting fresh)."""

    def results(self) -> dict:
        """The task's own keys of results.json."""
        return {}


def mean_over_workers(measures: Sequence[Measure]) -> list[float]:
    """Each measure over all workers, with one all-reduce for them all."""
    flat: list[float] = []
    for m in measures:
        flat.extend(m if isinstance(m, tuple) else (m,))
    means = iter(all_mean(flat))
    out = []
    for m in measures:
        if isinstance(m, tuple):
            total, count = next(means), next(means)
            out.append(total / max(count, 1))
        else:
            out.append(next(means))
    return out


def local_steps(batches: Sequence, train: RunConf, segments: Sequence[Segment] = (), world: int = 1) -> int:
    """This rank's steps of an epoch: its batches, at most ``train.max_steps_per_epoch`` less the
    steps per worker of the epoch's earlier ``segments`` (an elastic resume), or at most the
    ``world`` workers' share, rounded up, of ``train.max_batches_per_epoch`` less the batches
    those segments consumed (:func:`gossip_accel.train.config.check_epoch_caps`: not both)."""
    if train.max_steps_per_epoch:
        return max(0, min(len(batches), train.max_steps_per_epoch - steps_done(segments)))
    if train.max_batches_per_epoch:
        return max(0, min(len(batches), -(-(train.max_batches_per_epoch - batches_done(segments)) // world)))
    return len(batches)


def main(doc: str, argv: Optional[list[str]], load_conf: Callable[[list[str], list[str]], Any],
         make_task: Callable[[Any, int, int], Task], epochs: Callable[[Any], int]) -> dict:
    """A training entry point: the command line (``--config``, ``--exp-dir``, ``--name``,
    overrides), the configuration, the task, the run, :func:`train`; returns results.json's dict.

    ``train.warmup_epochs`` becomes ``sync.warmup_steps`` here, before the synchronizer is built
    (:func:`gossip_accel.train.config.warmup_in_steps`), with the steps of epoch 1 agreed by the ranks.
    """
    args = entry_args(doc, argv)
    conf = load_conf(args.config, args.overrides)
    check_epoch_caps(conf.train)
    sync_cfg = load_sync_config(OmegaConf.to_container(conf.sync) or None)
    accelerator = start_accelerator(conf.train.cpu, conf.train.collective_timeout)
    task = make_task(conf, accelerator.process_index, accelerator.num_processes)
    if conf.train.warmup_epochs is not None:
        first = agree_on_steps(local_steps(task.batches(1), conf.train, world=accelerator.num_processes))
        sync_cfg = warmup_in_steps(sync_cfg, conf.train.warmup_epochs, first)
    run = DistributedRun(task.model, task.optimizer, sync_cfg, Path(args.exp_dir), scheduler=task.scheduler,
                         accelerator=accelerator, **run_options(conf.train))
    if run.is_main:
        OmegaConf.save(conf, run.exp / "config.yaml")
    results = train(task, run, conf.train, epochs(conf), args.name or run.default_name())
    shutdown()
    return results


def train(task: Task, run: DistributedRun, conf: RunConf, epochs: int, name: str) -> dict:
    """Epochs 1..``epochs`` (from where a checkpoint left off) of ``task`` in ``run``, then the
    final average, ``final.pt`` and ``results.json`` (also returned)."""
    from torch.utils.tensorboard import SummaryWriter

    first_epoch, extra = run.resume(conf.resume)
    history, train_seconds = extra.get("history", []), extra.get("train_seconds", 0.0)
    task.load_state_dict(extra)
    n_params = sum(p.numel() for p in run.core.parameters())
    writer = SummaryWriter(str(run.exp / "tensorboard")) if run.is_main else None
    say = run.accelerator.print
    settings = run.sync_settings()
    say(f"[{task.tag}] {name}: {run.world} workers, {n_params / 1e6:.2f}M parameters, {task.describe()}")
    say(f"[{task.tag}] {name} sync: {settings_line(settings)}")
    if writer is not None:
        writer.add_text("sync_settings", settings_line(settings))

    for epoch in range(first_epoch, epochs + 1):
        if task.stopped:
            break
        start = time.perf_counter()
        saved = extra.get("epoch_state", {}) if epoch == first_epoch else {}
        steps = run_epoch(task, run, conf, epoch, name, writer, saved,
                          lambda: {"history": history, "train_seconds": train_seconds + time.perf_counter() - start})
        train_seconds += time.perf_counter() - start
        row = validate_epoch(task, run, epoch, steps, writer)
        task.end_epoch(epoch, row)
        history.append(row)
        k = task.valid_key
        say(f"[{task.tag}] {name} epoch {epoch}: {steps} steps, lr {row['lr']:.2e}, train {task.loss_label} "
            f"{row['train_loss']:.4f}, {task.valid_label} {row[k]:{task.valid_format}} (averaged model), "
            f"{row[k + '_replicas']:{task.valid_format}} (mean of replicas)" + (" -> stop" if task.stopped else ""))
        run.save(epoch, {"history": history, "train_seconds": train_seconds, **task.state_dict()})

    run.finish()
    final = validate_equal_model(task, run.core)
    results = {**run.results(name, n_params, len(history), train_seconds, history), **task.results(),
               f"final_{task.valid_key}": final}
    run.save_final()
    if run.is_main:
        (run.exp / "results.json").write_text(json.dumps(results, indent=2))
    if writer is not None:
        writer.add_scalar(f"{task.valid_scalar}_final", final, run.step)
        writer.close()
    say(f"[{task.tag}] {name} done: {task.valid_label} of the averaged model {final:{task.valid_format}}, "
        f"{results['bytes_sent_per_step_per_worker'] / 1e6:.3f} MB sent/step/worker, "
        f"{results['steps_per_second']:.2f} steps/s")
    return results


def run_epoch(task: Task, run: DistributedRun, conf: RunConf, epoch: int, name: str, writer: Any, saved: dict,
              progress: Callable[[], dict]) -> int:
    """The training steps of ``epoch`` (after a mid-epoch resume: the rest of them); returns the
    number of steps the ranks agreed on. ``saved``: the task's state in a mid-epoch checkpoint
    of this epoch; ``progress()``: the loop's state for one."""
    from tqdm import tqdm

    segments = run.segments_before(epoch)  # after an elastic resume: what other worlds ran of this epoch
    batches = task.rest_of_epoch(epoch, segments) if segments else task.batches(epoch)
    steps = agree_on_steps(local_steps(batches, conf, segments, run.accelerator.num_processes))
    run.model.train()
    skip = run.start_batch(epoch)
    task.begin_epoch(epoch, saved if skip else {})
    bar = tqdm(total=steps, initial=skip, desc=f"{name} epoch {epoch}", disable=not run.is_main, mininterval=2.0)
    for i in range(skip, steps):
        loss = task.loss(run.model, batches[i])
        run.optimizer.zero_grad(set_to_none=True)
        run.accelerator.backward(loss)
        run.accelerator.clip_grad_norm_(run.model.parameters(), conf.clip_norm)
        run.optimizer.step()
        run.after_step()
        bar.update(1)
        if writer is not None and run.step % conf.log_every == 0:
            writer.add_scalar(task.loss_scalar, task.running_loss(), run.step)
            writer.add_scalar("train/lr", run.optimizer.param_groups[0]["lr"], run.step)
            for k, v in run.metrics().items():
                writer.add_scalar(k, v, run.step)
            bar.set_postfix(loss=f"{task.running_loss():.3f}")
        run.save_step(epoch, i + 1, steps, lambda: {**progress(), **task.state_dict(), "epoch_state": task.epoch_state(),
                                                    "segments": [list(s) for s in segments]})
    bar.close()
    return steps


def validate_equal_model(task: Task, model: torch.nn.Module) -> float:
    """The validation number of a model that is the same on every worker."""
    measure = task.validate(model)
    if task.validates_whole_set:
        return measure if not isinstance(measure, tuple) else measure[0] / max(measure[1], 1)
    (value,) = mean_over_workers([measure])
    return value


def validate_epoch(task: Task, run: DistributedRun, epoch: int, steps: int, writer: Any) -> dict:
    """The epoch's history row: training loss, the validation of the replicas (their mean) and of
    their average, and the bytes each worker sent so far (mean over workers: the curve against traffic)."""
    train_loss, replicas = mean_over_workers([task.train_measure(), task.validate(run.core)])
    averaged = run.averaged_model()
    average = validate_equal_model(task, averaged) if averaged is not None else replicas
    run.save_epoch_model(epoch, averaged if averaged is not None else run.core)  # (train.save_epoch_models)
    k = task.valid_key
    row = {"epoch": epoch, "step": run.step, "steps": steps, "lr": run.optimizer.param_groups[0]["lr"],
           "train_loss": train_loss, k: average, f"{k}_replicas": replicas,
           "bytes_sent_per_worker": run.traffic()["bytes_sent_per_worker"]}
    if writer is not None:
        writer.add_scalar(task.valid_scalar, average, run.step)
        writer.add_scalar(f"{task.valid_scalar}_replicas", replicas, run.step)
    return row
