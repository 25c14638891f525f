"""DistributedRun: what one worker of any trainer holds. The Accelerate-prepared model and
optimizer, the synchronizer (or the DDP baseline with its byte counter), the step counter,
per-rank checkpoints (epoch ends and every ``checkpoint_every_steps`` steps) with exact resume,
the restart count, and the traffic summary.

    run = DistributedRun(model, optimizer, sync_cfg, exp_dir, checkpoint_every_steps=50)
    start_epoch, extra = run.resume()          # newest complete checkpoint every rank verified
    for epoch in range(start_epoch, epochs + 1):
        for i, batch in enumerate(...):
            if i < run.start_batch(epoch): continue           # resumed inside this epoch
            loss = run.model(...); run.accelerator.backward(loss); run.optimizer.step(); run.after_step()
            run.save_step(epoch, i + 1, steps, lambda: {...})  # mid-epoch checkpoint when due
        run.save(epoch, extra={...})
    run.finish()                               # final average (Algorithm 1, line 20)
    traffic = run.traffic()                    # bytes per worker, mean over workers

The trainers run this loop through :func:`gossip_accel.train.loop.train`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from omegaconf import OmegaConf

from ..sync.comm import Counter
from ..sync.config import ConfigError, SyncConfig
from ..sync.health import clear_optimizer_state
from . import checkpoint as ckpt
from . import elastic as elastic_resume
from .collectives import all_mean, average_of_replicas, barrier
from .describe import periods_label, sync_settings
from .process_group import start_accelerator


class DistributedRun:
    """Accelerator + prepared model/optimizer + synchronizer or DDP counter + checkpoints.

    ``accelerator``: one already started (:func:`gossip_accel.train.process_group.start_accelerator`),
    e.g. by a trainer that needed the rank and world size before it built its data; by default
    one is started here. ``ddp_wrapper``: None wraps the model in DDP only where the run needs DDP
    (:func:`gossip_accel.sync.integrations.accelerate.prepare`); True always (bench/step_profile.py measures
    what it costs); False is refused where it is needed.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sync_cfg: SyncConfig,
                 exp_dir: Path, cpu: Optional[bool] = None, scheduler: Any = None, checkpoint: bool = True,
                 keep_checkpoints: int = 3, checkpoint_every_steps: int = 0, collective_timeout: float = 1800.0,
                 accelerator: Any = None, elastic: bool = True, save_epoch_models: bool = False,
                 ddp_wrapper: Optional[bool] = None):
        from ..sync.integrations.accelerate import AccelerateSynchronizer, counting_allreduce_hook, prepare

        if keep_checkpoints < 1:
            raise ConfigError(f"train.keep_checkpoints={keep_checkpoints}: keep at least 1")
        if checkpoint_every_steps < 0:
            raise ConfigError(f"train.checkpoint_every_steps={checkpoint_every_steps}: use 0 (epoch ends only) or more")
        self.accelerator = accelerator or start_accelerator(cpu, collective_timeout)
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
        self.model, self.optimizer = prepare(self.accelerator, model, optimizer, sync_cfg, ddp_wrapper)
        self.core = self.accelerator.unwrap_model(self.model)
        self.scheduler = scheduler
        self.exp = Path(exp_dir)
        self.ckpt_root = self.exp / "checkpoints"
        self.checkpoint = checkpoint
        self.keep_checkpoints, self.every_steps = keep_checkpoints, checkpoint_every_steps
        self.save_epoch_models = save_epoch_models
        self.resumed_at: Optional[tuple[int, int]] = None  # (epoch, next batch) of a mid-epoch checkpoint
        self.elastic = elastic  # resume a checkpoint of another world size (train/elastic.py)
        self.resumed_segments: list[elastic_resume.Segment] = []  # earlier segments of the resumed epoch
        self.restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        if self.restarts:
            self.accelerator.print(f"[train] restart {self.restarts} of this job (TORCHELASTIC_RESTART_COUNT)")
        self.ddp_counter = Counter()
        self.sync = None
        if sync_cfg.enabled:
            self.sync = AccelerateSynchronizer(self.accelerator, self.model, sync_cfg)
            # sync.nonfinite=reset: a reset replica's optimizer state (momentum, Adam moments) is NaN too
            self.sync.on_reset = lambda names: clear_optimizer_state(self.optimizer, self.core, names)
        elif self.world > 1:
            self.model.register_comm_hook(self.ddp_counter, counting_allreduce_hook)
        self.sync_cfg = sync_cfg
        self.step = 0
        if self.accelerator.is_main_process:
            self.exp.mkdir(parents=True, exist_ok=True)

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def default_name(self) -> str:
        return self.sync_cfg.algorithm if self.sync is not None else ("ddp" if self.world > 1 else "single")

    def sync_settings(self) -> dict[str, Any]:
        """algorithm, eta, zeta, p, q, periods, warm-up, wire, resolved for this run (results.json)."""
        return sync_settings(self.sync, self.world)

    def after_step(self) -> None:
        """Call after every optimizer step."""
        if self.sync is not None:
            self.sync.step()
        self.step += 1

    def metrics(self) -> dict[str, float]:
        return self.sync.metrics() if self.sync is not None else {"sync/bytes_sent": self.ddp_counter.bytes_sent}

    def all_mean(self, values: list[float]) -> list[float]:
        """Mean over workers of a few scalars (every rank gets the same numbers)."""
        return all_mean(values)

    def averaged_model(self) -> Optional[torch.nn.Module]:
        """A copy of the model averaged over the replicas (the model :meth:`finish` would make
        now), or None where the replicas are equal anyway (DDP, one worker). Neither the
        replicas nor the synchronizer change, and the bytes are not counted as sync traffic."""
        if self.sync is None or self.world == 1:
            return None
        return average_of_replicas(self.core)

    # -- checkpoints ----------------------------------------------------------------------
    def _write(self, epoch: int, extra: dict, epoch_end: bool) -> None:
        """This rank's state; the checkpoint counts once every rank wrote (rank 0 marks it done,
        then prunes to the newest ``keep_checkpoints``)."""
        where = ckpt.checkpoint_dir(self.ckpt_root, epoch, self.step, epoch_end)
        ckpt.atomic_save({
            "world_size": self.world, "epoch": epoch, "step": self.step, "model": self.core.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else {},
            "sync": self.sync.state_dict() if self.sync is not None else {},
            "ddp_counter": vars(self.ddp_counter).copy(), "rng": ckpt.rng_state(), "extra": extra,
        }, where / f"rank{self.rank}.pt", checksum=True)
        barrier(f"checkpoint {where.name}")
        if self.is_main:
            ckpt.mark_done(where, epoch, self.step, self.world, epoch_end)
            ckpt.prune(self.ckpt_root, self.keep_checkpoints)

    def save(self, epoch: int, extra: dict) -> None:
        """The checkpoint after ``epoch`` (``extra``: the trainer's own state, e.g. history)."""
        if self.checkpoint:
            self._write(epoch, extra, epoch_end=True)

    def save_epoch_model(self, epoch: int, model: torch.nn.Module) -> None:
        """Rank 0, with ``save_epoch_models``: ``model`` (the replicas' average after ``epoch``, the
        same on every rank) to ``<exp>/epoch_models/epoch<E>.pt``, never pruned: the models that
        gossip_accel.train.average_checkpoints averages over epochs."""
        if self.save_epoch_models and self.is_main:
            from .average_checkpoints import epoch_model_path

            ckpt.atomic_save(model.state_dict(), epoch_model_path(self.exp, epoch))

    def save_step(self, epoch: int, next_batch: int, steps: int, extra: Callable[[], dict]) -> None:
        """Call after every step: a mid-epoch checkpoint every ``checkpoint_every_steps`` steps
        (not at the epoch's last step: the epoch-end one follows). ``extra()`` is the trainer's
        state, including its position in the epoch (``next_batch`` is stored here)."""
        if not (self.checkpoint and self.every_steps and self.step % self.every_steps == 0 and next_batch < steps):
            return
        self._write(epoch, {**extra(), "next_batch": next_batch}, epoch_end=False)

    def start_batch(self, epoch: int) -> int:
        """The first batch to run in ``epoch``: >0 in the epoch a mid-epoch checkpoint resumed."""
        return self.resumed_at[1] if self.resumed_at is not None and self.resumed_at[0] == epoch else 0

    def segments_before(self, epoch: int) -> list[elastic_resume.Segment]:
        """The (workers, batches each) segments of ``epoch`` run before this world's batch list began:
        non-empty in the epoch an elastic resume (or a resume after one) continues; the trainer's
        ``rest_of_epoch`` shards what they left (:mod:`gossip_accel.train.elastic`)."""
        return list(self.resumed_segments) if self.resumed_at is not None and self.resumed_at[0] == epoch else []

    def resume(self, enabled: bool = True) -> tuple[int, dict]:
        """Load the newest complete checkpoint every rank verified; returns (first epoch to run,
        extra state). After a mid-epoch checkpoint that is its epoch, and :meth:`start_batch`
        says where in it to continue. A corrupted newest checkpoint is reported and skipped; one
        of another model is refused (:class:`gossip_accel.train.checkpoint.CheckpointError`), one of
        another world size too unless ``elastic``: then the n replicas are averaged and the rest of the
        state merged (:mod:`gossip_accel.train.elastic`), with one log line saying so."""
        other = elastic_resume.loader(self.world, self.accelerator.print) if self.elastic else None
        found = ckpt.select(self.ckpt_root, self.world, self.accelerator.print, other) if enabled else None
        if found is None:
            if enabled and self.restarts:
                self.accelerator.print("[train] no complete checkpoint to resume from: starting at step 0")
            return 1, {}
        entry, state = found
        path = entry.path / f"rank{self.rank}.pt"
        ckpt.check_fits(path, self.core, state["model"])
        self.core.load_state_dict(state["model"])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scheduler is not None:
                self.scheduler.load_state_dict(state["scheduler"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise ckpt.CheckpointError(f"{path}: optimizer/scheduler state does not fit ({e}): it was written with "
                                       "another train.optimizer; use a new --exp-dir or train.resume=false") from e
        if self.sync is not None:
            ckpt.load_sync_state(path, self.sync, state["sync"])
        self.ddp_counter = Counter(**state["ddp_counter"])
        if state["rng"] is not None:  # None: a new rank beyond the old world keeps its own seeding
            ckpt.set_rng_state(state["rng"])
        self.step = state["step"]
        extra = state["extra"]
        where = "end of epoch" if entry.epoch_end else f"epoch {entry.epoch}, batch {extra.get('next_batch')}"
        self.accelerator.print(f"[train] resumed from {entry.path} (step {self.step}, {where})")
        if entry.epoch_end:
            if "elastic" in state:
                self._say_elastic(state["elastic"], f"end of epoch {entry.epoch}",
                                  f"epoch {entry.epoch + 1} sharded over {self.world} workers")
            return entry.epoch + 1, extra
        segments = [tuple(s) for s in extra.get("segments", [])]
        next_batch = int(extra["next_batch"])
        if "elastic" in state:  # the old world's segment ends here; this world starts a new batch list
            segments, next_batch = elastic_resume.segments_after(segments, state["elastic"]["from_world"], next_batch), 0
            done = elastic_resume.batches_done(segments)
            self._say_elastic(state["elastic"], f"epoch {entry.epoch}, step {self.step}",
                              f"the rest of epoch {entry.epoch} (after {done} batches) re-sharded over {self.world} workers")
        self.resumed_at, self.resumed_segments = (entry.epoch, next_batch), segments
        return entry.epoch, extra

    def _say_elastic(self, info: dict, where: str, data: str) -> None:
        n = info["from_world"]
        if self.sync is None:
            slots = "no synchronizer state"
        elif not self.sync_cfg.uses_bmuf:
            slots = "no BMUF slots"
        else:
            kind = "outer-optimizer" if self.sync_cfg.outer_optimizer is not None else "BMUF"
            slots = (f"{kind} slots carried (identical on all {n} ranks)" if info["slots_identical"]
                     else f"{kind} slots averaged over {n} ranks")
        if self.sync is not None and info.get("algorithm") not in (None, self.sync_cfg.algorithm):
            slots += f" ({info['algorithm']} continues as {self.sync_cfg.algorithm})"
        eta = elastic_resume.eta_note(self.sync_cfg, self.sync is not None and self.sync_cfg.uses_bmuf, n, self.world)
        self.accelerator.print(elastic_resume.resume_line(n, self.world, where, slots, eta, data))

    # -- the end ----------------------------------------------------------------------------
    def finish(self) -> None:
        """Final average over all workers (Algorithm 1, line 20)."""
        if self.sync is not None:
            self.sync.finalize()

    def traffic(self) -> dict[str, float]:
        """Bytes sent/received and comm seconds per worker (mean over workers), and per step."""
        c = self.sync.comm.stats.total() if (self.sync is not None and self.sync.comm) else self.ddp_counter
        sent, recv, seconds = all_mean([c.bytes_sent, c.bytes_recv, c.seconds])
        steps = max(self.step, 1)
        out = {"bytes_sent_per_worker": sent, "bytes_recv_per_worker": recv, "comm_seconds_per_worker": seconds,
               "bytes_sent_per_step_per_worker": sent / steps, "bytes_recv_per_step_per_worker": recv / steps}
        split = getattr(self.sync, "traffic_split", None)
        if split is not None:  # hierarchical: the above is between groups; add the gradients inside a group
            (intra,) = all_mean([split()["intra"]])
            out.update({"intra_group_bytes_sent_per_worker": intra, "intra_group_bytes_sent_per_step_per_worker": intra / steps})
        return out

    def results(self, name: str, n_params: int, epochs: int, train_seconds: float, history: list) -> dict:
        """The part of results.json every trainer writes (who, how long, how much traffic)."""
        return {
            "name": name, "algorithm": self.sync_cfg.algorithm if self.sync is not None else name,
            "periods": periods_label(self.sync_cfg) if self.sync is not None else "(1)",
            "workers": self.world, "parameters": n_params, "epochs": epochs, "steps_per_worker": self.step,
            "restarts": self.restarts,
            "train_seconds": train_seconds, "steps_per_second": self.step / max(train_seconds, 1e-9),
            **self.traffic(), "history": history, "sync": OmegaConf.to_container(OmegaConf.structured(self.sync_cfg)),
            "sync_settings": self.sync_settings(),
        }

    def save_final(self, name: str = "final.pt") -> None:
        if self.is_main:
            ckpt.atomic_save(self.core.state_dict(), self.exp / name)
